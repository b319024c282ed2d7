//! The positions of one data file's rows that a snapshot does not have:
//! format 2 position delete files (Parquet with the spec's reserved field
//! ids) and format 3 deletion vectors (a Roaring bitmap as a
//! `deletion-vector-v1` blob in a Puffin file).

use std::collections::HashMap;
use std::sync::Arc;

use arrow::array::{Int64Array, StringArray};
use arrow::datatypes::{DataType, Field, Schema};
use arrow::record_batch::RecordBatch;
use parquet::arrow::ArrowWriter;
use parquet::basic::{Compression, ZstdLevel};
use parquet::file::properties::WriterProperties;

use crate::manifest::{DELETE_FILE_PATH_ID, DELETE_POS_ID};
use crate::{PublishError, Result};

fn field(name: &str, data_type: DataType, id: i32) -> Field {
    Field::new(name, data_type, false).with_metadata(HashMap::from([("PARQUET:field_id".to_owned(), id.to_string())]))
}

/// A position delete file of the data file at `data_path`: its rows at
/// `positions` (ascending) are deleted.
pub fn position_delete_file(data_path: &str, positions: &[u64]) -> Result<Vec<u8>> {
    debug_assert!(positions.windows(2).all(|w| w[0] < w[1]), "positions ascend");
    let schema = Arc::new(Schema::new(vec![
        field("file_path", DataType::Utf8, DELETE_FILE_PATH_ID),
        field("pos", DataType::Int64, DELETE_POS_ID),
    ]));
    let paths = StringArray::from_iter_values(std::iter::repeat_n(data_path, positions.len()));
    let pos = Int64Array::from_iter_values(positions.iter().map(|&p| p as i64));
    let batch = RecordBatch::try_new(Arc::clone(&schema), vec![Arc::new(paths), Arc::new(pos)])?;
    let props = WriterProperties::builder()
        .set_compression(Compression::ZSTD(ZstdLevel::default()))
        .set_max_row_group_row_count(Some(1 << 20))
        .build();
    let mut out = Vec::new();
    let mut writer = ArrowWriter::try_new(&mut out, schema, Some(props))?;
    writer.write(&batch)?;
    writer.close()?;
    Ok(out)
}

/// Magic bytes that open and close a Puffin file.
const PUFFIN_MAGIC: [u8; 4] = *b"PFA1";
/// Magic bytes that open a deletion vector blob's bitmap.
const DV_MAGIC: [u8; 4] = [0xD1, 0xD3, 0x39, 0x64];
/// Field id of the row position, which a deletion vector covers.
const ROW_POSITION_ID: i32 = 2147483645;

/// A Puffin file holding one deletion vector.
#[derive(Debug)]
pub struct DeletionVectorFile {
    /// The whole file.
    pub bytes: Vec<u8>,
    /// Where the vector's blob starts (a manifest's `content_offset`).
    pub offset: i64,
    /// The blob's length (`content_size_in_bytes`).
    pub length: i64,
}

/// A Puffin file with the deletion vector of the data file at `data_path`:
/// its rows at `positions` (ascending) are deleted.
///
/// The blob is the spec's `deletion-vector-v1`: the length of what follows
/// up to the checksum (4 bytes, big-endian), the magic `D1 D3 39 64`, the
/// positions as a 64-bit Roaring bitmap in the portable format, and the
/// CRC-32 of magic and bitmap (big-endian). Its footer names the data file
/// and the cardinality; snapshot id and sequence number are -1, as the spec
/// requires of deletion vectors (they are inherited from the manifest).
pub fn deletion_vector_file(data_path: &str, positions: &[u64]) -> Result<DeletionVectorFile> {
    let mut bitmap = roaring::RoaringTreemap::from_sorted_iter(positions.iter().copied())
        .map_err(|e| PublishError::Encode(format!("deletion vector of {data_path}: positions do not ascend: {e}")))?;
    bitmap.optimize();
    let mut vector = Vec::with_capacity(4 + bitmap.serialized_size());
    vector.extend_from_slice(&DV_MAGIC);
    bitmap.serialize_into(&mut vector).map_err(|e| PublishError::Encode(e.to_string()))?;
    let crc = crc32fast::hash(&vector);

    let mut bytes = Vec::with_capacity(vector.len() + 512);
    bytes.extend_from_slice(&PUFFIN_MAGIC);
    let offset = bytes.len();
    let length_field = u32::try_from(vector.len())
        .map_err(|_| PublishError::Encode(format!("deletion vector of {data_path}: over 4 GiB")))?;
    bytes.extend_from_slice(&length_field.to_be_bytes());
    bytes.extend_from_slice(&vector);
    bytes.extend_from_slice(&crc.to_be_bytes());
    let length = bytes.len() - offset;

    let footer = serde_json::json!({
        "blobs": [{
            "type": "deletion-vector-v1",
            "fields": [ROW_POSITION_ID],
            "snapshot-id": -1,
            "sequence-number": -1,
            "offset": offset,
            "length": length,
            "properties": {
                "referenced-data-file": data_path,
                "cardinality": positions.len().to_string(),
            },
        }],
        "properties": { "created-by": concat!("fovea ", env!("CARGO_PKG_VERSION")) },
    });
    let payload = serde_json::to_vec(&footer).expect("JSON serialises");
    bytes.extend_from_slice(&PUFFIN_MAGIC);
    bytes.extend_from_slice(&payload);
    bytes.extend_from_slice(&(payload.len() as u32).to_le_bytes());
    bytes.extend_from_slice(&[0; 4]); // flags: payload not compressed
    bytes.extend_from_slice(&PUFFIN_MAGIC);
    Ok(DeletionVectorFile { bytes, offset: offset as i64, length: length as i64 })
}

/// The positions of the deletion vector blob `blob` (as a manifest's
/// `content_offset`/`content_size_in_bytes` cut it from its Puffin file),
/// checked: length, magic and CRC.
pub fn read_deletion_vector(blob: &[u8]) -> std::result::Result<Vec<u64>, String> {
    if blob.len() < 12 {
        return Err(format!("a deletion vector of {} bytes is too short", blob.len()));
    }
    let length = u32::from_be_bytes(blob[..4].try_into().expect("4 bytes")) as usize;
    if length + 8 != blob.len() {
        return Err(format!("its length field says {length} bytes, the blob has {}", blob.len() - 8));
    }
    let vector = &blob[4..4 + length];
    if vector[..4] != DV_MAGIC {
        return Err(format!("magic {:02x?}, expected {DV_MAGIC:02x?}", &vector[..4]));
    }
    let crc = u32::from_be_bytes(blob[4 + length..].try_into().expect("4 bytes"));
    if crc != crc32fast::hash(vector) {
        return Err("CRC-32 does not match".into());
    }
    let bitmap = roaring::RoaringTreemap::deserialize_from(&vector[4..]).map_err(|e| e.to_string())?;
    Ok(bitmap.iter().collect())
}

impl From<arrow::error::ArrowError> for PublishError {
    fn from(e: arrow::error::ArrowError) -> Self {
        PublishError::Encode(e.to_string())
    }
}

impl From<parquet::errors::ParquetError> for PublishError {
    fn from(e: parquet::errors::ParquetError) -> Self {
        PublishError::Encode(e.to_string())
    }
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;
    use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;

    use super::*;

    #[test]
    fn a_delete_file_lists_its_data_file_and_positions_under_the_reserved_ids() {
        let bytes = position_delete_file("s3://b/tables/1/f.parquet", &[0, 5, 4095]).unwrap();
        let reader = ParquetRecordBatchReaderBuilder::try_new(Bytes::from(bytes)).unwrap();
        let ids: Vec<i32> =
            reader.parquet_schema().root_schema().get_fields().iter().map(|f| f.get_basic_info().id()).collect();
        assert_eq!(ids, vec![DELETE_FILE_PATH_ID, DELETE_POS_ID]);
        let batch = reader.build().unwrap().next().unwrap().unwrap();
        let pos = batch.column(1).as_any().downcast_ref::<Int64Array>().unwrap();
        assert_eq!(pos.values().to_vec(), vec![0, 5, 4095]);
        let path = batch.column(0).as_any().downcast_ref::<StringArray>().unwrap();
        assert!(path.iter().all(|p| p == Some("s3://b/tables/1/f.parquet")));
    }

    #[test]
    fn a_deletion_vector_is_a_puffin_blob_that_reads_back_checked() {
        let positions: Vec<u64> = (0..70_000).filter(|p| p % 3 == 0).chain([(1 << 32) + 7]).collect();
        let dv = deletion_vector_file("s3://b/f.parquet", &positions).unwrap();
        let b = &dv.bytes;
        assert_eq!(&b[..4], b"PFA1");
        assert_eq!(&b[b.len() - 4..], b"PFA1");
        let payload_len = u32::from_le_bytes(b[b.len() - 12..b.len() - 8].try_into().unwrap()) as usize;
        let footer_start = b.len() - 12 - payload_len;
        assert_eq!(&b[footer_start - 4..footer_start], b"PFA1");
        let footer: serde_json::Value = serde_json::from_slice(&b[footer_start..b.len() - 12]).unwrap();
        let blob = &footer["blobs"][0];
        assert_eq!(blob["type"], "deletion-vector-v1");
        assert_eq!(blob["offset"], dv.offset);
        assert_eq!(blob["length"], dv.length);
        assert_eq!(blob["properties"]["cardinality"], positions.len().to_string());
        assert_eq!(blob["properties"]["referenced-data-file"], "s3://b/f.parquet");
        let cut = &b[dv.offset as usize..(dv.offset + dv.length) as usize];
        assert_eq!(read_deletion_vector(cut).unwrap(), positions);

        let mut damaged = cut.to_vec();
        damaged[20] ^= 1;
        assert!(read_deletion_vector(&damaged).unwrap_err().contains("CRC"), "a flipped bit is caught");
        assert!(deletion_vector_file("x", &[3, 2]).is_err(), "positions must ascend");
    }
}

//! Position delete files (format 2): the positions of one data file's rows
//! that a snapshot does not have, as Parquet with the spec's reserved
//! field ids.

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
}

//! Keeping the visible rows of a decoded batch inside its own buffers.
//!
//! A scan decodes each row group into buffers only it holds, and with
//! scattered deletes nearly every row group hides a few of its rows.
//! Arrow's `filter_record_batch` copies every column into newly allocated
//! buffers; [`keep_rows`] instead moves each run of kept rows down inside
//! the buffers the column already has: nothing is allocated and no memory
//! beyond the (cache-hot) decoded buffers is touched.
//!
//! A column takes the in-place path only when Arrow confirms that nothing
//! else holds its buffers (`Buffer::into_mutable` succeeds only for a
//! buffer whose reference is unique and which starts at its allocation).
//! A shared column (an in-memory block read by many scans, a sliced array)
//! or one of a type without an in-place path (booleans, views, nested
//! types, dictionaries) goes through Arrow's filter, so the answer is the
//! same either way.

use std::sync::Arc;

use arrow::array::{
    Array, ArrayRef, ArrowPrimitiveType, AsArray, BooleanArray, GenericByteArray, PrimitiveArray, RecordBatch,
    RecordBatchOptions, downcast_primitive,
};
use arrow::buffer::{BooleanBuffer, Buffer, MutableBuffer, NullBuffer, OffsetBuffer, ScalarBuffer};
use arrow::compute::{FilterBuilder, FilterPredicate};
use arrow::datatypes::{
    ArrowNativeType, BinaryType, ByteArrayType, DataType, LargeBinaryType, LargeUtf8Type, Utf8Type,
};

use crate::error::Result;

/// The rows of `batch` whose bit is set in `mask` (bit `i` of word
/// `i / 64` for row `i`), in order. `batch` is consumed so that the
/// columns it alone holds can be compacted where they lie.
///
/// When fewer than half the rows are kept, the columns are copied into
/// buffers of their kept size instead: a selective scan's batches must
/// not pin whole row groups' allocations for the few rows they return.
pub fn keep_rows(batch: RecordBatch, mask: Vec<u64>) -> Result<RecordBatch> {
    let rows = batch.num_rows();
    let keep = KeptRows::new(mask, rows);
    if keep.count * 2 < rows {
        let selection = BooleanArray::new(keep.mask, None);
        return Ok(arrow::compute::filter_record_batch(&batch, &selection)?);
    }
    let (schema, columns, _) = batch.into_parts();
    let columns = columns.into_iter().map(|c| keep.column(c)).collect::<Result<Vec<_>>>()?;
    let options = RecordBatchOptions::new().with_row_count(Some(keep.count));
    Ok(RecordBatch::try_new_with_options(schema, columns, &options)?)
}

/// The kept rows of one batch: as runs for the in-place path, as a
/// predicate for Arrow's filter.
struct KeptRows {
    /// Maximal runs `[start, end)` of kept rows, ascending.
    runs: Vec<(usize, usize)>,
    /// How many rows are kept.
    count: usize,
    /// Arrow's filter over the same rows, built on first use.
    predicate: std::sync::OnceLock<FilterPredicate>,
    mask: BooleanBuffer,
}

impl KeptRows {
    fn new(mask: Vec<u64>, rows: usize) -> Self {
        // Scanned by the rows that are not kept (few, with scattered
        // deletes), not bit by bit: a word of kept rows costs one test.
        let mut runs = Vec::new();
        let mut start = 0;
        for (w, &word) in mask.iter().enumerate().take(rows.div_ceil(64)) {
            let base = w * 64;
            let valid = if rows - base >= 64 { u64::MAX } else { (1u64 << (rows - base)) - 1 };
            let mut dropped = !word & valid;
            while dropped != 0 {
                let row = base + dropped.trailing_zeros() as usize;
                if start < row {
                    runs.push((start, row));
                }
                start = row + 1;
                // Clears the lowest set bit.
                dropped &= dropped - 1;
            }
        }
        if start < rows {
            runs.push((start, rows));
        }
        let count = runs.iter().map(|(s, e)| e - s).sum();
        let mask = BooleanBuffer::new(Buffer::from_vec(mask), 0, rows);
        KeptRows { runs, count, predicate: std::sync::OnceLock::new(), mask }
    }

    fn predicate(&self) -> &FilterPredicate {
        self.predicate
            .get_or_init(|| FilterBuilder::new(&BooleanArray::new(self.mask.clone(), None)).optimize().build())
    }

    /// Arrow's filter: a copy into new buffers.
    fn filtered(&self, column: &dyn Array) -> Result<ArrayRef> {
        Ok(self.predicate().filter(column)?)
    }

    fn column(&self, column: ArrayRef) -> Result<ArrayRef> {
        macro_rules! primitive {
            ($t:ty, $column:expr) => {
                self.primitive::<$t>($column)
            };
        }
        let data_type = column.data_type().clone();
        downcast_primitive! {
            data_type => (primitive, column),
            DataType::Utf8 => self.bytes::<Utf8Type>(column),
            DataType::LargeUtf8 => self.bytes::<LargeUtf8Type>(column),
            DataType::Binary => self.bytes::<BinaryType>(column),
            DataType::LargeBinary => self.bytes::<LargeBinaryType>(column),
            _ => self.filtered(&column),
        }
    }

    /// The kept bits of a validity buffer (a few hundred bytes: copied).
    fn nulls(&self, nulls: Option<NullBuffer>) -> Result<Option<NullBuffer>> {
        let Some(nulls) = nulls.filter(|n| n.null_count() > 0) else { return Ok(None) };
        let kept = self.predicate().filter(&BooleanArray::new(nulls.into_inner(), None))?;
        Ok(Some(NullBuffer::new(kept.as_boolean().values().clone())).filter(|n| n.null_count() > 0))
    }

    fn primitive<T: ArrowPrimitiveType>(&self, column: ArrayRef) -> Result<ArrayRef> {
        let typed = column.as_primitive::<T>().clone();
        // The batch's reference goes, so that `typed` may be the only one.
        drop(column);
        let (data_type, values, nulls) = typed.into_parts();
        let mut values = match unique::<T::Native>(values.into_inner()) {
            Ok(values) => values,
            Err(values) => {
                let typed = PrimitiveArray::<T>::try_new(ScalarBuffer::from(values), nulls)?.with_data_type(data_type);
                return self.filtered(&typed);
            }
        };
        let slots = values.typed_data_mut::<T::Native>();
        let mut to = 0;
        for &(start, end) in &self.runs {
            slots.copy_within(start..end, to);
            to += end - start;
        }
        values.truncate(self.count * size_of::<T::Native>());
        let values = ScalarBuffer::from(Buffer::from(values));
        Ok(Arc::new(PrimitiveArray::<T>::try_new(values, self.nulls(nulls)?)?.with_data_type(data_type)))
    }

    fn bytes<T: ByteArrayType>(&self, column: ArrayRef) -> Result<ArrayRef> {
        let typed = column.as_bytes::<T>().clone();
        drop(column);
        let (offsets, values, nulls) = typed.into_parts();
        let offsets_buffer = offsets.into_inner().into_inner();
        let (mut offsets, mut values) = match (unique::<T::Offset>(offsets_buffer), values.into_mutable()) {
            (Ok(offsets), Ok(values)) => (offsets, values),
            (offsets, values) => {
                let offsets = offsets.map_or_else(|b| b, Buffer::from);
                let values = values.map_or_else(|b| b, Buffer::from);
                // SAFETY: these are the unchanged parts of the valid array
                // `typed` (offsets in bounds and ascending, UTF-8 where the
                // type says so); only their ownership was tried.
                let typed = unsafe {
                    GenericByteArray::<T>::new_unchecked(OffsetBuffer::new_unchecked(offsets.into()), values, nulls)
                };
                return self.filtered(&typed);
            }
        };
        let ends = offsets.typed_data_mut::<T::Offset>();
        let bytes = values.as_slice_mut();
        // Offsets are rewritten in the buffer they are read from: a run's
        // rows land at or before where they are read (fewer rows are kept
        // before a run than lie before it), and a run's first offset lies
        // beyond everything written so far.
        let mut written = 0usize;
        let mut length = 0usize;
        for &(start, end) in &self.runs {
            let (from, to) = (ends[start], ends[end]);
            bytes.copy_within(from.as_usize()..to.as_usize(), length);
            // The run's end offsets, moved down and then shifted by the
            // bytes dropped before the run.
            ends.copy_within(start + 1..end + 1, written + 1);
            let shift = from - T::Offset::usize_as(length);
            for end in &mut ends[written + 1..written + 1 + end - start] {
                *end = *end - shift;
            }
            written += end - start;
            length += (to - from).as_usize();
        }
        ends[0] = T::Offset::usize_as(0);
        offsets.truncate((self.count + 1) * size_of::<T::Offset>());
        values.truncate(length);
        let offsets = ScalarBuffer::<T::Offset>::from(Buffer::from(offsets));
        // SAFETY: the offsets start at 0 and ascend (each run's are its
        // source offsets shifted by one amount, and runs are laid end to
        // end), and end at `length`, the bytes kept. Each value is the
        // same bytes as a value of the valid source array, so a UTF-8
        // type's values stay UTF-8 and start and end on char boundaries.
        let kept = unsafe {
            GenericByteArray::<T>::new_unchecked(
                OffsetBuffer::new_unchecked(offsets),
                Buffer::from(values),
                self.nulls(nulls)?,
            )
        };
        Ok(Arc::new(kept))
    }
}

/// The buffer as a mutable one of `N`s, if nothing else holds it, it starts
/// at its allocation and is aligned for `N`; otherwise the buffer back.
fn unique<N: ArrowNativeType>(buffer: Buffer) -> std::result::Result<MutableBuffer, Buffer> {
    if !buffer.as_ptr().cast::<N>().is_aligned() {
        return Err(buffer);
    }
    buffer.into_mutable()
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow::array::{
        BinaryArray, BooleanArray, Decimal128Array, Float64Array, Int32Array, Int64Array, LargeStringArray, StringArray,
    };
    use arrow::compute::filter_record_batch;
    use arrow::datatypes::{Field, Schema};
    use rand::rngs::SmallRng;
    use rand::{Rng, SeedableRng};

    fn batch(rows: usize, rng: &mut SmallRng) -> RecordBatch {
        let maybe = |rng: &mut SmallRng| rng.random_bool(0.8);
        let ints: Int64Array = (0..rows).map(|i| maybe(rng).then_some(i as i64)).collect();
        let dense: Int32Array = (0..rows as i32).collect();
        let floats: Float64Array = (0..rows).map(|i| i as f64 * 0.5).collect();
        let decimals = Decimal128Array::from_iter((0..rows).map(|i| maybe(rng).then_some(i as i128 * 100)))
            .with_precision_and_scale(20, 2)
            .unwrap_or_else(|e| panic!("{e}"));
        let names: StringArray = (0..rows).map(|i| maybe(rng).then(|| "é".repeat(i % 7) + &i.to_string())).collect();
        let large: LargeStringArray = (0..rows).map(|i| Some(format!("v{i}"))).collect();
        let blobs: BinaryArray = (0..rows).map(|i| Some(vec![i as u8; i % 5])).collect();
        let flags: BooleanArray = (0..rows).map(|i| Some(i % 3 == 0)).collect();
        let columns: Vec<ArrayRef> = vec![
            Arc::new(ints),
            Arc::new(dense),
            Arc::new(floats),
            Arc::new(decimals),
            Arc::new(names),
            Arc::new(large),
            Arc::new(blobs),
            Arc::new(flags),
        ];
        let fields: Vec<Field> =
            columns.iter().enumerate().map(|(i, c)| Field::new(format!("c{i}"), c.data_type().clone(), true)).collect();
        RecordBatch::try_new(Arc::new(Schema::new(fields)), columns).unwrap_or_else(|e| panic!("{e}"))
    }

    fn random_mask(rows: usize, keep: f64, rng: &mut SmallRng) -> Vec<u64> {
        let mut mask = vec![0u64; rows.div_ceil(64)];
        // Bits past the last row mean nothing, set or not.
        if let Some(last) = mask.last_mut() {
            *last = rng.random();
        }
        for i in 0..rows {
            if rng.random_bool(keep) {
                mask[i / 64] |= 1 << (i % 64);
            } else {
                mask[i / 64] &= !(1 << (i % 64));
            }
        }
        mask
    }

    fn arrow_filter(batch: &RecordBatch, mask: &[u64]) -> RecordBatch {
        let bits = BooleanArray::new(BooleanBuffer::new(Buffer::from_slice_ref(mask), 0, batch.num_rows()), None);
        filter_record_batch(batch, &bits).unwrap_or_else(|e| panic!("{e}"))
    }

    /// Every type, owned and shared, at densities from none kept to all
    /// kept (copied below half, in place above), against Arrow's filter of
    /// the same batch.
    #[test]
    fn kept_rows_equal_arrows_filter_for_owned_and_shared_columns() {
        let mut rng = SmallRng::seed_from_u64(7);
        for rows in [0, 1, 63, 64, 65, 1000, 8192] {
            for keep in [0.0, 0.01, 0.5, 0.7, 0.9, 0.99, 1.0] {
                let mask = random_mask(rows, keep, &mut rng);
                let owned = batch(rows, &mut rng);
                let expected = arrow_filter(&owned, &mask);
                // Shared: the caller keeps its batch, so every buffer has
                // two holders and must be copied, not changed.
                let shared = owned.clone();
                let kept = keep_rows(shared, mask.clone()).unwrap_or_else(|e| panic!("{e}"));
                assert_eq!(kept, expected, "shared, {rows} rows, keep {keep}");
                assert_eq!(arrow_filter(&owned, &mask), expected, "the caller's batch changed");
                let kept = keep_rows(owned, mask).unwrap_or_else(|e| panic!("{e}"));
                assert_eq!(kept, expected, "owned, {rows} rows, keep {keep}");
                kept.columns().iter().for_each(|c| c.to_data().validate_full().unwrap_or_else(|e| panic!("{e}")));
            }
        }
    }

    /// The owned path really works in place: the kept values stay in the
    /// allocation they were decoded into.
    #[test]
    fn an_owned_column_keeps_its_allocation() {
        let values: Int64Array = (0..1000).collect();
        let names: StringArray = (0..1000).map(|i| Some(i.to_string())).collect();
        let before = (values.values().as_ptr(), names.values().as_ptr());
        let schema = Arc::new(Schema::new(vec![
            Field::new("v", DataType::Int64, false),
            Field::new("n", DataType::Utf8, false),
        ]));
        let batch =
            RecordBatch::try_new(schema, vec![Arc::new(values), Arc::new(names)]).unwrap_or_else(|e| panic!("{e}"));
        let mut mask = vec![u64::MAX; 1000usize.div_ceil(64)];
        mask[0] &= !0b1010;
        let kept = keep_rows(batch, mask).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(kept.num_rows(), 998);
        assert_eq!(kept.column(0).as_primitive::<arrow::datatypes::Int64Type>().values().as_ptr(), before.0);
        assert_eq!(kept.column(1).as_string::<i32>().values().as_ptr(), before.1);
        assert_eq!(kept.column(1).as_string::<i32>().value(1), "2");
    }

    /// A batch of no columns keeps its row count.
    #[test]
    fn a_batch_without_columns_counts_its_kept_rows() {
        let options = RecordBatchOptions::new().with_row_count(Some(100));
        let batch = RecordBatch::try_new_with_options(Arc::new(Schema::empty()), vec![], &options)
            .unwrap_or_else(|e| panic!("{e}"));
        let kept = keep_rows(batch, vec![u64::MAX, 0b111]).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(kept.num_rows(), 67);
    }
}

//! Keeping the visible rows of a decoded batch inside its own buffers.
//!
//! A scan decodes each row group into buffers only it holds, and with
//! scattered deletes nearly every row group hides a few of its rows.
//! Arrow's `filter_record_batch` copies every column into newly allocated
//! buffers; [`keep_rows`] instead keeps the rows inside the buffers the
//! column already has: nothing is allocated and no memory beyond the
//! (cache-hot) decoded buffers is touched.
//!
//! Where it can, it fills holes: the batch's last kept rows move into the
//! slots of the dropped rows before them, so a column of `n` rows with `d`
//! dropped moves `d` values instead of the `n` that follow the first hole.
//! Every column of a batch takes the same layout. A variable-length column
//! fills holes in place only when no moved value is longer than the values
//! it replaced up to that point (fixed-width text, digests, codes: always);
//! when one column's would be, the whole batch keeps its order instead and
//! moves each run of kept rows down.
//!
//! A column takes an in-place path only when Arrow confirms that nothing
//! else holds its buffers (`Buffer::into_mutable` succeeds only for a
//! buffer whose reference is unique and which starts at its allocation).
//! A shared column (an in-memory block read by many scans, a sliced array)
//! or one of a type without an in-place path (booleans, views, nested
//! types, dictionaries) is copied by Arrow's `take` or filter in the same
//! layout, so the answer is the same either way.

use std::sync::{Arc, OnceLock};

use arrow::array::{
    Array, ArrayRef, ArrowPrimitiveType, AsArray, BooleanArray, BooleanBufferBuilder, GenericByteArray, PrimitiveArray,
    RecordBatch, RecordBatchOptions, UInt64Array, downcast_primitive,
};
use arrow::buffer::{BooleanBuffer, Buffer, MutableBuffer, NullBuffer, OffsetBuffer, ScalarBuffer};
use arrow::compute::{FilterBuilder, FilterPredicate};
use arrow::datatypes::{
    ArrowNativeType, BinaryType, ByteArrayType, DataType, LargeBinaryType, LargeUtf8Type, Utf8Type,
};

use crate::error::Result;

/// The rows of `batch` whose bit is set in `mask` (bit `i` of word
/// `i / 64` for row `i`). `batch` is consumed so that the columns it alone
/// holds can be compacted where they lie.
///
/// With `k` rows kept, a kept row among the first `k` stays where it is;
/// the kept rows after them take the places of the dropped rows among the
/// first `k`, in order (filling holes, see the module docs) — or, where a
/// variable-length column's values would not fit, every kept row keeps its
/// order. When fewer than half the rows are kept, the columns are copied
/// in order into buffers of their kept size instead: a selective scan's
/// batches must not pin whole row groups' allocations for the few rows
/// they return.
pub fn keep_rows(batch: RecordBatch, mask: Vec<u64>) -> Result<RecordBatch> {
    let rows = batch.num_rows();
    let count = fovea_scan_wasm::count_visible(&mask, rows);
    if count * 2 < rows {
        let selection = BooleanArray::new(BooleanBuffer::new(Buffer::from_vec(mask), 0, rows), None);
        return Ok(arrow::compute::filter_record_batch(&batch, &selection)?);
    }
    let keep = KeptRows::new(mask, rows, count, batch.columns());
    let (schema, columns, _) = batch.into_parts();
    let columns = columns.into_iter().map(|c| keep.column(c)).collect::<Result<Vec<_>>>()?;
    let options = RecordBatchOptions::new().with_row_count(Some(keep.count));
    Ok(RecordBatch::try_new_with_options(schema, columns, &options)?)
}

/// Where the kept rows of a batch go.
enum Layout {
    /// The dropped rows among the first `count` (ascending) each take the
    /// kept row after `count` at the same place in `movers` (ascending).
    Holes { holes: Vec<usize>, movers: Vec<usize> },
    /// Maximal runs `[start, end)` of kept rows, ascending, moved down in
    /// order.
    Runs(Vec<(usize, usize)>),
}

/// The kept rows of one batch: as a layout for the in-place paths, as
/// Arrow's filter or take indices for the copying ones.
struct KeptRows {
    layout: Layout,
    /// How many rows are kept.
    count: usize,
    mask: BooleanBuffer,
    /// Arrow's filter over the same rows (for [`Layout::Runs`]), built on
    /// first use.
    predicate: OnceLock<FilterPredicate>,
    /// The source row of every output row (for [`Layout::Holes`]), built
    /// on first use.
    indices: OnceLock<UInt64Array>,
}

impl KeptRows {
    /// Fills holes unless a variable-length column's moved values would
    /// outgrow the values they replace (see [`never_grows`]).
    fn new(mask: Vec<u64>, rows: usize, count: usize, columns: &[ArrayRef]) -> Self {
        let (holes, movers) = holes_and_movers(&mask, rows, count);
        let layout = if columns.iter().all(|c| holes_fit(c.as_ref(), &holes, &movers)) {
            Layout::Holes { holes, movers }
        } else {
            Layout::Runs(runs(&mask, rows))
        };
        let mask = BooleanBuffer::new(Buffer::from_vec(mask), 0, rows);
        KeptRows { layout, count, mask, predicate: OnceLock::new(), indices: OnceLock::new() }
    }

    fn predicate(&self) -> &FilterPredicate {
        self.predicate
            .get_or_init(|| FilterBuilder::new(&BooleanArray::new(self.mask.clone(), None)).optimize().build())
    }

    fn indices(&self) -> &UInt64Array {
        self.indices.get_or_init(|| match &self.layout {
            Layout::Holes { holes, movers } => {
                let mut indices: Vec<u64> = (0..self.count as u64).collect();
                for (&h, &m) in holes.iter().zip(movers) {
                    indices[h] = m as u64;
                }
                UInt64Array::from(indices)
            }
            Layout::Runs(runs) => runs.iter().flat_map(|&(s, e)| s as u64..e as u64).collect(),
        })
    }

    /// The kept rows copied into new buffers, in the batch's layout.
    fn copied(&self, column: &dyn Array) -> Result<ArrayRef> {
        Ok(match self.layout {
            Layout::Runs(_) => self.predicate().filter(column)?,
            Layout::Holes { .. } => arrow::compute::take(column, self.indices(), None)?,
        })
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
            _ => self.copied(&column),
        }
    }

    /// The kept bits of a validity buffer (a few hundred bytes: copied).
    fn nulls(&self, nulls: Option<NullBuffer>) -> Result<Option<NullBuffer>> {
        let Some(nulls) = nulls.filter(|n| n.null_count() > 0) else { return Ok(None) };
        let kept = match &self.layout {
            Layout::Holes { holes, movers } => {
                let mut bits = BooleanBufferBuilder::new(self.count);
                bits.append_buffer(&nulls.inner().slice(0, self.count));
                for (&h, &m) in holes.iter().zip(movers) {
                    bits.set_bit(h, nulls.is_valid(m));
                }
                bits.finish()
            }
            Layout::Runs(_) => {
                self.predicate().filter(&BooleanArray::new(nulls.into_inner(), None))?.as_boolean().values().clone()
            }
        };
        Ok(Some(NullBuffer::new(kept)).filter(|n| n.null_count() > 0))
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
                return self.copied(&typed);
            }
        };
        let slots = values.typed_data_mut::<T::Native>();
        match &self.layout {
            Layout::Holes { holes, movers } => {
                for (&h, &m) in holes.iter().zip(movers) {
                    slots[h] = slots[m];
                }
            }
            Layout::Runs(runs) => {
                let mut to = 0;
                for &(start, end) in runs {
                    slots.copy_within(start..end, to);
                    to += end - start;
                }
            }
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
                return self.copied(&typed);
            }
        };
        let ends = offsets.typed_data_mut::<T::Offset>();
        let bytes = values.as_slice_mut();
        let length = match &self.layout {
            Layout::Holes { holes, movers } => fill_holes(ends, bytes, holes, movers, self.count),
            Layout::Runs(runs) => compact_runs(ends, bytes, runs),
        };
        offsets.truncate((self.count + 1) * size_of::<T::Offset>());
        values.truncate(length);
        let offsets = ScalarBuffer::<T::Offset>::from(Buffer::from(offsets));
        // SAFETY: the offsets ascend and end at `length`, the bytes kept
        // (fill_holes and compact_runs say why), and each value is the
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

/// The dropped rows among the first `count` and the kept rows after them,
/// both ascending (as many of one as of the other).
fn holes_and_movers(mask: &[u64], rows: usize, count: usize) -> (Vec<usize>, Vec<usize>) {
    // Scanned by the bits that matter (few, with scattered deletes), not
    // bit by bit: a word of kept rows before `count` costs one test.
    let (mut holes, mut movers) = (Vec::new(), Vec::new());
    for (w, &word) in mask.iter().enumerate().take(rows.div_ceil(64)) {
        let base = w * 64;
        let (valid, before) = (rows_below(rows, base), rows_below(count, base));
        for (mut bits, out) in [(!word & valid & before, &mut holes), (word & valid & !before, &mut movers)] {
            while bits != 0 {
                out.push(base + bits.trailing_zeros() as usize);
                // Clears the lowest set bit.
                bits &= bits - 1;
            }
        }
    }
    debug_assert_eq!(holes.len(), movers.len());
    (holes, movers)
}

/// The bits of the mask word starting at row `base` that stand for rows
/// before row `n`.
fn rows_below(n: usize, base: usize) -> u64 {
    match n.saturating_sub(base) {
        0 => 0,
        n if n >= 64 => u64::MAX,
        n => (1u64 << n) - 1,
    }
}

/// Maximal runs `[start, end)` of kept rows, ascending.
fn runs(mask: &[u64], rows: usize) -> Vec<(usize, usize)> {
    // Scanned by the rows that are not kept (few, with scattered deletes).
    let mut runs = Vec::new();
    let mut start = 0;
    for (w, &word) in mask.iter().enumerate().take(rows.div_ceil(64)) {
        let base = w * 64;
        let mut dropped = !word & rows_below(rows, base);
        while dropped != 0 {
            let row = base + dropped.trailing_zeros() as usize;
            if start < row {
                runs.push((start, row));
            }
            start = row + 1;
            dropped &= dropped - 1;
        }
    }
    if start < rows {
        runs.push((start, rows));
    }
    runs
}

/// Whether a variable-length column can fill its holes in place: no
/// prefix of the moves makes the values up to a hole longer than they
/// were, so every write lands on bytes already read. Other columns can.
fn holes_fit(column: &dyn Array, holes: &[usize], movers: &[usize]) -> bool {
    match column.data_type() {
        DataType::Utf8 => never_grows(column.as_string::<i32>().value_offsets(), holes, movers),
        DataType::LargeUtf8 => never_grows(column.as_string::<i64>().value_offsets(), holes, movers),
        DataType::Binary => never_grows(column.as_binary::<i32>().value_offsets(), holes, movers),
        DataType::LargeBinary => never_grows(column.as_binary::<i64>().value_offsets(), holes, movers),
        _ => true,
    }
}

/// Whether, hole by hole, the moved values' bytes never exceed the
/// dropped values' bytes they replace so far.
fn never_grows<O: ArrowNativeType>(offsets: &[O], holes: &[usize], movers: &[usize]) -> bool {
    let length = |row: usize| offsets[row + 1].as_usize() as isize - offsets[row].as_usize() as isize;
    let mut growth = 0isize;
    holes.iter().zip(movers).all(|(&h, &m)| {
        growth += length(m) - length(h);
        growth <= 0
    })
}

/// Fills a byte column's holes in place (its offsets `ends`, its value
/// `bytes`); returns the kept bytes. [`never_grows`] must hold.
///
/// Each hole takes its mover's bytes, and the rows up to the next hole
/// move down by what the values so far have shrunk (not at all where they
/// kept their length). The offsets stay ascending: each row's are its
/// source offsets shifted by one amount, or a mover's length past the
/// previous row's end.
fn fill_holes<O: ArrowNativeType>(
    ends: &mut [O],
    bytes: &mut [u8],
    holes: &[usize],
    movers: &[usize],
    count: usize,
) -> usize {
    // The movers' bytes, taken before any offset is rewritten (the first
    // mover's start is `ends[count]`, rewritten last). They lie after
    // every byte of the first `count` rows, and with `never_grows` no
    // write reaches past the dropped bytes it replaces, so they are read
    // unchanged.
    let sources: Vec<(usize, usize)> = movers.iter().map(|&m| (ends[m].as_usize(), ends[m + 1].as_usize())).collect();
    for (i, (&hole, &(from, to))) in holes.iter().zip(&sources).enumerate() {
        // Rewritten already: the end of the row before.
        let at = ends[hole].as_usize();
        // Not yet: the dropped value's end.
        let old_end = ends[hole + 1].as_usize();
        bytes.copy_within(from..to, at);
        let new_end = at + (to - from);
        ends[hole + 1] = O::usize_as(new_end);
        // The rows up to the next hole move down by what was dropped.
        let next = holes.get(i + 1).copied().unwrap_or(count);
        if new_end != old_end && hole + 1 < next {
            let shift = old_end - new_end;
            bytes.copy_within(old_end..ends[next].as_usize(), new_end);
            for end in &mut ends[hole + 2..=next] {
                *end = O::usize_as(end.as_usize() - shift);
            }
        }
    }
    ends[count].as_usize()
}

/// Moves a byte column's runs of kept rows down in order (its offsets
/// `ends`, its value `bytes`); returns the kept bytes.
///
/// The offsets start at 0 and ascend: each run's are its source offsets
/// shifted by one amount, and runs are laid end to end.
fn compact_runs<O: ArrowNativeType>(ends: &mut [O], bytes: &mut [u8], runs: &[(usize, usize)]) -> usize {
    // Offsets are rewritten in the buffer they are read from: a run's
    // rows land at or before where they are read (fewer rows are kept
    // before a run than lie before it), and a run's first offset lies
    // beyond everything written so far.
    let mut written = 0usize;
    let mut length = 0usize;
    for &(start, end) in runs {
        let (from, to) = (ends[start].as_usize(), ends[end].as_usize());
        bytes.copy_within(from..to, length);
        // The run's end offsets, moved down and then shifted by the
        // bytes dropped before the run.
        ends.copy_within(start + 1..end + 1, written + 1);
        let shift = from - length;
        for end in &mut ends[written + 1..written + 1 + end - start] {
            *end = O::usize_as(end.as_usize() - shift);
        }
        written += end - start;
        length += to - from;
    }
    ends[0] = O::usize_as(0);
    length
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
        BinaryArray, BooleanArray, Decimal128Array, Float64Array, Int32Array, Int64Array, LargeStringArray,
        StringArray, UInt64Array,
    };
    use arrow::compute::filter_record_batch;
    use arrow::datatypes::{Field, Schema};
    use rand::rngs::SmallRng;
    use rand::{Rng, SeedableRng};

    /// Ten columns of every kind; `fixed` gives the byte columns values of
    /// one length (so their holes can be filled), else of many.
    fn batch(rows: usize, fixed: bool, rng: &mut SmallRng) -> RecordBatch {
        let maybe = |rng: &mut SmallRng| rng.random_bool(0.8);
        let ints: Int64Array = (0..rows).map(|i| maybe(rng).then_some(i as i64)).collect();
        let dense: Int32Array = (0..rows as i32).collect();
        let floats: Float64Array = (0..rows).map(|i| i as f64 * 0.5).collect();
        let decimals = Decimal128Array::from_iter((0..rows).map(|i| maybe(rng).then_some(i as i128 * 100)))
            .with_precision_and_scale(20, 2)
            .unwrap_or_else(|e| panic!("{e}"));
        let name = |i: usize| if fixed { format!("é{i:07}") } else { "é".repeat(i % 7) + &i.to_string() };
        let names: StringArray = (0..rows).map(|i| maybe(rng).then(|| name(i))).collect();
        let large: LargeStringArray =
            (0..rows).map(|i| Some(if fixed { format!("v{i:06}") } else { format!("v{i}") })).collect();
        let blobs: BinaryArray = (0..rows).map(|i| Some(vec![i as u8; if fixed { 4 } else { i % 5 }])).collect();
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

    /// What [`keep_rows`] returns, worked out row by row: Arrow's filter
    /// below half kept or where a byte column's moved values would
    /// outgrow the dropped ones before them, else the first `count` rows
    /// with each dropped one replaced by the next kept row after `count`.
    fn expected(batch: &RecordBatch, mask: &[u64]) -> RecordBatch {
        let rows = batch.num_rows();
        let kept: Vec<bool> = (0..rows).map(|i| mask[i / 64] >> (i % 64) & 1 == 1).collect();
        let count = kept.iter().filter(|&&k| k).count();
        if count * 2 < rows {
            return arrow_filter(batch, mask);
        }
        let holes: Vec<usize> = (0..count).filter(|&i| !kept[i]).collect();
        let movers: Vec<usize> = (count..rows).filter(|&i| kept[i]).collect();
        let fits = batch.columns().iter().all(|c| {
            let Ok(lengths) = arrow::compute::kernels::length::length(c) else { return true };
            let lengths = arrow::compute::cast(&lengths, &DataType::Int64).unwrap_or_else(|e| panic!("{e}"));
            let lengths = lengths.as_primitive::<arrow::datatypes::Int64Type>();
            let length = |i: usize| if lengths.is_null(i) { 0 } else { lengths.value(i) };
            let mut growth = 0;
            holes.iter().zip(&movers).all(|(&h, &m)| {
                growth += length(m) - length(h);
                growth <= 0
            })
        });
        if !fits {
            return arrow_filter(batch, mask);
        }
        let mut indices: Vec<u64> = (0..count as u64).collect();
        for (&h, &m) in holes.iter().zip(&movers) {
            indices[h] = m as u64;
        }
        arrow::compute::take_record_batch(batch, &UInt64Array::from(indices)).unwrap_or_else(|e| panic!("{e}"))
    }

    /// Every type, owned and shared, with byte values of one length and of
    /// many, at densities from none kept to all kept (copied below half,
    /// in place above), against the layout worked out row by row; and
    /// every layout is taken.
    #[test]
    fn kept_rows_equal_the_expected_layout_for_owned_and_shared_columns() {
        let mut rng = SmallRng::seed_from_u64(7);
        let (mut filled, mut in_order) = (0, 0);
        for fixed in [false, true] {
            for rows in [0, 1, 63, 64, 65, 1000, 8192] {
                for keep in [0.0, 0.01, 0.5, 0.7, 0.9, 0.99, 1.0] {
                    let mask = random_mask(rows, keep, &mut rng);
                    let owned = batch(rows, fixed, &mut rng);
                    let expected = expected(&owned, &mask);
                    let filtered = arrow_filter(&owned, &mask);
                    if expected == filtered {
                        in_order += 1;
                    } else {
                        filled += 1;
                    }
                    // Shared: the caller keeps its batch, so every buffer
                    // has two holders and must be copied, not changed.
                    let shared = owned.clone();
                    let kept = keep_rows(shared, mask.clone()).unwrap_or_else(|e| panic!("{e}"));
                    assert_eq!(kept, expected, "shared, {rows} rows, keep {keep}, fixed {fixed}");
                    assert_eq!(arrow_filter(&owned, &mask), filtered, "the caller's batch changed");
                    let kept = keep_rows(owned, mask).unwrap_or_else(|e| panic!("{e}"));
                    assert_eq!(kept, expected, "owned, {rows} rows, keep {keep}, fixed {fixed}");
                    kept.columns().iter().for_each(|c| c.to_data().validate_full().unwrap_or_else(|e| panic!("{e}")));
                }
            }
        }
        assert!(filled >= 5 && in_order >= 5, "{filled} batches filled holes, {in_order} kept their order");
    }

    /// Fixed-width values fill holes with the last rows, in place; a value
    /// that would outgrow the dropped ones before it keeps the whole batch
    /// in order.
    #[test]
    fn the_last_rows_fill_the_holes_unless_a_value_would_grow() {
        // Row `i` is `i` and `names[i]`.
        let batch = |names: [&str; 10]| {
            let values: Int64Array = (0..10).collect();
            let schema = Arc::new(Schema::new(vec![
                Field::new("v", DataType::Int64, false),
                Field::new("n", DataType::Utf8, false),
            ]));
            let names = StringArray::from(names.to_vec());
            RecordBatch::try_new(schema, vec![Arc::new(values), Arc::new(names)]).unwrap_or_else(|e| panic!("{e}"))
        };
        let kept = |batch: RecordBatch| {
            // Rows 1 and 3 are dropped: 8 are kept, and rows 8 and 9 move.
            let kept = keep_rows(batch, vec![0b11_1111_0101]).unwrap_or_else(|e| panic!("{e}"));
            kept.columns().iter().for_each(|c| c.to_data().validate_full().unwrap_or_else(|e| panic!("{e}")));
            let rows = kept.column(0).as_primitive::<arrow::datatypes::Int64Type>().values().to_vec();
            let names = kept.column(1).as_string::<i32>();
            let names: Vec<String> = names.iter().flatten().map(str::to_string).collect();
            (rows, names, kept.column(1).as_string::<i32>().values().as_ptr())
        };
        let fixed = batch(["n0", "n1", "n2", "n3", "n4", "n5", "n6", "n7", "n8", "n9"]);
        let allocation = fixed.column(1).as_string::<i32>().values().as_ptr();
        let (rows, names, after) = kept(fixed);
        assert_eq!(rows, [0, 8, 2, 9, 4, 5, 6, 7]);
        assert_eq!(names, ["n0", "n8", "n2", "n9", "n4", "n5", "n6", "n7"]);
        assert_eq!(after, allocation, "filled in place");
        // Row 8's value is longer than row 1's: in order.
        let (rows, _, _) = kept(batch(["n0", "n1", "n2", "n3", "n4", "n5", "n6", "n7", "n8+", "n9"]));
        assert_eq!(rows, [0, 2, 4, 5, 6, 7, 8, 9]);
        // Row 9's is longer than row 3's, but row 8's shorter one made
        // room first; the rows between the holes move down by a byte.
        let (rows, names, _) = kept(batch(["n0", "n1", "n2", "n3", "n4", "n5", "n6", "n7", "8", "n9+"]));
        assert_eq!(rows, [0, 8, 2, 9, 4, 5, 6, 7]);
        assert_eq!(names, ["n0", "8", "n2", "n9+", "n4", "n5", "n6", "n7"]);
        // And a shrink that is not made up stays: the rows after it move.
        let (rows, names, _) = kept(batch(["n0", "n1", "n2", "n3", "n4", "n5", "n6", "n7", "", "n9"]));
        assert_eq!(rows, [0, 8, 2, 9, 4, 5, 6, 7]);
        assert_eq!(names, ["n0", "", "n2", "n9", "n4", "n5", "n6", "n7"]);
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

//! The visibility-filter kernel of fovea (*vectorized filter on read*, VFoR).
//!
//! A scan decides for every row of a row group whether it is visible at a
//! snapshot `qts`:
//!
//! ```text
//! visible(row) ⇔ create_ts(row) ≤ qts  ∧  ¬ deleted_at(row, qts)
//! deleted_at(row, qts) ⇔ base bitmap has the row  ∨  a delete entry (row, ts) with ts ≤ qts exists
//! ```
//!
//! The pieces, each with a scalar reference it is tested against:
//!
//! | step | function |
//! |---|---|
//! | tile bitmap at qts from delete entries | [`apply_deletes`] |
//! | `create_ts ≤ qts` over the hidden int64 column | [`create_ts_mask`] |
//! | `create_mask AND NOT deleted` | [`and_not`] |
//! | mask → row indices | [`selection`] |
//!
//! Delete entries use the paper's packing: `entry = (offset << 52) | delete_ts`
//! with `offset < 4096` (the row's position in its tile) and `delete_ts`
//! in the low 52 bits. An entry of `0` is an unused slot and is ignored (a
//! real entry has `delete_ts ≥ 1`).
//!
//! The crate is plain `no_std`-friendly Rust without dependencies: it builds
//! natively (core and the Lambda functions use it) and for `wasm32` with
//! SIMD128, where [`js`] exports it to JavaScript through wasm-bindgen
//! (`scripts/wasm.sh` builds the package in `scan-wasm/js/`). The loops are
//! written in fixed-width chunks that LLVM turns into SIMD on both targets.
//!
//! ```
//! use fovea_scan_wasm::*;
//! let mut bitmap = [0u64; TILE_WORDS];
//! let entries = [encode_entry(3, 10), encode_entry(70, 20)];
//! apply_deletes(&mut bitmap, &entries, 15);
//! assert_eq!(bitmap[0], 1 << 3); // deleted at 10 ≤ 15; the delete at 20 is not visible yet
//! assert_eq!(bitmap[1], 0);
//! ```
#![warn(missing_docs)]
#![no_std]

extern crate alloc;

#[cfg(target_arch = "wasm32")]
pub mod js;

use alloc::vec::Vec;

/// Rows per tile.
pub const TILE_ROWS: usize = 4096;
/// 64-bit words in one tile bitmap.
pub const TILE_WORDS: usize = TILE_ROWS / 64;
/// Bit position of the row offset inside a delete entry.
pub const OFFSET_SHIFT: u32 = 52;
/// Mask of the timestamp bits of a delete entry (and of every fovea timestamp).
pub const TS_MASK: u64 = (1 << OFFSET_SHIFT) - 1;

/// Packs a delete entry. `offset` must be below [`TILE_ROWS`] and `ts` must fit
/// in 52 bits and be non-zero; both are internal invariants of the caller.
#[inline]
pub const fn encode_entry(offset: u16, ts: u64) -> u64 {
    debug_assert!((offset as usize) < TILE_ROWS);
    debug_assert!(ts != 0 && ts <= TS_MASK);
    ((offset as u64) << OFFSET_SHIFT) | ts
}

/// Row offset (inside its tile) of a delete entry.
#[inline]
pub const fn entry_offset(entry: u64) -> usize {
    (entry >> OFFSET_SHIFT) as usize
}

/// Delete timestamp of a delete entry.
#[inline]
pub const fn entry_ts(entry: u64) -> u64 {
    entry & TS_MASK
}

/// Sets in `bitmap` the bit of every entry whose delete timestamp is `≤ qts`.
/// Unused slots (`0`) are ignored. Branch-free: the comparison of a chunk of
/// eight entries vectorises, the bit setting is a scatter of ORs.
#[inline]
pub fn apply_deletes(bitmap: &mut [u64; TILE_WORDS], entries: &[u64], qts: u64) {
    let mut chunks = entries.chunks_exact(8);
    for chunk in &mut chunks {
        let mut bits = [0u64; 8];
        let mut words = [0usize; 8];
        for i in 0..8 {
            let e = chunk[i];
            let live = (e != 0) & ((e & TS_MASK) <= qts);
            let off = (e >> OFFSET_SHIFT) as usize;
            bits[i] = (live as u64) << (off & 63);
            words[i] = (off >> 6) & (TILE_WORDS - 1);
        }
        for i in 0..8 {
            bitmap[words[i]] |= bits[i];
        }
    }
    for &e in chunks.remainder() {
        let live = (e != 0) & ((e & TS_MASK) <= qts);
        let off = (e >> OFFSET_SHIFT) as usize;
        bitmap[(off >> 6) & (TILE_WORDS - 1)] |= (live as u64) << (off & 63);
    }
}

/// Scalar reference of [`apply_deletes`].
pub fn apply_deletes_scalar(bitmap: &mut [u64; TILE_WORDS], entries: &[u64], qts: u64) {
    for &e in entries {
        if e != 0 && entry_ts(e) <= qts {
            let off = entry_offset(e);
            bitmap[off / 64] |= 1u64 << (off % 64);
        }
    }
}

/// Number of `u64` words needed for a mask of `rows` bits.
#[inline]
pub const fn mask_words(rows: usize) -> usize {
    rows.div_ceil(64)
}

/// Writes into `out` a mask with bit `i` set iff `create_ts[i] ≤ qts`.
/// `out` must hold at least [`mask_words`]`(create_ts.len())` words; bits past
/// the end of `create_ts` are cleared.
pub fn create_ts_mask(create_ts: &[i64], qts: i64, out: &mut [u64]) {
    assert!(
        out.len() >= mask_words(create_ts.len()),
        "create_ts_mask: output of {} words cannot hold {} rows",
        out.len(),
        create_ts.len()
    );
    let mut chunks = create_ts.chunks_exact(64);
    let mut w = 0;
    for chunk in &mut chunks {
        let mut word = 0u64;
        for (j, &c) in chunk.iter().enumerate() {
            word |= ((c <= qts) as u64) << j;
        }
        out[w] = word;
        w += 1;
    }
    let rest = chunks.remainder();
    if !rest.is_empty() {
        let mut word = 0u64;
        for (j, &c) in rest.iter().enumerate() {
            word |= ((c <= qts) as u64) << j;
        }
        out[w] = word;
    }
}

/// Scalar reference of [`create_ts_mask`].
pub fn create_ts_mask_scalar(create_ts: &[i64], qts: i64, out: &mut [u64]) {
    for w in out.iter_mut().take(mask_words(create_ts.len())) {
        *w = 0;
    }
    for (i, &c) in create_ts.iter().enumerate() {
        if c <= qts {
            out[i / 64] |= 1 << (i % 64);
        }
    }
}

/// `dst &= !deleted`, word by word, over the shorter of the two.
#[inline]
pub fn and_not(dst: &mut [u64], deleted: &[u64]) {
    for (d, x) in dst.iter_mut().zip(deleted) {
        *d &= !*x;
    }
}

/// Number of set bits among the first `rows` bits of `mask`.
pub fn count_visible(mask: &[u64], rows: usize) -> usize {
    let full = rows / 64;
    let mut n: usize = mask[..full].iter().map(|w| w.count_ones() as usize).sum();
    let rest = rows % 64;
    if rest != 0 {
        n += (mask[full] & ((1u64 << rest) - 1)).count_ones() as usize;
    }
    n
}

/// Appends to `out` the index of every set bit among the first `rows` bits
/// of `mask`, in increasing order.
pub fn selection(mask: &[u64], rows: usize, out: &mut Vec<u32>) {
    for (w, &word) in mask.iter().enumerate().take(mask_words(rows)) {
        let mut word = word;
        if (w + 1) * 64 > rows {
            let rest = rows % 64;
            if rest != 0 {
                word &= (1u64 << rest) - 1;
            }
        }
        while word != 0 {
            let bit = word.trailing_zeros();
            out.push((w * 64) as u32 + bit);
            word &= word - 1;
        }
    }
}

#[cfg(test)]
mod tests {
    extern crate std;
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn apply_deletes_matches_scalar(
            base in proptest::collection::vec(any::<u64>(), TILE_WORDS),
            raw in proptest::collection::vec((0u16..4096, 0u64..100), 0..70),
            qts in 0u64..110,
        ) {
            let entries: Vec<u64> = raw.iter().map(|&(o, t)| if t == 0 { 0 } else { encode_entry(o, t) }).collect();
            let mut a = [0u64; TILE_WORDS];
            a.copy_from_slice(&base);
            let mut b = a;
            apply_deletes(&mut a, &entries, qts);
            apply_deletes_scalar(&mut b, &entries, qts);
            prop_assert_eq!(a, b);
        }

        #[test]
        fn create_ts_mask_matches_scalar(ts in proptest::collection::vec(0i64..50, 0..300), qts in 0i64..50) {
            let mut a = std::vec![u64::MAX; mask_words(ts.len())];
            let mut b = std::vec![u64::MAX; mask_words(ts.len())];
            create_ts_mask(&ts, qts, &mut a);
            create_ts_mask_scalar(&ts, qts, &mut b);
            prop_assert_eq!(&a, &b);
            let mut sel = Vec::new();
            selection(&a, ts.len(), &mut sel);
            let expect: Vec<u32> = ts.iter().enumerate().filter(|(_, c)| **c <= qts).map(|(i, _)| i as u32).collect();
            prop_assert_eq!(count_visible(&a, ts.len()), expect.len());
            prop_assert_eq!(sel, expect);
        }
    }

    #[test]
    fn entry_round_trip() {
        let e = encode_entry(4095, TS_MASK);
        assert_eq!(entry_offset(e), 4095);
        assert_eq!(entry_ts(e), TS_MASK);
    }

    #[test]
    fn and_not_clears_deleted() {
        let mut m = [0b1111u64, u64::MAX];
        and_not(&mut m, &[0b0101, 1]);
        assert_eq!(m, [0b1010, u64::MAX - 1]);
    }
}

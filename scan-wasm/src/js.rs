//! The kernel for JavaScript (wasm32 only): typed arrays in, typed arrays
//! out. `BigInt64Array` / `BigUint64Array` carry timestamps, create_ts
//! columns and bitmaps (little-endian `u64` words, bit `i` = row `i`), as
//! the replayer's `fovea.bitmaps` / `fovea.split` actions answer them.
//!
//! ```js
//! import { visibleRows } from "@fovea/scan-kernel";
//! const rows = visibleRows(createTs, qts, deleted);   // Uint32Array of visible row indices
//! ```

use alloc::vec;
use alloc::vec::Vec;

use wasm_bindgen::prelude::*;

/// Sets in `bitmap` (64 words: one tile of 4096 rows) the rows of the
/// delete entries (`offset << 52 | ts`) with `ts ≤ qts`.
#[wasm_bindgen(js_name = applyDeletes)]
pub fn apply_deletes(bitmap: &mut [u64], entries: &[u64], qts: u64) -> Result<(), JsError> {
    let words = bitmap.len();
    let tile: &mut [u64; crate::TILE_WORDS] = bitmap
        .try_into()
        .map_err(|_| JsError::new(&alloc::format!("a tile bitmap has {} words, not {words}", crate::TILE_WORDS)))?;
    crate::apply_deletes(tile, entries, qts);
    Ok(())
}

/// The mask (one bit per row, `ceil(rows / 64)` words) of the rows whose
/// `create_ts ≤ qts`.
#[wasm_bindgen(js_name = createTsMask)]
pub fn create_ts_mask(create_ts: &[i64], qts: i64) -> Vec<u64> {
    let mut out = vec![0u64; crate::mask_words(create_ts.len())];
    crate::create_ts_mask(create_ts, qts, &mut out);
    out
}

/// `mask AND NOT deleted`, word by word (`deleted` may be shorter: words
/// past its end are kept).
#[wasm_bindgen(js_name = andNot)]
pub fn and_not(mask: &mut [u64], deleted: &[u64]) {
    crate::and_not(mask, deleted);
}

/// Set bits among the first `rows` bits of `mask`.
#[wasm_bindgen(js_name = countVisible)]
pub fn count_visible(mask: &[u64], rows: usize) -> Result<usize, JsError> {
    check_mask(mask, rows)?;
    Ok(crate::count_visible(mask, rows))
}

/// The indices of the set bits among the first `rows` bits of `mask`.
#[wasm_bindgen]
pub fn selection(mask: &[u64], rows: usize) -> Result<Vec<u32>, JsError> {
    check_mask(mask, rows)?;
    let mut out = Vec::new();
    crate::selection(mask, rows, &mut out);
    Ok(out)
}

/// The rows of a row group visible at `qts`: `create_ts ≤ qts` and not in
/// `deleted` (the row group's deleted-row bitmap at `qts`, as the replayer
/// answers it; shorter than the rows is fine, an empty one deletes none).
#[wasm_bindgen(js_name = visibleRows)]
pub fn visible_rows(create_ts: &[i64], qts: i64, deleted: &[u64]) -> Vec<u32> {
    let mut mask = create_ts_mask(create_ts, qts);
    crate::and_not(&mut mask, deleted);
    let mut out = Vec::new();
    crate::selection(&mask, create_ts.len(), &mut out);
    out
}

fn check_mask(mask: &[u64], rows: usize) -> Result<(), JsError> {
    if mask.len() < crate::mask_words(rows) {
        return Err(JsError::new(&alloc::format!("a mask of {} words cannot hold {rows} rows", mask.len())));
    }
    Ok(())
}

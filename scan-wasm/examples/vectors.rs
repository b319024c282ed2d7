//! Writes test vectors of the native kernel for the JavaScript tests
//! (`scan-wasm/js/test/`): random inputs and what the native build answers,
//! as JSON (64-bit values as decimal strings: JSON numbers lose them).
//!
//! `cargo run -p fovea-scan-wasm --example vectors -- OUT.json [CASES] [SEED]`

use fovea_scan_wasm::{TILE_WORDS, apply_deletes, count_visible, create_ts_mask, encode_entry, mask_words, selection};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use serde_json::{Value, json};

fn words(w: &[u64]) -> Value {
    w.iter().map(|x| x.to_string()).collect()
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let out = args.next().ok_or("usage: vectors OUT.json [CASES] [SEED]")?;
    let cases: usize = args.next().map_or(Ok(200), |c| c.parse())?;
    let seed: u64 = args.next().map_or(Ok(7), |s| s.parse())?;
    let mut rng = SmallRng::seed_from_u64(seed);
    let ts_max = (1u64 << 52) - 1;

    let mut deletes = Vec::new();
    for _ in 0..cases {
        let base: Vec<u64> = (0..TILE_WORDS).map(|_| if rng.random_bool(0.3) { rng.random() } else { 0 }).collect();
        let n = rng.random_range(0..300);
        let entries: Vec<u64> = (0..n)
            .map(|_| {
                if rng.random_bool(0.05) {
                    0 // an unused slot
                } else {
                    encode_entry(rng.random_range(0..4096), rng.random_range(1..=ts_max))
                }
            })
            .collect();
        let qts = if rng.random_bool(0.1) { ts_max } else { rng.random_range(0..=ts_max) };
        let mut bitmap: [u64; TILE_WORDS] = base.clone().try_into().map_err(|_| "tile")?;
        apply_deletes(&mut bitmap, &entries, qts);
        deletes.push(
            json!({"base": words(&base), "entries": words(&entries), "qts": qts.to_string(), "bitmap": words(&bitmap)}),
        );
    }

    let mut visibility = Vec::new();
    for i in 0..cases {
        let rows = match i % 5 {
            0 => [0, 1, 63, 64, 65, 4096, 8192][rng.random_range(0..7)],
            _ => rng.random_range(0..10_000),
        };
        let spread = rng.random_range(1..=ts_max);
        let create_ts: Vec<i64> = (0..rows).map(|_| rng.random_range(1..=spread) as i64).collect();
        let qts = rng.random_range(0..=spread) as i64;
        let deleted_words =
            if rng.random_bool(0.2) { rng.random_range(0..=mask_words(rows)) } else { mask_words(rows) };
        let deleted: Vec<u64> = (0..deleted_words).map(|_| rng.random::<u64>() & rng.random::<u64>()).collect();
        let mut mask = vec![0u64; mask_words(rows)];
        create_ts_mask(&create_ts, qts, &mut mask);
        let created = mask.clone();
        fovea_scan_wasm::and_not(&mut mask, &deleted);
        let mut visible = Vec::new();
        selection(&mask, rows, &mut visible);
        visibility.push(json!({
            "create_ts": create_ts.iter().map(|t| t.to_string()).collect::<Vec<_>>(),
            "qts": qts.to_string(),
            "deleted": words(&deleted),
            "create_mask": words(&created),
            "mask": words(&mask),
            "count": count_visible(&mask, rows),
            "visible": visible,
        }));
    }
    let doc = json!({"seed": seed, "apply_deletes": deletes, "visibility": visibility});
    std::fs::write(&out, serde_json::to_vec(&doc)?).map_err(|e| format!("cannot write {out}: {e}"))?;
    Ok(())
}

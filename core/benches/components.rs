//! Criterion benchmarks of the core structures. `fovea bench components`
//! prints the same quantities as one table / JSON object.

use std::hint::black_box;

use criterion::{BatchSize, Criterion, Throughput, criterion_group, criterion_main};
use fovea_core::index::{PrimaryIndex, encode_key};
use fovea_core::visibility::FileVisibility;
use fovea_core::{Clock, FileId, RowId, TableId, Ts, Value};

fn visibility(c: &mut Criterion) {
    let mut g = c.benchmark_group("visibility");
    g.throughput(Throughput::Elements(4096));
    g.bench_function("append_4096_deletes", |b| {
        b.iter_batched(
            || FileVisibility::new(FileId(1), 1 << 20),
            |(_vis, mut w)| {
                for i in 0..4096u64 {
                    let _ = w.delete(((i * 2_654_435_761) % (1 << 20)) as usize, Ts(i + 1));
                }
            },
            BatchSize::SmallInput,
        )
    });
    let (vis, mut w) = FileVisibility::new(FileId(1), 4096);
    for i in 0..64u64 {
        let _ = w.delete((i * 61 % 4096) as usize, Ts(i + 1));
    }
    let mut out = Vec::new();
    g.throughput(Throughput::Elements(1));
    g.bench_function("tile_bitmap_64_pending", |b| b.iter(|| vis.deleted_bitmap(0, 4096, black_box(Ts(40)), &mut out)));
    g.finish();
}

fn index(c: &mut Criterion) {
    let mut index = PrimaryIndex::new();
    let keys: Vec<_> = (0..1_000_000i64).map(|k| encode_key(TableId(0), &[Value::Int(k)])).collect();
    for (i, k) in keys.iter().enumerate() {
        let _ = index.put(k, Ts(1), RowId(i as u64));
    }
    let mut ts = 2;
    let mut i = 0usize;
    c.bench_function("index_update_random_key_1m", |b| {
        b.iter(|| {
            i = (i + 7_919) % keys.len();
            let k = &keys[i];
            let row = index.latest(k);
            let _ = index.put(k, Ts(ts), RowId(ts));
            ts += 1;
            row
        })
    });
}

fn clock(c: &mut Criterion) {
    let clock = Clock::in_memory();
    c.bench_function("txn_begin_commit", |b| {
        b.iter(|| {
            let ts = clock.begin().unwrap_or(Ts::ZERO);
            clock.commit(ts)
        })
    });
}

criterion_group!(benches, visibility, index, clock);
criterion_main!(benches);

// The wasm32 kernel against the native one: the same random inputs
// (vectors written by `cargo run -p fovea-scan-wasm --example vectors`,
// named by FOVEA_WASM_VECTORS) must give the same answers. Run by
// scripts/wasm.sh.
import { test } from "node:test";
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { createRequire } from "node:module";

const kernel = createRequire(import.meta.url)("../dist/fovea_scan_wasm.js");
const path = process.env.FOVEA_WASM_VECTORS;
assert.ok(path, "FOVEA_WASM_VECTORS names the native kernel's vectors");
const vectors = JSON.parse(readFileSync(path, "utf8"));
const u64 = (xs) => BigUint64Array.from(xs, BigInt);
const i64 = (xs) => BigInt64Array.from(xs, BigInt);

test("there are vectors of every kind", () => {
  assert.ok(vectors.apply_deletes.length >= 100);
  assert.ok(vectors.visibility.length >= 100);
  assert.ok(vectors.visibility.some((v) => v.create_ts.length >= 4096), "a full tile");
  assert.ok(vectors.visibility.some((v) => v.create_ts.length === 0), "an empty row group");
});

test("applyDeletes sets the bits the native kernel sets", () => {
  for (const [i, v] of vectors.apply_deletes.entries()) {
    const bitmap = u64(v.base);
    kernel.applyDeletes(bitmap, u64(v.entries), BigInt(v.qts));
    assert.deepEqual(bitmap, u64(v.bitmap), `case ${i}`);
  }
});

test("createTsMask, andNot, countVisible, selection and visibleRows agree", () => {
  for (const [i, v] of vectors.visibility.entries()) {
    const createTs = i64(v.create_ts);
    const qts = BigInt(v.qts);
    const deleted = u64(v.deleted);
    const mask = kernel.createTsMask(createTs, qts);
    assert.deepEqual(mask, u64(v.create_mask), `create mask, case ${i}`);
    kernel.andNot(mask, deleted);
    assert.deepEqual(mask, u64(v.mask), `mask, case ${i}`);
    assert.equal(kernel.countVisible(mask, createTs.length), v.count, `count, case ${i}`);
    assert.deepEqual(Array.from(kernel.selection(mask, createTs.length)), v.visible, `selection, case ${i}`);
    assert.deepEqual(Array.from(kernel.visibleRows(createTs, qts, deleted)), v.visible, `visibleRows, case ${i}`);
  }
});

test("bad sizes are errors, not wrong answers", () => {
  assert.throws(() => kernel.applyDeletes(new BigUint64Array(3), new BigUint64Array(0), 1n), /64/);
  assert.throws(() => kernel.countVisible(new BigUint64Array(1), 65), /cannot hold 65 rows/);
  assert.throws(() => kernel.selection(new BigUint64Array(0), 1), /cannot hold 1 rows/);
});

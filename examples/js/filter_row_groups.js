// A table of a local fovea lake read in JavaScript at a snapshot of the
// live replayer: the replayer names the table's files and row groups and
// answers each row group's deleted-row bitmap (Flight action fovea.split);
// parquet-wasm reads the row groups from the lake; the wasm kernel keeps the
// rows whose _fovea_create_ts ≤ qts and whose bit is not set. The rows still
// in the replayer's memory come with the split as Arrow IPC, visibility
// applied. Prints one JSON line: qts, row groups read, rows read, visible rows.
//
//   node filter_row_groups.js --connect grpc://127.0.0.1:50051 --metrics http://127.0.0.1:9187 \
//        --lake ./lake --table public.pgbench_accounts [--token T]
//
// (npm install here first; the kernel is ../../scan-wasm/js, built by scripts/wasm.sh build.)
"use strict";
const fs = require("node:fs");
const path = require("node:path");
const grpc = require("@grpc/grpc-js");
const protoLoader = require("@grpc/proto-loader");
const { readParquet } = require("parquet-wasm/node");
const { tableFromIPC } = require("apache-arrow");
const kernel = require("@fovea/scan-kernel");

function args() {
  const out = {};
  const argv = process.argv.slice(2);
  for (let i = 0; i < argv.length; i += 2) {
    if (!argv[i].startsWith("--") || argv[i + 1] === undefined) throw new Error(`bad argument ${argv[i]}`);
    out[argv[i].slice(2)] = argv[i + 1];
  }
  for (const need of ["connect", "metrics", "lake", "table"]) {
    if (!out[need]) throw new Error(`--${need} is required`);
  }
  return out;
}

/** The newest snapshot a query may read: the high watermark (every mirror
 * ts below it is replayed) minus one. */
async function newestSnapshot(metricsUrl) {
  const res = await fetch(new URL("/metrics", metricsUrl));
  if (!res.ok) throw new Error(`${metricsUrl}: HTTP ${res.status}`);
  const line = (await res.text()).split("\n").find((l) => l.startsWith("fovea_hwm "));
  if (!line) throw new Error(`${metricsUrl} has no fovea_hwm`);
  return BigInt(Math.trunc(Number(line.split(" ")[1]))) - 1n;
}

/** Every result body of one Flight DoAction. */
function doAction(client, token, type, body) {
  const metadata = new grpc.Metadata();
  if (token) metadata.set("authorization", `Bearer ${token}`);
  return new Promise((resolve, reject) => {
    const results = [];
    const call = client.DoAction({ type, body: Buffer.from(body) }, metadata);
    call.on("data", (r) => results.push(r.body));
    call.on("error", reject);
    call.on("end", () => resolve(results));
  });
}

/** Little-endian u64 words (an aligned copy) as a BigUint64Array. */
function words(bytes) {
  const copy = new Uint8Array(bytes.length);
  copy.set(bytes);
  return new BigUint64Array(copy.buffer, 0, bytes.length / 8);
}

/** Visible rows of row group `rowGroup` of the Parquet object `file`. */
function visibleInRowGroup(bytes, rowGroup, qts, deleted) {
  const table = tableFromIPC(readParquet(bytes, { rowGroups: [rowGroup] }).intoIPCStream());
  const createTs = table.getChild("_fovea_create_ts");
  if (!createTs) throw new Error("no _fovea_create_ts column");
  const ts = BigInt64Array.from(createTs.toArray());
  const rows = kernel.visibleRows(ts, qts, deleted);
  return { read: table.numRows, visible: rows.length };
}

async function main() {
  const a = args();
  const url = new URL(a.connect);
  if (url.protocol !== "grpc:" && url.protocol !== "grpc+tls:") throw new Error(`--connect ${a.connect}: grpc:// or grpc+tls://`);
  const credentials = url.protocol === "grpc+tls:" ? grpc.credentials.createSsl() : grpc.credentials.createInsecure();
  const def = protoLoader.loadSync(path.join(__dirname, "flight.proto"), { keepCase: true });
  const { FlightService } = grpc.loadPackageDefinition(def).arrow.flight.protocol;
  const client = new FlightService(url.host, credentials);

  const qts = await newestSnapshot(a.metrics);
  const results = await doAction(client, a.token, "fovea.split", JSON.stringify({ table: a.table, qts: Number(qts) }));
  const head = JSON.parse(results[0].toString("utf8"));
  const memory = tableFromIPC(results[1]);
  let rowGroups = 0;
  let read = 0;
  let visible = memory.numRows;
  const objects = new Map();
  const object = (p) => {
    if (!objects.has(p)) objects.set(p, new Uint8Array(fs.readFileSync(path.join(a.lake, p))));
    return objects.get(p);
  };
  for (const file of head.files) {
    const parts = file.row_groups
      ? file.row_groups.map((g) => ({ path: file.path, rowGroup: g.row_group, bitmap: g.bitmap }))
      : file.flushed_blocks.map((b) => ({ path: b.path, rowGroup: 0, bitmap: b.bitmap }));
    for (const part of parts) {
      const r = visibleInRowGroup(object(part.path), part.rowGroup, qts, words(results[part.bitmap]));
      rowGroups += 1;
      read += r.read;
      visible += r.visible;
    }
  }
  client.close();
  console.log(JSON.stringify({ qts: Number(qts), row_groups: rowGroups, rows_read: read, in_memory: memory.numRows, visible }));
}

main().catch((e) => {
  console.error(`filter_row_groups: ${e.message}`);
  process.exit(1);
});

#!/usr/bin/env bash
# Fuzzes every decoder of untrusted bytes with cargo fuzz (libFuzzer, the
# nightly toolchain) for SECONDS each (default 15): Debezium, DMS,
# pgoutput, the DDL parser, checkpoint manifests, index images, visibility
# checkpoints, split tasks and the visibility RPC's request bodies. The
# targets' bodies are fovea-fuzz-targets (fuzz/); cargo fuzz's driver is
# fuzz/libfuzzer (its own workspace). Corpora live in
# /var/tmp/fovea-fuzz/corpus (seeded from pg-tiny and the engine's formats;
# they grow from run to run); a crash or a hang fails the script and leaves
# its input under fuzz/libfuzzer/artifacts/.
#
# `replay` instead of SECONDS runs each corpus once without mutating it, on
# the stable toolchain in the workspace's test build (fuzz/tests/corpus.rs
# with FOVEA_FUZZ_CORPUS; CI's suite runs it so), then checks that the
# libFuzzer driver still compiles (stable `cargo check`): no nightly build.
# `check` does the latter only (CI: its suite has already run the replay).
#   usage: bash scripts/fuzz.sh [SECONDS|replay|check] [TARGET...]
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-/var/tmp/fovea-target}"
WORK=/var/tmp/fovea-fuzz
corpus="$WORK/corpus"
secs="${1:-15}"; shift || true
case "$secs" in
  replay | check) ;;
  *[!0-9]* | '') echo "fuzz.sh: $secs: expected SECONDS (a whole number), replay or check" >&2; exit 2 ;;
esac

if [ "$secs" = replay ]; then
  echo "== every corpus replayed once (stable, fuzz/tests/corpus.rs; seeds and $corpus)"
  mkdir -p "$WORK"
  log="$WORK/replay.log"
  if ! FOVEA_FUZZ_CORPUS="$corpus" cargo nextest run --workspace -E 'package(fovea-fuzz-targets)' --no-capture >"$log" 2>&1; then
    grep -E "findings|panicked|hung|peak memory|error" "$log" || tail -20 "$log"
    echo "fuzz replay: findings (the whole output in $log)"
    exit 1
  fi
  grep -E "inputs$|^FOVEA_FUZZ_CORPUS" "$log" || true
fi
if [ "$secs" = replay ] || [ "$secs" = check ]; then
  echo "== the libFuzzer driver compiles (fuzz/libfuzzer, cargo check)"
  CARGO_TARGET_DIR="$WORK/check-target" cargo check -q --manifest-path fuzz/libfuzzer/Cargo.toml --bins
  exit 0
fi

targets=("$@")
[ ${#targets[@]} -eq 0 ] && targets=(debezium dms pgoutput ddl checkpoint_manifest index_image visibility_checkpoint split_task rpc)

# libFuzzer's instrumentation needs the nightly toolchain.
if ! rustup toolchain list | grep -q '^nightly'; then
  echo "== installing the nightly toolchain (rustup, minimal profile)"
  rustup toolchain install nightly --profile minimal ||
    { echo "fuzz: the nightly toolchain is missing and rustup could not install it"; exit 1; }
fi

TOOLS=/var/tmp/fovea-tools
if [ ! -x "$TOOLS/bin/cargo-fuzz" ]; then
  echo "== installing cargo-fuzz in $TOOLS"
  CARGO_TARGET_DIR="$TOOLS/build" cargo install cargo-fuzz --locked --root "$TOOLS" --quiet
fi
export PATH="$TOOLS/bin:$PATH"
mkdir -p "$corpus"
python3 scripts/fuzz_seeds.py "$corpus"
cargo run -q -p fovea-fuzz-targets --bin fuzz-seeds -- "$corpus"

failed=()
for t in "${targets[@]}"; do
  echo "== fuzz $t (${secs}s)"
  mkdir -p "$corpus/$t"
  # -timeout: an input taking over 10 s is a hang; -rss_limit_mb: a
  # decoder must not balloon on small inputs. Debug assertions are on, so
  # an arithmetic overflow is a crash too.
  log="$WORK/$t.log"
  if cargo +nightly fuzz run --fuzz-dir fuzz/libfuzzer --sanitizer none --target-dir "$WORK/target" "$t" "$corpus/$t" -- \
    -max_total_time="$secs" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 >"$log" 2>&1; then
    grep -E "^stat::number_of_executed_units|^INFO: seed corpus: files" "$log" || true
  else
    grep -E "panicked|ERROR|SUMMARY|artifact|^stat::number_of_executed_units" "$log" || tail -20 "$log"
    failed+=("$t")
  fi
done
if [ ${#failed[@]} -gt 0 ]; then
  echo "fuzz: crashes or hangs in ${failed[*]} (inputs under fuzz/libfuzzer/artifacts/; logs in $WORK)"
  exit 1
fi

#!/usr/bin/env bash
# The property tests at soak size: the model test (the engine against its
# MVCC oracle through the shard pool, the sink, checkpoints and restores)
# and the ordering property, MODEL_CASES cases each (default 2,000), run
# from the suite's own test build (`cargo test --workspace --no-run` is
# what `cargo nextest run --workspace` builds, so after the suite this
# builds nothing: the engine and its hot libraries are at opt-level 1 in
# test builds, debug assertions and overflow checks kept) as two processes
# of half the cases each, with independent random seeds, one per core. A
# failure prints proptest's minimal case and its seed
# (PROPTEST_RNG_SEED=… reproduces it).
set -euo pipefail
cd "$(dirname "$0")/.."
cases=${MODEL_CASES:-2000}
procs=${MODEL_PROCS:-2}
case "$cases$procs" in
  *[!0-9]*) echo "MODEL_CASES and MODEL_PROCS must be whole numbers (got '$cases', '$procs')" >&2; exit 2 ;;
esac
[ "$procs" -gt 0 ] || { echo "MODEL_PROCS must be at least 1" >&2; exit 2; }
# One build query: its diagnostics rendered on stderr (a failed build shows
# why and stops the script), the artifacts as JSON on stdout.
bin=$(cargo test -q --workspace --no-run --message-format json-render-diagnostics |
  python3 -c 'import json,sys
for l in sys.stdin:
    m = json.loads(l)
    if (m.get("reason") == "compiler-artifact" and m["target"]["name"] == "it"
            and "fovea-core" in m["package_id"] and m.get("executable")):
        print(m["executable"])')
[ -x "$bin" ] || { echo "no model test binary"; exit 1; }
per=$(( (cases + procs - 1) / procs ))
echo "== $procs × $per cases of engine_matches_mvcc_oracle and the ordering property ($bin)"
started=$(date +%s)
pids=()
for i in $(seq 1 "$procs"); do
  PROPTEST_CASES=$per "$bin" --test-threads 1 -q engine_matches_mvcc_oracle ordering:: >"${TMPDIR:-/tmp}/fovea-model-$i.log" 2>&1 &
  pids+=($!)
done
status=0
for i in "${!pids[@]}"; do
  if ! wait "${pids[$i]}"; then
    status=1
    echo "== process $((i + 1)) failed:"
    cat "${TMPDIR:-/tmp}/fovea-model-$((i + 1)).log"
  else
    echo "process $((i + 1)): $(grep 'test result' "${TMPDIR:-/tmp}/fovea-model-$((i + 1)).log")"
  fi
done
echo "model test: $(( per * procs )) cases in $(( $(date +%s) - started )) s"
exit $status

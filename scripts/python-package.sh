#!/usr/bin/env bash
# The fovea Python package as users install it: `pip install ./clients/python`
# (maturin builds the wheel from the workspace; a debug build here, as CI's
# time allows — users get release), then the package's tests run from that
# installation, with no `fovea` on PATH, against a replayed pg-tiny lake.
# The suite's tests (clients/python/tests) load the module `cargo test`
# builds; this checks the wheel's layout and metadata as pip installs them.
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-/var/tmp/fovea-target}"
PY=/var/tmp/fovea-py/bin/python
FOVEA_BIN="$CARGO_TARGET_DIR/debug/fovea"
[ -x "$FOVEA_BIN" ] || { echo "$FOVEA_BIN is not built (cargo build --workspace)"; exit 1; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

echo "== pip install ./clients/python (maturin, --profile dev)"
PATH="$(dirname "$PY"):$PATH" MATURIN_PEP517_ARGS="--profile dev" "$PY" -m pip install -q --no-deps --no-build-isolation \
  --target "$work/site" ./clients/python
ls "$work/site/fovea"

echo "== the package's tests from the installed package"
"$FOVEA_BIN" replay --lake "$work/lake" --input tests/data/pg-tiny/debezium_events.precise_schemas.jsonl.gz > /dev/null
env -i PATH=/usr/bin:/bin HOME="$HOME" PYTHONPATH="$work/site" FOVEA_BIN="$FOVEA_BIN" FOVEA_LAKE="$work/lake" \
  "$PY" -c "
import fovea, os, sys
assert fovea.__file__.startswith('$work/site/'), fovea.__file__
print(f'fovea {fovea.__version__} from {os.path.dirname(fovea.__file__)}')
"
env -i PATH=/usr/bin:/bin HOME="$HOME" PYTHONPATH="$work/site" FOVEA_BIN="$FOVEA_BIN" FOVEA_LAKE="$work/lake" \
  "$PY" clients/python/tests/test_fovea.py

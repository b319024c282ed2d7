#!/usr/bin/env bash
# cargo deny: licences (permissive only), bans and sources of every
# dependency (deny.toml), then security advisories (RustSec) when the
# advisory database can be fetched: it lives on github.com, which this
# project's build machines cannot reach, so there the check says it was not
# made instead of passing silently.
#   usage: bash scripts/deny.sh
set -euo pipefail
cd "$(dirname "$0")/.."
TOOLS=/var/tmp/fovea-tools
if [ ! -x "$TOOLS/bin/cargo-deny" ]; then
  echo "== installing cargo-deny in $TOOLS"
  CARGO_TARGET_DIR="$TOOLS/build" cargo install cargo-deny --version 0.20.2 --locked --root "$TOOLS" --quiet
fi
"$TOOLS/bin/cargo-deny" check licenses bans sources
log=$(mktemp)
if "$TOOLS/bin/cargo-deny" check advisories >"$log" 2>&1; then
  echo "advisories ok"
elif grep -q "failed to fetch advisory database" "$log"; then
  echo "advisories: NOT CHECKED — the RustSec database (github.com/RustSec/advisory-db) is unreachable from this machine"
else
  cat "$log"
  rm -f "$log"
  exit 1
fi
rm -f "$log"

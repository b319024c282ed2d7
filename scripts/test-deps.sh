#!/usr/bin/env bash
# Installs what the test suite needs besides the Rust toolchain, when it is
# missing: cargo-nextest (the suite's runner); Debian's PostgreSQL 15 server binaries (the serve tests start and
# stop their own throwaway cluster) and a Python venv at /var/tmp/fovea-py
# with a Flight SQL client (pyarrow, adbc_driver_flightsql), which the tests
# use unless FOVEA_PYTHON names another interpreter, and moto (the local
# S3/DynamoDB stand-in the AWS tests start with scripts/moto_serial.py); and
# kinesalite and kinesis-local, the local Kinesis stand-ins (npm, in /var/tmp/fovea-npm unless
# FOVEA_NODE_MODULES names other node_modules); boto3 and matplotlib for the
# Python client and its example; prometheus_client (its OpenMetrics parser
# reads /metrics in a test); pyiceberg and DuckDB with its iceberg extension
# (the Iceberg tests read published tables as users do); cargo-lambda (local Lambda endpoint); the JS
# example's npm packages and the wasm32 kernel package (below).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
# The steps install into places of their own and mostly wait on downloads,
# so they run side by side; Debian's packages (PostgreSQL, then the wasm
# toolchain: one dpkg at a time) run in one chain. Each step's output goes
# to a log that is printed if the step fails.
LOGS=$(mktemp -d)
trap 'rm -rf "$LOGS"' EXIT

debian_and_wasm() {
  if [ ! -x /usr/lib/postgresql/15/bin/initdb ]; then
    echo "== installing PostgreSQL 15"
    SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq postgresql-15 >/dev/null
  fi
  bash "$ROOT/scripts/wasm.sh" build
}

nextest() {
  # cargo-nextest, the suite's runner (on the build machines already; else
  # built from crates.io at a pinned version into ~/.cargo/bin).
  if ! cargo nextest --version >/dev/null 2>&1; then
    echo "== installing cargo-nextest"
    cargo install --locked --quiet cargo-nextest --version 0.9.143
  fi
}

python_venv() {
  VENV=/var/tmp/fovea-py
  if ! "$VENV/bin/python" -c "import adbc_driver_flightsql.dbapi, pyarrow.flight, moto.moto_server.werkzeug_app, boto3, matplotlib, prometheus_client.openmetrics.parser, pyiceberg.table, duckdb, duckdb_extension_iceberg, duckdb_extension_avro, duckdb_extension_httpfs, pandas, nbclient, nbformat, ipykernel, maturin" 2>/dev/null; then
    echo "== installing the Python Flight SQL client (pyarrow, adbc_driver_flightsql), moto, boto3, matplotlib, prometheus_client, the Iceberg readers (pyiceberg, DuckDB with its iceberg extension), pandas, what runs the example notebook (nbclient, ipykernel) and maturin (the fovea package's build) in $VENV"
    python3 -m venv "$VENV"
    # DuckDB's extensions from PyPI are built for one DuckDB version: the
    # four pins move together (httpfs: reading Iceberg tables on S3).
    "$VENV/bin/pip" install -q pyarrow adbc_driver_manager adbc_driver_flightsql 'moto[server]==5.2.5' boto3 matplotlib 'prometheus_client==0.21.1' \
      'pyiceberg==0.12.0' 'duckdb==1.5.5' 'duckdb-extension-iceberg==1.5.5' 'duckdb-extension-avro==1.5.5' 'duckdb-extension-httpfs==1.5.5' \
      'pandas==3.1.1' 'nbclient==0.11.0' 'nbformat==5.11.1' 'ipykernel==7.4.0' 'maturin==1.16.0'
  fi
}

cargo_lambda() {
  # cargo-lambda: `cargo lambda watch` is the local Lambda endpoint of the
  # scan-function tests (its own venv: it brings ziglang).
  LAMBDA_VENV=/var/tmp/fovea-tools/lambda-venv
  if [ -z "${FOVEA_CARGO_LAMBDA:-}" ] && [ ! -x "$LAMBDA_VENV/bin/cargo-lambda" ]; then
    echo "== installing cargo-lambda in $LAMBDA_VENV"
    mkdir -p /var/tmp/fovea-tools
    python3 -m venv "$LAMBDA_VENV"
    "$LAMBDA_VENV/bin/pip" install -q 'cargo-lambda==1.9.2'
  fi
}

node_modules() {
  NPM=/var/tmp/fovea-npm
  # kinesis-local (kinesis-mock): enhanced fan-out's SubscribeToShard.
  if [ -z "${FOVEA_NODE_MODULES:-}" ] && { [ ! -f "$NPM/node_modules/kinesalite/package.json" ] ||
    [ ! -f "$NPM/node_modules/kinesis-local/main.js" ]; }; then
    echo "== installing kinesalite and kinesis-local (local Kinesis) in $NPM"
    mkdir -p "$NPM"
    (cd "$NPM" && { [ -f package.json ] || npm init -y >/dev/null; } &&
      npm install -s --no-audit --no-fund kinesalite@3.3.3 kinesis-local@0.6.2)
  fi
  # The JavaScript example (examples/js): its npm packages in /var/tmp/fovea-npm-js
  # (or FOVEA_NODE_MODULES_JS) at the versions its package.json pins, the
  # kernel package linked from this checkout, and the kernel built for wasm32
  # (scripts/wasm.sh build: Debian's rustc-web and a pinned wasm-bindgen).
  NPM_JS=/var/tmp/fovea-npm-js
  if [ -z "${FOVEA_NODE_MODULES_JS:-}" ]; then
    want=$(node -e 'const d = require(process.argv[1]).dependencies;
      console.log(Object.entries(d).filter(([, v]) => !v.startsWith("file:")).map(([k, v]) => k + "@" + v).join(" "))' "$ROOT/examples/js/package.json")
    have=$(cat "$NPM_JS/.installed" 2>/dev/null || true)
    if [ "$want" != "$have" ]; then
      echo "== installing the JS example's packages in $NPM_JS"
      mkdir -p "$NPM_JS"
      # shellcheck disable=SC2086 # one word per package
      (cd "$NPM_JS" && { [ -f package.json ] || npm init -y >/dev/null; } && npm install -s --no-audit --no-fund $want)
      echo "$want" > "$NPM_JS/.installed"
    fi
    mkdir -p "$NPM_JS/node_modules/@fovea"
    ln -sfn "$ROOT/scan-wasm/js" "$NPM_JS/node_modules/@fovea/scan-kernel"
  fi
}

pids=()
steps=(debian_and_wasm nextest python_venv cargo_lambda node_modules)
for step in "${steps[@]}"; do
  "$step" >"$LOGS/$step.log" 2>&1 &
  pids+=($!)
done
failed=()
for i in "${!steps[@]}"; do
  if wait "${pids[$i]}"; then
    grep -E '^(== |scan-wasm/js/dist)' "$LOGS/${steps[$i]}.log" || true
  else
    echo "== test-deps: ${steps[$i]} failed:"
    cat "$LOGS/${steps[$i]}.log"
    failed+=("${steps[$i]}")
  fi
done
[ ${#failed[@]} -eq 0 ] || { echo "test-deps: ${failed[*]} failed"; exit 1; }

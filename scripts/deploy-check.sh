#!/usr/bin/env bash
# Checks the deployment offline: template.yaml linted by cfn-lint (pinned to
# 1.53.3: from 1.54 on it skips the SAM transform and passes broken
# AWS::Serverless::Function resources) and `sam validate --lint`, the
# replayer's entrypoint script parsed, and `sam build --beta-features` of
# the template as users run it (its rust-cargolambda build method runs
# `cargo lambda build --release` for each of the three functions), with
# FunctionArchitecture=x86_64: arm64, the default, needs the aarch64
# standard library, which rustup cannot fetch here (see infra/README.md).
# Installs aws-sam-cli and cfn-lint in /var/tmp/fovea-tools/sam-venv once.
set -euo pipefail
cd "$(dirname "$0")/.."
TOOLS=/var/tmp/fovea-tools
SAM_VENV=$TOOLS/sam-venv
if ! "$SAM_VENV/bin/cfn-lint" --version 2>/dev/null | grep -q '1.53.3' || [ ! -x "$SAM_VENV/bin/sam" ]; then
  echo "== installing aws-sam-cli and cfn-lint 1.53.3 in $SAM_VENV"
  mkdir -p "$TOOLS"
  python3 -m venv "$SAM_VENV"
  "$SAM_VENV/bin/pip" install -q aws-sam-cli 'cfn-lint==1.53.3'
fi
echo "== cfn-lint template.yaml"
"$SAM_VENV/bin/cfn-lint" template.yaml
echo "== sam validate --lint"
SAM_CLI_TELEMETRY=0 AWS_DEFAULT_REGION=us-east-1 "$SAM_VENV/bin/sam" validate --lint --region us-east-1
sh -n infra/entrypoint.sh
echo "== sam build --beta-features (cargo lambda build --release of scan, combine, gc)"
LAMBDA_BIN=$(dirname "${FOVEA_CARGO_LAMBDA:-$TOOLS/lambda-venv/bin/cargo-lambda}")
build_dir="${CARGO_TARGET_DIR:-target}/sam-build"
rm -rf "$build_dir"
PATH="$LAMBDA_BIN:$PATH" SAM_CLI_TELEMETRY=0 AWS_DEFAULT_REGION=us-east-1 "$SAM_VENV/bin/sam" build \
  --beta-features --parameter-overrides FunctionArchitecture=x86_64 --build-dir "$build_dir"
grep -q 'CodeUri: ScanFunction' "$build_dir/template.yaml" || { echo "sam build wrote no template naming its artifacts"; exit 1; }
for f in ScanFunction CombineFunction GcFunction; do
  test -x "$build_dir/$f/bootstrap" || { echo "no $build_dir/$f/bootstrap"; exit 1; }
  file "$build_dir/$f/bootstrap" 2>/dev/null | grep -q 'x86-64' || [ ! -x /usr/bin/file ] || { echo "$f: not an x86-64 binary"; exit 1; }
  echo "$f: $(du -h "$build_dir/$f/bootstrap" | cut -f1)"
done
# Fault injection is compiled only under the `faults` feature, which the
# workspace's tests turn on and release builds do not: none of its code may
# be in a function (its log and parse messages are the tell).
for f in ScanFunction CombineFunction GcFunction; do
  if grep -a -q -e 'FOVEA_KILL_AT: aborting' -e 'injecting faults into' -e 'latency_ms=N' "$build_dir/$f/bootstrap"; then
    echo "$f: fault injection code in a release build"
    exit 1
  fi
done
echo "no fault injection code in the functions"

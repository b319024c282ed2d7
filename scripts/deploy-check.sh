#!/usr/bin/env bash
# Checks the deployment offline: template.yaml linted by cfn-lint (pinned to
# 1.53.3: from 1.54 on it skips the SAM transform and passes broken
# AWS::Serverless::Function resources) and `sam validate --lint`, the
# replayer's entrypoint script parsed, and the three Lambda functions built
# with `cargo lambda build --release` (x86_64 here; `--arm64` where the
# aarch64 std is installed, see infra/README.md). Installs aws-sam-cli and
# cfn-lint in /var/tmp/fovea-tools/sam-venv once.
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
echo "== cargo lambda build --release (scan, combine, gc)"
LAMBDA_BIN=$(dirname "${FOVEA_CARGO_LAMBDA:-$TOOLS/lambda-venv/bin/cargo-lambda}")
PATH="$LAMBDA_BIN:$PATH" cargo lambda build --release -p fovea-scan-fn -p fovea-combine-fn -p fovea-gc-fn
target="${CARGO_TARGET_DIR:-target}/lambda"
for f in fovea-scan fovea-combine fovea-gc; do
  test -x "$target/$f/bootstrap" || { echo "no $target/$f/bootstrap"; exit 1; }
  echo "$f: $(du -h "$target/$f/bootstrap" | cut -f1)"
done
# Fault injection is compiled only under the `faults` feature, which the
# workspace's tests turn on and release builds do not: none of its code may
# be in a function (its log and parse messages are the tell).
for f in fovea-scan fovea-combine fovea-gc; do
  if grep -a -q -e 'FOVEA_KILL_AT: aborting' -e 'injecting faults into' -e 'latency_ms=N' "$target/$f/bootstrap"; then
    echo "$f: fault injection code in a release build"
    exit 1
  fi
done
echo "no fault injection code in the functions"

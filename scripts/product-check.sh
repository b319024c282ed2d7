#!/usr/bin/env bash
# The product holds no harness: checks that the `fovea` binary and the
# Lambda functions, as release builds resolve them, depend on neither the
# test harnesses (fovea-testkit, fovea-fuzz-targets) nor the benchmarks (fovea-bench) nor
# criterion, and do not turn on fault injection (the `faults` feature of
# fovea-core and fovea-aws); then that a built `fovea` binary contains no
# symbol or message of the harness crates. Usage:
#   scripts/product-check.sh [PATH/TO/fovea]
# (default: the debug binary the tests built; a release binary is also
# checked for fault-injection code, which the tests' builds enable).
set -euo pipefail
cd "$(dirname "$0")/.."
status=0
for pkg in fovea-replayer fovea-scan-fn fovea-combine-fn fovea-gc-fn; do
  # Normal and build edges only: what `cargo build --release -p PKG` compiles.
  tree=$(cargo tree -q -p "$pkg" -e normal,build --prefix none -f '{p} [{f}]')
  if grep -E '^(fovea-testkit|fovea-fuzz-targets|fovea-bench|criterion|proptest) ' <<<"$tree"; then
    echo "$pkg: a harness crate is in the product's dependency graph"
    status=1
  fi
  if grep -E '^fovea-(core|aws) .*\[[^]]*faults' <<<"$tree"; then
    echo "$pkg: fault injection is turned on in the product's build"
    status=1
  fi
done
bin="${1:-${CARGO_TARGET_DIR:-target}/debug/fovea}"
if [ -x "$bin" ]; then
  # Crate names appear in every mangled symbol of a crate, messages in its
  # code: neither may be in the product.
  for tell in fovea_testkit fovea_fuzz_targets fovea_bench 'did not start (run scripts/test-deps.sh' 'fovea-bench gen'; do
    if grep -a -q -F -- "$tell" "$bin"; then
      echo "$bin: harness code in the product binary ($tell)"
      status=1
    fi
  done
  case "$bin" in
    */release/*)
      if grep -a -q -e 'FOVEA_KILL_AT: aborting' -e 'injecting faults into' -e 'latency_ms=N' "$bin"; then
        echo "$bin: fault injection code in a release build"
        status=1
      fi ;;
  esac
  echo "checked $bin"
else
  echo "no binary at $bin: dependency graph checked only"
fi
[ "$status" = 0 ] && echo "the product holds no harness"
exit "$status"

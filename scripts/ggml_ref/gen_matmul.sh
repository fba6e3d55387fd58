#!/usr/bin/env bash
# Regenerate crates/rgml-cpu/tests/fixtures/ggml_matmul/ from a llama.cpp build's ggml (see
# matmul_ref.c), the one scripts/llamacpp.sh builds (shared libraries; GGML_NATIVE=ON, or
# `--isa avx2|avx512` for that instruction set's build, which must run on this CPU).
# Needs a C compiler.
#
# Usage: scripts/ggml_ref/gen_matmul.sh [--isa native|avx2|avx512] [OUT_DIR]
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
isa=native
if [ "${1:-}" = --isa ]; then
    isa=${2:?--isa needs a value}
    shift 2
fi
bin=$(bash "$root/scripts/llamacpp.sh" --isa "$isa" llama | tail -n 1)
cache=${RGML_LLAMACPP_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/rgml/llamacpp}
src=$cache/llama-cpp-python-0.3.36/vendor/llama.cpp
out=${1:-$root/crates/rgml-cpu/tests/fixtures/ggml_matmul}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cc -O2 -std=c11 -Wall -Wextra -I"$src/ggml/include" "$(dirname "$0")/matmul_ref.c" \
    -L"$bin" -Wl,-rpath,"$bin" -lggml -lggml-cpu -lggml-base -lm -o "$tmp/matmul_ref"
mkdir -p "$out"
# The default CPU paths: tiled K-quant kernels on, no forced tiling, no repacking.
env -u GGML_CPU_TILED_MM -u GGML_CPU_TILED_MM_FORCE "$tmp/matmul_ref" "$out"
echo "llama.cpp build: $isa"
echo "CPU: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ //')"
echo "flags: $(grep -m1 '^flags' /proc/cpuinfo | tr ' ' '\n' | grep -E '^(avx|fma|f16c)' | sort | tr '\n' ' ')"

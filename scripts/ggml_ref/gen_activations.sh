#!/usr/bin/env bash
# Regenerate crates/rgml-cpu/tests/fixtures/ggml_activations/activations.bin from a llama.cpp build's ggml
# (see activations_ref.c). ggml-cpu computes them element by element with libm, so any build
# gives the same file. Needs a C compiler.
#
# Usage: scripts/ggml_ref/gen_activations.sh
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
bin=$(bash "$root/scripts/llamacpp.sh" --isa avx2 llama | tail -n 1)
cache=${RGML_LLAMACPP_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/rgml/llamacpp}
src=$cache/llama-cpp-python-0.3.36/vendor/llama.cpp
out=$root/crates/rgml-cpu/tests/fixtures/ggml_activations
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cc -O2 -std=c11 -Wall -Wextra -I"$src/ggml/include" "$(dirname "$0")/activations_ref.c" \
    -L"$bin" -Wl,-rpath,"$bin" -lggml -lggml-cpu -lggml-base -lm -o "$tmp/activations_ref"
mkdir -p "$out"
"$tmp/activations_ref" "$out"
echo "llama.cpp build: avx2 -> $out"

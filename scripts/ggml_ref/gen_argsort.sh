#!/usr/bin/env bash
# Regenerate crates/rgml-cpu/tests/fixtures/ggml_argsort/argsort.bin from a llama.cpp build's ggml
# (see argsort_ref.c). ggml-cpu's argsort has no SIMD and no thread dependence, so any build
# gives the same file. Needs a C compiler.
#
# Usage: scripts/ggml_ref/gen_argsort.sh
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
bin=$(bash "$root/scripts/llamacpp.sh" --isa avx2 llama | tail -n 1)
cache=${RGML_LLAMACPP_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/rgml/llamacpp}
src=$cache/llama-cpp-python-0.3.36/vendor/llama.cpp
out=$root/crates/rgml-cpu/tests/fixtures/ggml_argsort
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cc -O2 -std=c11 -Wall -Wextra -I"$src/ggml/include" "$(dirname "$0")/argsort_ref.c" \
    -L"$bin" -Wl,-rpath,"$bin" -lggml -lggml-cpu -lggml-base -lm -o "$tmp/argsort_ref"
mkdir -p "$out"
"$tmp/argsort_ref" "$out"
echo "llama.cpp build: avx2 -> $out"

#!/usr/bin/env bash
# Regenerate crates/rgml-cpu/tests/fixtures/ggml_mul_mat_id/<avx2|avx512>/mul_mat_id.bin from a llama.cpp
# build's ggml (see mul_mat_id_ref.c): the build scripts/llamacpp.sh makes for `--isa avx2` or
# `--isa native` (an AVX-512 CPU's native build is the avx512 fixture). Needs a C compiler.
#
# Usage: scripts/ggml_ref/gen_mul_mat_id.sh --isa avx2|native
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
[ "${1:-}" = --isa ] || { echo "usage: $0 --isa avx2|native" >&2; exit 2; }
isa=${2:?--isa needs a value}
case $isa in
    avx2) name=avx2 ;;
    native)
        grep -qw avx512f /proc/cpuinfo || { echo "the native fixture is the AVX-512 one" >&2; exit 2; }
        name=avx512 ;;
    *) echo "unknown --isa $isa" >&2; exit 2 ;;
esac
bin=$(bash "$root/scripts/llamacpp.sh" --isa "$isa" llama | tail -n 1)
cache=${RGML_LLAMACPP_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/rgml/llamacpp}
src=$cache/llama-cpp-python-0.3.36/vendor/llama.cpp
out=$root/crates/rgml-cpu/tests/fixtures/ggml_mul_mat_id/$name
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cc -O2 -std=c11 -Wall -Wextra -I"$src/ggml/include" "$(dirname "$0")/mul_mat_id_ref.c" \
    -L"$bin" -Wl,-rpath,"$bin" -lggml -lggml-cpu -lggml-base -lm -o "$tmp/mul_mat_id_ref"
mkdir -p "$out"
"$tmp/mul_mat_id_ref" "$out"
echo "llama.cpp build: $isa -> $out"
echo "CPU: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ //')"

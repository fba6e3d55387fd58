#!/usr/bin/env bash
# Build scripts/ggml_ref/NAME_ref.c against a llama.cpp build's ggml and write its fixture into
# crates/rgml-cpu/tests/fixtures/ggml_NAME/<avx2|avx512>/: the build scripts/llamacpp.sh makes
# for `--isa avx2` or `--isa native` (an AVX-512 CPU's native build is the avx512 fixture).
# Needs a C compiler. The gen_*.sh scripts of the per-ISA fixtures call it.
#
# Usage: scripts/ggml_ref/run_isa_ref.sh NAME --isa avx2|native
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
name=${1:?usage: $0 NAME --isa avx2|native}
[ "${2:-}" = --isa ] || { echo "usage: $0 NAME --isa avx2|native" >&2; exit 2; }
isa=${3:?--isa needs a value}
case $isa in
    avx2) dir=avx2 ;;
    native)
        grep -qw avx512f /proc/cpuinfo || { echo "the native fixture is the AVX-512 one" >&2; exit 2; }
        dir=avx512 ;;
    *) echo "unknown --isa $isa" >&2; exit 2 ;;
esac
bin=$(bash "$root/scripts/llamacpp.sh" --isa "$isa" llama | tail -n 1)
cache=${RGML_LLAMACPP_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/rgml/llamacpp}
src=$cache/llama-cpp-python-0.3.36/vendor/llama.cpp
out=$root/crates/rgml-cpu/tests/fixtures/ggml_$name/$dir
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cc -O2 -std=c11 -Wall -Wextra -I"$src/ggml/include" "$(dirname "$0")/${name}_ref.c" \
    -L"$bin" -Wl,-rpath,"$bin" -lggml -lggml-cpu -lggml-base -lm -o "$tmp/${name}_ref"
mkdir -p "$out"
"$tmp/${name}_ref" "$out"
echo "llama.cpp build: $isa -> $out"
echo "CPU: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ //')"

#!/usr/bin/env bash
# Regenerate crates/rgml-cpu/tests/fixtures/ggml_rope/ from a native llama.cpp build's ggml
# (see rope_ref.c), the one scripts/llamacpp.sh builds (shared libraries, GGML_NATIVE=ON).
# Needs a C compiler.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
bin=$(bash "$root/scripts/llamacpp.sh" llama | tail -n 1)
cache=${RGML_LLAMACPP_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/rgml/llamacpp}
src=$cache/llama-cpp-python-0.3.36/vendor/llama.cpp
out=${1:-$root/crates/rgml-cpu/tests/fixtures/ggml_rope}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cc -O2 -std=c11 -Wall -Wextra -I"$src/ggml/include" "$(dirname "$0")/rope_ref.c" \
    -L"$bin" -Wl,-rpath,"$bin" -lggml -lggml-cpu -lggml-base -lm -o "$tmp/rope_ref"
mkdir -p "$out"
"$tmp/rope_ref" "$out"
echo "CPU: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ //')"
echo "flags: $(grep -m1 '^flags' /proc/cpuinfo | tr ' ' '\n' | grep -E '^(avx|fma|f16c)' | sort | tr '\n' ' ')"

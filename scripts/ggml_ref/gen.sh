#!/usr/bin/env bash
# Bit-exactness fixtures from ggml's own C quantizers, run the way llama-quantize runs them
# without an importance matrix: `quantize_<type>(src, dst, nrow, n_per_row, NULL)` for every
# type that has one (q4_0 q4_1 q5_0 q5_1 q8_0 q2_K q3_K q4_K q5_K q6_K iq4_nl iq4_xs) and
# `quantize_row_<type>_ref` for the activation types (q8_1 q8_K), plus ggml's
# `dequantize_row_<type>` of those bytes for the types gguf-py's fixtures do not cover.
#
# Usage: scripts/ggml_ref/gen.sh /root/.cache/rgml/llamacpp/llama-cpp-python-0.3.36/vendor/llama.cpp/ggml
#        (the ggml tree vendored in llama-cpp-python 0.3.36, the documented source; any ggml
#        tree with the same layout works). Needs gcc, python3 + numpy.
# Output: crates/rgml/tests/fixtures/quant/ggml_ref/
#   input.f32       raw little-endian f32 input: 14 rows of 1280 values (17920), with edge blocks
#   <type>.bin      the quantized input, for every quantized dtype rgml has
#   <type>.deq.f32  dequantize_row_<type>(<type>.bin), for q2_K q3_K iq4_nl iq4_xs
#   manifest.txt    per type: entry point, rows x values per row, whether the NULL path equals
#                   quantize_row_<type>_ref (it does for all but iq4_nl), dequant fixture or not
#   SOURCE          the ggml tree the fixtures came from
# ggml-quants.c is compiled as ggml-base is for a release build on plain x86-64: -O2 -DNDEBUG
# (asserts off), and -ffp-contract=off, which changes nothing there (baseline x86-64 has no FMA,
# so ggml-base never fuses) but keeps the fixtures the same if this runs on a machine that does.
set -euo pipefail
GGML=${1:?usage: $0 /path/to/ggml (e.g. the llama-cpp-python 0.3.36 vendored tree)}
HERE=$(cd "$(dirname "$0")" && pwd)
OUT="$HERE/../../crates/rgml/tests/fixtures/quant/ggml_ref"
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
mkdir -p "$OUT"

CFLAGS=(-O2 -DNDEBUG -ffp-contract=off -march=x86-64 -I"$GGML/include" -I"$GGML/src")
gcc "${CFLAGS[@]}" -c "$GGML/src/ggml-quants.c" -o "$WORK/quants.o"
gcc "${CFLAGS[@]}" "$HERE/ref_quant.c" "$WORK/quants.o" -lm -o "$WORK/ref_quant"

python3 - "$OUT/input.f32" "$HERE/../../crates/rgml/tests/fixtures/quant/q4_0.in.f32" <<'PY'
import sys
import numpy as np
rng = np.random.default_rng(5)
legacy = np.fromfile(sys.argv[2], dtype="<f4")  # the gguf fixture input, with its edge blocks
parts = [
    legacy,
    rng.standard_normal(4096).astype(np.float32),
    rng.uniform(-1, 1, 4096).astype(np.float32) * 3,
    (0.1 + 2 * np.cos(np.arange(4096, dtype=np.float32))).astype(np.float32),
    np.zeros(256, np.float32),
    np.full(256, 0.3, np.float32),
    (rng.standard_normal(256) * 1e-7).astype(np.float32),
    rng.uniform(0.5, 2, 256).astype(np.float32),
    -rng.uniform(0.5, 2, 256).astype(np.float32),
    (rng.standard_normal(256) * 1e4).astype(np.float32),
]
x = np.concatenate(parts).astype("<f4")
assert x.size % 1280 == 0
x.tofile(sys.argv[1])
PY

rm -f "$OUT"/*.bin "$OUT"/*.deq.f32
(cd "$OUT" && "$WORK/ref_quant" input.f32)
REV=$(git -C "$GGML" rev-parse HEAD 2>/dev/null || true)
{
    case "$GGML" in
    *llama-cpp-python-0.3.36/vendor/llama.cpp/ggml*)
        echo "ggml vendored in llama-cpp-python 0.3.36 (vendor/llama.cpp/ggml)" ;;
    *) echo "ggml tree $(basename "$(dirname "$GGML")")/$(basename "$GGML") ${REV:-(no git revision)}" ;;
    esac
    echo "ggml-quants.c sha256 $(sha256sum "$GGML/src/ggml-quants.c" | cut -d' ' -f1)"
    echo "built with gcc $(gcc -dumpfullversion) ${CFLAGS[*]:0:4}"
} > "$OUT/SOURCE"
echo "wrote $(ls "$OUT" | wc -l) files to $OUT"

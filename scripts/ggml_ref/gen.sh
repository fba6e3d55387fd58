#!/usr/bin/env bash
# Bit-exactness fixtures from ggml's own C quantizers, run the way llama-quantize runs them
# without an importance matrix: `quantize_<type>(src, dst, nrow, n_per_row, NULL)` for every
# type that has one (q4_0 q4_1 q5_0 q5_1 q8_0 q2_K q3_K q4_K q5_K q6_K iq4_nl iq4_xs mxfp4) and
# `quantize_row_<type>_ref` for the activation types (q8_1 q8_K), plus ggml's
# `dequantize_row_<type>` of those bytes for the types gguf-py's fixtures do not cover, plus
# MXFP4's edge blocks.
#
# Usage: scripts/ggml_ref/gen.sh /root/.cache/rgml/llamacpp/llama-cpp-python-0.3.36/vendor/llama.cpp/ggml
#        (the ggml tree vendored in llama-cpp-python 0.3.36, the documented source; any ggml
#        tree with the same layout works). Needs gcc, python3 + numpy.
# Output: crates/rgml/tests/fixtures/quant/ggml_ref/
#   input.f32       raw little-endian f32 input: 14 rows of 1280 values (17920), with edge blocks
#   <type>.bin      the quantized input, for every quantized dtype rgml has
#   <type>.deq.f32  dequantize_row_<type>(<type>.bin), for q2_K q3_K iq4_nl iq4_xs mxfp4
#   mxfp4_edges.f32 raw f32 blocks for MXFP4's edge cases (exact powers of two and magnitudes
#                   just below them, codebook ties, zero blocks among others, exponents outside
#                   E8M0's range, infinities and NaN), and mxfp4_edges.bin / .deq.f32: ggml's
#                   quantize_mxfp4 (one row) and dequantize_row_mxfp4 of them
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

python3 - "$OUT/mxfp4_edges.f32" <<'PY'
import sys
import numpy as np
f32 = np.float32
rng = np.random.default_rng(39)
blocks = []
def block(v):
    v = np.asarray(v, dtype=f32)
    assert v.size == 32
    blocks.append(v)
def rand_block(scale):
    block(rng.standard_normal(32).astype(f32) * f32(scale))
# Zero blocks among non-zero ones (+0 and -0).
rand_block(1.0); block(np.zeros(32)); rand_block(0.1); block(np.full(32, -0.0)); rand_block(3.0)
# Largest magnitude an exact power of two 2^k = 8d (d = 2^(k-3), half the scale), the other
# values on the midpoints between codes (ties: the first code wins) and on codes, both signs.
mids = np.array([0.5, 1.5, 2.5, 3.5, 5, 7, 0.25, 6.5])
codes = np.array([1, 2, 3, 4, 6])
for k in (-20, -1, 0, 2, 3, 20, 100):
    d = 2.0 ** (k - 3)
    v = np.concatenate([[8, -8], mids, -mids, codes, -codes, [1e-3, -1e-3, 0, 8 - 2.0 ** -21]])
    block((v * d).astype(f32))
# Largest magnitudes just below and just above powers of two (log2f rounds some up).
for k in (-126, -30, -1, 0, 1, 2, 3, 20, 60, 127):
    p = f32(2.0 ** k)
    for m in (np.nextafter(p, f32(0)), np.nextafter(p, f32(np.inf))):
        v = rng.uniform(-1, 1, 32).astype(f32) * m
        v[int(rng.integers(32))] = -m if rng.integers(2) else m
        block(v)
# Random values on quarter steps of d = 0.5 (largest 6: many exact codes and ties) and
# values past the largest code (amax in [8d, 16d) with d = 0.5).
for _ in range(4):
    v = rng.integers(-24, 25, 32).astype(f32) * f32(0.25)
    v[0] = f32(6.0)
    block(v)
block(np.concatenate([[7.99], rng.uniform(-7.99, 7.99, 31)]))
# Exponents outside E8M0's range: the largest magnitude in [2^-126, 2^-124) truncates to
# -1, -2 (bytes 255, 254); subnormals further down; the top of the float range.
for m in (2.0 ** -126, 2.0 ** -125, 2.0 ** -127, 1e-40, 1.4e-45, 1e38, 3.4e38):
    v = rng.uniform(-1, 1, 32) * m
    v[3] = m
    block(v.astype(f32))
block(np.full(32, np.finfo(np.float32).max))
# Non-finite values: an infinity sets the largest magnitude; NaNs never do.
v = rng.standard_normal(32); v[5] = np.inf; block(v)
v = rng.standard_normal(32); v[7] = -np.inf; v[8] = np.nan; block(v)
v = rng.standard_normal(32); v[0] = np.nan; v[31] = np.nan; block(v)
block(np.full(32, np.nan))
np.concatenate(blocks).astype("<f4").tofile(sys.argv[1])
PY

rm -f "$OUT"/*.bin "$OUT"/*.deq.f32
(cd "$OUT" && "$WORK/ref_quant" input.f32 mxfp4_edges.f32)
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

#!/usr/bin/env bash
# Bit-exactness fixtures from ggml's own C reference quantizers, for the types gguf-py cannot
# quantize (Q8_1, Q4_K, Q5_K, Q6_K, Q8_K) and, as a second opinion, the legacy ones.
#
# Usage: scripts/ggml_ref/gen.sh /path/to/ggml-checkout   (needs gcc, python3 + numpy)
# Output: crates/rgml/tests/fixtures/quant/ggml_ref/
#   input.f32   raw little-endian f32 input (a multiple of 256 values)
#   <type>.bin  quantize_row_<type>_ref(input) for q4_0 q4_1 q5_0 q5_1 q8_0 q8_1 q4_K q5_K q6_K q8_K
#   SOURCE      the ggml commit the fixtures came from
# The fixtures committed were made from ggml-org/ggml d99724f2 with gcc -O2 -ffp-contract=off
# (no FMA contraction, which ggml's reference code does not rely on).
set -euo pipefail
GGML=${1:?usage: $0 /path/to/ggml}
HERE=$(cd "$(dirname "$0")" && pwd)
OUT="$HERE/../../crates/rgml/tests/fixtures/quant/ggml_ref"
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
mkdir -p "$OUT"

gcc -O2 -ffp-contract=off -c "$GGML/src/ggml-quants.c" -I"$GGML/include" -I"$GGML/src" -o "$WORK/quants.o"
gcc -O2 -ffp-contract=off -I"$GGML/include" -I"$GGML/src" "$HERE/ref_quant.c" "$WORK/quants.o" -lm -o "$WORK/ref_quant"

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
assert x.size % 256 == 0
x.tofile(sys.argv[1])
PY

(cd "$OUT" && "$WORK/ref_quant" input.f32)
echo "ggml-org/ggml $(git -C "$GGML" rev-parse HEAD 2>/dev/null || echo unknown)" > "$OUT/SOURCE"
echo "wrote $(ls "$OUT" | wc -l) files to $OUT"

#!/usr/bin/env python3
"""Generate bit-exactness fixtures for rgml's quantization codecs from gguf-py.

gguf-py (PyPI package `gguf`) is ggml's own Python port of the GGUF block formats; its legacy
quantizers are written to be bit-exact with ggml's `quantize_row_*_ref`. rgml's tests compare
against the files written here, so the Rust test suite needs neither Python nor ggml.

Usage:  pip install gguf numpy && python3 scripts/gen_quant_fixtures.py
Output: crates/rgml/tests/fixtures/quant/  (scripts/ggml_ref/gen.sh adds ggml_ref/ there: the
        quantizers gguf-py lacks, checked against ggml's C reference code)

Format (all numbers little-endian, no headers):
  manifest.txt          one line per fixture: `<dtype> <n_elements> <mode>` where dtype is ggml's
                        lower-case name (q4_0, q4_K, bf16, ...) and mode is
                          `quant`   - <dtype>.in.f32 was quantized by gguf into <dtype>.bin; the
                                      Rust quantizer must reproduce <dtype>.bin byte for byte;
                          `dequant` - <dtype>.bin was synthesised here (gguf-py cannot quantize
                                      that type); only dequantization is checked.
                        Lines starting with '#' are comments.
  <dtype>.in.f32        (quant mode only) n_elements raw f32: the input that was quantized.
  <dtype>.bin           the encoded blocks (n_elements / block_size * block_bytes bytes).
  <dtype>.out.f32       n_elements raw f32: gguf's decoding of <dtype>.bin.

gguf-py 0.19 can quantize F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1 and Q8_0; it can only dequantize
Q4_K, Q5_K and Q6_K; it knows neither Q8_1 nor Q8_K as codecs, so those have no fixture.
"""

from __future__ import annotations

import os
import sys

import numpy as np
from gguf import GGMLQuantizationType as T
from gguf import quants
from gguf.constants import GGML_QUANT_SIZES

OUT_DIR = os.path.join(
    os.path.dirname(os.path.abspath(__file__)), "..", "crates", "rgml", "tests", "fixtures", "quant"
)

BLOCK = 32
N_BLOCKS = 128  # 4096 values per legacy fixture


def legacy_input(rng: np.random.Generator) -> np.ndarray:
    """Mostly random blocks of varied scale, plus hand-made blocks that hit edge cases."""
    blocks: list[np.ndarray] = []

    def halves(lo: float, hi: float, pin: float) -> np.ndarray:
        # Multiples of 0.5 make `x * id` land exactly on .5 when the scale is 1, which exercises
        # the round-half-away (q8) and truncate-after-+0.5 (q4/q5) paths.
        b = rng.integers(int(lo * 2), int(hi * 2) + 1, size=BLOCK).astype(np.float32) / 2
        b[rng.integers(0, BLOCK)] = pin
        return b

    blocks.append(np.zeros(BLOCK, np.float32))  # d == 0 -> id == 0
    blocks.append(np.full(BLOCK, 0.75, np.float32))  # max == min for the _1 types
    blocks.append(halves(-7.5, 7.5, -8.0))  # q4_0: d = 1
    blocks.append(halves(-15.5, 15.5, -16.0))  # q5_0: d = 1
    blocks.append(halves(-126.5, 126.5, 127.0))  # q8_0: d = 1
    b = rng.uniform(-3, 3, BLOCK).astype(np.float32)
    b[7] = -10.0  # dominant negative max
    blocks.append(b)
    b = rng.uniform(-3, 3, BLOCK).astype(np.float32)
    b[20] = 10.0  # dominant positive max
    blocks.append(b)
    b = rng.uniform(-1, 1, BLOCK).astype(np.float32)
    b[3], b[9] = 5.0, -5.0  # |max| tie: the first one wins
    blocks.append(b)
    b = rng.uniform(-1, 1, BLOCK).astype(np.float32)
    b[3], b[9] = -5.0, 5.0
    blocks.append(b)
    blocks.append((rng.standard_normal(BLOCK) * 1e-6).astype(np.float32))  # subnormal f16 scales
    blocks.append((rng.standard_normal(BLOCK) * 3e-8).astype(np.float32))  # scales underflow f16
    blocks.append((rng.standard_normal(BLOCK) * 2e3).astype(np.float32))  # large
    blocks.append(-rng.uniform(0.5, 4.0, BLOCK).astype(np.float32))  # all negative
    blocks.append(rng.uniform(0.5, 4.0, BLOCK).astype(np.float32))  # all positive, min > 0
    b = rng.uniform(-1, 1, BLOCK).astype(np.float32)
    b[::2] = 0.0  # sparse
    blocks.append(b)

    while len(blocks) < N_BLOCKS:
        scale = np.float32(10.0 ** rng.uniform(-3, 2))
        if rng.random() < 0.5:
            b = rng.standard_normal(BLOCK).astype(np.float32) * scale
        else:
            b = rng.uniform(-1, 1, BLOCK).astype(np.float32) * scale
        blocks.append(b.astype(np.float32))
    return np.concatenate(blocks).astype(np.float32)


def float_input(rng: np.random.Generator) -> np.ndarray:
    """Inputs for the f16/bf16 conversions: random magnitudes plus rounding ties and extremes."""
    vals = [
        (rng.standard_normal(2048) * 10.0 ** rng.uniform(-8, 5, 2048)).astype(np.float32),
        # Random bit patterns whose low 16 bits are exactly 0x8000 (bf16 ties) or whose low 13
        # bits are exactly 0x1000 (f16 ties), in a safe exponent range.
        ((rng.integers(0x3000_0000, 0x4600_0000, 512, dtype=np.uint32) & ~np.uint32(0xFFFF)) | 0x8000)
        .view(np.float32),
        ((rng.integers(0x3800_0000, 0x4700_0000, 512, dtype=np.uint32) & ~np.uint32(0x1FFF)) | 0x1000)
        .view(np.float32),
        np.array(
            [0.0, -0.0, 1.0, -1.0, 65504.0, 65519.0, 65520.0, 70000.0, -1e9, 6e-8, 3e-8, 1e-40,
             3.4e38, -3.4e38, np.inf, -np.inf],
            np.float32,
        ),
    ]
    out = np.concatenate(vals).astype(np.float32)
    pad = (-len(out)) % 64
    return np.concatenate([out, rng.standard_normal(pad).astype(np.float32)])


def f16_bytes(rng: np.random.Generator, n: int, lo: float, hi: float, signed: bool) -> np.ndarray:
    v = rng.uniform(lo, hi, n)
    if signed:
        v *= rng.choice([-1.0, 1.0], n)
    return v.astype(np.float16).view(np.uint8).reshape(n, 2)


def kquant_blocks(rng: np.random.Generator, qtype: T, n_blocks: int) -> np.ndarray:
    """Random block bytes with finite, moderate f16 super-block scales (raw random bytes elsewhere)."""
    _, type_size = GGML_QUANT_SIZES[qtype]
    raw = rng.integers(0, 256, (n_blocks, type_size), dtype=np.uint8)
    if qtype in (T.Q4_K, T.Q5_K):
        raw[:, 0:2] = f16_bytes(rng, n_blocks, 1e-4, 0.1, signed=False)  # d
        raw[:, 2:4] = f16_bytes(rng, n_blocks, 1e-4, 0.1, signed=True)  # dmin
        raw[0, 0:4] = 0  # a zero super-block
    elif qtype == T.Q6_K:
        raw[:, type_size - 2:] = f16_bytes(rng, n_blocks, 1e-5, 0.01, signed=True)  # d (last field)
        raw[0, type_size - 2:] = 0
    else:
        raise ValueError(qtype)
    return raw


def write(name: str, arr: np.ndarray) -> None:
    with open(os.path.join(OUT_DIR, name), "wb") as f:
        f.write(np.ascontiguousarray(arr).tobytes())


def main() -> int:
    os.makedirs(OUT_DIR, exist_ok=True)
    rng = np.random.default_rng(20240611)
    manifest = ["# generated by scripts/gen_quant_fixtures.py; see its docstring for the format"]

    data = legacy_input(rng)
    for qtype in (T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0):
        name = qtype.name.lower()
        q = quants.quantize(data, qtype)
        deq = quants.dequantize(q, qtype).astype(np.float32)
        write(f"{name}.in.f32", data.astype("<f4"))
        write(f"{name}.bin", q)
        write(f"{name}.out.f32", deq.astype("<f4"))
        manifest.append(f"{name} {data.size} quant")

    fdata = float_input(rng)
    for qtype in (T.F16, T.BF16):
        name = qtype.name.lower()
        q = quants.quantize(fdata, qtype)
        deq = quants.dequantize(q, qtype).astype(np.float32)
        write(f"{name}.in.f32", fdata.astype("<f4"))
        write(f"{name}.bin", q.view(np.uint8))
        write(f"{name}.out.f32", deq.astype("<f4"))
        manifest.append(f"{name} {fdata.size} quant")

    for qtype in (T.Q4_K, T.Q5_K, T.Q6_K):
        name = qtype.name[:-1].lower() + "K"
        n_blocks = 16
        blocks = kquant_blocks(rng, qtype, n_blocks)
        deq = quants.dequantize(blocks.reshape(-1), qtype).astype(np.float32)
        assert np.all(np.isfinite(deq))
        write(f"{name}.bin", blocks)
        write(f"{name}.out.f32", deq.astype("<f4"))
        manifest.append(f"{name} {deq.size} dequant")

    with open(os.path.join(OUT_DIR, "manifest.txt"), "w") as f:
        f.write("\n".join(manifest) + "\n")
    print(f"wrote {len(manifest) - 1} fixtures to {os.path.normpath(OUT_DIR)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

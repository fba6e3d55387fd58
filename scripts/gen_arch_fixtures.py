#!/usr/bin/env python3
"""Reference logits of llama.cpp for the random-weight models of `crates/rgml-testmodels`.

Each architecture rgml-llm supports (or will) has a tiny random model that
`rgml-random-model --arch NAME --out FILE` writes, byte for byte the same on every run. This
script writes each file, runs it in llama.cpp and records what llama.cpp computes:

    python3 scripts/gen_arch_fixtures.py --isa avx2 [--arch NAME ...] [--bin PATH]
        [--flash-attn on]

It needs llama.cpp's shared libraries built natively for the named instruction set (see
`scripts/llamacpp.sh`), found through `LLAMA_CPP_LIB_PATH`, the `llama_cpp` Python package of
the same source package (llama-cpp-python 0.3.36) on `PYTHONPATH`, numpy, and the vocabulary
files under `models/` (`scripts/fetch-model.sh`, `scripts/fetch-vocab.sh`). Without `--bin` the
generator is built with `cargo build --release -p rgml-testmodels`.

For each architecture it writes `crates/rgml-cli/tests/fixtures/arch/<isa>/<arch>.json`: the
file's sha256, the instruction set and, per prompt, the tokens (special tokens parsed, BOS and
EOS as the vocabulary says, as llama.cpp's tools and `rgml logits` tokenize a prompt) and the 10 largest logits of the last position after the prompt is
decoded in one batch, rounded to 4 decimals; then `continuation`: 32 more tokens chosen
greedily and decoded one at a time, each with its own top 10. Loading and context are as in
`scripts/gen_model_fixtures.py`: repacking off, flash attention off, n_ctx 512, 2 threads.
With `--flash-attn on` the fixture is `<arch>.fa-on.json`, made with flash attention on.
The script stops if llama.cpp refuses a file or if logits are not finite or barely vary.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import pathlib
import subprocess
import sys

import numpy as np
import llama_cpp as L

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from gen_model_fixtures import load, sha256, tokenize  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parent.parent
ARCHS = [
    "gemma3", "qwen2", "qwen3", "llama3", "phi3", "mistral", "qwen3moe", "mixtral", "gpt-oss",
    "qwen35", "qwen35moe", "gemma4", "gemma4moe",
]
CONTINUATION = 32

STORY = (
    "Once upon a time, in a small village at the edge of a great forest, there lived an old "
    "clockmaker who repaired every clock in the valley and never told anyone his name."
)
LIST = (
    "Shopping list: three apples, two loaves of bread, a jar of honey, fresh basil, olive oil, "
    "sea salt, black pepper, and a bottle of sparkling water for the weekend."
)
TALE = (
    "Every morning he opened the shutters at seven, wound the great tower clock by hand, and "
    "listened for the faint tick that told him the pendulum was true. Children brought him broken "
    "music boxes, pocket watches with cracked glass, and once a brass astrolabe that nobody in the "
    "valley could explain."
)
# 137 tokens in Qwen's vocabulary: more than two of the 64-token chunks of llama.cpp's chunked
# delta net (its unfused graph; the CPU runs the fused GATED_DELTA_NET op, token by token), the
# last one partial.
LONG = " ".join([STORY, TALE, LIST])
COMMON = [
    "Once upon a time",
    "The capital of France is",
    "Hello, world! 1234567 naïve café 🚀 def f(x): return x**2",
    STORY,
]
CHAT = {
    "gemma3": "<start_of_turn>user\nWrite a haiku about the sea.<end_of_turn>\n<start_of_turn>model\n",
    "qwen2": "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
    "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n",
    "llama3": "<|start_header_id|>user<|end_header_id|>\n\nWhat is 2+2?<|eot_id|>"
    "<|start_header_id|>assistant<|end_header_id|>\n\n",
    "phi3": "<|user|>\nWhat is 2+2?<|end|>\n<|assistant|>\n",
    # Mistral's [INST] is plain text in the LLaMA SentencePiece vocabulary; </s> is special.
    "mistral": "[INST] Hi there [/INST] Hello!</s>[INST] What is 2+2? [/INST]",
}
# Gemma 4's template with thinking off, as it renders one user turn (its BOS is the vocabulary's).
CHAT["gemma4"] = CHAT["gemma4moe"] = (
    "<|turn>user\nWrite a haiku about the sea.<turn|>\n<|turn>model\n<|channel>thought\n<channel|>"
)
CHAT["qwen3"] = CHAT["qwen3moe"] = CHAT["qwen35"] = CHAT["qwen35moe"] = CHAT["qwen2"]
CHAT["mixtral"] = CHAT["mistral"]
# gpt-oss's test model has the Llama 3 vocabulary (llama.cpp vendors no o200k one).
CHAT["gpt-oss"] = CHAT["llama3"]


def prompts(arch: str) -> list[str]:
    """The family's prompts; those with an 8-token window get a second one well past it, those
    with delta nets one of several chunks."""
    extra = [LIST] if arch in ("gemma3", "gpt-oss", "gemma4", "gemma4moe") else []
    if arch in ("qwen35", "qwen35moe"):
        extra = [LONG]
    return COMMON + extra + [CHAT[arch]]


def write_model(arch: str, binary: pathlib.Path, out: pathlib.Path) -> None:
    subprocess.run([str(binary), "--arch", arch, "--out", str(out)], cwd=ROOT, check=True)


def logits_of(model, ctx) -> np.ndarray:
    n_vocab = L.llama_vocab_n_tokens(L.llama_model_get_vocab(model))
    ptr = ctypes.cast(L.llama_get_logits_ith(ctx, -1), ctypes.POINTER(ctypes.c_float))
    return np.ctypeslib.as_array(ptr, shape=(n_vocab,)).copy()


def decode(ctx, tokens: list[int]) -> None:
    arr = (L.llama_token * len(tokens))(*tokens)
    if L.llama_decode(ctx, L.llama_batch_get_one(arr, len(tokens))) != 0:
        sys.exit("llama_decode failed")


def top10(logits: np.ndarray, what: str) -> list[list]:
    if not np.all(np.isfinite(logits)):
        sys.exit(f"{what}: non-finite logits")
    if float(np.std(logits)) < 0.05:
        sys.exit(f"{what}: logits barely vary (std {np.std(logits)})")
    order = np.argsort(-logits, kind="stable")[:10]
    return [[int(i), round(float(logits[i]), 4)] for i in order]


def run_case(model, ctx, vocab, prompt: str, what: str, steps: int = CONTINUATION) -> dict:
    tokens = tokenize(vocab, prompt, True)
    L.llama_memory_clear(L.llama_get_memory(ctx), True)
    decode(ctx, tokens)
    top = top10(logits_of(model, ctx), what)
    continuation = []
    for step in range(steps):
        token = (continuation[-1]["top10"] if continuation else top)[0][0]
        decode(ctx, [token])
        step_top = top10(logits_of(model, ctx), f"{what} step {step}")
        continuation.append({"token": token, "top10": step_top})
    return {"prompt": prompt, "tokens": tokens, "top10": top, "continuation": continuation}


def fixture(arch: str, path: pathlib.Path, isa: str, flash_attn: bool) -> dict:
    model, ctx = load(path, flash_attn=flash_attn)
    vocab = L.llama_model_get_vocab(model)
    cases = [run_case(model, ctx, vocab, p, f"{arch} {p[:20]!r}") for p in prompts(arch)]
    L.llama_free(ctx)
    L.llama_model_free(model)
    return {
        "arch": arch,
        "file": path.name,
        "sha256": sha256(path),
        "isa": isa,
        "flash_attn": "on" if flash_attn else "off",
        "llama_cpp": "llama-cpp-python 0.3.36 (vendored llama.cpp), native build, repack off",
        "cases": cases,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--isa", required=True, help="the instruction set llama.cpp was built for")
    ap.add_argument("--arch", action="append", choices=ARCHS, help="default: all")
    ap.add_argument("--bin", type=pathlib.Path, help="rgml-random-model (default: build it)")
    ap.add_argument("--flash-attn", choices=["off", "on"], default="off")
    target = pathlib.Path(os.environ.get("CARGO_TARGET_DIR", ROOT / "target"))
    ap.add_argument("--models", type=pathlib.Path, default=target / "arch-models")
    args = ap.parse_args()
    if args.bin is None:
        subprocess.run(["cargo", "build", "--release", "-q", "-p", "rgml-testmodels"], cwd=ROOT, check=True)
        args.bin = target / "release" / "rgml-random-model"
    out_dir = ROOT / "crates" / "rgml-cli" / "tests" / "fixtures" / "arch" / args.isa
    out_dir.mkdir(parents=True, exist_ok=True)
    args.models.mkdir(parents=True, exist_ok=True)
    L.llama_backend_init()
    for arch in args.arch or ARCHS:
        path = args.models / f"{arch}.gguf"
        write_model(arch, args.bin, path)
        fx = fixture(arch, path, args.isa, args.flash_attn == "on")
        suffix = ".fa-on" if args.flash_attn == "on" else ""
        out = out_dir / f"{arch}{suffix}.json"
        out.write_text(json.dumps(fx, indent=1, ensure_ascii=False) + "\n")
        print(f"{out}: {len(fx['cases'])} prompts", file=sys.stderr)


if __name__ == "__main__":
    main()

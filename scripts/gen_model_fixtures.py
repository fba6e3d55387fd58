#!/usr/bin/env python3
"""Reference logits of llama.cpp for GGUF files, one fixture per file and instruction set.

rgml's CPU kernels mirror the arithmetic of a *native* ggml-cpu build on the same instruction
set, with weight repacking off (repacked layouts change the order of float operations). This
script records what such a build computes, so the tests need no llama.cpp:

    python3 scripts/gen_model_fixtures.py --isa avx2 --out DIR MODEL.gguf [MODEL.gguf ...]
    python3 scripts/gen_model_fixtures.py --isa avx2 --out DIR --prompts P.json --add-special \
        --n-ctx 1024 MODEL.gguf

It needs llama.cpp's shared libraries, built natively for the named instruction set (see
`scripts/llamacpp.sh`), found through `LLAMA_CPP_LIB_PATH`, and the `llama_cpp` Python package
of the same source package (llama-cpp-python 0.3.36; its pure-Python `llama_cpp/` folder works
without compiling it again) on `PYTHONPATH`, with numpy.

For each file it writes `DIR/<file stem>.json`: the file's sha256, the instruction set, and per
prompt of `../shared/fixtures/smollm2/prompts.json` (or `--prompts`), and of prompts cut from
`--long-text` to exactly the token counts `--lengths` names (e.g. 513 tokens: a micro-batch of
512, then one token alone over 768 cells, which is what generation at that depth computes): the tokens (special tokens
parsed; BOS and the like only with `--add-special`, where the vocabulary adds them) and the 10
largest next-token logits at the last position, rounded to 4 decimals. Flash attention is off
(`--flash-attn on` for the fixtures of rgml's `-fa on`; `--cache-type-k/v` as llama.cpp's
flags, for rgml's `-ctk/-ctv`) and 2 threads are used, as in the other
fixtures; the prompt is decoded in micro-batches of 512 tokens
(one for short prompts, so llama.cpp's batched matmul paths are the ones recorded) in a context
of 512 cells, or `--n-ctx`.
"""

from __future__ import annotations

import argparse
import ctypes
import hashlib
import json
import pathlib
import sys

import numpy as np
import llama_cpp as L

ROOT = pathlib.Path(__file__).resolve().parent.parent
PROMPTS = ROOT.parent / "shared" / "fixtures" / "smollm2" / "prompts.json"


def sha256(path: pathlib.Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


GGML_TYPES = {"f32": 0, "f16": 1, "q4_0": 2, "q8_0": 8}


def load(path: pathlib.Path, n_ctx: int = 512, flash_attn: bool = False, ctk="f16", ctv="f16"):
    mp = L.llama_model_default_params()
    mp.use_extra_bufts = False  # no CPU_REPACK: the plain layouts' arithmetic is the reference
    model = L.llama_model_load_from_file(str(path).encode(), mp)
    if not model:
        sys.exit(f"llama.cpp could not load {path}")
    cp = L.llama_context_default_params()
    cp.n_ctx = n_ctx
    cp.n_batch = n_ctx
    cp.n_ubatch = 512
    cp.n_threads = 2
    cp.n_threads_batch = 2
    cp.flash_attn_type = 1 if flash_attn else 0  # LLAMA_FLASH_ATTN_TYPE_ENABLED / _DISABLED
    cp.type_k = GGML_TYPES[ctk]
    cp.type_v = GGML_TYPES[ctv]
    # Sliding-window layers keep only their window, as llama.cpp's tools do by default (the C
    # API's default is a full-size cache); rgml places their cells the same way.
    cp.swa_full = False
    ctx = L.llama_init_from_model(model, cp)
    if not ctx:
        sys.exit(f"llama.cpp could not make a context for {path}")
    return model, ctx


def tokenize(vocab, text: str, add_special: bool = False) -> list[int]:
    raw = text.encode()
    buf = (L.llama_token * (len(raw) + 16))()
    n = L.llama_tokenize(vocab, raw, len(raw), buf, len(buf), add_special, True)
    if n < 0:
        sys.exit(f"tokenization of {text!r} failed")
    return list(buf[:n])


def prompt_of_length(vocab, text: str, n: int, add_special: bool) -> str:
    """The shortest prefix of `text` that tokenizes to exactly `n` tokens (cut at a word
    boundary where one gives `n`, else at a character)."""
    cuts = [i for i, ch in enumerate(text) if ch == " "] + [len(text)]
    for cut in cuts + list(range(1, len(text) + 1)):
        if len(tokenize(vocab, text[:cut], add_special)) == n:
            return text[:cut]
    sys.exit(f"no prefix of the long text has {n} tokens")


def top10(model, ctx, tokens: list[int]) -> list[list]:
    L.llama_memory_clear(L.llama_get_memory(ctx), True)
    arr = (L.llama_token * len(tokens))(*tokens)
    if L.llama_decode(ctx, L.llama_batch_get_one(arr, len(tokens))) != 0:
        sys.exit("llama_decode failed")
    n_vocab = L.llama_vocab_n_tokens(L.llama_model_get_vocab(model))
    ptr = L.llama_get_logits_ith(ctx, -1)
    logits = np.ctypeslib.as_array(ctypes.cast(ptr, ctypes.POINTER(ctypes.c_float)), shape=(n_vocab,))
    order = np.argsort(-logits, kind="stable")[:10]
    return [[int(i), round(float(logits[i]), 4)] for i in order]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--isa", required=True, help="the instruction set llama.cpp was built for")
    ap.add_argument("--out", required=True, type=pathlib.Path)
    ap.add_argument("--prompts", type=pathlib.Path, default=PROMPTS, help="a JSON list of prompts")
    ap.add_argument("--add-special", action="store_true", help="add BOS etc. as the vocabulary says")
    ap.add_argument("--n-ctx", type=int, default=512)
    ap.add_argument("--flash-attn", choices=["on", "off"], default="off")
    ap.add_argument("--cache-type-k", choices=sorted(GGML_TYPES), default="f16")
    ap.add_argument("--cache-type-v", choices=sorted(GGML_TYPES), default="f16")
    ap.add_argument("--suffix", default="", help="appended to each fixture's file stem")
    ap.add_argument(
        "--lengths",
        default="",
        help="also prompts of exactly these token counts (comma-separated), cut from --long-text",
    )
    ap.add_argument("--long-text", type=pathlib.Path, default=PROMPTS.parent / "ppl-text.txt")
    ap.add_argument("models", nargs="+", type=pathlib.Path)
    args = ap.parse_args()
    prompts = json.loads(args.prompts.read_text())
    L.llama_backend_init()
    args.out.mkdir(parents=True, exist_ok=True)
    for path in args.models:
        model, ctx = load(
            path, args.n_ctx, args.flash_attn == "on", args.cache_type_k, args.cache_type_v
        )
        vocab = L.llama_model_get_vocab(model)
        cases = []
        long_text = " ".join([args.long_text.read_text()] * 4)
        lengths = [int(n) for n in args.lengths.split(",") if n]
        extra = [prompt_of_length(vocab, long_text, n, args.add_special) for n in lengths]
        for prompt in prompts + extra:
            tokens = tokenize(vocab, prompt, args.add_special)
            cases.append({"prompt": prompt, "tokens": tokens, "top10": top10(model, ctx, tokens)})
        fixture = {
            "file": path.name,
            "sha256": sha256(path),
            "isa": args.isa,
            "llama_cpp": "llama-cpp-python 0.3.36 (vendored llama.cpp), native build, repack off",
            "flash_attn": args.flash_attn,
            "cache_type_k": args.cache_type_k,
            "cache_type_v": args.cache_type_v,
            "cases": cases,
        }
        out = args.out / (path.stem + args.suffix + ".json")
        out.write_text(json.dumps(fixture, indent=1, ensure_ascii=False) + "\n")
        print(f"{out}: {len(cases)} prompts", file=sys.stderr)
        L.llama_free(ctx)
        L.llama_model_free(model)


if __name__ == "__main__":
    main()

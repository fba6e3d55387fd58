#!/usr/bin/env python3
"""Greedy continuations by llama.cpp, for `rgml run --temp 0` (and `--chat`) to be checked against.

    python3 scripts/gen_greedy_fixtures.py --isa avx2 --out FILE.json [--chat-template gemma] \
        MODEL.gguf PROMPT [PROMPT ...]

For each prompt: the prompt is tokenized as `rgml run` does (BOS as the vocabulary says, special
tokens parsed), decoded in one batch, then 32 tokens are chosen by argmax one at a time (stopping
at an end-of-generation token), and the generated pieces are joined as llama.cpp prints them.
With `--chat-template NAME`, each prompt is first wrapped as one user message by llama.cpp's
built-in template of that name (`llama_chat_apply_template`), as `rgml run --chat` wraps it; the
record keeps the unwrapped prompt and the wrapped text. Same loading as
`scripts/gen_model_fixtures.py` (repacking off, flash attention off, 2 threads); same
environment (`LLAMA_CPP_LIB_PATH`, `PYTHONPATH` with the `llama_cpp` package).
"""

from __future__ import annotations

import argparse
import ctypes
import json
import pathlib
import sys

import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import gen_model_fixtures as G  # noqa: E402

L = G.L
N_PREDICT = 32


def chat_wrap(template: str, prompt: str) -> str:
    msg = L.llama_chat_message(role=b"user", content=prompt.encode())
    msgs = (L.llama_chat_message * 1)(msg)
    buf = ctypes.create_string_buffer(len(prompt) * 4 + 256)
    n = L.llama_chat_apply_template(template.encode(), msgs, 1, True, buf, len(buf))
    if n < 0 or n > len(buf):
        sys.exit(f"llama_chat_apply_template({template}) failed")
    return buf.raw[:n].decode()


def piece(vocab, token: int) -> bytes:
    buf = ctypes.create_string_buffer(256)
    n = L.llama_token_to_piece(vocab, token, buf, len(buf), 0, False)
    return buf.raw[:n]


def greedy(model, ctx, tokens: list[int]) -> tuple[list[int], str]:
    vocab = L.llama_model_get_vocab(model)
    n_vocab = L.llama_vocab_n_tokens(vocab)
    L.llama_memory_clear(L.llama_get_memory(ctx), True)
    batch = (L.llama_token * len(tokens))(*tokens)
    if L.llama_decode(ctx, L.llama_batch_get_one(batch, len(tokens))) != 0:
        sys.exit("llama_decode failed")
    out: list[int] = []
    for _ in range(N_PREDICT):
        ptr = L.llama_get_logits_ith(ctx, -1)
        logits = np.ctypeslib.as_array(ctypes.cast(ptr, ctypes.POINTER(ctypes.c_float)), shape=(n_vocab,))
        t = int(np.argmax(logits))
        if L.llama_vocab_is_eog(vocab, t):
            break
        out.append(t)
        one = (L.llama_token * 1)(t)
        if L.llama_decode(ctx, L.llama_batch_get_one(one, 1)) != 0:
            sys.exit("llama_decode failed")
    text = b"".join(piece(vocab, t) for t in out).decode("utf-8", errors="replace")
    return out, text


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--isa", required=True)
    ap.add_argument("--out", required=True, type=pathlib.Path)
    ap.add_argument("--chat-template", help="llama.cpp's built-in template to wrap prompts in")
    ap.add_argument("model", type=pathlib.Path)
    ap.add_argument("prompts", nargs="+")
    args = ap.parse_args()
    L.llama_backend_init()
    model, ctx = G.load(args.model, 1024)
    vocab = L.llama_model_get_vocab(model)
    cases = []
    for prompt in args.prompts:
        text = chat_wrap(args.chat_template, prompt) if args.chat_template else prompt
        tokens = G.tokenize(vocab, text, True)
        generated, greedy_text = greedy(model, ctx, tokens)
        cases.append({"prompt": prompt, "text": text, "tokens": tokens,
                      "generated": generated, "greedy_text": greedy_text})
    fixture = {
        "file": args.model.name,
        "sha256": G.sha256(args.model),
        "isa": args.isa,
        "chat_template": args.chat_template,
        "n_predict": N_PREDICT,
        "llama_cpp": "llama-cpp-python 0.3.36 (vendored llama.cpp), native build, repack off",
        "cases": cases,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(fixture, indent=1, ensure_ascii=False) + "\n")
    print(f"{args.out}: {len(cases)} prompts", file=sys.stderr)


if __name__ == "__main__":
    main()

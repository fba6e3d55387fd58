#!/usr/bin/env python3
"""Compare `rgml logits` with a local llama.cpp on the same GGUF file, prompt by prompt.

The demo model amplifies rounding differences (one int8 activation quant flipping by a step can
move a logit by 0.1), so rgml's CPU kernels mirror the arithmetic of a *native* ggml-cpu build
on the same CPU. This script is how that is checked: it needs llama.cpp's Python bindings,
built natively, e.g.

    python3 -m venv /tmp/llama && CMAKE_ARGS="-DGGML_NATIVE=ON -DLLAMA_CURL=OFF" \
        /tmp/llama/bin/pip install numpy llama-cpp-python==0.3.36     # ~10 min on 2 cores

and is run with that interpreter from the repository root after `cargo build --release`:

    /tmp/llama/bin/python scripts/compare_llama_cpp.py [PROMPT ...]

Without prompts it uses the fixture's. For each prompt it prints the number of tokens, the
largest |logit difference| over llama.cpp's top 10, and `*` when the top-10 order differs.
Flash attention is off, as in llama.cpp's Python default and the fixture.
"""

import json
import pathlib
import subprocess
import sys

import numpy as np
import llama_cpp

ROOT = pathlib.Path(__file__).resolve().parent.parent
MODEL = ROOT / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"
RGML = ROOT / "target" / "release" / "rgml"
FIXTURE = ROOT / "crates" / "rgml-llm" / "tests" / "fixtures" / "reference.json"


def llama_cpp_logits(model, prompt):
    tokens = model.tokenize(prompt.encode(), add_bos=False, special=True)
    model.reset()
    model.eval(tokens)
    n_vocab = model.n_vocab()
    logits = np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(model.ctx, -1), shape=(n_vocab,))
    return tokens, logits.copy()


def rgml_top(prompt, k):
    out = subprocess.run(
        [str(RGML), "logits", "-m", str(MODEL), "-p", prompt, "--json", "--top", str(k)],
        capture_output=True, text=True, check=True,
    ).stdout
    return json.loads(out)


def main():
    prompts = sys.argv[1:] or [c["prompt"] for c in json.loads(FIXTURE.read_text())["cases"]]
    model = llama_cpp.Llama(model_path=str(MODEL), n_ctx=512, verbose=False, flash_attn=False)
    worst = 0.0
    for prompt in prompts:
        tokens, logits = llama_cpp_logits(model, prompt)
        top = [int(i) for i in np.argsort(-logits, kind="stable")[:10]]
        ours = rgml_top(prompt, 50)
        mine = {i: l for i, l in ours["top"]}
        diff = max(abs(float(logits[i]) - mine.get(i, float("inf"))) for i in top)
        same_order = [i for i, _ in ours["top"][:10]] == top
        same_tokens = ours["tokens"] == tokens
        worst = max(worst, diff)
        print(f"{len(tokens):4d} {diff:.5f}{'' if same_order else '*'}{'' if same_tokens else ' (tokens differ)'}  {prompt[:60]!r}")
    print(f"worst: {worst:.5f}")


if __name__ == "__main__":
    main()

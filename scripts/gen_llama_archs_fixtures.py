#!/usr/bin/env python3
"""Reference logits of llama.cpp for the random models of its own `test-llama-archs` tool.

llama.cpp's `tests/test-llama-archs` (built by `scripts/llamacpp.sh test-llama-archs`) saves a
small random-weight file for each architecture it knows (`-o DIR -s SEED -a REGEX`): F32
weights drawn from the seed, every optional tensor its loader knows (biases, per-matrix
scales, input scales, LongRoPE factors) present, and its `test` tokenizer. This script saves
the files of the architectures rgml runs and records what llama.cpp computes for them:

    python3 scripts/gen_llama_archs_fixtures.py --isa avx2 --tool PATH/test-llama-archs [--seed 1]
        [--arch NAME ...] [--n-ctx N]

It needs what `scripts/gen_arch_fixtures.py` needs (llama.cpp's libraries for the named
instruction set through `LLAMA_CPP_LIB_PATH`, the `llama_cpp` package, numpy). For each file it
writes `crates/rgml-cli/tests/fixtures/llama_archs/<isa>/<file stem>.json`: the seed, the
file's sha256 and, per prompt, the tokens and the top 10 logits after the prompt is decoded in
one batch, then a greedy continuation of 32 single-token decodes, each with its top 10
(repacking off, flash attention off, n_ctx 512, 2 threads, as the other fixtures).

`--n-ctx N` runs the files under another context and writes `<file stem>.ctx-<N>.json`, which
records it: Phi-3's file carries LongRoPE's long and short factors and a training context of
256, so llama.cpp reads the long ones at 512 and the short ones at `--arch phi3 --n-ctx 256`.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import subprocess
import sys
import tempfile

import llama_cpp as L

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from gen_arch_fixtures import COMMON, LIST, run_case  # noqa: E402
from gen_model_fixtures import load, sha256  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parent.parent
# llama.cpp's names of the architectures rgml runs (test-llama-archs' -a is a regex).
ARCHS = ["llama", "qwen2", "qwen3", "qwen3moe", "phi3", "gemma3", "gpt-oss", "qwen35", "qwen35moe"]
STEPS = 32


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--isa", required=True, help="the instruction set llama.cpp was built for")
    ap.add_argument("--tool", required=True, type=pathlib.Path, help="test-llama-archs")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--arch", action="append", choices=ARCHS, help="default: all")
    ap.add_argument("--n-ctx", type=int, default=512)
    args = ap.parse_args()
    out_dir = ROOT / "crates" / "rgml-cli" / "tests" / "fixtures" / "llama_archs" / args.isa
    out_dir.mkdir(parents=True, exist_ok=True)
    L.llama_backend_init()
    with tempfile.TemporaryDirectory() as tmp:
        regex = "^(" + "|".join(args.arch or ARCHS) + ")$"
        subprocess.run([str(args.tool), "-a", regex, "-s", str(args.seed), "-o", tmp],
                       check=True, stdout=subprocess.DEVNULL)
        for path in sorted(pathlib.Path(tmp).glob("*.gguf")):
            model, ctx = load(path, n_ctx=args.n_ctx)
            vocab = L.llama_model_get_vocab(model)
            cases = [run_case(model, ctx, vocab, p, f"{path.stem} {p[:20]!r}", STEPS)
                     for p in COMMON + [LIST]]
            L.llama_free(ctx)
            L.llama_model_free(model)
            fx = {
                "file": path.name,
                "seed": args.seed,
                **({"n_ctx": args.n_ctx} if args.n_ctx != 512 else {}),
                "sha256": sha256(path),
                "isa": args.isa,
                "llama_cpp": "llama-cpp-python 0.3.36 (vendored llama.cpp), test-llama-archs, "
                "native build, repack off",
                "cases": cases,
            }
            suffix = f".ctx-{args.n_ctx}" if args.n_ctx != 512 else ""
            out = out_dir / f"{path.stem}{suffix}.json"
            out.write_text(json.dumps(fx, indent=1, ensure_ascii=False) + "\n")
            print(f"{out}: {len(cases)} prompts", file=sys.stderr)


if __name__ == "__main__":
    main()

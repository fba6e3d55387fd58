#!/usr/bin/env python3
"""Reference embeddings of llama.cpp for the demo model and for a BERT encoder, one fixture
per instruction set.

    python3 scripts/gen_embedding_fixtures.py --isa avx2|avx512 [MODEL.gguf]
    python3 scripts/gen_embedding_fixtures.py --isa avx2|avx512 --bert [--bin PATH]

It needs llama.cpp's shared libraries built natively for the instruction set
(`scripts/llamacpp.sh`), found through `LLAMA_CPP_LIB_PATH`, and the `llama_cpp` Python package
of the same source package (llama-cpp-python 0.3.36) on `PYTHONPATH`, with numpy (as
`scripts/gen_model_fixtures.py`, whose loading it shares: repacking off, 2 threads).

It writes `crates/rgml-cli/tests/fixtures/embeddings/<isa>.json`: the model's sha256 and, per
prompt and pooling (`last`, `mean`, `cls`), the tokens (special tokens added and parsed, as
llama-server tokenizes an embedding input) and the pooled embedding that
`llama_get_embeddings_seq` returns for a context with `embeddings` on and that pooling type,
normalised as llama-server's `/v1/embeddings` does (`common_embd_normalize`, Euclidean), each
value as Python prints the f32 (round trip).

With `--bert` the model is `rgml-random-model --arch bert` (a random-weight BERT with llama.cpp's
bge vocabulary, byte for byte the same on every run; built with `cargo build --release -p
rgml-testmodels` unless `--bin` names the generator), which llama.cpp runs as an encoder
(bidirectional attention, no KV cache): the fixture is `embeddings/bert-<isa>.json`, with the
poolings `cls` (the file's) and `mean`, each with flash attention off and on (`"fa"`), and
more prompts (accents, CJK, punctuation, an empty text: the WordPiece tokenizer's cases).
"""

from __future__ import annotations

import argparse
import json
import pathlib
import subprocess
import sys

import numpy as np
import llama_cpp as L

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from gen_model_fixtures import sha256, tokenize  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parent.parent
PROMPTS = [
    "Hello, world",
    "The quick brown fox jumps over the lazy dog. It was a bright cold day in April.",
]
POOLINGS = {"mean": 1, "cls": 2, "last": 3}
BERT_PROMPTS = PROMPTS + [
    "Héllo Wörld! naïve café, 東京タワー and the 2 cats' toys.",
    "",
    " ".join(["A long sentence about retrieval, embeddings and search."] * 12),
]
BERT_POOLINGS = {"cls": 2, "mean": 1}


def normalize(v: np.ndarray) -> np.ndarray:
    """common_embd_normalize with embd_normalize = 2: the squares summed in double."""
    total = 0.0
    for x in v:
        total += float(np.float32(x) * np.float32(x))
    norm = total ** 0.5
    inv = np.float32(1.0 / norm) if norm > 0 else np.float32(0.0)
    return (v.astype(np.float32) * inv).astype(np.float32)


def embed(model, pooling: int, tokens: list[int], flash_attn: bool = False) -> list[float]:
    cp = L.llama_context_default_params()
    cp.n_ctx = 512
    cp.n_batch = 512
    cp.n_ubatch = 512
    cp.n_threads = 2
    cp.n_threads_batch = 2
    cp.flash_attn_type = 1 if flash_attn else 0
    cp.embeddings = True
    cp.pooling_type = pooling
    ctx = L.llama_init_from_model(model, cp)
    if not ctx:
        sys.exit("llama.cpp could not make an embeddings context")
    batch = L.llama_batch_init(len(tokens), 0, 1)
    for i, t in enumerate(tokens):
        batch.token[i] = t
        batch.pos[i] = i
        batch.n_seq_id[i] = 1
        batch.seq_id[i][0] = 0
        batch.logits[i] = True
    batch.n_tokens = len(tokens)
    if L.llama_decode(ctx, batch) != 0:
        sys.exit("llama_decode failed")
    n_embd = L.llama_model_n_embd(model)
    ptr = L.llama_get_embeddings_seq(ctx, 0)
    v = np.ctypeslib.as_array(ptr, shape=(n_embd,)).copy()
    L.llama_batch_free(batch)
    L.llama_free(ctx)
    if not np.all(np.isfinite(v)) or np.ptp(v) == 0:
        sys.exit("embedding not finite or constant")
    return [float(x) for x in normalize(v)]


def bert_model(bin_path: str | None) -> pathlib.Path:
    """The random BERT model, written by rgml-random-model into target/."""
    if bin_path is None:
        subprocess.run(["cargo", "build", "--release", "-q", "-p", "rgml-testmodels"], cwd=ROOT, check=True)
        bin_path = str(ROOT / "target" / "release" / "rgml-random-model")
    out = ROOT / "target" / "bert.gguf"
    subprocess.run([bin_path, "--arch", "bert", "--out", str(out)], cwd=ROOT, check=True)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--isa", required=True, choices=["avx2", "avx512"])
    ap.add_argument("--bert", action="store_true", help="the random BERT encoder instead of MODEL")
    ap.add_argument("--bin", help="the rgml-random-model binary (with --bert)")
    ap.add_argument("model", nargs="?", default=str(ROOT / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"))
    args = ap.parse_args()
    path = bert_model(args.bin) if args.bert else pathlib.Path(args.model)
    L.llama_backend_init()
    mp = L.llama_model_default_params()
    mp.use_extra_bufts = False
    model = L.llama_model_load_from_file(str(path).encode(), mp)
    if not model:
        sys.exit(f"llama.cpp could not load {path}")
    vocab = L.llama_model_get_vocab(model)
    cases = []
    prompts, poolings = (BERT_PROMPTS, BERT_POOLINGS) if args.bert else (PROMPTS, POOLINGS)
    for prompt in prompts:
        tokens = tokenize(vocab, prompt, True)
        for name, pooling in poolings.items():
            for fa in [False, True] if args.bert else [False]:
                case = {"prompt": prompt, "pooling": name, "tokens": tokens,
                        "embedding": embed(model, pooling, tokens, fa)}
                if args.bert:
                    case["fa"] = fa
                cases.append(case)
    out = ROOT / "crates" / "rgml-cli" / "tests" / "fixtures" / "embeddings"
    out.mkdir(parents=True, exist_ok=True)
    name = f"bert-{args.isa}.json" if args.bert else f"{args.isa}.json"
    fixture = {"model": path.name, "sha256": sha256(path), "isa": args.isa, "cases": cases}
    (out / name).write_text(json.dumps(fixture) + "\n")
    print(f"wrote {out / name}: {len(cases)} cases")


if __name__ == "__main__":
    main()

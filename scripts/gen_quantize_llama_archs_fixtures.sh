#!/usr/bin/env bash
# Regenerate crates/rgml-cli/tests/fixtures/quantize_llama_archs.json: the sha256 and size of
# what llama.cpp's `llama-quantize` writes for the mixture-of-experts files of its own
# `test-llama-archs` tool (seed 1, F32, 3-D expert tensors) and its Qwen3.5 hybrid files
# (delta-net tensors), per preset. `tests/llama_archs.rs`
# checks `rgml quantize` against them: the expert rules (MXFP4_MOE's MXFP4 experts and Q8_0
# rest, the K-quant presets' per-layer expert choices) on files that have experts.
#
# Usage: scripts/gen_quantize_llama_archs_fixtures.sh
# llama-quantize and test-llama-archs come from $LLAMA_QUANTIZE and $RGML_TEST_LLAMA_ARCHS if
# set, else from the cached AVX2 llama.cpp build of scripts/llamacpp.sh (built there if needed).
set -euo pipefail
cd "$(dirname "$0")/.."

LLAMA_CPP_PYTHON_VERSION=0.3.36
OUT=crates/rgml-cli/tests/fixtures/quantize_llama_archs.json
SEED=1
# file stem: presets
CASES="gpt-oss-moe:MXFP4_MOE,Q4_K_M qwen3moe-moe:MXFP4_MOE,Q4_K_M,Q2_K qwen35moe-moe:MXFP4_MOE,Q4_K_M,Q2_K qwen35-dense:Q4_K_M,Q8_0"

bin=$(bash scripts/llamacpp.sh --isa avx2 llama-quantize test-llama-archs | tail -n 1)
quantize=${LLAMA_QUANTIZE:-$bin/llama-quantize}
tool=${RGML_TEST_LLAMA_ARCHS:-$bin/test-llama-archs}
export LD_LIBRARY_PATH=$(dirname "$quantize")${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
"$tool" -a "^(gpt-oss|qwen3moe|qwen35|qwen35moe)$" -s "$SEED" -o "$work" >/dev/null
rows=$work/rows
: >"$rows"
for case in $CASES; do
    stem=${case%%:*}
    for preset in ${case#*:}; do
        preset=${preset//,/ }
        for p in $preset; do
            echo "== llama-quantize $stem $p" >&2
            "$quantize" "$work/$stem.gguf" "$work/out.gguf" "$p" 2 >"$work/log" 2>&1 \
                || { tail -n 5 "$work/log" >&2; exit 1; }
            echo "$stem $(sha256sum "$work/$stem.gguf" | cut -d' ' -f1) $p" \
                "$(sha256sum "$work/out.gguf" | cut -d' ' -f1) $(stat -c %s "$work/out.gguf")" >>"$rows"
            rm -f "$work/out.gguf"
        done
    done
done
python3 - "$rows" "$SEED" "$LLAMA_CPP_PYTHON_VERSION" >"$OUT" <<'PY'
import json, sys
rows, seed, version = sys.argv[1:]
files = {}
for line in open(rows):
    stem, source, preset, sha, size = line.split()
    f = files.setdefault(stem, {"sha256": source, "outputs": {}})
    f["outputs"][preset] = {"sha256": sha, "bytes": int(size)}
print(json.dumps({
    "seed": int(seed),
    "generator": f"test-llama-archs -s {seed}; llama-quantize FILE OUT PRESET 2, llama.cpp "
                 f"vendored in llama-cpp-python {version}",
    "files": files,
}, indent=2))
PY
echo "== wrote $OUT" >&2

#!/usr/bin/env bash
# Regenerate crates/rgml-cli/tests/fixtures/quantize.json: for every preset `rgml quantize`
# knows, the sha256 and size of what llama.cpp's `llama-quantize --allow-requantize` writes
# for the demo model (SmolLM2-135M-Instruct Q4_1; no importance matrix). The CLI test
# tests/quantize.rs checks `rgml quantize` against these.
#
# Usage: scripts/gen_quantize_fixtures.sh [-m MODEL] [-o OUT.json]
# llama-quantize comes from $LLAMA_QUANTIZE if set, else from the cached native llama.cpp
# build of scripts/llamacpp.sh (built there the first time, about 10 minutes on 2 cores).
set -euo pipefail
cd "$(dirname "$0")/.."

LLAMA_CPP_PYTHON_VERSION=0.3.36
MODEL=models/SmolLM2-135M-Instruct.Q4_1.gguf
OUT=crates/rgml-cli/tests/fixtures/quantize.json
PRESETS="Q4_0 Q4_1 MXFP4_MOE Q5_0 Q5_1 Q8_0 Q2_K Q3_K_S Q3_K_M Q3_K_L Q4_K_S Q4_K_M Q5_K_S Q5_K_M Q6_K IQ4_NL IQ4_XS F16 BF16 F32"

while getopts "m:o:h" opt; do
    case $opt in
        m) MODEL=$OPTARG ;;
        o) OUT=$OPTARG ;;
        h) sed -n '2,10p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) sed -n '2,10p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2 ;;
    esac
done
log() { echo "== $*" >&2; }

# --- llama-quantize ----------------------------------------------------------------------------
quantize=${LLAMA_QUANTIZE:-}
if [ -z "$quantize" ]; then
    quantize=$(bash scripts/llamacpp.sh llama-quantize | tail -n 1)/llama-quantize
fi
# A shared-library build finds its libraries beside the binary.
export LD_LIBRARY_PATH=$(dirname "$quantize")${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}

# --- the model and the outputs -----------------------------------------------------------------
[ "$MODEL" != models/SmolLM2-135M-Instruct.Q4_1.gguf ] || bash scripts/fetch-model.sh
[ -f "$MODEL" ] || { echo "model $MODEL not found" >&2; exit 1; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
rows=$work/rows
: >"$rows"
for preset in $PRESETS; do
    log "llama-quantize $preset"
    # Two threads: the output does not depend on the count, and this is what CI machines have.
    if ! "$quantize" --allow-requantize "$MODEL" "$work/out.gguf" "$preset" 2 >"$work/log" 2>&1; then
        tail -n 5 "$work/log" >&2
        exit 1
    fi
    echo "$preset $(sha256sum "$work/out.gguf" | cut -d' ' -f1) $(stat -c %s "$work/out.gguf")" >>"$rows"
    rm -f "$work/out.gguf"
done
model_sha=$(sha256sum "$MODEL" | cut -d' ' -f1)
mkdir -p "$(dirname "$OUT")"
python3 - "$rows" "$(basename "$MODEL")" "$model_sha" "$LLAMA_CPP_PYTHON_VERSION" >"$OUT" <<'PY'
import json, sys
rows, model, model_sha, version = sys.argv[1:]
outputs = {}
for line in open(rows):
    preset, sha, size = line.split()
    outputs[preset] = {"sha256": sha, "bytes": int(size)}
print(json.dumps({
    "model": model,
    "model_sha256": model_sha,
    "generator": f"llama-quantize --allow-requantize MODEL OUT PRESET 2, llama.cpp vendored in "
                 f"llama-cpp-python {version}",
    "outputs": outputs,
}, indent=2))
PY
log "wrote $OUT"

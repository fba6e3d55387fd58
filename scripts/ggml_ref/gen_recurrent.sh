#!/usr/bin/env bash
# Regenerate crates/rgml-cpu/tests/fixtures/ggml_recurrent/<avx2|avx512>/ from a llama.cpp build's
# ggml: SSM_CONV and GATED_DELTA_NET (see recurrent_ref.c and run_isa_ref.sh).
#
# Usage: scripts/ggml_ref/gen_recurrent.sh --isa avx2|native
exec bash "$(dirname "$0")/run_isa_ref.sh" recurrent "$@"

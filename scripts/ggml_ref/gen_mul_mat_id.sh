#!/usr/bin/env bash
# Regenerate crates/rgml-cpu/tests/fixtures/ggml_mul_mat_id/<avx2|avx512>/ from a llama.cpp build's ggml
# (see mul_mat_id_ref.c and run_isa_ref.sh).
#
# Usage: scripts/ggml_ref/gen_mul_mat_id.sh --isa avx2|native
exec bash "$(dirname "$0")/run_isa_ref.sh" mul_mat_id "$@"

#!/usr/bin/env bash
# Fuzz the GGUF reader (target gguf_reader in crates/rgml-gguf/fuzz) with inputs of up to 64 KiB,
# seeded with real headers. Not part of CI; works on a fresh Debian machine with rustup, python3
# and a C++ compiler (installs cargo-fuzz, and the nightly toolchain unless RUSTC_BOOTSTRAP=1 on
# stable is wanted).
#
#   scripts/fuzz-gguf.sh [RUNS [LIBFUZZER_FLAG...]]
#
# RUNS: executions (default 10000000; -1 runs until stopped). Extra flags go to libFuzzer (e.g.
# -max_total_time=600). One worker: pass no -jobs/-workers on a shared machine.
#
# Seeds (regenerated on every run, under $RGML_FUZZ_DIR/seeds, default ~/.cache/rgml/fuzz-gguf):
#  - from the demo model (fetched if missing) by `cargo run --example fuzz_seeds`: its first
#    64 KiB as they are, its key-values and 272 tensor infos shrunk into whole files that parse
#    (v3 and v2), its key-values alone, and its tensor-info section alone;
#  - from the PyPI `gguf` package (ggml's own Python writer, in a venv under ~/.cache/rgml): every
#    value and tensor type, nested arrays, a custom alignment, a tokenizer-sized vocab,
#    a big-endian file and a v2 file (skipped with a warning if pip cannot install it);
#  - the hostile corpus, crates/rgml-gguf/tests/corpus (read only).
# New inputs go to $RGML_FUZZ_DIR/corpus, kept between runs; crashes to
# crates/rgml-gguf/fuzz/artifacts/gguf_reader/ (minimize with `cargo fuzz tmin gguf_reader FILE`).
#
# The target is built with `-s none` (no AddressSanitizer) unless FUZZ_SANITIZER says otherwise:
# everything from_bytes reaches is safe Rust, so ASan could only slow it down (about 2x); debug
# assertions and overflow checks stay on.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
runs=${1:-10000000}
shift || true
dir=${RGML_FUZZ_DIR:-$HOME/.cache/rgml/fuzz-gguf}
seeds=$dir/seeds
corpus=$dir/corpus
sanitizer=${FUZZ_SANITIZER:-none}
mkdir -p "$seeds" "$corpus"

# Toolchain: cargo-fuzz needs nightly (or RUSTC_BOOTSTRAP=1 on stable) and a C++ compiler for
# libFuzzer.
if ! command -v c++ >/dev/null 2>&1 && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends g++
fi
if [ "${RUSTC_BOOTSTRAP:-}" = 1 ]; then
    toolchain=()
else
    rustup toolchain list | grep -q '^nightly' || rustup toolchain install nightly --profile minimal
    toolchain=(+nightly)
fi
if ! cargo fuzz --version >/dev/null 2>&1; then
    cargo install cargo-fuzz --locked || cargo install cargo-fuzz
fi

# Seeds from the real model, by rgml's reader and writer.
bash scripts/fetch-model.sh
cargo run -q --locked -p rgml-gguf --example fuzz_seeds -- \
    models/SmolLM2-135M-Instruct.Q4_1.gguf "$seeds"

# Seeds from ggml's Python writer.
venv=$HOME/.cache/rgml/gguf-venv
if { [ -x "$venv/bin/python" ] || python3 -m venv "$venv"; } &&
    "$venv/bin/pip" install -q --disable-pip-version-check gguf==0.19.0 &&
    "$venv/bin/python" scripts/fuzz_gguf_seeds.py "$seeds"; then
    :
else
    echo "warning: no seeds from the PyPI gguf package (could not install it in $venv)" >&2
fi
ls -l "$seeds"

cd crates/rgml-gguf/fuzz
cargo "${toolchain[@]}" fuzz build -s "$sanitizer" gguf_reader
exec cargo "${toolchain[@]}" fuzz run -s "$sanitizer" gguf_reader "$corpus" "$seeds" "$root/crates/rgml-gguf/tests/corpus" -- \
    -max_len=65536 -runs="$runs" -print_final_stats=1 "$@"

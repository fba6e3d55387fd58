#!/usr/bin/env bash
# Fuzz the RPC server (target rpc_server in crates/rgml-rpc/fuzz): arbitrary client byte
# streams are decoded, checked and served against the CPU device (graphs rebuilt and computed)
# with a 1 MiB memory cap. Not part of CI; works on a fresh Debian machine with rustup and a C++
# compiler (installs cargo-fuzz, and the nightly toolchain unless RUSTC_BOOTSTRAP=1 on stable
# is wanted).
#
#   scripts/fuzz-rpc.sh [RUNS [LIBFUZZER_FLAG...]]
#
# RUNS: executions (default 10000000; -1 runs until stopped). Extra flags go to libFuzzer (e.g.
# -max_total_time=600). One worker: pass no -jobs/-workers on a shared machine.
#
# Seeds (regenerated on every run under $RGML_FUZZ_DIR/seeds, default ~/.cache/rgml/fuzz-rpc):
# whole conversations over several op families (`cargo run --example rpc_fuzz_seeds`, the
# conversations of crates/rgml-rpc/tests/common/seeds.rs). New inputs go to
# $RGML_FUZZ_DIR/corpus, kept between runs; crashes to crates/rgml-rpc/fuzz/artifacts/.
#
# The target is built with AddressSanitizer unless FUZZ_SANITIZER says otherwise (e.g. none,
# about twice as fast): served graphs reach the CPU kernels, whose unsafe code it watches.
set -euo pipefail
cd "$(dirname "$0")/.."
runs=${1:-10000000}
shift || true
dir=${RGML_FUZZ_DIR:-$HOME/.cache/rgml/fuzz-rpc}
seeds=$dir/seeds
corpus=$dir/corpus
sanitizer=${FUZZ_SANITIZER:-address}
mkdir -p "$seeds" "$corpus"

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

cargo run -q --locked -p rgml-rpc --example rpc_fuzz_seeds -- "$seeds"
ls -l "$seeds"

cd crates/rgml-rpc/fuzz
cargo "${toolchain[@]}" fuzz build -s "$sanitizer" rpc_server
exec cargo "${toolchain[@]}" fuzz run -s "$sanitizer" rpc_server "$corpus" "$seeds" -- \
    -max_len=65536 -runs="$runs" -print_final_stats=1 "$@"

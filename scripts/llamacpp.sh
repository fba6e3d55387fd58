#!/usr/bin/env bash
# Builds the reference llama.cpp (the copy vendored in the PyPI source package llama-cpp-python,
# CPU only, shared libraries, AMX off: ggml's AMX path dies with SIGILL on these VMs) once per
# instruction set into a cache directory, and prints the directory holding its binaries and
# libraries. Used by the fixture and benchmark scripts; not part of CI.
#
# Usage: scripts/llamacpp.sh [--isa native|avx2|avx512] [--rpc] [TARGET ...]
#   --isa native   GGML_NATIVE=ON: what this CPU has (the default)
#   --isa avx2     AVX2 + FMA + F16C + BMI2, no AVX-512: the AVX2 path, also on an AVX-512 CPU
#   --isa avx512   AVX-512 F/BW/DQ/VL/VNNI/BF16 (needs such a CPU to run)
#   --rpc          with ggml's RPC backend (-DGGML_RPC=ON, its own build directory): the
#                  targets ggml-rpc-server and the tools' --rpc flag
#   TARGET         CMake targets (default: llama-bench llama-quantize llama-perplexity llama);
#                  llama-server turns LLAMA_BUILD_SERVER on in the build directory
# The cache is $RGML_LLAMACPP_DIR (default ${XDG_CACHE_HOME:-$HOME/.cache}/rgml/llamacpp); a build
# takes about 10 minutes on 2 cores. The Python bindings of the same package work with these
# libraries: PYTHONPATH=<cache>/llama-cpp-python-<version> LLAMA_CPP_LIB_PATH=<printed dir>.
set -euo pipefail

LLAMA_CPP_PYTHON_VERSION=0.3.36
cache=${RGML_LLAMACPP_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/rgml/llamacpp}
isa=native
rpc=OFF
while [ $# -gt 0 ]; do
    case $1 in
        --isa) isa=${2:?--isa needs a value}; shift 2 ;;
        --rpc) rpc=ON; shift ;;
        *) break ;;
    esac
done
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(llama-bench llama-quantize llama-perplexity llama)
case $isa in
    native) flags=(-DGGML_NATIVE=ON) ;;
    avx2) flags=(-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON
        -DGGML_BMI2=ON -DGGML_AVX512=OFF) ;;
    avx512) flags=(-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON
        -DGGML_BMI2=ON -DGGML_AVX512=ON -DGGML_AVX512_VNNI=ON -DGGML_AVX512_BF16=ON) ;;
    *) echo "unknown --isa '$isa' (native, avx2 or avx512)" >&2; exit 2 ;;
esac

log() { echo "== $*" >&2; }

need=()
command -v cmake >/dev/null 2>&1 || need+=(cmake)
{ command -v cc >/dev/null 2>&1 && command -v c++ >/dev/null 2>&1 && command -v make >/dev/null 2>&1; } ||
    need+=(build-essential)
if [ ${#need[@]} -gt 0 ]; then
    log "installing ${need[*]} with apt-get"
    sudo=()
    [ "$(id -u)" = 0 ] || sudo=(sudo)
    "${sudo[@]}" apt-get update -qq
    DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi

src=$cache/llama-cpp-python-$LLAMA_CPP_PYTHON_VERSION
build=$cache/build-$LLAMA_CPP_PYTHON_VERSION-$isa
[ "$rpc" = OFF ] || build=$build-rpc
mkdir -p "$cache"
if [ ! -f "$src/vendor/llama.cpp/CMakeLists.txt" ]; then
    sdist=$cache/llama_cpp_python-$LLAMA_CPP_PYTHON_VERSION.tar.gz
    if [ ! -f "$sdist" ]; then
        log "downloading llama-cpp-python==$LLAMA_CPP_PYTHON_VERSION (source package)"
        python3 -m pip download --no-binary llama-cpp-python --no-deps --quiet \
            --disable-pip-version-check -d "$cache" "llama-cpp-python==$LLAMA_CPP_PYTHON_VERSION"
    fi
    log "unpacking $sdist"
    rm -rf "$src" "$cache/llama_cpp_python-$LLAMA_CPP_PYTHON_VERSION"
    tar -xzf "$sdist" -C "$cache"
    mv "$cache/llama_cpp_python-$LLAMA_CPP_PYTHON_VERSION" "$src"
fi

missing=()
for t in "${targets[@]}"; do
    case $t in
        llama) [ -f "$build/bin/libllama.so" ] || missing+=("$t") ;;
        *) [ -x "$build/bin/$t" ] || missing+=("$t") ;;
    esac
done
server=OFF
for t in "${targets[@]}"; do [ "$t" != llama-server ] || server=ON; done
if [ ${#missing[@]} -gt 0 ]; then
    # The server is off unless asked for (it is a long build); asking turns it on in an existing
    # build directory too, whose other targets stay built.
    if [ ! -f "$build/CMakeCache.txt" ] ||
        { [ $server = ON ] && grep -q '^LLAMA_BUILD_SERVER:BOOL=OFF' "$build/CMakeCache.txt"; }; then
        cmake -S "$src/vendor/llama.cpp" -B "$build" -DCMAKE_BUILD_TYPE=Release "${flags[@]}" \
            -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF \
            -DGGML_RPC=$rpc -DGGML_CUDA=OFF -DGGML_VULKAN=OFF -DGGML_METAL=OFF -DGGML_BLAS=OFF \
            -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_SERVER=$server \
            -DBUILD_SHARED_LIBS=ON >"$build.configure.log" 2>&1 ||
            { tail -n 30 "$build.configure.log" >&2; exit 1; }
    fi
    log "building ${missing[*]} ($isa, RPC $rpc) in $build: about 10 minutes on 2 cores"
    cmake --build "$build" --target "${missing[@]}" -j "$(nproc)" >"$build.build.log" 2>&1 ||
        { tail -n 30 "$build.build.log" >&2; exit 1; }
fi
echo "$build/bin"

#!/usr/bin/env bash
# Builds the reference llama.cpp (the copy vendored in the PyPI source package llama-cpp-python,
# CPU only, shared libraries, AMX off: ggml's AMX path dies with SIGILL on these VMs) once per
# instruction set into a cache directory, and prints the directory holding its binaries and
# libraries. Used by the fixture and benchmark scripts; not part of CI.
#
# Usage: scripts/llamacpp.sh [--isa native|avx2|avx512] [--rpc] [--vulkan [--vk-tools T]] [--dir]
#            [TARGET ...]
#   --isa native   GGML_NATIVE=ON without AMX: what this CPU has (the default, except with --vulkan)
#   --isa avx2     AVX2 + FMA + F16C + BMI2, no AVX-512: the AVX2 path, also on an AVX-512 CPU
#   --isa avx512   AVX-512 F/BW/DQ/VL/VNNI/BF16 (needs such a CPU to run)
#   --rpc          with ggml's RPC backend (-DGGML_RPC=ON, its own build directory): the
#                  targets ggml-rpc-server and the tools' --rpc flag
#   --vulkan       with ggml's Vulkan backend (-DGGML_VULKAN=ON, its own build directory
#                  build-<version>-<isa>-vulkan), for carrying to a GPU machine: the CPU part
#                  defaults to --isa avx2 (that machine's CPU is unknown), the default target is
#                  llama-bench (with its libraries), and the binaries get RUNPATH $ORIGIN so the
#                  bin/ directory runs from wherever it is copied (it needs a Vulkan loader,
#                  libvulkan.so.1, and a driver there; besides glibc and libstdc++ only
#                  libgomp.so.1, which scripts/gpu-device-pack.sh packs: LLAMA_OPENSSL is off, so
#                  no libssl). Shader generation (155 shader files, thousands of variants) makes
#                  this build slow: 21 minutes on 2 cores shared with other builds. The
#                  binaries and libraries: llama-bench 18 KB, libggml-vulkan.so 44 MB (the
#                  SPIR-V; 4.7 MB xz-compressed), libllama-common 6.1 MB, libllama 4.6 MB,
#                  libggml-cpu 1.4 MB, libggml-base 0.9 MB, libllama-bench-impl, libggml: 55 MB
#                  in all before strip.
#   --vk-tools trixie|bookworm
#                  where the shader compiler (glslc) and the Vulkan/SPIR-V headers come from
#                  (default trixie). bookworm: Debian 12's own packages (glslc from shaderc
#                  2023.2 / glslang 11.13, libvulkan-dev 1.3.239, spirv-headers), installed with
#                  apt-get. They build, but that glslc lacks GL_KHR_cooperative_matrix,
#                  GL_NV_cooperative_matrix2 and GL_EXT_integer_dot_product (ggml's
#                  vulkan-shaders/feature-tests/*.comp fail), so ggml-vulkan is built without
#                  its cooperative-matrix (coopmat, NVIDIA coopmat2) mat-mat shaders and its
#                  int8-dot (MMQ) shaders, and VK_KHR_cooperative_matrix / VK_NV_cooperative_
#                  matrix2 are not even in the 1.3.239 headers: on an NVIDIA GPU prompts would run
#                  the scalar fallback, far below what llama.cpp's Vulkan backend does for a user
#                  with a current Vulkan SDK. trixie: the fix, Debian 13's glslc 2025.2 (glslang
#                  15.1.0, which compiles the coopmat, coopmat2 and integer-dot feature tests;
#                  still not GL_EXT_bfloat16, float_e2m1/e4m3 or coopmat2 decode_vector, which
#                  ggml only uses for BF16/MXFP4-type weights and an optional coopmat2 detail),
#                  libvulkan-dev 1.4.309 (vulkan.hpp with VK_KHR_cooperative_matrix and
#                  VK_NV_cooperative_matrix2) and spirv-headers 1.4.309. They are fetched with
#                  `apt-get download` through a private apt state (trixie's package list under
#                  the cache, nothing installed) and unpacked with dpkg -x under
#                  <cache>/vulkan-tools-trixie/root. Trixie's glslc needs glibc 2.38 and
#                  libstdc++ 13, so trixie's libc6, libstdc++6 and libgcc-s1 are unpacked there
#                  too and <cache>/vulkan-tools-trixie/glslc is a wrapper that starts glslc
#                  through trixie's own ld-linux-x86-64.so.2 with --library-path (the system's
#                  libraries are untouched). The headers are header-only and the built code
#                  links against bookworm's libvulkan.so.1 (ggml loads every Vulkan function
#                  through vulkan.hpp's dynamic dispatcher, so only vkGetInstanceProcAddr is
#                  linked), so the binaries still need only glibc 2.36.
#   --dir          print the bin directory these options build into and exit (nothing built)
#   TARGET         CMake targets (default: llama-bench llama-quantize llama-perplexity llama;
#                  with --vulkan: llama-bench); llama-server turns LLAMA_BUILD_SERVER on in the
#                  build directory, test-llama-archs (random-weight files of every architecture,
#                  `-o DIR -s SEED -a REGEX`) LLAMA_BUILD_TESTS
# The cache is $RGML_LLAMACPP_DIR (default ${XDG_CACHE_HOME:-$HOME/.cache}/rgml/llamacpp); a build
# takes about 10 minutes on 2 cores. The Python bindings of the same package work with these
# libraries: PYTHONPATH=<cache>/llama-cpp-python-<version> LLAMA_CPP_LIB_PATH=<printed dir>.
set -euo pipefail

LLAMA_CPP_PYTHON_VERSION=0.3.36
cache=${RGML_LLAMACPP_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/rgml/llamacpp}
isa=
rpc=OFF
vulkan=OFF
vk_tools=trixie
print_dir=0
while [ $# -gt 0 ]; do
    case $1 in
        --isa) isa=${2:?--isa needs a value}; shift 2 ;;
        --rpc) rpc=ON; shift ;;
        --vulkan) vulkan=ON; shift ;;
        --vk-tools) vk_tools=${2:?--vk-tools needs a value}; shift 2 ;;
        --dir) print_dir=1; shift ;;
        *) break ;;
    esac
done
case $vk_tools in
    trixie|bookworm) ;;
    *) echo "unknown --vk-tools '$vk_tools' (trixie or bookworm)" >&2; exit 2 ;;
esac
if [ -z "$isa" ]; then
    isa=native
    [ $vulkan = OFF ] || isa=avx2
fi
targets=("$@")
if [ ${#targets[@]} -eq 0 ]; then
    if [ $vulkan = ON ]; then
        targets=(llama-bench)
    else
        targets=(llama-bench llama-quantize llama-perplexity llama)
    fi
fi
no_amx="-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
case $isa in
    # -march=native turns AMX on where the CPU has it, and ggml's AMX matmul (on with repacking,
    # its default) dies with SIGILL on these VMs; the GGML_AMX_* options below only act without
    # GGML_NATIVE. Its own build directory (native-noamx), so older native builds are not reused.
    native) flags=(-DGGML_NATIVE=ON -DCMAKE_C_FLAGS="$no_amx" -DCMAKE_CXX_FLAGS="$no_amx") ;;
    avx2) flags=(-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON
        -DGGML_BMI2=ON -DGGML_AVX512=OFF) ;;
    avx512) flags=(-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON
        -DGGML_BMI2=ON -DGGML_AVX512=ON -DGGML_AVX512_VNNI=ON -DGGML_AVX512_BF16=ON) ;;
    *) echo "unknown --isa '$isa' (native, avx2 or avx512)" >&2; exit 2 ;;
esac

log() { echo "== $*" >&2; }

src=$cache/llama-cpp-python-$LLAMA_CPP_PYTHON_VERSION
build=$cache/build-$LLAMA_CPP_PYTHON_VERSION-$isa
[ "$isa" != native ] || build=$build-noamx
[ "$rpc" = OFF ] || build=$build-rpc
[ "$vulkan" = OFF ] || build=$build-vulkan
[ "$vulkan" = OFF ] || [ "$vk_tools" = trixie ] || build=$build-bookworm
if [ $print_dir = 1 ]; then
    echo "$build/bin"
    exit 0
fi

sudo=()
[ "$(id -u)" = 0 ] || sudo=(sudo)
need=()
command -v cmake >/dev/null 2>&1 || need+=(cmake)
{ command -v cc >/dev/null 2>&1 && command -v c++ >/dev/null 2>&1 && command -v make >/dev/null 2>&1; } ||
    need+=(build-essential)
if [ $vulkan = ON ]; then
    # The loader to link against (and to run on lavapipe here); bookworm's tools if asked for.
    [ -e /usr/lib/x86_64-linux-gnu/libvulkan.so.1 ] || need+=(libvulkan1)
    if [ "$vk_tools" = bookworm ]; then
        command -v glslc >/dev/null 2>&1 || need+=(glslc)
        [ -f /usr/include/vulkan/vulkan.hpp ] || need+=(libvulkan-dev)
        [ -f /usr/share/cmake/SPIRV-Headers/SPIRV-HeadersConfig.cmake ] || need+=(spirv-headers)
    fi
    command -v dpkg >/dev/null 2>&1 || { echo "--vulkan needs Debian's dpkg and apt-get" >&2; exit 1; }
fi
if [ ${#need[@]} -gt 0 ]; then
    log "installing ${need[*]} with apt-get"
    "${sudo[@]}" apt-get update -qq
    DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi

mkdir -p "$cache"

# Debian 13's shader compiler and Vulkan/SPIR-V headers, unpacked (not installed) under the
# cache; see --vk-tools in the header.
trixie_vulkan_tools() {
    local dir=$cache/vulkan-tools-trixie
    if [ ! -x "$dir/glslc" ] || [ ! -f "$dir/root/usr/include/vulkan/vulkan.hpp" ]; then
        log "fetching Debian trixie's glslc, libvulkan-dev and spirv-headers into $dir"
        rm -rf "$dir"
        mkdir -p "$dir/apt/lists/partial" "$dir/apt/cache/archives/partial" "$dir/debs" "$dir/root"
        echo "deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://deb.debian.org/debian trixie main" \
            >"$dir/apt/sources.list"
        local o=(-oDir::State::Lists="$dir/apt/lists" -oDir::Etc::SourceList="$dir/apt/sources.list"
            -oDir::Etc::SourceParts=/dev/null -oDir::State::Status=/dev/null
            -oDir::Cache="$dir/apt/cache" -oAPT::Architecture=amd64 -oAPT::Architectures=amd64
            -oAPT::Sandbox::User="$(id -un)" -qq)
        apt-get "${o[@]}" update
        (cd "$dir/debs" && apt-get "${o[@]}" download glslc libshaderc1 libc6 libstdc++6 libgcc-s1 \
            libvulkan-dev spirv-headers)
        local f
        for f in "$dir"/debs/*.deb; do dpkg -x "$f" "$dir/root"; done
        cat >"$dir/glslc" <<'WRAP'
#!/bin/sh
# Debian trixie's glslc, run through trixie's own dynamic loader and libraries (written by
# scripts/llamacpp.sh --vulkan).
d=$(dirname "$(readlink -f "$0")")/root
l=$d/usr/lib/x86_64-linux-gnu
exec "$l/ld-linux-x86-64.so.2" --library-path "$l" "$d/usr/bin/glslc" "$@"
WRAP
        chmod +x "$dir/glslc"
        "$dir/glslc" --version >&2 || { echo "trixie's glslc does not run here" >&2; exit 1; }
    fi
    vk_flags=(-DVulkan_GLSLC_EXECUTABLE="$dir/glslc" -DVulkan_INCLUDE_DIR="$dir/root/usr/include"
        -DVulkan_LIBRARY=/usr/lib/x86_64-linux-gnu/libvulkan.so.1
        -DSPIRV-Headers_DIR="$dir/root/usr/share/cmake/SPIRV-Headers")
}
vk_flags=()
if [ "$vulkan" = ON ]; then
    [ "$vk_tools" = bookworm ] || trixie_vulkan_tools
    # $ORIGIN: bin/ runs from wherever it is copied (the libraries sit beside the binaries);
    # no OpenSSL (llama-common's HTTP client): one library fewer to carry.
    vk_flags+=(-DCMAKE_BUILD_RPATH="\$ORIGIN" -DLLAMA_OPENSSL=OFF)
fi
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
tests=OFF
for t in "${targets[@]}"; do
    [ "$t" != llama-server ] || server=ON
    [ "$t" != test-llama-archs ] || tests=ON
done
# A Vulkan build directory configured before OpenSSL was turned off is reconfigured and its
# targets relinked (the shaders stay built).
if [ "$vulkan" = ON ] && grep -q '^LLAMA_OPENSSL:BOOL=ON' "$build/CMakeCache.txt" 2>/dev/null; then
    missing=("${targets[@]}")
fi
if [ ${#missing[@]} -gt 0 ]; then
    # The server is off unless asked for (it is a long build); asking turns it on in an existing
    # build directory too, whose other targets stay built.
    if [ ! -f "$build/CMakeCache.txt" ] ||
        { [ $server = ON ] && grep -q '^LLAMA_BUILD_SERVER:BOOL=OFF' "$build/CMakeCache.txt"; } ||
        { [ $tests = ON ] && grep -q '^LLAMA_BUILD_TESTS:BOOL=OFF' "$build/CMakeCache.txt"; } ||
        { [ "$vulkan" = ON ] && grep -q '^LLAMA_OPENSSL:BOOL=ON' "$build/CMakeCache.txt"; }; then
        cmake -S "$src/vendor/llama.cpp" -B "$build" -DCMAKE_BUILD_TYPE=Release "${flags[@]}" \
            -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF \
            -DGGML_RPC=$rpc -DGGML_CUDA=OFF -DGGML_VULKAN=$vulkan -DGGML_METAL=OFF -DGGML_BLAS=OFF \
            -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=$tests -DLLAMA_BUILD_SERVER=$server \
            ${vk_flags[@]+"${vk_flags[@]}"} \
            -DBUILD_SHARED_LIBS=ON >"$build.configure.log" 2>&1 ||
            { tail -n 30 "$build.configure.log" >&2; exit 1; }
    fi
    if [ "$vulkan" = ON ]; then
        grep -E 'by glslc' "$build.configure.log" >&2 || true
    fi
    log "building ${missing[*]} ($isa, RPC $rpc, Vulkan $vulkan) in $build: about 10 minutes on 2 cores (25 with Vulkan)"
    cmake --build "$build" --target "${missing[@]}" -j "$(nproc)" >"$build.build.log" 2>&1 ||
        { tail -n 30 "$build.build.log" >&2; exit 1; }
fi
echo "$build/bin"

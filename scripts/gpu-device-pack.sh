#!/usr/bin/env bash
# Packs what scripts/gpu-device-check.sh needs on the GPU machine (issue 30) into .gpucheck/ in
# the repository root, the folder a device `run` carries (carry [".gpucheck"]). Not part of CI.
#
#   .gpucheck/gpucheck.tar.xz   bin/rgml, bin/rgml-random-model (release, stripped);
#                               llama/llama-bench and the shared libraries it loads (llama.cpp
#                               with -DGGML_VULKAN=ON from scripts/llamacpp.sh --vulkan, CPU part
#                               AVX2, stripped, RUNPATH $ORIGIN: runs from wherever unpacked);
#                               vocab/ggml-vocab-llama-bpe.gguf (the llama-* shapes' vocabulary)
#                               and vocab/smollm2-135m.vocab.gguf (the demo model's tokenizer.*
#                               keys, no tensors: the demo model itself, 98 MB, is too big)
#   .gpucheck/*.deb             the Vulkan loader and GL friends, downloaded as the device README
#                               says (libvulkan1 libegl1 libglvnd0 libopengl0 libgl1 libglx0
#                               libgles2, amd64): the device has NVIDIA's driver but no loader
#   .gpucheck/MANIFEST          what is inside, sizes, versions, the commit
#
# The device generates its models itself (rgml-random-model --shape ... --type ...). The whole
# working tree that travels (tracked and untracked-not-ignored files, plus the carry) must stay
# under 64 MiB: the script prints both sizes and fails above 62 MiB together (a margin for files
# others add before the run). It adds /.gpucheck/ to .git/info/exclude.
#
# Usage: scripts/gpu-device-pack.sh [--no-build] [--bin-dir DIR]
#   --no-build     use target/release/{rgml,rgml-random-model} and the llama.cpp build as they
#                  are (fails if missing) instead of building them first
#   --bin-dir DIR  take rgml and rgml-random-model from DIR (no cargo build), e.g. a release
#                  build of another checkout
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD

build=1
bin_dir=target/release
while [ $# -gt 0 ]; do
    case $1 in
        --no-build) build=0; shift ;;
        --bin-dir) bin_dir=${2:?--bin-dir needs a directory}; rgml_build=0; shift 2 ;;
        -h | --help) sed -n '2,26p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) echo "unknown argument '$1' (--no-build, --bin-dir DIR)" >&2; exit 2 ;;
    esac
done
rgml_build=${rgml_build:-$build}

log() { echo "== $*" >&2; }
LIMIT_MIB=64
MARGIN_MIB=2

pack=$root/.gpucheck
exclude=$(git rev-parse --git-path info/exclude)
mkdir -p "$(dirname "$exclude")"
grep -qx '/.gpucheck/' "$exclude" 2>/dev/null || echo '/.gpucheck/' >>"$exclude"

need=()
command -v strip >/dev/null 2>&1 || need+=(binutils)
command -v xz >/dev/null 2>&1 || need+=(xz-utils)
if [ ${#need[@]} -gt 0 ]; then
    log "installing ${need[*]} with apt-get"
    sudo=()
    [ "$(id -u)" = 0 ] || sudo=(sudo)
    "${sudo[@]}" apt-get update -qq
    DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi

# 1. rgml and rgml-random-model, release.
if [ "$rgml_build" = 1 ]; then
    log "cargo build --release -p rgml-cli -p rgml-testmodels"
    cargo build --release -p rgml-cli -p rgml-testmodels
fi
for b in rgml rgml-random-model; do
    [ -x "$bin_dir/$b" ] || { echo "$bin_dir/$b is missing" >&2; exit 1; }
done

# 2. llama.cpp with the Vulkan backend (built once, cached; see scripts/llamacpp.sh).
if [ $build = 1 ]; then
    llama_bin=$(bash scripts/llamacpp.sh --vulkan llama-bench)
else
    llama_bin=$(bash scripts/llamacpp.sh --vulkan --dir)
fi
[ -x "$llama_bin/llama-bench" ] || { echo "no Vulkan llama-bench in '$llama_bin'" >&2; exit 1; }

# 3. The vocabularies the shapes copy their tokenizer from.
[ -f models/vocab/ggml-vocab-llama-bpe.gguf ] || bash scripts/fetch-vocab.sh
[ -f models/SmolLM2-135M-Instruct.Q4_1.gguf ] || bash scripts/fetch-model.sh

stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
mkdir -p "$stage/bin" "$stage/llama" "$stage/vocab"
cp "$bin_dir/rgml" "$bin_dir/rgml-random-model" "$stage/bin/"
strip "$stage/bin/rgml" "$stage/bin/rgml-random-model"

# llama-bench and every library it loads from the build directory, under the names it asks for
# (the sonames), as plain files.
cp "$llama_bin/llama-bench" "$stage/llama/"
libs=$(LD_LIBRARY_PATH=$llama_bin ldd "$llama_bin/llama-bench" | awk -v d="$llama_bin/" 'index($3, d) == 1 { print $1 }')
[ -n "$libs" ] || { echo "ldd found no llama.cpp libraries for $llama_bin/llama-bench" >&2; exit 1; }
for l in $libs; do cp -L "$llama_bin/$l" "$stage/llama/$l"; done
# Libraries from the system that a machine with only glibc, libstdc++ and the Vulkan loader may
# lack (OpenMP's libgomp.so.1): beside the others, found through the same $ORIGIN.
sys_libs=$(LD_LIBRARY_PATH=$llama_bin ldd "$llama_bin/llama-bench" | awk -v d="$llama_bin/" '
    $3 ~ /^\// && index($3, d) != 1 && $1 !~ /^(libc|libm|libstdc\+\+|libgcc_s|libvulkan|ld-linux.*|libpthread|libdl|librt)\.so/ { print $3 }')
for l in $sys_libs; do cp -L "$l" "$stage/llama/"; done
strip "$stage/llama/llama-bench"
strip --strip-unneeded "$stage"/llama/*.so*
# RUNPATH $ORIGIN (set at configure time) lets the copy find its libraries; check it survived.
# shellcheck disable=SC2016
if ! readelf -d "$stage/llama/llama-bench" | grep -q 'R.*PATH.*\$ORIGIN'; then
    echo "llama-bench has no \$ORIGIN RUNPATH (rebuild with scripts/llamacpp.sh --vulkan)" >&2
    exit 1
fi
missing=$(cd "$stage/llama" && env -u LD_LIBRARY_PATH ldd ./llama-bench | { grep 'not found' || true; })
[ -z "$missing" ] || { echo "the packed llama-bench misses libraries: $missing" >&2; exit 1; }

cp models/vocab/ggml-vocab-llama-bpe.gguf "$stage/vocab/"
python3 - models/SmolLM2-135M-Instruct.Q4_1.gguf "$stage/vocab/smollm2-135m.vocab.gguf" <<'PY'
# A vocabulary-only GGUF: the source's tokenizer.* keys (and general.architecture), no tensors,
# as llama.cpp's ggml-vocab-*.gguf files are; rgml-random-model copies only tokenizer.* keys.
import struct, sys
src, dst = sys.argv[1], sys.argv[2]
f = open(src, 'rb')
magic, version = f.read(4), struct.unpack('<I', f.read(4))[0]
if magic != b'GGUF' or version not in (2, 3):
    raise SystemExit(f'{src}: not a GGUF v2/v3 file')
n_tensors, n_kv = struct.unpack('<QQ', f.read(16))
SIZES = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
def skip_value(t):
    if t in SIZES:
        f.seek(SIZES[t], 1)
    elif t == 8:
        (n,) = struct.unpack('<Q', f.read(8)); f.seek(n, 1)
    elif t == 9:
        et, n = struct.unpack('<IQ', f.read(12))
        if et in SIZES:
            f.seek(SIZES[et] * n, 1)
        else:
            for _ in range(n):
                skip_value(et)
    else:
        raise SystemExit(f'{src}: unknown GGUF value type {t}')
kept = []
for _ in range(n_kv):
    start = f.tell()
    (klen,) = struct.unpack('<Q', f.read(8)); key = f.read(klen).decode()
    (t,) = struct.unpack('<I', f.read(4)); skip_value(t)
    end = f.tell()
    if key.startswith('tokenizer.') or key == 'general.architecture':
        f.seek(start); kept.append(f.read(end - start))
with open(dst, 'wb') as o:
    o.write(b'GGUF' + struct.pack('<IQQ', version, 0, len(kept)))
    for kv in kept:
        o.write(kv)
PY

# 4. The Vulkan loader debs, exactly as the device README downloads them.
rm -rf "$pack"
mkdir -p "$pack" /tmp/amd64/partial
o=(-oAPT::Architecture=amd64 -oAPT::Architectures=amd64 -oDir::State::Lists=/tmp/amd64)
log "apt-get download libvulkan1 libegl1 libglvnd0 libopengl0 libgl1 libglx0 libgles2 (amd64)"
apt-get "${o[@]}" update -qq
(cd "$pack" && apt-get "${o[@]}" -oAPT::Sandbox::User="$(id -un)" -qq download \
    libvulkan1 libegl1 libglvnd0 libopengl0 libgl1 libglx0 libgles2)

# 5. Manifest, tarball, sizes.
{
    echo "packed $(date -u +%Y-%m-%dT%H:%M:%SZ) from $(git rev-parse --short HEAD)$(git diff --quiet HEAD -- crates 2>/dev/null || echo ' (+ uncommitted changes in crates/)')"
    echo "rgml: $bin_dir; llama.cpp: llama-cpp-python 0.3.36 sdist, Vulkan, from $llama_bin"
    grep -h -E 'supported by glslc' "$(dirname "$llama_bin").configure.log" 2>/dev/null |
        sed 's/^-- /  /' || true
    echo "files (bytes):"
    (cd "$stage" && find . -type f -printf '  %p %s\n' | sort)
    (cd "$pack" && find . -name '*.deb' -printf '  %p %s\n' | sort)
} >"$stage/MANIFEST"
cp "$stage/MANIFEST" "$pack/MANIFEST"
log "compressing (xz -9)"
tar -C "$stage" -cf - bin llama vocab MANIFEST | xz -9 -T2 >"$pack/gpucheck.tar.xz"

mib() { awk -v b="$1" 'BEGIN { printf "%.1f MiB", b / 1048576 }'; }
raw=$(du -sb "$stage" | cut -f1)
carry=$(du -sb "$pack" | cut -f1)
tree=$(git ls-files -z --cached --others --exclude-standard | xargs -0 -r stat -c %s -- 2>/dev/null |
    awk '{ s += $1 } END { print s + 0 }')
total=$((carry + tree))
cat "$pack/MANIFEST"
echo "unpacked payload: $(mib "$raw"); .gpucheck (carry): $(mib "$carry"); working tree that travels besides: $(mib "$tree"); together: $(mib "$total") of $LIMIT_MIB MiB"
if [ "$total" -gt $(((LIMIT_MIB - MARGIN_MIB) * 1048576)) ]; then
    echo "over $((LIMIT_MIB - MARGIN_MIB)) MiB: a device run would refuse it" >&2
    exit 1
fi
echo "device run: carry [\".gpucheck\"], command: bash scripts/gpu-device-check.sh"

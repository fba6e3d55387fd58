#!/usr/bin/env bash
# Run a command against Mesa's lavapipe from Debian trixie-backports (Mesa 26), whose CPU Vulkan
# device has VK_KHR_cooperative_matrix (8x8x8 f16), so mul_mm_coop can be tested without a GPU.
# Debian 12's own lavapipe (Mesa 22.3) lacks cooperative matrices. Developer tool, not CI.
#
# Usage: bash scripts/mesa-trixie.sh <program> [args...]
#   e.g. bash scripts/mesa-trixie.sh target/release/rgml devices
#        bash scripts/mesa-trixie.sh target/release/deps/opcheck-<hash> wgpu_fast_arithmetic
# Cache: $RGML_MESA_TRIXIE_CACHE (default ~/.cache/rgml/mesa-trixie), ~310 MB unpacked (38 .debs);
# delete it to refetch. Nothing is installed system-wide and the system's apt setup is untouched.
set -euo pipefail
[ $# -ge 1 ] || { sed -n '6,8p' "$0" >&2; exit 2; }

CACHE=${RGML_MESA_TRIXIE_CACHE:-$HOME/.cache/rgml/mesa-trixie}
ROOT=$CACHE/root                        # the .debs are unpacked here (dpkg -x)
LIB=$ROOT/usr/lib/x86_64-linux-gnu      # trixie is usr-merged: every library lands here
ICD=$CACHE/lvp_icd.json

if [ ! -e "$CACHE/.done" ]; then
  # A private apt state (sources, lists, cache, an empty dpkg status) so that apt-get resolves
  # and downloads trixie packages as if nothing were installed, without root or system changes.
  A=$CACHE/apt
  mkdir -p "$A/lists/partial" "$A/cache/archives/partial" "$A/sources.list.d" "$A/prefs.d" "$CACHE/debs"
  : > "$A/status"
  key=/usr/share/keyrings/debian-archive-keyring.gpg   # bookworm's keyring already has trixie's keys
  printf 'deb [arch=amd64 signed-by=%s] http://deb.debian.org/debian %s main\n' \
    "$key" trixie "$key" trixie-backports > "$A/sources.list"
  APT=(-o "Dir::Etc::SourceList=$A/sources.list" -o "Dir::Etc::SourceParts=$A/sources.list.d"
       -o "Dir::Etc::Preferences=$A/prefs" -o "Dir::Etc::PreferencesParts=$A/prefs.d"
       -o "Dir::State=$A" -o "Dir::State::Lists=$A/lists" -o "Dir::State::status=$A/status"
       -o "Dir::Cache=$A/cache" -o APT::Architecture=amd64 -o APT::Architectures=amd64
       -o Debug::NoLocking=1 -o APT::Sandbox::User=root
       -t trixie-backports)   # prefer backports' versions: that is where Mesa 26 lives
  apt-get "${APT[@]}" -q update >&2
  # The driver, trixie's Vulkan loader and everything they depend on, recursively (libc6,
  # libstdc++6, libgcc-s1, libLLVM, zstd, expat, libdrm, xcb/x11/wayland, ...). The system's
  # own libraries are older (glibc 2.36 < the 2.39 Mesa needs), so all of them come from trixie.
  pkgs=$(apt-cache "${APT[@]}" depends --recurse --no-recommends --no-suggests --no-conflicts \
           --no-breaks --no-replaces --no-enhances mesa-vulkan-drivers libvulkan1 | grep -v '^[ <]' | sort -u)
  (cd "$CACHE/debs" && apt-get "${APT[@]}" -q download $pkgs >&2)
  rm -rf "$ROOT"
  for deb in "$CACHE"/debs/*.deb; do dpkg -x "$deb" "$ROOT"; done
  # The packaged ICD names the bare soname; point it at the unpacked driver instead.
  sed "s|\"libvulkan_lvp.so\"|\"$LIB/libvulkan_lvp.so\"|" "$ROOT/usr/share/vulkan/icd.d/lvp_icd.json" > "$ICD"
  # Fail now, not at run time, if any library the driver or the loader needs is missing.
  for so in libvulkan_lvp.so libvulkan.so.1; do
    if "$LIB/ld-linux-x86-64.so.2" --library-path "$LIB" --list "$LIB/$so" | grep -q 'not found'; then
      echo "mesa-trixie: $so has unresolved libraries" >&2; exit 1
    fi
  done
  rm -rf "$A" "$CACHE/debs"   # only the unpacked tree is needed from now on
  touch "$CACHE/.done"
fi

# Only lavapipe: VK_DRIVER_FILES for new loaders, VK_ICD_FILENAMES for old ones.
export VK_DRIVER_FILES=$ICD VK_ICD_FILENAMES=$ICD
# The loader and Mesa want a runtime dir (wayland/x11 WSI probing); containers often lack one.
if [ -z "${XDG_RUNTIME_DIR:-}" ]; then
  XDG_RUNTIME_DIR=$(mktemp -d); export XDG_RUNTIME_DIR
  trap 'rm -rf "$XDG_RUNTIME_DIR"' EXIT
fi
# Trixie's dynamic loader with trixie's libraries first: the program (built against bookworm's
# glibc, which trixie's is compatible with) then dlopens trixie's libvulkan and the driver.
# Not exec'd, so the trap above can clean up; the program's exit status is ours (set -e).
prog=$1
[[ $prog == */* ]] || prog=$(type -P "$prog") || { echo "mesa-trixie: $1 not found" >&2; exit 127; }
"$LIB/ld-linux-x86-64.so.2" --library-path "$LIB" "$prog" "${@:2}"

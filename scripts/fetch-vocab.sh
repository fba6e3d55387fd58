#!/usr/bin/env bash
# Put llama.cpp's vocabulary-only GGUF files (tokenizer metadata of Llama 3, Qwen2, Qwen3.5,
# Phi-3, LLaMA SentencePiece, Gemma 4 and BERT's WordPiece (bge), no weights) in models/vocab/
# unless they are already there.
# They ship in the PyPI source package llama-cpp-python 0.3.36 (vendor/llama.cpp/models/); the
# package is cached where scripts/llamacpp.sh caches it, so it is downloaded at most once.
set -euo pipefail
cd "$(dirname "$0")/.."

version=0.3.36
sdist_sha=832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e
cache=${RGML_LLAMACPP_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/rgml/llamacpp}
sdist=$cache/llama_cpp_python-$version.tar.gz
files=(
    "97272e430d53bc7688f52d5e0ad8ea8f163ede9f1bbd1694feaa504797d5d96e ggml-vocab-llama-bpe.gguf"
    "44c2f46b715f585c6ab513970e8a006bfa5badd6108560054921cf598d154d8c ggml-vocab-qwen2.gguf"
    "63ed952ff338996cf0bdf24a7b10015124273f75c6dc9bb427356aa3f67ec62c ggml-vocab-qwen35.gguf"
    "967d7190d11c4842eab697079d98d56c2116e10eb617be355a2733bfc132e326 ggml-vocab-phi-3.gguf"
    "16c3724582d59aa8bf84711894e833f916ee46a31d80e21312759c48bf8d0e69 ggml-vocab-llama-spm.gguf"
    "58b1ba0b57f3b4d7c468ba4ffd91ad85190346a3d7ad7e71d1cabaae8a14bb65 ggml-vocab-gemma-4.gguf"
    "fbcbe22278fb302694d5f4a41bfe48c5f90e8e3554eab1c0435387dff654a854 ggml-vocab-bert-bge.gguf"
)

have_all() {
    for entry in "${files[@]}"; do
        set -- $entry
        [ -f "models/vocab/$2" ] && echo "$1  models/vocab/$2" | sha256sum --check --quiet --status || return 1
    done
}
have_all && exit 0

mkdir -p "$cache" models/vocab
if ! { [ -f "$sdist" ] && echo "$sdist_sha  $sdist" | sha256sum --check --quiet --status; }; then
    tmp=$(mktemp -d)
    trap 'rm -rf "$tmp"' EXIT
    # pip prepares an sdist's metadata with its build backend (scikit-build-core), which it
    # installs into an isolated environment: no build isolation fails on a fresh machine.
    python3 -m pip download --no-binary llama-cpp-python --no-deps --quiet \
        --disable-pip-version-check "llama-cpp-python==$version" -d "$tmp"
    echo "$sdist_sha  $tmp/llama_cpp_python-$version.tar.gz" | sha256sum --check --quiet
    mv "$tmp/llama_cpp_python-$version.tar.gz" "$sdist"
fi
members=()
for entry in "${files[@]}"; do
    set -- $entry
    members+=("llama_cpp_python-$version/vendor/llama.cpp/models/$2")
done
tar -xzf "$sdist" -C models/vocab --strip-components=4 "${members[@]}"
for entry in "${files[@]}"; do
    set -- $entry
    echo "$1  models/vocab/$2" | sha256sum --check --quiet
done
echo "fetched models/vocab/"

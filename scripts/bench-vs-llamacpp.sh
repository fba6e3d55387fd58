#!/usr/bin/env bash
# rgml vs llama.cpp on this machine, side by side (issue 7). Not part of CI.
#
# Builds the reference llama.cpp (the copy vendored in the PyPI source package llama-cpp-python,
# CPU only, AMX off: ggml's AMX path dies with SIGILL on this VM) once into a cache directory,
# builds `rgml` in release, then runs llama-bench and `rgml bench` alternately on the same GGUF
# (the demo model), R rounds each, and prints both tools' pp and tg tokens/s (mean over rounds)
# and the ratios rgml / llama.cpp against the issue's targets (tg >= 1.5x, pp >= 2x).
#
# Usage: scripts/bench-vs-llamacpp.sh [-r ROUNDS] [-t THREADS] [-p N_PROMPT] [-n N_GEN] [-m MODEL]
# The same settings come from the environment: ROUNDS, THREADS, N_PROMPT, N_GEN, MODEL.
# The llama.cpp build lives in $RGML_LLAMACPP_DIR (default ${XDG_CACHE_HOME:-$HOME/.cache}/rgml/llamacpp).
set -euo pipefail
cd "$(dirname "$0")/.."

LLAMA_CPP_PYTHON_VERSION=0.3.36
ROUNDS=${ROUNDS:-3}
THREADS=${THREADS:-2}
N_PROMPT=${N_PROMPT:-256}
N_GEN=${N_GEN:-64}
MODEL=${MODEL:-}
cache=${RGML_LLAMACPP_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/rgml/llamacpp}

usage() { sed -n '2,13p' "$0" | sed 's/^# \{0,1\}//'; }
while getopts "r:t:p:n:m:h" opt; do
    case $opt in
        r) ROUNDS=$OPTARG ;;
        t) THREADS=$OPTARG ;;
        p) N_PROMPT=$OPTARG ;;
        n) N_GEN=$OPTARG ;;
        m) MODEL=$OPTARG ;;
        h) usage; exit 0 ;;
        *) usage >&2; exit 2 ;;
    esac
done
for v in ROUNDS THREADS N_PROMPT N_GEN; do
    if ! [[ ${!v} =~ ^[1-9][0-9]*$ ]]; then
        echo "$v must be a positive integer (got '${!v}')" >&2
        exit 2
    fi
done

log() { echo "== $*" >&2; }

# --- tools: cmake and a C/C++ toolchain -----------------------------------------------------
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

# --- llama.cpp (cached) ----------------------------------------------------------------------
src=$cache/llama-cpp-python-$LLAMA_CPP_PYTHON_VERSION
build=$cache/build-$LLAMA_CPP_PYTHON_VERSION
llama_bench=$build/bin/llama-bench
if [ ! -x "$llama_bench" ]; then
    mkdir -p "$cache"
    if [ ! -f "$src/vendor/llama.cpp/CMakeLists.txt" ]; then
        sdist=$(ls "$cache"/llama_cpp_python-"$LLAMA_CPP_PYTHON_VERSION".tar.gz 2>/dev/null || true)
        if [ -z "$sdist" ]; then
            log "downloading llama-cpp-python==$LLAMA_CPP_PYTHON_VERSION (source package)"
            # --no-binary for this package only: its build requirements (scikit-build-core, cmake,
            # ninja) may come as wheels to prepare its metadata; from source they take very long.
            python3 -m pip download --no-binary llama-cpp-python --no-deps --quiet \
                --disable-pip-version-check -d "$cache" "llama-cpp-python==$LLAMA_CPP_PYTHON_VERSION"
            sdist=$(ls "$cache"/llama_cpp_python-"$LLAMA_CPP_PYTHON_VERSION".tar.gz)
        fi
        log "unpacking $sdist"
        rm -rf "$src"
        tar -xzf "$sdist" -C "$cache"
        [ -d "$src" ] || mv "$cache/llama_cpp_python-$LLAMA_CPP_PYTHON_VERSION" "$src"
    fi
    log "building llama-bench (CPU only, AMX off) in $build: about 10 minutes on 2 cores"
    cmake -S "$src/vendor/llama.cpp" -B "$build" -DCMAKE_BUILD_TYPE=Release \
        -DGGML_NATIVE=ON -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF \
        -DGGML_CUDA=OFF -DGGML_VULKAN=OFF -DGGML_METAL=OFF -DGGML_BLAS=OFF \
        -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_SERVER=OFF -DBUILD_SHARED_LIBS=OFF \
        >"$cache/cmake-configure.log" 2>&1 ||
        { tail -n 30 "$cache/cmake-configure.log" >&2; exit 1; }
    cmake --build "$build" --target llama-bench -j "$(nproc)" >"$cache/cmake-build.log" 2>&1 ||
        { tail -n 30 "$cache/cmake-build.log" >&2; exit 1; }
    [ -x "$llama_bench" ] || { echo "llama-bench not built; see $cache/cmake-build.log" >&2; exit 1; }
fi

# --- rgml and the model ----------------------------------------------------------------------
log "building rgml (release)"
cargo build --release --quiet -p rgml-cli
rgml=target/release/rgml
if [ -z "$MODEL" ]; then
    bash scripts/fetch-model.sh
    MODEL=models/SmolLM2-135M-Instruct.Q4_1.gguf
fi
[ -f "$MODEL" ] || { echo "model $MODEL not found" >&2; exit 1; }

# --- alternate rounds ------------------------------------------------------------------------
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
results=$work/results
: >"$results"
for round in $(seq 1 "$ROUNDS"); do
    log "round $round/$ROUNDS: llama-bench"
    # One JSON array per run; each entry is one test (pp or tg) with avg_ts in tokens/s.
    if ! "$llama_bench" -m "$MODEL" -p "$N_PROMPT" -n "$N_GEN" -t "$THREADS" -r 1 -o json \
        >"$work/llama.json" 2>"$work/llama.err"; then
        cat "$work/llama.err" >&2
        exit 1
    fi
    python3 - "$work/llama.json" >>"$results" <<'PY'
import json, sys
for t in json.load(open(sys.argv[1])):
    kind = "pp" if t["n_gen"] == 0 else "tg"
    print("llama.cpp", kind, t["avg_ts"])
PY
    log "round $round/$ROUNDS: rgml bench"
    "$rgml" bench -m "$MODEL" -p "$N_PROMPT" -n "$N_GEN" -t "$THREADS" -r 1 --json >"$work/rgml.json"
    python3 - "$work/rgml.json" >>"$results" <<'PY'
import json, sys
v = json.loads(open(sys.argv[1]).read().strip().splitlines()[-1])
print("rgml pp", v["pp_tok_s"])
print("rgml tg", v["tg_tok_s"])
PY
done

# --- report ----------------------------------------------------------------------------------
python3 - "$results" "$N_PROMPT" "$N_GEN" "$THREADS" "$ROUNDS" "$MODEL" "$LLAMA_CPP_PYTHON_VERSION" <<'PY'
import statistics, sys
path, n_prompt, n_gen, threads, rounds, model, llama_version = sys.argv[1:]
runs = {}
for line in open(path):
    tool, kind, ts = line.split()
    runs.setdefault((tool, kind), []).append(float(ts))
def mean(tool, kind):
    v = runs.get((tool, kind), [])
    return statistics.mean(v) if v else float("nan")
def spread(tool, kind):
    v = runs.get((tool, kind), [])
    return statistics.stdev(v) if len(v) > 1 else 0.0
cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "?")
print(f"model {model}, {threads} threads, {rounds} rounds (alternating), CPU {cpu}")
print(f"llama.cpp: llama-bench from llama-cpp-python {llama_version} (CPU, AMX off); tokens/s, mean ± sd")
print(f"| test | llama.cpp | rgml | rgml / llama.cpp | target | |")
print(f"| --- | ---: | ---: | ---: | ---: | --- |")
for kind, n, target in (("pp", n_prompt, 2.0), ("tg", n_gen, 1.5)):
    l, r = mean("llama.cpp", kind), mean("rgml", kind)
    ratio = r / l if l > 0 else float("nan")
    verdict = "PASS" if ratio >= target else "MISS"
    print(f"| {kind}{n} | {l:.1f} ± {spread('llama.cpp', kind):.1f} | {r:.1f} ± {spread('rgml', kind):.1f} "
          f"| {ratio:.2f}x | >= {target:g}x | {verdict} |")
print("per round (and best round: least disturbed by other work on the machine):")
for kind in ("pp", "tg"):
    best = {}
    for tool in ("llama.cpp", "rgml"):
        v = runs.get((tool, kind), [])
        best[tool] = max(v, default=float("nan"))
        print(f"  {kind} {tool:9}: " + "  ".join(f"{x:7.1f}" for x in v) + f"   best {best[tool]:.1f}")
    print(f"  {kind} best rgml / best llama.cpp: {best['rgml'] / best['llama.cpp']:.2f}x")
load = open("/proc/loadavg").read().split()[0]
print(f"load average (1 min) after the runs: {load} on {__import__('os').cpu_count()} CPUs"
      " (anything besides the benchmark makes the figures noisy)")
PY

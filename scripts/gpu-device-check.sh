#!/usr/bin/env bash
# rgml's GPU backend against llama.cpp's Vulkan backend on the lent GPU machine (issue 30), as
# one prepared run. Not part of CI. Prepare here with scripts/gpu-device-pack.sh (it fills
# .gpucheck/), then run on the device from the repository root:
#     run(command="bash scripts/gpu-device-check.sh", carry=[".gpucheck"], timeout_s=540)
# It ends within 8 minutes: every step has its own cap, clipped to what is left of the whole
# budget (default 450 s), and a step that fails, times out or meets a flag rgml does not have
# yet is noted in its row and the run goes on. Steps, in this order:
#   - unpack .gpucheck/gpucheck.tar.xz; unpack the Vulkan loader debs (.gpucheck/*.deb) into /
#     when no libvulkan.so.1 is there; export NVIDIA's VK_DRIVER_FILES when rgml sees no GPU;
#     nvidia-smi (name, memory, clocks), `rgml devices`, `llama-bench --list-devices`;
#   - the GPU memory bandwidth: a PyTorch device-to-device copy (bytes read + written / time);
#   - the models, into a temporary folder: rgml-random-model --shape smollm2-135m --type Q4_1
#     (the demo model's shape) first, then in the background llama-1b Q4_K_M, llama-8b Q4_K_M,
#     llama-1b Q8_0, llama-1b F16 and qwen3moe-30b-a3b Q4_K_M with 32 experts (MUL_MAT_ID and
#     the routing on the GPU), then gpt-oss-20b MXFP4_MOE with 16 experts and
#     qwen35moe-35b-a3b Q4_K_M with 32 (MXFP4 experts, the delta net and multi-section ROPE);
#   - RGML_WGPU_EXACT=1 and =0 `rgml test-ops -b Vulkan0` ('N passed, M failed'), the fast one
#     also with RGML_WGPU_COOPMAT=0 (the register-tiled prompt kernel instead of tensor cores);
#   - the smollm2 model's `rgml logits --json --top 10` on Vulkan0 (exact and fast) against the
#     CPU's: top-1 agreement, top-10 overlap, the largest logit difference on the shared ids;
#     its perplexity on docs/GPU.md (8 chunks of 256) on Vulkan0 fast (with and without
#     cooperative matrices) against the CPU's (issue 30's bar: within 0.5%);
#   - per model, llama-bench -ngl 99 (Vulkan) and rgml bench -ngl 99 alternating: pp512 + tg128
#     (-r 3), then tg128 at depth 4096 (-d 4096); on llama-1b Q4_K_M also -ngl 8 (half of its
#     16 blocks) for both and rgml on the CPU alone (--device CPU). Order: llama-8b Q4_K_M,
#     rgml's kernel profile on llama-8b (pp512, tg32), llama-1b Q4_K_M (+ -ngl 8, CPU),
#     llama-8b at depth, llama-1b Q8_0 and F16, the mixture of experts, smollm2, the
#     other depths: what matters most for the targets first, should the budget run out.
# Output (also under $OUT, which the device tool brings back): gpu-table.md (the table),
# gpu-check.log (everything printed), gpu-results.json (the parsed numbers and each step's
# status), gpu-raw.tar.gz (each step's stdout/stderr), gpu-profile-{pp,tg}.txt (rgml's GPU time
# per kernel on llama-8b Q4_K_M, from `rgml bench --trace` and scripts/trace-kernels.py),
# gpu-perf-model.txt (with --perf-model: `rgml test-ops --mode perf-model`, MUL_MAT alone at
# the 8B shapes, each run waited for, so short products show the submit-and-wait latency),
# gpu-llama-perf.txt (llama.cpp's GPU time per op in a decode, GGML_VK_PERF_LOGGER); the
# profile step also times llama-8b's tg64 with block mat-vec variants (RGML_WGPU_MV_ROWS 0 1 2,
# RGML_WGPU_MV_TEAM 32 128, RGML_WGPU_FUSE_GLU=0), with RGML_WGPU_MV_DP4A=1 and with -fa off,
# and pp512 without cooperative matrices.
# Without $OUT they go to /tmp/gpucheck-out.
#
# Usage: scripts/gpu-device-check.sh [--quick|--dry-run] [--budget SECONDS] [--models LIST]
#            [--no-checks] [--no-bench]
#   --quick, --dry-run  tiny sizes to try the whole script here on lavapipe (Mesa's CPU Vulkan
#                       driver): smollm2-135m only, -p 32 -n 8 -r 1, depth 64, -ngl 15 of 30
#                       blocks, budget 1500 s, caps x4; uses target/release and the llama.cpp
#                       build directly when .gpucheck/ has no package
#   --budget S          the whole run's seconds (default 450; 1500 with --quick)
#   --models LIST       only these models, comma-separated keys: smollm2-q4_1, llama1b-q4_k_m,
#                       llama1b-q8_0, llama1b-f16, llama8b-q4_k_m, qwen3moe-q4_k_m,
#                       gptoss-mxfp4, qwen35moe-q4_k_m (e.g. for a rerun; the last two are the
#                       plan's last pairs, run if the budget is left)
#   --no-checks         skip test-ops and logits;  --no-bench: skip the benches
#   --perf-model        also `rgml test-ops --mode perf-model` (about a minute)
#   --tune              instead of the benches, only llama-8b's tuning variants (`bench_tune`:
#                       DP4A and flash attention on and off, tg64 and tg32 at depth 4096); with
#                       --no-checks --models llama8b-q4_k_m it takes about two minutes
# Functions run through run_step (a `bash -c` of their text) look unreachable to shellcheck.
# shellcheck disable=SC2317
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
root=$PWD

quick=0
budget=
only=
checks=1
benches=1
perf_model=0
tune=0
while [ $# -gt 0 ]; do
    case $1 in
        --quick | --dry-run) quick=1; shift ;;
        --budget) budget=${2:?--budget needs seconds}; shift 2 ;;
        --models) only=${2:?--models needs a list}; shift 2 ;;
        --no-checks) checks=0; shift ;;
        --perf-model) perf_model=1; shift ;;
        --tune) tune=1; shift ;;
        --no-bench) benches=0; shift ;;
        -h | --help) sed -n '2,37p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) echo "unknown argument '$1' (see --help)" >&2; exit 2 ;;
    esac
done
[ -n "$budget" ] || { [ $quick = 1 ] && budget=1500 || budget=450; }
[[ $budget =~ ^[0-9]+$ ]] || { echo "--budget takes whole seconds" >&2; exit 2; }

T0=$(date +%s)
DEADLINE=$((T0 + budget))
OUT=${OUT:-${TMPDIR:-/tmp}/gpucheck-out}
mkdir -p "$OUT"
rm -f "$OUT/gpu-table.md" "$OUT/gpu-check.log" "$OUT/gpu-results.json" "$OUT/gpu-raw.tar.gz" \
    "$OUT"/gpu-profile-*.txt "$OUT/gpu-perf-model.txt" "$OUT/gpu-llama-perf.txt"
W=$(mktemp -d "${TMPDIR:-/tmp}/gpucheck.XXXXXX")
mkdir -p "$W/steps" "$W/models"

if [ $quick = 1 ]; then
    SCALE=4
    NP=32 NG=8 REPS=1 DEPTH=64 PPL_CHUNKS=1
else
    SCALE=1
    NP=512 NG=128 REPS=3 DEPTH=4096 PPL_CHUNKS=8
fi
# key | shape | type | blocks (for -ngl half)
MODELS=(
    "smollm2-q4_1 smollm2-135m Q4_1 30"
    "llama1b-q4_k_m llama-1b Q4_K_M 16"
    "llama1b-q8_0 llama-1b Q8_0 16"
    "llama1b-f16 llama-1b F16 16"
    "llama8b-q4_k_m llama-8b Q4_K_M 32"
    "qwen3moe-q4_k_m qwen3moe-30b-a3b Q4_K_M 48"
    "gptoss-mxfp4 gpt-oss-20b MXFP4_MOE 24"
    "qwen35moe-q4_k_m qwen35moe-35b-a3b Q4_K_M 40"
)
[ $quick = 0 ] || MODELS=("${MODELS[0]}")
HALF_MODEL=llama1b-q4_k_m
[ $quick = 0 ] || HALF_MODEL=smollm2-q4_1
LOGITS_MODEL=smollm2-q4_1

selected() { [ -z "$only" ] || [[ ",$only," == *",$1,"* ]]; }
model_field() { # KEY FIELD (2 shape, 3 type, 4 blocks)
    local m f
    for m in "${MODELS[@]}"; do
        read -r -a f <<<"$m"
        if [ "${f[0]}" = "$1" ]; then echo "${f[$(($2 - 1))]}"; return 0; fi
    done
    return 1
}

elapsed() { echo $(($(date +%s) - T0)); }
say() { echo "[$(printf '%4d' "$(elapsed)")s] $*"; }

# run_step NAME CAP CMD...: runs CMD with stdout/stderr in $W/steps/NAME.{out,err}, under
# `timeout` of min(CAP x SCALE, what is left of the budget); records NAME, status (OK, FAIL rc,
# TIMEOUT, NOFLAG <flag>, SKIP), seconds and the timeout in $W/steps.tsv; on failure prints the
# last lines of the step's stderr. Returns the command's status (125 when skipped).
run_step() {
    local name=$1 cap=$(($2 * SCALE)) t left rc t0 t1 status flag
    shift 2
    local shown="$*"
    if declare -F "$1" >/dev/null; then
        # A function of this script: run it in a bash that has the functions and settings.
        set -- bash -c "$(declare -p root W quick SCALE RGML GEN LLAMA_BENCH VOCAB_DIR 2>/dev/null)
$(declare -f)
\"\$@\"" run_step "$@"
    fi
    left=$((DEADLINE - $(date +%s)))
    t=$cap
    [ "$t" -le "$left" ] || t=$left
    if [ "$t" -lt 3 ]; then
        printf '%s\tSKIP\t0\t0\n' "$name" >>"$W/steps.tsv"
        say "$name: SKIP (budget spent)"
        return 125
    fi
    say "$name: $shown (timeout ${t}s)"
    t0=$(date +%s.%N)
    timeout -k 5 "$t" "$@" >"$W/steps/$name.out" 2>"$W/steps/$name.err"
    rc=$?
    t1=$(date +%s.%N)
    local dt
    dt=$(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.1f", b - a }')
    if [ $rc = 0 ]; then
        status=OK
    elif [ $rc = 124 ] || [ $rc = 137 ]; then
        status=TIMEOUT
    else
        # clap: "unexpected argument '-d' found"; rgml-random-model: 'unknown argument "--shape"';
        # -ngl before rgml has it reads as -n with the value "gl".
        flag=$(grep -o -E "(unexpected|unknown) argument ['\"][^'\"]*['\"]" "$W/steps/$name.err" | head -1 |
            sed -E "s/.*argument ['\"]([^'\"]*)['\"]/\1/")
        [ -n "$flag" ] || ! grep -q -E "invalid value 'gl'|'--n-gen <N_GEN>' cannot be used multiple" \
            "$W/steps/$name.err" || flag=-ngl
        if [ -n "$flag" ]; then status="NOFLAG $flag"; else status="FAIL $rc"; fi
    fi
    printf '%s\t%s\t%s\t%s\n' "$name" "$status" "$dt" "$t" >>"$W/steps.tsv"
    say "$name: $status in ${dt}s"
    if [ $rc != 0 ]; then
        tail -n 6 "$W/steps/$name.err" | sed 's/^/    | /'
        [ -s "$W/steps/$name.err" ] || tail -n 6 "$W/steps/$name.out" | sed 's/^/    | /'
    fi
    return $rc
}

# The status a step got (empty if it did not run).
step_status() { awk -F'\t' -v n="$1" '$1 == n { s = $2 } END { print s }' "$W/steps.tsv" 2>/dev/null; }

unpack_payload() {
    local tgz=$root/.gpucheck/gpucheck.tar.xz dest=$W/pkg
    mkdir -p "$dest"
    if [ -f "$tgz" ]; then
        if command -v xz >/dev/null 2>&1; then
            tar -C "$dest" -xJf "$tgz"
        else
            python3 -c 'import sys, tarfile; tarfile.open(sys.argv[1], "r:xz").extractall(sys.argv[2])' "$tgz" "$dest"
        fi || return 1
        RGML=$dest/bin/rgml
        GEN=$dest/bin/rgml-random-model
        LLAMA_BENCH=$dest/llama/llama-bench
        VOCAB_DIR=$dest/vocab
        cat "$dest/MANIFEST"
    elif [ "$quick" = 1 ]; then
        # Here, without a package: the builds themselves.
        RGML=$root/target/release/rgml
        GEN=$root/target/release/rgml-random-model
        LLAMA_BENCH=$(bash "$root/scripts/llamacpp.sh" --vulkan --dir)/llama-bench
        VOCAB_DIR=$dest/vocab
        mkdir -p "$VOCAB_DIR"
        cp "$root/models/vocab/ggml-vocab-llama-bpe.gguf" "$VOCAB_DIR/" &&
            cp "$root/models/SmolLM2-135M-Instruct.Q4_1.gguf" "$VOCAB_DIR/smollm2-135m.vocab.gguf"
    else
        echo "no $tgz: run scripts/gpu-device-pack.sh first and carry .gpucheck" >&2
        return 1
    fi
}

# Vulkan loader and driver. The debs go to / only where no loader is installed (the device).
setup_vulkan() {
    local cache
    cache=$(ldconfig -p 2>/dev/null)
    if ! grep -q 'libvulkan\.so\.1' <<<"$cache"; then
        local f n=0
        for f in "$root"/.gpucheck/*.deb; do
            [ -f "$f" ] || { echo "no loader debs in .gpucheck/" >&2; return 1; }
            dpkg -x "$f" / || return 1
            n=$((n + 1))
        done
        ldconfig
        echo "unpacked $n debs into /"
    else
        echo "a Vulkan loader is installed: $(grep -m1 'libvulkan\.so\.1' <<<"$cache")"
    fi
}

has_gpu() {
    local list
    list=$("$RGML" devices --json 2>/dev/null)
    grep -q '"name": *"Vulkan' <<<"$list"
}

bandwidth() {
    PYTHONUNBUFFERED=1 python3 - "$quick" <<'PY'
import json, sys, time
quick = sys.argv[1] == "1"
try:
    import torch
    if not torch.cuda.is_available():
        raise RuntimeError("torch sees no CUDA device")
    n = 1 << 30
    a = torch.empty(n, dtype=torch.uint8, device="cuda")
    b = torch.empty_like(a)
    a.fill_(1)
    for _ in range(3):
        b.copy_(a)
    torch.cuda.synchronize()
    iters = 20
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    e0.record()
    for _ in range(iters):
        b.copy_(a)
    e1.record()
    torch.cuda.synchronize()
    s = e0.elapsed_time(e1) / 1e3
    print(json.dumps({"gbs": 2 * n * iters / s / 1e9, "method": "torch device-to-device copy, 1 GiB x 20, read+write",
                      "device": torch.cuda.get_device_name()}))
except Exception as e:
    if not quick:
        raise
    # Here (lavapipe) the GPU's memory is the host's: a memcpy of 256 MiB, read + written.
    print(f"no CUDA ({e}); host memcpy instead", file=sys.stderr)
    n = 256 << 20
    a = bytearray(b"\1") * n
    b = bytearray(n)
    b[:] = a
    best = 0.0
    for _ in range(5):
        t = time.perf_counter()
        b[:] = a
        best = max(best, 2 * n / (time.perf_counter() - t) / 1e9)
    print(json.dumps({"gbs": best, "method": "host memcpy 256 MiB, read+written (no CUDA)", "device": "host"}))
PY
}

gen_model() { # KEY
    local key=$1 shape type vocab
    shape=$(model_field "$key" 2)
    type=$(model_field "$key" 3)
    vocab=$VOCAB_DIR/ggml-vocab-llama-bpe.gguf
    [ "$shape" != smollm2-135m ] || vocab=$VOCAB_DIR/smollm2-135m.vocab.gguf
    local cap=40 experts=()
    case $key in llama1b-f16) cap=50 ;; llama8b-*) cap=90 ;; smollm2-*) cap=30 ;; esac
    # The mixture of experts with 32 of its 128 experts (as wide, 8 used per token: a decode
    # step's work in a 5.3 GB file), on the Llama 3 vocabulary carried for the others.
    case $key in qwen3moe-*) cap=90 experts=(--experts 32) ;; esac
    # gpt-oss-20b with 16 of its 32 MXFP4 experts (4 used per token: MUL_MAT_ID's MXFP4
    # decode), Qwen3.5-35B-A3B with 32 of 256 (its delta-net layers, SSM_CONV and
    # GATED_DELTA_NET, and multi-section ROPE on the GPU).
    case $key in gptoss-*) cap=90 experts=(--experts 16) ;; qwen35moe-*) cap=90 experts=(--experts 32) ;; esac
    if ! run_step "gen-$key" $cap "$GEN" --shape "$shape" --type "$type" --vocab "$vocab" \
        "${experts[@]}" --out "$W/models/$key.gguf"; then
        rm -f "$W/models/$key.gguf"
        # A dry run here can stand in the demo model itself for its shape.
        if [ "$quick" = 1 ] && [ "$key" = smollm2-q4_1 ] && [ -f "$root/models/SmolLM2-135M-Instruct.Q4_1.gguf" ]; then
            ln -s "$root/models/SmolLM2-135M-Instruct.Q4_1.gguf" "$W/models/$key.gguf"
            say "gen-$key: using the demo model models/SmolLM2-135M-Instruct.Q4_1.gguf instead"
            echo "demo-model-stand-in=yes" >>"$W/features"
        fi
    fi
    [ ! -s "$W/models/$key.gguf" ] || stat -L -c %s "$W/models/$key.gguf" >"$W/models/$key.bytes"
}

# rgml's GPU flags: -ngl 99 if rgml has it, else --device Vulkan0 (noted in the results). rgml
# offloads by default only to a GPU that is not a CPU driver, so the dry run on lavapipe names
# the devices (as it makes llama.cpp see lavapipe with GGML_VK_VISIBLE_DEVICES).
RGML_PAIR=()
[ "$quick" = 0 ] || RGML_PAIR=(--device "Vulkan0,CPU")
RGML_GPU=("${RGML_PAIR[@]}" -ngl 99)
rgml_probe() {
    # clap rejects an unknown flag before any file is opened: a cheap probe. Without -ngl, clap
    # reads "-ngl" as -n with the value "gl".
    local said
    said=$("$RGML" bench -m /nonexistent.gguf -ngl 99 2>&1)
    if grep -q -E "unexpected argument|invalid value 'gl'" <<<"$said"; then
        RGML_GPU=(--device Vulkan0)
        echo "rgml bench has no -ngl: the GPU runs use --device Vulkan0 and the -ngl half rows are marked"
        echo "rgml-ngl=no" >>"$W/features"
    else
        echo "rgml-ngl=yes" >>"$W/features"
    fi
    said=$("$RGML" bench -m /nonexistent.gguf -d 64 2>&1)
    if grep -q "unexpected argument '-d'" <<<"$said"; then
        echo "rgml bench has no -d: the depth rows are marked"
        echo "rgml-depth=no" >>"$W/features"
    else
        echo "rgml-depth=yes" >>"$W/features"
    fi
}

bench_pair() { # KEY
    local key=$1 f=$W/models/$1.gguf
    [ -s "$f" ] || { say "bench $key: no model (generation $(step_status "gen-$key"))"; return; }
    local cap=60
    case $key in llama8b-* | qwen3moe-*) cap=90 ;; smollm2-*) cap=45 ;; esac
    run_step "llama-$key" $cap "$LLAMA_BENCH" -m "$f" -ngl 99 -p $NP -n $NG -r $REPS -o json
    run_step "rgml-$key" $((cap + 30)) "$RGML" bench -m "$f" -p $NP -n $NG -r $REPS --json "${RGML_GPU[@]}"
}

bench_depth() { # KEY
    local key=$1 f=$W/models/$1.gguf
    [ -s "$f" ] || return
    local cap=60
    case $key in llama8b-*) cap=90 ;; smollm2-*) cap=45 ;; esac
    run_step "llama-$key-d" $cap "$LLAMA_BENCH" -m "$f" -ngl 99 -p 0 -n $NG -d $DEPTH -r $REPS -o json
    if grep -q 'rgml-depth=no' "$W/features"; then
        printf '%s\t%s\t0\t0\n' "rgml-$key-d" "NOFLAG -d" >>"$W/steps.tsv"
        say "rgml-$key-d: NOFLAG -d (rgml bench has no -d yet)"
    else
        run_step "rgml-$key-d" $((cap + 60)) "$RGML" bench -m "$f" -p 0 -n $NG -d $DEPTH -r $REPS \
            -c $((DEPTH + NG + 64)) --json "${RGML_GPU[@]}"
    fi
}

bench_half() { # KEY: -ngl at half the blocks for both, and rgml on the CPU alone
    local key=$1 f=$W/models/$1.gguf half
    [ -s "$f" ] || return
    half=$(($(model_field "$key" 4) / 2))
    run_step "llama-$key-half" 60 "$LLAMA_BENCH" -m "$f" -ngl $half -p $NP -n $NG -r $REPS -o json
    if grep -q 'rgml-ngl=no' "$W/features"; then
        printf '%s\t%s\t0\t0\n' "rgml-$key-half" "NOFLAG -ngl" >>"$W/steps.tsv"
        say "rgml-$key-half: NOFLAG -ngl (rgml has no -ngl yet)"
    else
        run_step "rgml-$key-half" 90 "$RGML" bench -m "$f" -p $NP -n $NG -r $REPS --json \
            "${RGML_PAIR[@]}" -ngl $half
    fi
    run_step "rgml-$key-cpu" 90 "$RGML" bench -m "$f" -p $NP -n $NG -r $REPS --json --device CPU
}

bench_profile() { # KEY: rgml's GPU time per kernel (--trace, GPU timestamps), prompt and decode
    local key=$1 f=$W/models/$1.gguf phase
    # MUL_MAT alone at an 8B block's shapes, each weight type, mat-vec and 512 columns.
    if [ "$perf_model" = 1 ] && RGML_WGPU_EXACT=0 run_step perf-model 90 "$RGML" test-ops --mode perf-model -b Vulkan0; then
        cp "$W/steps/perf-model.out" "$OUT/gpu-perf-model.txt"
        cat "$OUT/gpu-perf-model.txt"
    fi
    [ -s "$f" ] || return
    # The block mat-vec's shapes against the older kernel (RGML_WGPU_MV_ROWS=0): rows per team,
    # invocations per team (RGML_WGPU_MV_TEAM), and the fused gate/up/SwiGLU mat-vec off
    # (RGML_WGPU_FUSE_GLU=0); generation alone, 64 tokens. Each variant is ROWS:TEAM:GLU.
    local variant rows team glu name
    for variant in 0:32:1 1:32:1 2:32:1 1:128:1 2:128:1 1:32:0; do
        IFS=: read -r rows team glu <<<"$variant"
        name="mv-r${rows}t${team}g${glu}-$key"
        RGML_WGPU_MV_ROWS=$rows RGML_WGPU_MV_TEAM=$team RGML_WGPU_FUSE_GLU=$glu run_step "$name" 40 \
            "$RGML" bench -m "$f" -p 0 -n 64 -r 2 --json "${RGML_GPU[@]}" \
            && echo "tg64 with RGML_WGPU_MV_ROWS=$rows RGML_WGPU_MV_TEAM=$team RGML_WGPU_FUSE_GLU=$glu: $(tr -d '\n' <"$W/steps/$name.out" | grep -o '"tg_tok_s":[^,}]*' | tail -1)"
    done
    # The DP4A mat-vec (int8 activations, packed integer dots; off by default until measured).
    RGML_WGPU_MV_DP4A=1 run_step "dp4a-$key" 40 "$RGML" bench -m "$f" -p 0 -n 64 -r 2 --json \
        "${RGML_GPU[@]}" && echo "tg64 with RGML_WGPU_MV_DP4A=1: $(tr -d '\n' <"$W/steps/dp4a-$key.out" | grep -o '"tg_tok_s":[^,}]*' | tail -1)"
    # Attention as separate ops (KQ, SOFT_MAX, KQV) instead of the GPU's flash attention.
    run_step "fa-off-$key" 40 "$RGML" bench -m "$f" -p 0 -n 64 -r 2 -fa off --json "${RGML_GPU[@]}" \
        && echo "tg64 with -fa off: $(tr -d '\n' <"$W/steps/fa-off-$key.out" | grep -o '"tg_tok_s":[^,}]*' | tail -1)"
    # The prompt without cooperative matrices (the register-tiled kernel), for comparison.
    RGML_WGPU_COOPMAT=0 run_step "nocoop-pp-$key" 40 "$RGML" bench -m "$f" -p $NP -n 0 -r 1 \
        --json "${RGML_GPU[@]}" && echo "pp$NP with RGML_WGPU_COOPMAT=0: $(tr -d '\n' <"$W/steps/nocoop-pp-$key.out" | grep -o '"pp_tok_s":[^,}]*' | tail -1)"
    # llama.cpp's own GPU time per op in a decode (its Vulkan perf logger), for comparison.
    GGML_VK_PERF_LOGGER=1 run_step "llama-perf-$key" 30 "$LLAMA_BENCH" -m "$f" -ngl 99 -p 0 -n 4 -r 1 \
        && tail -n 80 "$W/steps/llama-perf-$key.err" >"$OUT/gpu-llama-perf.txt" \
        && tail -n 40 "$OUT/gpu-llama-perf.txt"
    for phase in pp tg; do
        local shape=(-p $NP -n 0)
        [ $phase = pp ] || shape=(-p 0 -n 32)
        if run_step "profile-$key-$phase" 60 "$RGML" bench -m "$f" "${shape[@]}" -r 1 --json \
            "${RGML_GPU[@]}" --trace "$W/trace-$phase.json"; then
            python3 "$root/scripts/trace-kernels.py" "$W/trace-$phase.json" --top 25 \
                >"$OUT/gpu-profile-$phase.txt" 2>&1
            python3 "$root/scripts/trace-kernels.py" "$W/trace-$phase.json" --by-op \
                >>"$OUT/gpu-profile-$phase.txt" 2>&1
            echo "GPU time per kernel, $key, $phase ($NP-token prompt or 32 decoded tokens):"
            cat "$OUT/gpu-profile-$phase.txt"
        fi
    done
}

bench_tune() { # KEY: generation with DP4A and flash attention each on and off, at depth 0 and DEPTH
    local key=$1 f=$W/models/$1.gguf dp4a fa name
    [ -s "$f" ] || return
    for dp4a in 0 1; do
        for fa in on off; do
            name="tune-dp4a$dp4a-fa$fa-$key"
            RGML_WGPU_MV_DP4A=$dp4a run_step "$name" 40 "$RGML" bench -m "$f" -p 0 -n 64 -r 2 -fa $fa \
                --json "${RGML_GPU[@]}" \
                && echo "tg64 with RGML_WGPU_MV_DP4A=$dp4a -fa $fa: $(tr -d '\n' <"$W/steps/$name.out" | grep -o '"tg_tok_s":[^,}]*' | tail -1)"
        done
    done
    for fa in on off; do
        name="tune-d-fa$fa-$key"
        run_step "$name" 60 "$RGML" bench -m "$f" -p 0 -n 32 -d $DEPTH -c $((DEPTH + 64)) -r 2 -fa $fa \
            --json "${RGML_GPU[@]}" \
            && echo "tg32 at depth $DEPTH with -fa $fa: $(tr -d '\n' <"$W/steps/$name.out" | grep -o '"tg_tok_s":[^,}]*' | tail -1)"
    done
}

main() {
    say "gpu-device-check: $([ $quick = 1 ] && echo 'quick dry run' || echo 'device run'), budget ${budget}s, work dir $W, output $OUT"
    echo "host: $(uname -srm); $(nproc) cores; $(awk '/MemTotal/ { printf "%.0f GiB", $2 / 1048576 }' /proc/meminfo)"
    echo "budget $budget $quick $NP $NG $REPS $DEPTH $HALF_MODEL" >"$W/params"
    : >"$W/features"

    : >"$W/steps.tsv"
    run_step unpack 60 unpack_payload_cmd || { say "no binaries: stopping"; finish; return; }
    # shellcheck disable=SC1091
    . "$W/paths"
    cat "$W/steps/unpack.out"
    run_step vulkan-loader 30 setup_vulkan
    cat "$W/steps/vulkan-loader.out"
    [ -n "${XDG_RUNTIME_DIR:-}" ] || { XDG_RUNTIME_DIR=$(mktemp -d); export XDG_RUNTIME_DIR; }
    if ! has_gpu; then
        if [ -f /usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json ]; then
            export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
            export __EGL_VENDOR_LIBRARY_FILENAMES=/usr/local/nvidia/share/glvnd/egl_vendor.d/10_nvidia.json
            say "no GPU seen: exported VK_DRIVER_FILES=$VK_DRIVER_FILES"
            if has_gpu; then say "rgml sees a Vulkan device now"; else say "rgml still sees no Vulkan device"; fi
        fi
    fi
    if [ $quick = 1 ]; then
        # ggml's Vulkan backend skips CPU devices (lavapipe) unless named.
        export GGML_VK_VISIBLE_DEVICES=${GGML_VK_VISIBLE_DEVICES:-0}
    fi
    if command -v nvidia-smi >/dev/null 2>&1; then
        run_step nvidia-smi 15 nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used,clocks.sm,clocks.mem,clocks.max.sm,clocks.max.mem,power.limit,temperature.gpu --format=csv
        cat "$W/steps/nvidia-smi.out"
    else
        echo "no nvidia-smi here"
    fi
    run_step devices 30 "$RGML" devices
    cat "$W/steps/devices.out"
    run_step devices-json 30 "$RGML" devices --json
    run_step llama-devices 30 "$LLAMA_BENCH" --list-devices
    cat "$W/steps/llama-devices.out"
    rgml_probe

    run_step bandwidth 45 bandwidth
    cat "$W/steps/bandwidth.out"

    # The demo-shape model now; the others in the background while the checks run.
    selected "$LOGITS_MODEL" || [ $checks = 0 ] || only="$only,$LOGITS_MODEL"
    local m key bg=()
    for m in "${MODELS[@]}"; do
        key=${m%% *}
        selected "$key" || continue
        if [ "$key" = "$LOGITS_MODEL" ]; then gen_model "$key"; else bg+=("$key"); fi
    done
    local order=(llama1b-q4_k_m llama8b-q4_k_m llama1b-q8_0 llama1b-f16 qwen3moe-q4_k_m
        gptoss-mxfp4 qwen35moe-q4_k_m) gen_pid=
    if [ ${#bg[@]} -gt 0 ]; then
        (
            for key in "${order[@]}"; do
                [[ " ${bg[*]} " == *" $key "* ]] && gen_model "$key"
            done
        ) &
        gen_pid=$!
    fi

    if [ $checks = 1 ]; then
        RGML_WGPU_EXACT=1 run_step test-ops-exact 90 "$RGML" test-ops -b Vulkan0
        RGML_WGPU_EXACT=0 run_step test-ops-fast 90 "$RGML" test-ops -b Vulkan0
        RGML_WGPU_EXACT=0 RGML_WGPU_COOPMAT=0 run_step test-ops-fast-nocoop 90 "$RGML" test-ops -b Vulkan0
        local lm=$W/models/$LOGITS_MODEL.gguf prompt="Once upon a time"
        if [ -s "$lm" ]; then
            run_step logits-cpu 30 "$RGML" logits -m "$lm" -p "$prompt" --top 10 --json --device CPU
            RGML_WGPU_EXACT=1 run_step logits-exact 30 "$RGML" logits -m "$lm" -p "$prompt" --top 10 --json --device Vulkan0
            RGML_WGPU_EXACT=0 run_step logits-fast 30 "$RGML" logits -m "$lm" -p "$prompt" --top 10 --json --device Vulkan0
            # Perplexity of a text of the repository (the fixture text stays behind in ../shared).
            local text=$root/docs/GPU.md
            run_step ppl-cpu 40 "$RGML" perplexity -m "$lm" -f "$text" -c 256 --chunks $PPL_CHUNKS --device CPU
            RGML_WGPU_EXACT=0 run_step ppl-fast 30 "$RGML" perplexity -m "$lm" -f "$text" -c 256 --chunks $PPL_CHUNKS --device Vulkan0
            RGML_WGPU_EXACT=0 RGML_WGPU_COOPMAT=0 run_step ppl-fast-nocoop 30 "$RGML" perplexity -m "$lm" -f "$text" -c 256 --chunks $PPL_CHUNKS --device Vulkan0
        fi
    fi

    if [ -n "$gen_pid" ]; then
        say "waiting for the model generation"
        wait "$gen_pid"
        ls -l "$W/models"
    fi

    if [ $benches = 1 ]; then
        local plan=(
            "pair llama8b-q4_k_m" "profile llama8b-q4_k_m" "pair llama1b-q4_k_m" "half $HALF_MODEL"
            "depth llama8b-q4_k_m"
            "pair llama1b-q8_0" "pair llama1b-f16" "pair qwen3moe-q4_k_m" "pair smollm2-q4_1"
            "pair gptoss-mxfp4" "pair qwen35moe-q4_k_m"
            "depth llama1b-q4_k_m" "depth llama1b-q8_0" "depth llama1b-f16" "depth smollm2-q4_1"
        )
        [ $quick = 0 ] || plan=("pair smollm2-q4_1" "profile smollm2-q4_1" "half smollm2-q4_1" "depth smollm2-q4_1")
        [ $tune = 0 ] || plan=("tune llama8b-q4_k_m")
        [ $tune = 0 ] || [ $quick = 0 ] || plan=("tune smollm2-q4_1")
        local p
        for p in "${plan[@]}"; do
            key=${p#* }
            model_field "$key" 2 >/dev/null || continue
            selected "$key" || continue
            case ${p%% *} in
                pair) bench_pair "$key" ;;
                half) bench_half "$key" ;;
                profile) bench_profile "$key" ;;
                depth) bench_depth "$key" ;;
                tune) bench_tune "$key" ;;
            esac
        done
    fi
    finish
}

finish() {
    say "building the table"
    local m key
    for m in "${MODELS[@]}"; do
        key=${m%% *}
        echo "$m $(cat "$W/models/$key.bytes" 2>/dev/null || echo 0)"
    done >"$W/models.txt"
    python3 - "$W" "$OUT" <<'PY'
import json, os, re, sys
W, OUT = sys.argv[1], sys.argv[2]
p = open(f"{W}/params").read().split()
budget, quick, NP, NG, REPS, DEPTH, HALF = int(p[1]), p[2] == "1", p[3], p[4], p[5], p[6], p[7]
steps = {}
for line in open(f"{W}/steps.tsv"):
    f = line.rstrip("\n").split("\t")
    steps[f[0]] = {"status": f[1], "seconds": float(f[2]), "timeout": int(f[3])}
features = dict(l.strip().split("=", 1) for l in open(f"{W}/features") if "=" in l)
models = []
for line in open(f"{W}/models.txt"):
    key, shape, typ, blocks, size = line.split()
    models.append({"key": key, "shape": shape, "type": typ, "blocks": int(blocks), "bytes": int(size)})

def text(name, ext):
    try:
        return open(f"{W}/steps/{name}.{ext}", errors="replace").read()
    except OSError:
        return ""

def tail(name, n=2):
    lines = [l for l in (text(name, "err") or text(name, "out")).splitlines() if l.strip()]
    return " / ".join(l.strip()[:160] for l in lines[-n:])

def first_json(s):
    for i, c in enumerate(s):
        if c in "[{":
            try:
                return json.JSONDecoder().raw_decode(s[i:])[0]
            except ValueError:
                continue
    return None

bw = None
if steps.get("bandwidth", {}).get("status") == "OK":
    bw = first_json(text("bandwidth", "out"))

def llama(name):
    """{test: (tok/s, sd)} from llama-bench -o json."""
    st = steps.get(name)
    if not st or st["status"] != "OK":
        return None
    res = {}
    for r in first_json(text(name, "out")) or []:
        t = f"pp{r['n_prompt']}" if r.get("n_prompt") else f"tg{r['n_gen']}"
        if r.get("n_depth"):
            t += f"@d{r['n_depth']}"
        res[t] = (r["avg_ts"], r.get("stddev_ts", 0.0))
    return res

def rgml(name, depth=0):
    st = steps.get(name)
    if not st or st["status"] != "OK":
        return None
    j = first_json(text(name, "out")) or {}
    res = {"_device": j.get("device")}
    d = f"@d{depth}" if depth else ""
    if j.get("n_prompt"):
        res[f"pp{j['n_prompt']}{d}"] = (j.get("pp_tok_s"), j.get("pp_tok_s_sd"))
    if j.get("n_gen"):
        res[f"tg{j['n_gen']}{d}"] = (j.get("tg_tok_s"), j.get("tg_tok_s_sd"))
    return res

def why(name):
    st = steps.get(name)
    if st is None:
        return "not run"
    s = st["status"]
    if s.startswith("NOFLAG"):
        return f"rgml has no {s.split(' ', 1)[1]}"
    if s == "SKIP":
        return "SKIP (budget)"
    if s == "TIMEOUT":
        return f"TIMEOUT ({st['timeout']}s)"
    return s.replace("FAIL ", "FAIL rc=") if s != "OK" else "no result"

def fmt(v):
    return f"{v:,.1f}" if v >= 10 else f"{v:.2f}"

def pct(v):
    return f"{v:.0f}%" if v >= 10 else f"{v:.1f}%"

rows, results = [], {"bandwidth": bw, "steps": steps, "features": features, "models": models, "rows": []}
gbs = bw["gbs"] if bw else None
ngl_note = "" if features.get("rgml-ngl", "yes") == "yes" else " †"
cpu = {}
for m in models:
    key = m["key"]
    label = f"{m['shape']} {m['type']}"
    sets = [("", f"llama-{key}", f"rgml-{key}", 0), ("@d", f"llama-{key}-d", f"rgml-{key}-d", int(DEPTH))]
    if key == HALF:
        sets.append(("half", f"llama-{key}-half", f"rgml-{key}-half", 0))
        sets.append(("cpu", None, f"rgml-{key}-cpu", 0))
    for kind, ln, rn, depth in sets:
        if (ln is None or ln not in steps) and rn not in steps:
            continue
        L = llama(ln) if ln else None
        R = rgml(rn, depth)
        tests = [f"pp{NP}", f"tg{NG}"] if kind != "@d" else [f"tg{NG}@d{DEPTH}"]
        for t in tests:
            name = {"": t, "@d": f"tg{NG} @ d{DEPTH}", "half": f"{t} -ngl {m['blocks'] // 2}/{m['blocks']}",
                    "cpu": f"{t} CPU alone"}[kind]
            lv = L.get(t) if L else None
            rv = R.get(t) if R else None
            lcell = "-" if ln is None else (fmt(lv[0]) if lv and lv[0] else why(ln))
            rcell = fmt(rv[0]) if rv and rv[0] else why(rn)
            if kind in ("", "@d") and rv and rv[0] and features.get("rgml-ngl") == "no":
                rcell += " †"
            ratio = f"{rv[0] / lv[0]:.2f}x" if (lv and rv and lv[0] and rv[0]) else ""
            target, limit = "", ""
            if kind == "cpu" and rv and rv[0]:
                cpu[t] = rv[0]
            if kind in ("", "@d") and t.startswith("tg") and gbs and m["bytes"]:
                lim = gbs * 1e9 / m["bytes"]
                parts = [f"{fmt(lim)}"]
                if rv and rv[0]:
                    parts.append(f"rgml {pct(100 * rv[0] / lim)}")
                if lv and lv[0]:
                    parts.append(f"llama.cpp {pct(100 * lv[0] / lim)}")
                limit = parts[0] + (" (" + ", ".join(parts[1:]) + ")" if len(parts) > 1 else "")
            if kind == "" and t.startswith("tg") and m["shape"] == "llama-8b" and m["type"] == "Q4_K_M":
                lim = gbs * 1e9 / m["bytes"] if gbs and m["bytes"] else None
                a = ("PASS" if rv[0] >= lv[0] else "FAIL") if (rv and rv[0] and lv and lv[0]) else "?"
                b = ("PASS" if rv[0] >= 0.6 * lim else "FAIL") if (rv and rv[0] and lim) else "?"
                target = f">= llama.cpp: {a}; >= 60% of limit: {b}"
            if kind == "" and t.startswith("pp"):
                target = ">= 0.8x" + (": PASS" if ratio and rv[0] >= 0.8 * lv[0] else ": FAIL" if ratio else "")
            rows.append([label, name, lcell, rcell, ratio, target, limit, kind, t])
            results["rows"].append({"model": key, "test": name, "llama_tok_s": lv[0] if lv else None,
                                    "llama_sd": lv[1] if lv else None, "rgml_tok_s": rv[0] if rv else None,
                                    "rgml_sd": rv[1] if rv else None, "rgml_device": R.get("_device") if R else None,
                                    "bytes": m["bytes"]})
# -ngl half against the CPU alone.
for r in rows:
    if r[7] == "half":
        t = r[8]
        try:
            v = float(r[3].replace(",", "").rstrip(" †"))
        except ValueError:
            v = None
        if t in cpu:
            r[5] = f"> CPU alone ({fmt(cpu[t])})" + (f": {'PASS' if v and v > cpu[t] else 'FAIL'}" if v else "")

def testops(name):
    st = steps.get(name)
    if st is None:
        return "not run"
    m = re.findall(r"^\s*(\d+) passed, (\d+) failed.*$", text(name, "out") + "\n" + text(name, "err"), re.M)
    line = f"{m[-1][0]} passed, {m[-1][1]} failed" if m else ""
    if st["status"] == "OK":
        return line or "OK (no summary line)"
    return f"{why(name)}" + (f": {line}" if line else f": {tail(name)}")

def logits(name):
    c, g = steps.get("logits-cpu"), steps.get(name)
    if g is None:
        return "not run", None
    if not c or c["status"] != "OK":
        return f"CPU run {why('logits-cpu')}: {tail('logits-cpu')}", None
    if g["status"] != "OK":
        return f"{why(name)}: {tail(name)}", None
    a, b = first_json(text("logits-cpu", "out")), first_json(text(name, "out"))
    if not a or not b:
        return "no JSON", None
    ca, gb = dict((int(i), v) for i, v in a["top"]), dict((int(i), v) for i, v in b["top"])
    shared = [i for i in ca if i in gb]
    d = max((abs(ca[i] - gb[i]) for i in shared), default=float("nan"))
    same_tokens = a.get("tokens") == b.get("tokens")
    top1 = a["top"][0][0] == b["top"][0][0]
    res = {"top1_agree": top1, "overlap": len(shared), "max_abs_diff": d, "tokens_equal": same_tokens,
           "cpu_top": a["top"], "gpu_top": b["top"]}
    s = (f"top-1 {'agrees' if top1 else 'DIFFERS'} ({a['top'][0][0]} vs {b['top'][0][0]}), "
         f"top-10 overlap {len(shared)}/{len(ca)}, largest logit difference on the shared ids {d:.3g}"
         + ("" if same_tokens else ", TOKENS DIFFER"))
    return s, res

lines = []
title = "rgml GPU backend vs llama.cpp Vulkan"
dev = (first_json(text("devices-json", "out")) or []) if steps.get("devices-json", {}).get("status") == "OK" else []
gpu = next((d for d in dev if str(d.get("name", "")).startswith("Vulkan")), None)
smi = text("nvidia-smi", "out").strip().splitlines()
lines.append(f"# {title}" + (" (quick dry run)" if quick else ""))
lines.append("")
if len(smi) > 1:
    lines.append(f"GPU: {smi[1].strip()} (nvidia-smi: {smi[0].strip()})")
if gpu:
    lines.append(f"rgml device: {gpu.get('name')} = {gpu.get('description')}")
ldev = [l.strip() for l in text("llama-devices", "out").splitlines() if l.strip() and not l.startswith("Available")]
if ldev:
    lines.append(f"llama.cpp device: {ldev[0]}")
lines.append(f"bandwidth: " + (f"{bw['gbs']:,.0f} GB/s ({bw['method']})" if bw else why("bandwidth")))
lines.append(f"settings: -p {NP} -n {NG} -r {REPS}, depth {DEPTH}, -ngl 99 unless shown; tok/s means")
lines.append("")
lines.append("| model | test | llama.cpp Vulkan tok/s | rgml tok/s | ratio | target | limit tok/s (% of it) |")
lines.append("| --- | --- | ---: | ---: | ---: | --- | --- |")
for r in rows:
    lines.append("| " + " | ".join(r[:7]) + " |")
lines.append("")
lines.append(f"| check | result |")
lines.append("| --- | --- |")
lines.append(f"| test-ops -b Vulkan0, exact (RGML_WGPU_EXACT=1) | {testops('test-ops-exact')} |")
lines.append(f"| test-ops -b Vulkan0, fast (RGML_WGPU_EXACT=0) | {testops('test-ops-fast')} |")
lines.append(f"| test-ops -b Vulkan0, fast without cooperative matrices (RGML_WGPU_COOPMAT=0) | {testops('test-ops-fast-nocoop')} |")
for name, label in (("logits-exact", "exact"), ("logits-fast", "fast")):
    s, res = logits(name)
    results[name] = res
    lines.append(f"| logits smollm2-135m Q4_1, Vulkan0 {label} vs CPU | {s} |")
def ppl(name):
    st = steps.get(name)
    if not st or st["status"] != "OK":
        return None
    m = re.findall(r"PPL = ([0-9.eE+-]+)", text(name, "out") + text(name, "err"))
    return float(m[-1]) if m else None

base = ppl("ppl-cpu")
for name, label in (("ppl-fast", "fast"), ("ppl-fast-nocoop", "fast, no cooperative matrices")):
    v = ppl(name)
    if name not in steps:
        continue
    if v is None or base is None:
        cell = f"{why(name) if v is None else 'CPU ' + why('ppl-cpu')}"
    else:
        rel = 100 * (v - base) / base
        cell = f"{v:.4f} vs CPU {base:.4f} ({rel:+.3f}%; bar: within 0.5%: {'PASS' if abs(rel) <= 0.5 else 'FAIL'})"
    results[name] = v
    lines.append(f"| perplexity smollm2-135m Q4_1 (docs/GPU.md, chunks of 256), Vulkan0 {label} | {cell} |")
lines.append("")
lines.append("limit: the model file's bytes read once per token at the measured bandwidth (weights only, "
             "no KV cache); tg targets: llama-8b Q4_K_M tg >= llama.cpp Vulkan and >= 60% of the limit; "
             "pp >= 0.8x llama.cpp Vulkan; -ngl half faster than the CPU alone.")
if features.get("demo-model-stand-in") == "yes":
    lines.append("smollm2-135m Q4_1: rgml-random-model could not make it (see below); the demo model stood in.")
if features.get("rgml-ngl") == "no":
    lines.append("† rgml has no -ngl yet: its GPU rows ran with --device Vulkan0.")
devs = sorted({str(r["rgml_device"]) for r in results["rows"]
               if r["rgml_device"] is not None and "CPU alone" not in r["test"]})
if devs:
    lines.append(f"the devices rgml bench reported for its GPU rows: {', '.join(devs)}")
bad = [(n, s) for n, s in steps.items() if s["status"] not in ("OK", "SKIP")]
skipped = [n for n, s in steps.items() if s["status"] == "SKIP"]
if bad or skipped:
    lines.append("")
    lines.append("Steps that did not succeed (their last error lines; all output in gpu-raw.tar.gz):")
    for n, s in bad:
        t = tail(n) if not s["status"].startswith("NOFLAG") else ""
        lines.append(f"- {n}: {s['status']} after {s['seconds']}s" + (f": {t}" if t else ""))
    if skipped:
        lines.append(f"- not run, the budget was spent: {', '.join(skipped)}")
total = sum(s["seconds"] for s in steps.values())
lines.append("")
lines.append(f"({len(steps)} steps, {total:.0f}s in steps, budget {budget}s)")
table = "\n".join(lines) + "\n"
open(f"{OUT}/gpu-table.md", "w").write(table)
json.dump(results, open(f"{OUT}/gpu-results.json", "w"), indent=1, default=str)
print(table)
PY
    tar -C "$W" -czf "$OUT/gpu-raw.tar.gz" steps steps.tsv features params models.txt 2>/dev/null
    say "done: $OUT/gpu-table.md, gpu-check.log, gpu-results.json, gpu-raw.tar.gz"
}

# unpack_payload sets the paths in this shell; run_step runs commands, so it gets a wrapper that
# writes them to a file the main shell reads.
unpack_payload_cmd() {
    unpack_payload || return 1
    {
        printf 'RGML=%q\nGEN=%q\nLLAMA_BENCH=%q\nVOCAB_DIR=%q\n' "$RGML" "$GEN" "$LLAMA_BENCH" "$VOCAB_DIR"
    } >"$W/paths"
    local b
    for b in "$RGML" "$GEN" "$LLAMA_BENCH"; do [ -x "$b" ] || { echo "missing: $b" >&2; return 1; }; done
}

main 2>&1 | tee "$OUT/gpu-check.log"
status=${PIPESTATUS[0]}
rm -rf "$W"
exit "$status"

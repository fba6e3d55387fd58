#!/usr/bin/env bash
# rgml vs llama.cpp on this machine, side by side (issues 7 and 16). Not part of CI.
#
# Builds the reference llama.cpp for the chosen instruction set once (scripts/llamacpp.sh),
# builds `rgml` in release, then for each model and each load level runs llama-bench and
# `rgml bench` alternately, R rounds each, and prints a table of pp and tg tokens/s (mean over
# rounds) with the ratios rgml / llama.cpp against issue 31's targets (tg >= 1.1x; pp >= 1.5x,
# >= 3x where the CPU has AMX, whose path llama.cpp's native build cannot run here; tg at depth
# >= 1x). A quiet tg row also passes at >= 90% of this machine's limit: the file's bytes read once per token at
# the DRAM read bandwidth that `cargo bench -p rgml-cpu` measures (the better of 1 and THREADS
# threads), shown in the limit column. A pp row's limit is the int8 multiply-add peak the same
# benchmark measures (AMX where the CPU has it, else AVX-512 VNNI) over the file's parameter
# count, one multiply-add per parameter and token. For a mixture-of-experts file both count
# the active weights only: the expert tensors' bytes and parameters times expert_used_count /
# expert_count.
#
# Usage: scripts/bench-vs-llamacpp.sh [-r ROUNDS] [-t THREADS] [-p N_PROMPT] [-n N_GEN]
#            [-d DEPTH] [-m MODEL]... [-s SHAPE:TYPE]... [--busy N[,N..]]
#            [--isa native|avx2|avx512] [--no-repack] [--dram-gbs GBS] [--fa on|off]
#            [--ctk TYPE] [--ctv TYPE]
#   -m MODEL     a GGUF file; repeat for several (default: the demo model)
#   -s SHAPE:TYPE[:EXPERTS] a real-size random-weight file made by `rgml-random-model --shape
#                SHAPE --type TYPE [--experts EXPERTS]` (e.g. llama-1b:Q4_K_M, llama-8b:Q4_0,
#                qwen3moe-30b-a3b:Q4_K_M:64), kept in $RGML_RANDOM_MODEL_DIR (default
#                ~/rgml-random-models: outside ~/.cache/rgml, because a few of these files
#                are tens of GB and CI machines start from that cache); repeat for several
#   -d DEPTH     also tg N_GEN with DEPTH tokens already in the KV cache (llama-bench -d;
#                e.g. 4096), quiet rounds only
#   --busy LIST  load levels: N CPU-bound background processes run during those rounds
#                (default 0; e.g. --busy 0,1,2)
#   --isa ISA    llama.cpp built for ISA (scripts/llamacpp.sh) and rgml forced to the same
#                arithmetic with RGML_CPU_ISA and without AMX (default native: each uses what
#                the CPU has), so an AVX-512 machine can measure the AVX2 path of both (for
#                avx2 rgml also drops its AVX-512 instructions, RGML_CPU_AVX512=0)
#   --no-repack  llama.cpp without repacked weights (its arithmetic reference); by default it
#                repacks, its fastest configuration
#   --dram-gbs G the DRAM read bandwidth in GB/s for the tg limit (default: measured first)
#   --fa on|off  flash attention in both (default on: what both do by default on a CPU)
#   --ctk, --ctv the KV cache types of both (default f16; q8_0, q4_0: quantized caches)
# The settings also come from the environment: ROUNDS, THREADS, N_PROMPT, N_GEN.
set -euo pipefail
cd "$(dirname "$0")/.."

ROUNDS=${ROUNDS:-3}
THREADS=${THREADS:-2}
N_PROMPT=${N_PROMPT:-512}
N_GEN=${N_GEN:-128}
DEPTH=0
MODELS=()
SHAPES=()
BUSY=0
ISA=native
REPACK=1
DRAM_GBS=
FA=on
CTK=f16
CTV=f16

usage() { sed -n '2,35p' "$0" | sed 's/^# \{0,1\}//'; }
while [ $# -gt 0 ]; do
    case $1 in
        -r) ROUNDS=${2:?}; shift 2 ;;
        -t) THREADS=${2:?}; shift 2 ;;
        -p) N_PROMPT=${2:?}; shift 2 ;;
        -n) N_GEN=${2:?}; shift 2 ;;
        -m) MODELS+=("${2:?}"); shift 2 ;;
        -s) SHAPES+=("${2:?}"); shift 2 ;;
        -d) DEPTH=${2:?}; shift 2 ;;
        --busy) BUSY=${2:?}; shift 2 ;;
        --isa) ISA=${2:?}; shift 2 ;;
        --no-repack) REPACK=0; shift ;;
        --dram-gbs) DRAM_GBS=${2:?}; shift 2 ;;
        --fa) FA=${2:?}; shift 2 ;;
        --ctk) CTK=${2:?}; shift 2 ;;
        --ctv) CTV=${2:?}; shift 2 ;;
        -h | --help) usage; exit 0 ;;
        *) usage >&2; exit 2 ;;
    esac
done
for v in ROUNDS THREADS N_PROMPT N_GEN; do
    if ! [[ ${!v} =~ ^[1-9][0-9]*$ ]]; then
        echo "$v must be a positive integer (got '${!v}')" >&2
        exit 2
    fi
done
[[ $DEPTH =~ ^[0-9]+$ ]] || { echo "-d takes a token count (got '$DEPTH')" >&2; exit 2; }
[[ $BUSY =~ ^[0-9]+(,[0-9]+)*$ ]] || { echo "--busy takes N[,N..] (got '$BUSY')" >&2; exit 2; }
[[ $FA =~ ^(on|off)$ ]] || { echo "--fa takes on or off (got '$FA')" >&2; exit 2; }
# The attention settings, the same for both.
attn=(-fa "$FA" -ctk "$CTK" -ctv "$CTV")
rgml_isa=()
case $ISA in
    native) ;;
    # The forced instruction set's path of both: no AMX tiles for rgml either.
    avx2) rgml_isa=(env RGML_CPU_ISA=avx2 RGML_CPU_AMX=0 RGML_CPU_AVX512=0) ;;
    avx512) rgml_isa=(env RGML_CPU_ISA=avx512 RGML_CPU_AMX=0) ;;
    *) echo "--isa takes native, avx2 or avx512 (got '$ISA')" >&2; exit 2 ;;
esac

log() { echo "== $*" >&2; }

bin=$(bash scripts/llamacpp.sh --isa "$ISA" llama-bench | tail -n 1)
llama_bench=$bin/llama-bench
log "building rgml (release)"
cargo build --release --quiet -p rgml-cli -p rgml-testmodels
rgml=target/release/rgml
random_dir=${RGML_RANDOM_MODEL_DIR:-$HOME/rgml-random-models}
for st in ${SHAPES[@]+"${SHAPES[@]}"}; do
    IFS=: read -r shape type experts <<<"$st"
    [ -n "$type" ] || { echo "-s takes SHAPE:TYPE[:EXPERTS] (got '$st')" >&2; exit 2; }
    mkdir -p "$random_dir"
    f=$random_dir/$shape-$type.gguf
    more=()
    if [ -n "$experts" ]; then
        f=$random_dir/$shape-x$experts-$type.gguf
        more=(--experts "$experts")
    fi
    if [ ! -f "$f" ]; then
        log "writing $f (rgml-random-model, seed 0)"
        target/release/rgml-random-model --shape "$shape" --type "$type" ${more[@]+"${more[@]}"} \
            --out "$f.tmp" >&2
        mv "$f.tmp" "$f"
    fi
    MODELS+=("$f")
done
if [ ${#MODELS[@]} -eq 0 ]; then
    bash scripts/fetch-model.sh
    MODELS=(models/SmolLM2-135M-Instruct.Q4_1.gguf)
fi
for m in "${MODELS[@]}"; do
    [ -f "$m" ] || { echo "model $m not found" >&2; exit 1; }
done

log "measuring the DRAM read bandwidth and the int8 peaks (cargo bench -p rgml-cpu)"
ceilings=$(RGML_BENCH_QUICK=1 RGML_BENCH_ONLY=mul_mat RGML_BENCH_DTYPES=f32 \
    RGML_BENCH_THREADS="$THREADS" cargo bench -q -p rgml-cpu --bench kernels 2>/dev/null)
if [ -z "$DRAM_GBS" ]; then
    DRAM_GBS=$(sed -n 's/^| DRAM read, [^|]* |[^|]* | \([0-9.]*\) GB\/s |$/\1/p' <<<"$ceilings" |
        sort -g | tail -n 1)
fi
[[ $DRAM_GBS =~ ^[0-9]+(\.[0-9]+)?$ ]] || { echo "no DRAM bandwidth (got '$DRAM_GBS')" >&2; exit 1; }
# The best int8 multiply-add peak ("AMX 3843" or "AVX-512 VNNI 498", GMAC/s), or "- 0".
# A forced instruction set runs without AMX (and AVX2 without VNNI: no int8 peak measured).
peaks=$(sed -n 's/^| int8 multiply-adds, \([^,]*\), [^|]* | | \([0-9.]*\) GMAC\/s |$/\1 \2/p' \
    <<<"$ceilings")
case $ISA in
    avx512) peaks=$(grep -v '^AMX ' <<<"$peaks" || true) ;;
    avx2) peaks= ;;
esac
INT8_PEAK=$(sort -k2 -g <<<"$peaks" | sed '/^$/d' | tail -n 1 | tr ' ' '_')
INT8_PEAK=${INT8_PEAK:-none_0}

work=$(mktemp -d)
busy_pids=()
stop_busy() {
    for p in "${busy_pids[@]}"; do kill "$p" 2>/dev/null || true; done
    busy_pids=()
}
trap 'stop_busy; rm -rf "$work"' EXIT
start_busy() {
    for _ in $(seq 1 "$1"); do
        # A CPU-bound process that never sleeps, like a compiler job.
        python3 -c 'while True: pass' &
        busy_pids+=($!)
    done
}

results=$work/results
: >"$results"
params=$work/params
: >"$params"
sizes=$work/sizes
# Per model: the bytes read per token and the share of the parameters that are active (1 for
# a dense model; the active experts' share for a mixture of experts), from its tensor list.
for m in "${MODELS[@]}"; do
    "$rgml" gguf-info "$m" | python3 -c '
import re, sys
meta, total, experts, n_total, n_experts = {}, 0, 0, 0, 0
for line in sys.stdin:
    k = re.match(r"\s+\S+\.(expert_count|expert_used_count) = (\d+)$", line)
    if k:
        meta[k.group(1)] = int(k.group(2))
    t = re.match(r"\s+(\S+)\s+\S+\s+\[([\d, ]+)\] (\d+) bytes at", line)
    if t:
        n = 1
        for d in t.group(2).split(","):
            n *= int(d)
        b = int(t.group(3))
        total, n_total = total + b, n_total + n
        if "_exps." in t.group(1):
            experts, n_experts = experts + b, n_experts + n
used = meta.get("expert_used_count", 0) / meta["expert_count"] if meta.get("expert_count") else 1
active = total - experts * (1 - used)
print(sys.argv[1], int(active), (n_total - n_experts * (1 - used)) / n_total)
' "$(basename "$m" .gguf)" >>"$sizes"
done
IFS=, read -r -a levels <<<"$BUSY"
for m in "${MODELS[@]}"; do
    name=$(basename "$m" .gguf)
    for busy in "${levels[@]}"; do
        start_busy "$busy"
        for round in $(seq 1 "$ROUNDS"); do
            log "$name, busy $busy, round $round/$ROUNDS: llama-bench"
            if ! LD_LIBRARY_PATH=$bin "$llama_bench" -m "$m" -p "$N_PROMPT" -n "$N_GEN" -t "$THREADS" \
                -r 1 -o json --repack "$REPACK" "${attn[@]}" >"$work/llama.json" 2>"$work/llama.err"; then
                cat "$work/llama.err" >&2
                exit 1
            fi
            if [ "$DEPTH" -gt 0 ] && [ "$busy" = 0 ]; then
                if ! LD_LIBRARY_PATH=$bin "$llama_bench" -m "$m" -p 0 -n "$N_GEN" -d "$DEPTH" \
                    -t "$THREADS" -r 1 -o json --repack "$REPACK" "${attn[@]}" >"$work/llama-d.json" \
                    2>"$work/llama.err"; then
                    cat "$work/llama.err" >&2
                    exit 1
                fi
                python3 - "$work/llama-d.json" "$work/llama.json" <<'PY'
import json, sys
a = json.load(open(sys.argv[2])) + json.load(open(sys.argv[1]))
json.dump(a, open(sys.argv[2], "w"))
PY
            fi
            python3 - "$work/llama.json" "$name" "$busy" >>"$results" <<'PY'
import json, sys
for t in json.load(open(sys.argv[1])):
    kind = "pp" if t["n_gen"] == 0 else ("tgd" if t.get("n_depth", 0) > 0 else "tg")
    print(sys.argv[2], sys.argv[3], "llama.cpp", kind, t["avg_ts"])
PY
            log "$name, busy $busy, round $round/$ROUNDS: rgml bench"
            # -ngl 0: the CPU against llama.cpp's CPU build, also where a GPU would take the
            # model by default.
            "${rgml_isa[@]}" "$rgml" bench -m "$m" -p "$N_PROMPT" -n "$N_GEN" -t "$THREADS" -r 1 \
                -ngl 0 "${attn[@]}" --json >"$work/rgml.json"
            if [ "$DEPTH" -gt 0 ] && [ "$busy" = 0 ]; then
                "${rgml_isa[@]}" "$rgml" bench -m "$m" -p 0 -n "$N_GEN" -d "$DEPTH" \
                    -t "$THREADS" -r 1 -ngl 0 "${attn[@]}" --json >>"$work/rgml.json"
            fi
            python3 - "$work/rgml.json" "$name" "$busy" "$params" >>"$results" <<'PY'
import json, sys
lines = [json.loads(l) for l in open(sys.argv[1]).read().strip().splitlines()]
v = lines[0]
print(sys.argv[2], sys.argv[3], "rgml pp", v["pp_tok_s"])
print(sys.argv[2], sys.argv[3], "rgml tg", v["tg_tok_s"])
for d in lines[1:]:
    print(sys.argv[2], sys.argv[3], "rgml tgd", d["tg_tok_s"])
with open(sys.argv[4], "a") as f:
    f.write(f"{sys.argv[2]} {v['n_params']}\n")
PY
        done
        stop_busy
    done
done

python3 - "$results" "$N_PROMPT" "$N_GEN" "$THREADS" "$ROUNDS" "$ISA" "$REPACK" "$sizes" \
    "$DRAM_GBS" "$params" "$INT8_PEAK" "$DEPTH" <<'PY'
import os, statistics, sys
path, n_prompt, n_gen, threads, rounds, isa, repack, sizes, dram, params, peak, depth = sys.argv[1:]
size = {m: int(b) for m, b, _ in (l.split() for l in open(sizes))}
active = {m: float(f) for m, _, f in (l.split() for l in open(sizes))}
n_params = {m: int(n) * active.get(m, 1.0) for m, n in (l.split() for l in open(params))}
dram = float(dram) * 1e9
peak_name, peak = peak.rsplit("_", 1)
peak_name, peak = peak_name.replace("_", " "), float(peak) * 1e9
runs = {}
for line in open(path):
    model, busy, tool, kind, ts = line.split()
    runs.setdefault((model, int(busy), tool, kind), []).append(float(ts))
def mean(*key):
    v = runs.get(key, [])
    return statistics.mean(v) if v else float("nan")
cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "?")
cpu_flags = next((l.split(":", 1)[1].split() for l in open("/proc/cpuinfo") if l.startswith("flags")), [])
print(f"{threads} threads, {rounds} rounds (alternating), CPU {cpu}, instruction set {isa}, "
      f"llama.cpp repack {'on' if repack == '1' else 'off'}")
print("tokens/s (mean); quiet = rgml's share of its own quiet speed under that load; limit = "
      f"tg: the file read once per token at {dram / 1e9:.1f} GB/s (DRAM read); pp: one int8 "
      f"multiply-add per parameter and token at {peak_name}'s {peak / 1e9:.0f} GMAC/s; and "
      "rgml's share of it")
print("| model | busy | test | llama.cpp | rgml | rgml / llama.cpp | target | quiet | limit |")
print("| --- | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: |")
keys = sorted({(m, b) for (m, b, _, _) in runs})
for model, busy in keys:
    # The issue's prompt targets: 3x on an AMX CPU, 1.5x with AVX-512; none on AVX2 alone.
    if peak_name == "AMX" and isa == "native":
        pp_target = 3.0
    elif isa == "avx512" or (isa == "native" and "avx512f" in cpu_flags):
        pp_target = 1.5
    else:
        pp_target = None
    tests = [("pp", f"pp{n_prompt}", pp_target), ("tg", f"tg{n_gen}", 1.1)]
    if int(depth) > 0 and busy == 0:
        tests.append(("tgd", f"tg{n_gen}@d{depth}", 1.0))
    for kind, label, target in tests:
        l, r = mean(model, busy, "llama.cpp", kind), mean(model, busy, "rgml", kind)
        q = mean(model, 0, "rgml", kind)
        ratio = r / l if l > 0 else float("nan")
        if target is None and busy == 0:
            goal, ok = "none (AVX2)", None
        else:
            goal = f">= {target:g}x" if busy == 0 else ">= 1x"
            ok = ratio >= (target if busy == 0 else 1.0)
        limit = "-"
        if kind == "tg" and busy == 0 and size.get(model):
            lim = dram / size[model]
            limit = f"{lim:.0f} ({r / lim:.0%})"
            if r >= 0.9 * lim:
                goal += " or >= 90% of limit"
                ok = True
        if kind == "pp" and busy == 0 and n_params.get(model) and peak > 0:
            lim = peak / n_params[model]
            limit = f"{lim:.0f} ({r / lim:.0%})"
        share = f"{r / q:.2f}" if busy and q == q and q > 0 else "-"
        verdict = "" if ok is None else " PASS" if ok else " MISS"
        print(f"| {model} | {busy} | {label} | {l:.1f} | {r:.1f} | {ratio:.2f}x{verdict} "
              f"| {goal} | {share} | {limit} |")
load = open("/proc/loadavg").read().split()[0]
print(f"load average (1 min) after the runs: {load} on {os.cpu_count()} CPUs")
PY

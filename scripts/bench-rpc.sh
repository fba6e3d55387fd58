#!/usr/bin/env bash
# rgml and llama.cpp as RPC client and as RPC server over loopback, side by side (issue 18).
# Not part of CI.
#
# Builds llama.cpp with its RPC backend once (scripts/llamacpp.sh --rpc: ggml-rpc-server,
# llama-bench) and rgml in release, then for each pairing of client (llama-bench, rgml bench)
# and server (ggml-rpc-server, rgml rpc-server) measures pp and tg with every layer on the
# remote device and with the layers split between the local CPU and the remote device, and
# beside them both clients with no server at all. R rounds each; prints one table of tokens/s
# (mean), with each remote row's share of the same client's local speed.
#
# Usage: scripts/bench-rpc.sh [-r ROUNDS] [-t THREADS] [-p N_PROMPT] [-n N_GEN] [-m MODEL]
#   THREADS: the client's compute threads and the server's (default 2); both run on this
#   machine, so a split's local and remote halves take turns on the same cores.
# Layer split: rgml `--device CPU,RPC0[..] --tensor-split 1,1`; llama.cpp `-ngl N/2` (the
# layers it does not offload stay on its CPU), N the model's block count.
set -euo pipefail
cd "$(dirname "$0")/.."

ROUNDS=3
THREADS=2
N_PROMPT=256
N_GEN=64
MODEL=models/SmolLM2-135M-Instruct.Q4_1.gguf
while [ $# -gt 0 ]; do
    case $1 in
        -r) ROUNDS=${2:?}; shift 2 ;;
        -t) THREADS=${2:?}; shift 2 ;;
        -p) N_PROMPT=${2:?}; shift 2 ;;
        -n) N_GEN=${2:?}; shift 2 ;;
        -m) MODEL=${2:?}; shift 2 ;;
        -h | --help) sed -n '2,18p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) echo "unknown flag $1 (see --help)" >&2; exit 2 ;;
    esac
done
log() { echo "== $*" >&2; }

bin=$(bash scripts/llamacpp.sh --rpc ggml-rpc-server llama-bench | tail -n 1)
log "building rgml (release)"
cargo build --release --quiet -p rgml-cli
rgml=$PWD/target/release/rgml
[ -f "$MODEL" ] || bash scripts/fetch-model.sh
n_layer=$("$rgml" gguf-info "$MODEL" | sed -n 's/.*block_count[^0-9]*\([0-9][0-9]*\).*/\1/p' | head -n 1)
[ -n "$n_layer" ] || { echo "cannot read the block count of $MODEL" >&2; exit 1; }
half=$((n_layer / 2))

work=$(mktemp -d)
server_pid=
stop_server() {
    if [ -n "$server_pid" ]; then kill "$server_pid" 2>/dev/null || true; wait "$server_pid" 2>/dev/null || true; fi
    server_pid=
}
trap 'stop_server; rm -rf "$work"' EXIT
port=50152
start_server() { # $1: ggml | rgml
    stop_server
    port=$((port + 1))
    if [ "$1" = ggml ]; then
        "$bin/ggml-rpc-server" -H 127.0.0.1 -p "$port" -t "$THREADS" >"$work/server.log" 2>&1 &
    else
        "$rgml" rpc-server -H 127.0.0.1 -p "$port" -t "$THREADS" >"$work/server.log" 2>&1 &
    fi
    server_pid=$!
    for _ in $(seq 1 100); do
        (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null && return 0
        sleep 0.1
    done
    echo "the $1 server did not start" >&2
    cat "$work/server.log" >&2
    exit 1
}

results=$work/results
: >"$results"
llama() { # $1: row label, rest: llama-bench flags
    local label=$1
    shift
    LD_LIBRARY_PATH=$bin "$bin/llama-bench" -m "$MODEL" -p "$N_PROMPT" -n "$N_GEN" -t "$THREADS" \
        -r 1 -o json "$@" >"$work/l.json" 2>"$work/l.err" || { cat "$work/l.err" >&2; exit 1; }
    python3 - "$work/l.json" "$label" >>"$results" <<'PY'
import json, sys
for t in json.load(open(sys.argv[1])):
    print(sys.argv[2], "pp" if t["n_gen"] == 0 else "tg", t["avg_ts"])
PY
}
rgml_bench() { # $1: row label, rest: rgml bench flags
    local label=$1
    shift
    "$rgml" bench -m "$MODEL" -p "$N_PROMPT" -n "$N_GEN" -t "$THREADS" -r 1 --json "$@" \
        >"$work/r.json"
    python3 - "$work/r.json" "$label" >>"$results" <<'PY'
import json, sys
v = json.loads(open(sys.argv[1]).read().strip().splitlines()[-1])
print(sys.argv[2], "pp", v["pp_tok_s"])
print(sys.argv[2], "tg", v["tg_tok_s"])
PY
}

for round in $(seq 1 "$ROUNDS"); do
    log "round $round/$ROUNDS: local"
    llama "llama.cpp|local|-" -ngl 0
    rgml_bench "rgml|local|-"
    for server in ggml rgml; do
        start_server "$server"
        ep=127.0.0.1:$port
        name=$([ "$server" = ggml ] && echo ggml-rpc-server || echo "rgml rpc-server")
        log "round $round/$ROUNDS: $name"
        llama "llama.cpp|$name|all remote" --rpc "$ep" -ngl 99
        llama "llama.cpp|$name|split 1:1" --rpc "$ep" -ngl "$half"
        rgml_bench "rgml|$name|all remote" --rpc "$ep"
        rgml_bench "rgml|$name|split 1:1" --rpc "$ep" --device "CPU,RPC0[$ep]" --tensor-split 1,1
        stop_server
    done
done

python3 - "$results" "$THREADS" "$ROUNDS" "$N_PROMPT" "$N_GEN" "$MODEL" <<'PY'
import statistics, sys
path, threads, rounds, n_prompt, n_gen, model = sys.argv[1:]
runs = {}
for line in open(path):
    label, kind, ts = line.rsplit(None, 2)
    runs.setdefault((label, kind), []).append(float(ts))
cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "?")
print(f"{model}: pp{n_prompt} and tg{n_gen}, {threads} threads (client and server), {rounds} rounds, "
      f"loopback, CPU {cpu}")
print("| client | server | layers | pp t/s | tg t/s | pp / local | tg / local |")
print("| --- | --- | --- | ---: | ---: | ---: | ---: |")
labels = list(dict.fromkeys(l for l, _ in runs))
for label in labels:
    client, server, layers = label.split("|")
    pp, tg = (statistics.mean(runs[(label, k)]) for k in ("pp", "tg"))
    lpp, ltg = (statistics.mean(runs[(f"{client}|local|-", k)]) for k in ("pp", "tg"))
    print(f"| {client} | {server} | {layers} | {pp:.1f} | {tg:.1f} | {pp / lpp:.2f} | {tg / ltg:.2f} |")
PY

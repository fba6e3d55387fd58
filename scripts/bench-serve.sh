#!/usr/bin/env bash
# Concurrent streaming clients against `rgml serve` and llama.cpp's `llama-server` (built from
# the PyPI source package by scripts/llamacpp.sh), same model, 8 slots: aggregate generated
# tokens/s and per-token latency p50/p99 for N = 1, 4, 8, 16 clients, in one run. llama-server
# runs at -t 1 and -t 2 (on a 2-core machine its threads wait on each other while the client
# takes a core); the better of the two is the anchor. Finally 64 connections on rgml's 8 slots
# must complete without an error. A benchmark, not a test.
#
# Usage: scripts/bench-serve.sh [-m MODEL] [-s SECONDS per point] [-n MAX_TOKENS] [-c "1 4 8 16"]
set -euo pipefail
cd "$(dirname "$0")/.."

model=models/SmolLM2-135M-Instruct.Q4_1.gguf
seconds=20
max_tokens=64
clients="1 4 8 16"
while getopts "m:s:n:c:" opt; do
    case $opt in
        m) model=$OPTARG ;;
        s) seconds=$OPTARG ;;
        n) max_tokens=$OPTARG ;;
        c) clients=$OPTARG ;;
        *) exit 2 ;;
    esac
done
slots=8
ctx=512

cargo build --release -q -p rgml-cli
rgml=target/release/rgml
bin=$(bash scripts/llamacpp.sh llama-server)
port=18080

wait_ready() {
    for _ in $(seq 600); do
        curl -sf "http://127.0.0.1:$port/health" >/dev/null 2>&1 && return 0
        sleep 0.1
    done
    echo "the server did not come up" >&2
    return 1
}

server_pid=
stop_server() {
    [ -z "$server_pid" ] && return 0
    kill -TERM "$server_pid" 2>/dev/null || true
    wait "$server_pid" 2>/dev/null || true
    server_pid=
}
trap stop_server EXIT

# run NAME CMD...: start the server, measure every client count, stop it.
run() {
    local name=$1
    shift
    "$@" >"/tmp/bench-serve-$name.log" 2>&1 &
    server_pid=$!
    wait_ready
    # One short request first, so that start-up costs stay out of the figures.
    python3 scripts/serve_load.py "http://127.0.0.1:$port" 1 1 8 >/dev/null
    for n in $clients; do
        r=$(python3 scripts/serve_load.py "http://127.0.0.1:$port" "$n" "$seconds" "$max_tokens")
        echo "$name $n $r"
    done
    stop_server
}

results=$(mktemp)
{
    run rgml "$rgml" serve -m "$model" --port $port -np $slots -c $ctx
    run "llama-server-t1" env LD_LIBRARY_PATH="$bin" "$bin/llama-server" -m "$model" --port $port \
        -np $slots -c $((ctx * slots)) -t 1
    run "llama-server-t2" env LD_LIBRARY_PATH="$bin" "$bin/llama-server" -m "$model" --port $port \
        -np $slots -c $((ctx * slots)) -t 2
} | tee "$results"

echo
echo "64 connections on $slots slots (rgml serve):"
"$rgml" serve -m "$model" --port $port -np $slots -c $ctx >/tmp/bench-serve-rgml64.log 2>&1 &
server_pid=$!
wait_ready
python3 scripts/serve_load.py "http://127.0.0.1:$port" 64 "$seconds" 32 | tee -a "$results"
stop_server

echo
python3 - "$results" "$seconds" "$max_tokens" <<'PY'
import json, sys
rows = {}
for line in open(sys.argv[1]):
    parts = line.split(" ", 2)
    if len(parts) == 3 and parts[2].startswith("{"):
        rows[(parts[0], int(parts[1]))] = json.loads(parts[2])
names = ["rgml", "llama-server-t1", "llama-server-t2"]
ns = sorted({n for _, n in rows})
print(f"{sys.argv[2]} s per point, max_tokens {sys.argv[3]}, 8 slots; tok/s aggregate, per-token latency ms")
print("| N | " + " | ".join(f"{n} tok/s | {n} p50 | {n} p99" for n in names) + " | rgml / best llama-server |")
print("|---|" + "---:|" * (3 * len(names) + 1))
for n in ns:
    cells, best = [], 0.0
    for name in names:
        r = rows.get((name, n))
        if r is None:
            cells += ["-", "-", "-"]
            continue
        err = f" ({r['errors']} errors)" if r["errors"] else ""
        cells += [f"{r['tok_s']:.1f}{err}", f"{r['p50_ms']:.0f}", f"{r['p99_ms']:.0f}"]
        if name != "rgml":
            best = max(best, r["tok_s"])
    ours = rows.get(("rgml", n), {}).get("tok_s", 0.0)
    ratio = f"{ours / best:.2f}x" if best else "-"
    print(f"| {n} | " + " | ".join(cells) + f" | {ratio} |")
PY
rm -f "$results"

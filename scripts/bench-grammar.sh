#!/usr/bin/env bash
# The per-token cost of grammar-constrained sampling (issue 33): `rgml run` on the demo model,
# greedy, 256 tokens, 2 threads, alternating unconstrained (--ignore-eos, so it runs as long)
# and constrained by a JSON schema whose documents are long (at least 40 array items), ROUNDS
# times; prints each run's generation speed and the medians.
#
# Usage: scripts/bench-grammar.sh [-r ROUNDS] [-m MODEL] [-t THREADS]
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=5
model=models/SmolLM2-135M-Instruct.Q4_1.gguf
threads=2
while getopts "r:m:t:" opt; do
  case $opt in
    r) rounds=$OPTARG ;;
    m) model=$OPTARG ;;
    t) threads=$OPTARG ;;
    *) sed -n 2,7p "$0"; exit 2 ;;
  esac
done
cargo build --release -q -p rgml-cli
rgml=target/release/rgml
schema='{"type":"array","items":{"type":"object","properties":{"name":{"type":"string"},"age":{"type":"integer","minimum":0,"maximum":99}},"required":["name","age"]},"minItems":40}'
prompt="A list of people with their names and ages as JSON:"
speed() { sed -n 's/.*generated: \([0-9]*\) tokens in .* (\([0-9.]*\) tok\/s).*/\1 \2/p'; }
plain=() constrained=()
for ((i = 1; i <= rounds; i++)); do
  read -r n1 s1 < <("$rgml" run -m "$model" -t "$threads" -p "$prompt" -n 256 --temp 0 --ignore-eos 2>&1 >/dev/null | speed)
  read -r n2 s2 < <("$rgml" run -m "$model" -t "$threads" -p "$prompt" -n 256 --temp 0 -j "$schema" 2>&1 >/dev/null | speed)
  echo "round $i: plain $n1 tokens at $s1 tok/s; json schema $n2 tokens at $s2 tok/s"
  plain+=("$s1") constrained+=("$s2")
done
median() { printf '%s\n' "$@" | sort -g | awk '{a[NR]=$1} END {print (NR % 2) ? a[(NR+1)/2] : (a[NR/2] + a[NR/2+1]) / 2}'; }
p=$(median "${plain[@]}") c=$(median "${constrained[@]}")
echo "median: plain $p tok/s, json schema $c tok/s ($(awk -v p="$p" -v c="$c" 'BEGIN {printf "%+.1f%%", (c / p - 1) * 100}'))"

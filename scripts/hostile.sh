#!/usr/bin/env bash
# Hostile invocations of the release `rgml` binary (issue 15): prints a table
# `input | exit code | outcome` and fails if any run panicked, died by a signal or timed out.
# Each row is also a test in crates/rgml-cli/tests/hostile.rs; this script shows them side by
# side against the binary users run. Exit codes: 0 success, 1 runtime error, 2 usage error,
# 141 the reader of stdout went away (rgml ends quietly, as the shell reports for Unix tools).
#
# Usage: scripts/hostile.sh [MODEL]   (default: the demo model; needs python3 for the variants)
set -uo pipefail
cd "$(dirname "$0")/.."
MODEL=${1:-models/SmolLM2-135M-Instruct.Q4_1.gguf}
[ -f "$MODEL" ] || { echo "model $MODEL missing: run scripts/fetch-model.sh" >&2; exit 1; }
cargo build --release -q -p rgml-cli || exit 1
R=target/release/rgml
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
LIMIT=${HOSTILE_TIMEOUT:-120}

# Variants of the model: every weight byte 0xFF (NaN scales), rope.dimension_count 0, a block
# count one short of the blocks in the file.
python3 - "$MODEL" "$TMP" <<'PY'
import struct, sys, shutil
src, tmp = sys.argv[1], sys.argv[2]
data = bytearray(open(src, "rb").read())
def u32_key(buf, key, value):
    k = key.encode()
    i = buf.find(struct.pack("<Q", len(k)) + k)
    assert i >= 0, key
    j = i + 8 + len(k)
    assert struct.unpack_from("<I", buf, j)[0] == 4, "u32 expected"
    out = bytearray(buf)
    struct.pack_into("<I", out, j + 4, value)
    return out
blocks = struct.unpack_from("<I", data, data.find(b"llama.block_count") + 17 + 4)[0]
open(f"{tmp}/rope0.gguf", "wb").write(u32_key(data, "llama.rope.dimension_count", 0))
open(f"{tmp}/short.gguf", "wb").write(u32_key(data, "llama.block_count", blocks - 1))
PY
# Every byte of the data section (where `gguf-info` says it starts) set to 0xFF.
DATA_AT=$($R gguf-info "$MODEL" | head -1 | sed -E 's/.*data at ([0-9]+).*/\1/')
python3 - "$MODEL" "$TMP/nan.gguf" "$DATA_AT" <<'PY'
import sys
src, dst, at = sys.argv[1], sys.argv[2], int(sys.argv[3])
data = bytearray(open(src, "rb").read())
data[at:] = b"\xff" * (len(data) - at)
open(dst, "wb").write(data)
PY
printf 'The quick brown fox jumps over the lazy dog. %.0s' {1..50} > "$TMP/text.txt"
cp "$MODEL" "$TMP/victim.gguf"

BAD=0
row() { # row LABEL CODE STDERR_FILE ELAPSED
    local label=$1 code=$2 err=$3 outcome
    outcome=$(grep -m1 -E '^(error|warning|generation stopped)' "$err" | cut -c1-110)
    [ -z "$outcome" ] && outcome="ok"
    if grep -q panicked "$err"; then outcome="PANIC: $outcome"; BAD=1; fi
    if [ "$code" = 124 ]; then outcome="TIMEOUT"; BAD=1; fi
    if [ "$code" -gt 128 ] && [ "$code" != 141 ]; then outcome="SIGNAL $((code - 128)): $outcome"; BAD=1; fi
    printf '| %s | %s | %s |\n' "$label" "$code" "$outcome"
}
try() { # try LABEL ARGS... (stdout discarded)
    local label=$1; shift
    timeout "$LIMIT" "$R" "$@" >/dev/null 2>"$TMP/err"
    row "$label" $? "$TMP/err"
}
piped() { # piped LABEL ARGS... (stdout into `head -1`)
    local label=$1; shift
    timeout "$LIMIT" "$R" "$@" 2>"$TMP/err" | head -1 >/dev/null
    row "$label" "${PIPESTATUS[0]}" "$TMP/err"
}
full() { # full LABEL ARGS... (stdout to /dev/full)
    local label=$1; shift
    timeout "$LIMIT" "$R" "$@" >/dev/full 2>"$TMP/err"
    row "$label" $? "$TMP/err"
}

M=(-m "$MODEL" -t 2)
echo "| input | exit | outcome |"
echo "| --- | ---: | --- |"
piped "gguf-info M \| head -1" gguf-info "$MODEL"
piped "logits … \| head -1" logits "${M[@]}" -p Hello
piped "test-ops -b CPU … \| head -1" test-ops -b CPU -o ADD
full "gguf-info M > /dev/full" gguf-info "$MODEL"
full "devices > /dev/full" devices
full "logits … > /dev/full" logits "${M[@]}" -p Hello
full "bench … > /dev/full" bench "${M[@]}" -p 8 -n 2 -r 1
# A context that fits in free memory but is far more than this run fills: the cache is
# reserved, not touched, so memory grows with the tokens. Stopped after 8 s.
"$R" run "${M[@]}" -c 1000000 -n 1000000 --temp 0 >/dev/null 2>"$TMP/err" &
pid=$!
sleep 8
hwm=$(awk '/VmHWM/ {print int($2 / 1024)}' "/proc/$pid/status" 2>/dev/null)
if kill $pid 2>/dev/null; then
    wait $pid 2>/dev/null
    printf '| %s | %s | %s |\n' "run -c 1000000 -n 1000000" "(stopped)" \
        "still generating after 8 s, peak resident ${hwm:-?} MiB"
else
    wait $pid
    row "run -c 1000000 -n 1000000" $? "$TMP/err"
fi
try "run -c 100000000 -n 100000000" run "${M[@]}" -c 100000000 -n 100000000
try "perplexity -f /dev/zero" perplexity "${M[@]}" -f /dev/zero
try "perplexity -c 2" perplexity "${M[@]}" -c 2 -f "$TMP/text.txt"
try "run -n 18446744073709551615 -c 64" run "${M[@]}" -n 18446744073709551615 -c 64 --temp 0
try "run -c 0" run "${M[@]}" -c 0
try "run -c 1 (prompt of 4 tokens)" run "${M[@]}" -c 1
try "run -c 2 -p <long prompt>" run "${M[@]}" -c 2 -p "a prompt longer than two tokens"
try "logits -c 2 -p <long prompt>" logits "${M[@]}" -c 2 -p "a prompt longer than two tokens"
try "bench -c 64 -p 512" bench "${M[@]}" -c 64 -p 512 -n 1 -r 1
try "run -n 1000000 -c 32" run "${M[@]}" -n 1000000 -c 32 --temp 0
try "run --temp NaN" run "${M[@]}" --temp NaN
try "run --top-p 0" run "${M[@]}" --top-p 0
try "run --min-p 2" run "${M[@]}" --min-p 2
try "run --repeat-penalty 0" run "${M[@]}" --repeat-penalty 0
try "run --repeat-penalty NaN" run "${M[@]}" --repeat-penalty NaN
try "run --repeat-penalty -1" run "${M[@]}" --repeat-penalty -1
try "run -t 1000" run -m "$MODEL" -t 1000
try "bench -t 0" bench -m "$MODEL" -t 0
try "run (weights all 0xFF: NaN)" run -m "$TMP/nan.gguf" -t 2 -n 8
try "logits (weights all 0xFF: NaN)" logits -m "$TMP/nan.gguf" -t 2 -p Hello
for var in RGML_CPU_ISA=bogus RGML_CPU_REPACK=bogus RGML_CPU_DEVICES=abc RGML_CPU_DEVICES=1000; do
    env "$var" timeout "$LIMIT" "$R" devices >/dev/null 2>"$TMP/err"
    row "$var devices" $? "$TMP/err"
done
try "run (rope.dimension_count = 0)" run -m "$TMP/rope0.gguf" -t 2
try "run (block_count one short)" run -m "$TMP/short.gguf" -t 2
try "run --trace /no/such/dir/x.json" run "${M[@]}" --trace /no/such/dir/x.json
try "run -m /tmp" run -m /tmp
try "gguf-info README.md" gguf-info README.md
# A model file truncated, then one rewritten in place, while a run reads it.
for change in truncate rewrite; do
    cp "$MODEL" "$TMP/victim.gguf"
    timeout "$LIMIT" "$R" run -m "$TMP/victim.gguf" -t 2 -c 4096 -n 100000 --temp 0 \
        >/dev/null 2>"$TMP/err" &
    pid=$!
    sleep 3
    if [ $change = truncate ]; then
        truncate -s 4096 "$TMP/victim.gguf"
    else
        dd if=/dev/urandom of="$TMP/victim.gguf" bs=1M count=1 seek=20 conv=notrunc status=none
    fi
    wait $pid
    row "model file: $change during run" $? "$TMP/err"
done
echo
if [ $BAD = 0 ]; then echo "no panic, no signal, no timeout"; else echo "FAILURES above"; fi
exit $BAD

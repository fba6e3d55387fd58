#!/usr/bin/env python3
"""Load for an OpenAI-compatible server (rgml serve, llama-server): N clients, each sending
streaming /v1/completions requests one after another for a fixed time; prints one JSON line
with the aggregate generated tokens/s and the per-token latency (gap between a stream's
consecutive tokens) p50/p99. Standard library only.

usage: serve_load.py URL CLIENTS SECONDS MAX_TOKENS
"""
import http.client
import json
import sys
import threading
import time
import urllib.parse

URL, CLIENTS, SECONDS, MAX_TOKENS = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), int(sys.argv[4])
PROMPTS = [
    "Once upon a time, in a small village by the sea, there lived",
    "The history of the Roman Empire begins with",
    "Here is a long list of animals and where they live:",
    "Write a story about a robot who learns to paint.",
]
host = urllib.parse.urlparse(URL)
lock = threading.Lock()
gaps, tokens, errors, requests = [], [0], [], [0]


def one_request(conn, prompt):
    body = json.dumps({"prompt": prompt, "max_tokens": MAX_TOKENS, "stream": True,
                       "temperature": 0.8, "seed": 1, "ignore_eos": True})
    conn.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
    resp = conn.getresponse()
    if resp.status != 200:
        raise RuntimeError(f"HTTP {resp.status}: {resp.read()[:200]!r}")
    last, mine, n = None, [], 0
    while True:
        line = resp.readline()
        if not line:
            break
        line = line.strip()
        if not line.startswith(b"data: "):
            continue
        data = line[6:]
        if data == b"[DONE]":
            break
        event = json.loads(data)
        if "error" in event:
            raise RuntimeError(str(event["error"]))
        choices = event.get("choices") or []
        if choices and "text" in choices[0] and choices[0].get("finish_reason") is None:
            now = time.perf_counter()
            if last is not None:
                mine.append(now - last)
            last = now
            n += 1
    resp.read()
    return mine, n


def client(i, deadline):
    k = 0
    while time.perf_counter() < deadline:
        # A connection per request: servers differ in how long they keep one alive.
        conn = http.client.HTTPConnection(host.hostname, host.port, timeout=600)
        try:
            mine, n = one_request(conn, PROMPTS[(i + k) % len(PROMPTS)])
        except Exception as e:  # noqa: BLE001 - every failure is counted and reported
            with lock:
                errors.append(repr(e))
            continue
        finally:
            conn.close()
        k += 1
        with lock:
            gaps.extend(mine)
            tokens[0] += n
            requests[0] += 1


t0 = time.perf_counter()
deadline = t0 + SECONDS
threads = [threading.Thread(target=client, args=(i, deadline)) for i in range(CLIENTS)]
for t in threads:
    t.start()
for t in threads:
    t.join()
wall = time.perf_counter() - t0
gaps.sort()


def pct(p):
    return 1000 * gaps[min(len(gaps) - 1, int(p / 100 * len(gaps)))] if gaps else float("nan")


print(json.dumps({"clients": CLIENTS, "tokens": tokens[0], "requests": requests[0],
                  "seconds": round(wall, 2), "tok_s": round(tokens[0] / wall, 2),
                  "p50_ms": round(pct(50), 1), "p99_ms": round(pct(99), 1),
                  "errors": len(errors), "first_error": errors[0] if errors else None}))

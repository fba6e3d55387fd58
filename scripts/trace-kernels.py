#!/usr/bin/env python3
"""Time per kernel from an rgml trace (`rgml bench --trace FILE` on a GPU stream).

The wgpu backend records a "kernel" span per dispatch, measured with GPU timestamps, named by
the node's op and the kernel ("MUL_MAT Fast(MulMv, 5)"). This sums them by name and prints a
table, largest first: total milliseconds, share of the kernels' time, dispatches and mean
microseconds per dispatch. With --by-op the kernels of one op are summed together.

Usage: scripts/trace-kernels.py TRACE.json [--by-op] [--top N] [--json OUT]
"""
import argparse
import json
import sys
from collections import defaultdict


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("trace")
    ap.add_argument("--by-op", action="store_true", help="sum the kernels of each op")
    ap.add_argument("--top", type=int, default=30, help="rows to print (default 30)")
    ap.add_argument("--json", help="also write the table as JSON here")
    args = ap.parse_args()
    try:
        events = json.load(open(args.trace))["traceEvents"]
    except (OSError, ValueError, KeyError) as e:
        sys.exit(f"{args.trace}: not an rgml trace ({e})")
    total = defaultdict(float)
    count = defaultdict(int)
    for ev in events:
        if ev.get("ph") != "X" or ev.get("cat") != "kernel":
            continue
        name = ev["name"].split(" ", 1)[0] if args.by_op else ev["name"]
        total[name] += ev["dur"]
        count[name] += 1
    if not total:
        sys.exit(f"{args.trace}: no kernel spans (no GPU stream, or an adapter without "
                 "TIMESTAMP_QUERY_INSIDE_PASSES)")
    all_us = sum(total.values())
    rows = sorted(total, key=total.get, reverse=True)
    print(f"{'kernel':<44} {'ms':>10} {'share':>7} {'calls':>7} {'us/call':>9}")
    for name in rows[: args.top]:
        print(f"{name:<44} {total[name] / 1e3:>10.2f} {100 * total[name] / all_us:>6.1f}% "
              f"{count[name]:>7} {total[name] / count[name]:>9.1f}")
    print(f"{'all kernels':<44} {all_us / 1e3:>10.2f} {100.0:>6.1f}% {sum(count.values()):>7}")
    if args.json:
        json.dump([{"kernel": n, "us": total[n], "calls": count[n]} for n in rows],
                  open(args.json, "w"), indent=1)


if __name__ == "__main__":
    main()

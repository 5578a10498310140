#!/usr/bin/env python3
"""A/B service benchmark (not a test): `execute` of /bin/true round trip
through `moat serve --stdio` (template launch) for two or more moat
binaries, and `bwrap --unshare-all -- /bin/true`, alternated round by
round (so the machine's load hits each alike); per binary the p50 of each
round and its ratio to the same round's bwrap p50.

Usage: bench/serve_ab.py MOAT_A MOAT_B ...   Env: ROUNDS (default 6),
RUNS (executions per binary per round, default 100)."""

import os
import shutil
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import serve  # noqa: E402

ROUNDS = int(os.environ.get("ROUNDS", "6"))
RUNS = int(os.environ.get("RUNS", "100"))


def served(moat, ws):
    serve.MOAT = moat
    serve.RUNS = RUNS
    svc = serve.Service(ws, "template")
    try:
        return statistics.median(svc.timed())
    finally:
        svc.close()


def main():
    binaries = sys.argv[1:]
    if not binaries or not shutil.which("bwrap"):
        raise SystemExit("usage: serve_ab.py MOAT_A [MOAT_B ...] (and bwrap on PATH)")
    ws = tempfile.mkdtemp(prefix="moat-bench-")
    serve.RUNS = RUNS
    rows = {b: [] for b in binaries}
    for r in range(ROUNDS):
        order = binaries if r % 2 == 0 else list(reversed(binaries))
        bw = statistics.median(serve.one_shot(
            ["bwrap", "--unshare-all", "--ro-bind", "/", "/", "--", "/bin/true"], ws))
        for b in order:
            rows[b].append((served(b, ws), bw))
        load = os.getloadavg()[0]
        print(f"round {r + 1}: load {load:.1f}, bwrap {bw * 1e3:.2f} ms, " + ", ".join(
            f"{os.path.basename(b)} {rows[b][-1][0] * 1e3:.2f} ms ({rows[b][-1][0] / bw:.2f}x)"
            for b in binaries), flush=True)
    print(f"\n{RUNS} executions per binary per round, {ROUNDS} rounds")
    print("| binary | p50 ms per round (min-max) | ratio to bwrap p50 (min-max) |\n|---|---|---|")
    for b, xs in rows.items():
        ms = [x * 1e3 for x, _ in xs]
        ratio = [x / bw for x, bw in xs]
        print(f"| {b} | {min(ms):.2f}-{max(ms):.2f} | {min(ratio):.2f}-{max(ratio):.2f} |")
    shutil.rmtree(ws, ignore_errors=True)


if __name__ == "__main__":
    main()

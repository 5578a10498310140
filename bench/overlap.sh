#!/usr/bin/env bash
# Can the namespaces be built while moat probes? bench/overlap.c in its three
# modes (serial = today's order; early; early and moved to another cpu) in
# alternating rounds; each process reports the time until its child is ready
# (whole-process times here are dominated by the network namespace's
# teardown). Prints each mode's median and the median of its paired
# difference to serial with a 95% bootstrap interval, and the share of idle
# cpu during the run (the overlap needs a cpu to run on).
# Env: RUNS (default 300).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
OUT_DIR="${OUT_DIR:-$ROOT/target/bench}"
mkdir -p "$OUT_DIR"
BIN="$OUT_DIR/overlap"
command -v cc >/dev/null || { echo "missing cc (apt-get install gcc)" >&2; exit 1; }
cc -O2 -Wall -Wextra -static -o "$BIN" "$ROOT/bench/overlap.c"
BIN="$BIN" RUNS="${RUNS:-300}" python3 - <<'PY'
import os, random, statistics, subprocess
modes = ["serial", "early", "migrated"]
runs, bin_ = int(os.environ["RUNS"]), os.environ["BIN"]
def idle():
    f = [int(x) for x in open("/proc/stat").readline().split()[1:9]]
    return f[3], sum(f)
i0, t0 = idle()
t = {m: [] for m in modes}
for r in range(runs):
    k = r % len(modes)
    for m in modes[k:] + modes[:k]:
        t[m].append(int(subprocess.run([bin_, m], check=True, capture_output=True, text=True).stdout))
i1, t1 = idle()
print(f"rounds {runs}, idle cpu during the run {100 * (i1 - i0) / (t1 - t0):.0f}%")
for m in modes:
    line = f"{m:9} median until ready {statistics.median(t[m]):6.0f} µs"
    if m != "serial":
        d = [a - b for a, b in zip(t[m], t["serial"])]
        boot = sorted(statistics.median(random.choices(d, k=len(d))) for _ in range(1000))
        line += f"   vs serial {statistics.median(d):+5.0f} µs [{boot[25]:+.0f}, {boot[974]:+.0f}]"
    print(line)
PY

#!/usr/bin/env python3
"""Benchmark runner and verdicts for bench/*.sh.

Commands are timed in alternating rounds (each round runs every command
once, the starting command rotating), so a slow stretch of a shared machine
hits every command alike. Comparisons report the median with a 95%
bootstrap confidence interval over the rounds (paired resampling), and a
verdict against the target that is one of:
  "target reached"      the whole interval is on the target's good side,
  "target not reached"  the whole interval is on the bad side,
  "within noise"        the interval straddles the target (or, with no
                        target, zero): this run cannot resolve it.

  ab.py run OUT.json RUNS WARMUP NAME CMD [NAME CMD ...]
  ab.py table OUT.json REF [RATIO_TARGET [TARGET_ROW]]   markdown rows:
        each command's min/median/max and its ratio to REF (target: ratio
        <= RATIO_TARGET, applied to the row named TARGET_ROW, or without
        one to every row whose name starts with "moat")
  ab.py diff OUT.json A B TARGET_MS LABEL   one row: B's added time over A
  ab.py over OUT.json REF BASE CMD TARGET LABEL   one row: CMD's added time
        over BASE as a multiple of REF's time (median-based, paired rounds,
        95% CI; target: multiple <= TARGET, "-" for none)
  ab.py spread LABEL UNIT DIRECTION TARGET V1 V2 ...   min/median/max of
        repeated whole-run measurements; DIRECTION is ">=" or "<="; the
        verdict needs every repeat on one side of TARGET ("-": no target).
"""
import json
import os
import random
import shlex
import statistics
import sys
import time

BOOT = 2000


def run(out, runs, warmup, pairs):
    names = pairs[0::2]
    cmds = [shlex.split(c) for c in pairs[1::2]]
    devnull = os.open(os.devnull, os.O_RDWR)
    fa = [
        (os.POSIX_SPAWN_DUP2, devnull, 0),
        (os.POSIX_SPAWN_DUP2, devnull, 1),
        (os.POSIX_SPAWN_DUP2, devnull, 2),
    ]
    times = {n: [] for n in names}
    for r in range(warmup + runs):
        k = r % len(names)
        for i in list(range(k, len(names))) + list(range(0, k)):
            t0 = time.perf_counter_ns()
            pid = os.posix_spawnp(cmds[i][0], cmds[i], os.environ, file_actions=fa)
            _, st = os.waitpid(pid, 0)
            t1 = time.perf_counter_ns()
            if os.waitstatus_to_exitcode(st) != 0:
                sys.exit(f"{names[i]}: {' '.join(cmds[i])} exited {os.waitstatus_to_exitcode(st)}")
            if r >= warmup:
                times[names[i]].append((t1 - t0) / 1e6)
    json.dump({"runs": runs, "order": names, "times_ms": times}, open(out, "w"))


def load(path):
    d = json.load(open(path))
    return d["order"], d["times_ms"]


def ci(stat, a, b):
    """Median-based statistic over paired rounds, with a bootstrap 95% CI."""
    n = len(a)
    rng = random.Random(1)
    point = stat(statistics.median(a), statistics.median(b))
    boots = []
    for _ in range(BOOT):
        idx = [rng.randrange(n) for _ in range(n)]
        boots.append(stat(statistics.median([a[i] for i in idx]),
                          statistics.median([b[i] for i in idx])))
    boots.sort()
    return point, boots[int(0.025 * BOOT)], boots[int(0.975 * BOOT) - 1]


def verdict(lo, hi, target, good_below):
    if target is None:
        return "within noise (interval includes no change)" if lo <= 0 <= hi else (
            "resolved: slower" if lo > 0 else "resolved: faster")
    if good_below:
        if hi < target:
            return "target reached"
        if lo > target:
            return "target not reached"
    else:
        if lo > target:
            return "target reached"
        if hi < target:
            return "target not reached"
    return "within noise (interval straddles the target)"


def table(path, ref, ratio_target=None, target_row=None):
    order, t = load(path)
    print(f"| command | min (ms) | median (ms) | max (ms) | median vs {ref} (95% CI) | verdict |")
    print("|---|---:|---:|---:|---:|---|")
    for n in order:
        v = t[n]
        if n == ref:
            ratio, verdict_s = "1.00×", "reference"
        else:
            p, lo, hi = ci(lambda a, b: b / a, t[ref], v)
            ratio = f"{p:.2f}× [{lo:.2f}, {hi:.2f}]"
            judged = n == target_row if target_row else n.startswith("moat")
            if ratio_target is not None and judged:
                verdict_s = f"target ≤ {ratio_target}×: " + verdict(lo, hi, ratio_target, True)
            else:
                verdict_s = "—"
        print(f"| {n} | {min(v):.2f} | {statistics.median(v):.2f} | {max(v):.2f} | {ratio} | {verdict_s} |")


def diff(path, a, b, target_ms, label):
    _, t = load(path)
    p, lo, hi = ci(lambda x, y: y - x, t[a], t[b])
    ma, mb = statistics.median(t[a]), statistics.median(t[b])
    print(f"| {label} ({len(t[a])} alternating rounds) | "
          f"{ma:.2f} → {mb:.2f} ms median; added {p:+.2f} ms [95% CI {lo:+.2f}, {hi:+.2f}] | "
          f"< {target_ms} ms: {verdict(lo, hi, target_ms, True)} |")


def ci_over(ref, base, cmd):
    """(median(cmd) - median(base)) / median(ref) over paired rounds, with a
    bootstrap 95% CI."""
    def stat(idx):
        m = lambda v: statistics.median([v[i] for i in idx])
        return (m(cmd) - m(base)) / m(ref)
    n = len(ref)
    rng = random.Random(1)
    point = stat(range(n))
    boots = sorted(stat([rng.randrange(n) for _ in range(n)]) for _ in range(BOOT))
    return point, boots[int(0.025 * BOOT)], boots[int(0.975 * BOOT) - 1]


def over(path, ref, base, cmd, target, label):
    _, t = load(path)
    p, lo, hi = ci_over(t[ref], t[base], t[cmd])
    added = statistics.median(t[cmd]) - statistics.median(t[base])
    mr = statistics.median(t[ref])
    v = "—" if target is None else f"≤ {target}× {ref}: " + verdict(lo, hi, target, True)
    print(f"| {label} ({len(t[ref])} alternating rounds) | "
          f"{added:+.1f} ms over {base}; {ref} {mr:.1f} ms (min {min(t[ref]):.1f}, max {max(t[ref]):.1f}); "
          f"{p:.2f}× {ref} [95% CI {lo:.2f}, {hi:.2f}] | {v} |")


def num(x):
    return f"{x:,.0f}" if abs(x) >= 1000 else f"{x:.3g}"


def spread(label, unit, direction, target, values):
    v = sorted(values)
    med = statistics.median(v)
    result = f"median {num(med)} {unit} (min {num(v[0])}, max {num(v[-1])}, {len(v)} repeats)"
    if target is None:
        print(f"| {label} | {result} | — |")
        return
    if direction == ">=":
        s = "target reached" if v[0] >= target else ("target not reached" if v[-1] < target
                                                    else "within noise (repeats on both sides)")
    else:
        s = "target reached" if v[-1] <= target else ("target not reached" if v[0] > target
                                                     else "within noise (repeats on both sides)")
    print(f"| {label} | {result} | {direction} {num(target)} {unit}: {s} |")


if __name__ == "__main__":
    a = sys.argv[1:]
    if a and a[0] == "run" and len(a) >= 6 and len(a) % 2 == 0:
        run(a[1], int(a[2]), int(a[3]), a[4:])
    elif a and a[0] == "table" and len(a) in (3, 4, 5):
        table(a[1], a[2], float(a[3]) if len(a) >= 4 else None, a[4] if len(a) == 5 else None)
    elif a and a[0] == "diff" and len(a) == 6:
        diff(a[1], a[2], a[3], float(a[4]), a[5])
    elif a and a[0] == "over" and len(a) == 7:
        over(a[1], a[2], a[3], a[4], None if a[5] == "-" else float(a[5]), a[6])
    elif a and a[0] == "spread" and len(a) >= 6:
        target = None if a[4] == "-" else float(a[4])
        spread(a[1], a[2], a[3], target, [float(x) for x in a[5:]])
    else:
        sys.exit(__doc__)

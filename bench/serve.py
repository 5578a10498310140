#!/usr/bin/env python3
"""Service benchmark (not a test): `execute` of /bin/true round trip through
`moat serve --stdio` (request → execution.finished), forked from a sandbox
template (`--launch template`, the default) and as a one-shot child
(`--launch oneshot`), vs one-shot `moat exec -- /bin/true` vs
`bwrap --unshare-all -- /bin/true`, p50/p99 in one run, with the template's
ratio to bwrap (issue 11's target: at most 0.5); then a soak: SEQ
executions in sequence (default 3,000) with the service's RSS and open fd
count after a warm-up and at 1k, 2k, 3k…, exiting 1 when the fds grow or
the RSS keeps growing past its plateau (more than PLATEAU_KB, default
2048 kB, per 1,000 executions after the first 1,000: the service
remembers its last 1,000 executions, so it fills up to there and must
stay flat after).

Env: MOAT_BIN (default target/release/moat, else target/debug/moat),
RUNS (default 200), SEQ (default 3000), PLATEAU_KB (default 2048).
SOAK_ONLY=1 skips the latency table."""

import json
import os
import shutil
import statistics
import subprocess
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MOAT = os.environ.get("MOAT_BIN") or next(
    p for p in (f"{ROOT}/target/release/moat", f"{ROOT}/target/debug/moat") if os.path.exists(p)
)
RUNS = int(os.environ.get("RUNS", "200"))
SEQ = int(os.environ.get("SEQ", "3000"))
PLATEAU_KB = int(os.environ.get("PLATEAU_KB", "2048"))
# The service remembers this many executions (docs/protocol.md).
REMEMBERED = 1000


def pct(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(len(xs) * p))]


def one_shot(argv, cwd):
    times = []
    for _ in range(RUNS):
        t = time.perf_counter()
        subprocess.run(argv, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                       check=False)
        times.append(time.perf_counter() - t)
    return times


def proc_stats(pid):
    rss = 0
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                rss = int(line.split()[1])
    return rss, len(os.listdir(f"/proc/{pid}/fd"))


class Service:
    """`moat serve --stdio --launch LAUNCH` in `ws`."""

    def __init__(self, ws, launch):
        self.launch = launch
        self.srv = subprocess.Popen(
            [MOAT, "serve", "--stdio", "--no-audit", "--policy", "workspace-contained",
             "--launch", launch],
            cwd=ws, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        )
        self.n = 0

    def execute(self):
        self.n += 1
        self.srv.stdin.write(json.dumps({"jsonrpc": "2.0", "id": self.n, "method": "execute",
                                         "params": {"command": ["/bin/true"]}}) + "\n")
        self.srv.stdin.flush()
        while True:
            msg = json.loads(self.srv.stdout.readline())
            if "error" in msg:
                raise SystemExit(f"execute failed: {msg}")
            params = msg.get("params", {})
            if params.get("type") == "execution.failed":
                raise SystemExit(f"execute failed: {msg}")
            if params.get("type") == "execution.finished":
                if params.get("launch", "oneshot") != self.launch:
                    raise SystemExit(f"asked for {self.launch}, ran {params.get('launch')}: {msg}")
                return

    def timed(self):
        for _ in range(10):
            self.execute()
        xs = []
        for _ in range(RUNS):
            t = time.perf_counter()
            self.execute()
            xs.append(time.perf_counter() - t)
        return xs

    def close(self):
        self.srv.stdin.close()
        self.srv.wait()


def soak(svc):
    """SEQ executions in sequence; the RSS and fds at each 1,000. Returns
    whether the service stayed flat past its plateau."""
    for _ in range(100):
        svc.execute()
    marks = [(0, *proc_stats(svc.srv.pid))]
    for i in range(1, SEQ + 1):
        svc.execute()
        if i % 1000 == 0 or i == SEQ:
            marks.append((i, *proc_stats(svc.srv.pid)))
    print(f"\nsoak: {SEQ} executions in sequence ({svc.launch}), after 100 to warm up:")
    print("| executions | RSS kB | open fds |\n|---|---|---|")
    for n, rss, fds in marks:
        print(f"| {n} | {rss} | {fds} |")
    ok = True
    if marks[-1][2] > marks[0][2] + 2:
        print(f"FAIL: open fds grew from {marks[0][2]} to {marks[-1][2]}")
        ok = False
    past = [m for m in marks if m[0] >= REMEMBERED]
    if len(past) >= 2:
        (n0, r0, _), (n1, r1, _) = past[0], past[-1]
        per_k = (r1 - r0) * 1000 / (n1 - n0)
        print(f"RSS growth past {REMEMBERED} executions: {per_k:.0f} kB per 1,000 (limit {PLATEAU_KB})")
        if per_k > PLATEAU_KB:
            print("FAIL: the RSS keeps growing past its plateau")
            ok = False
    else:
        print(f"(SEQ below {2 * REMEMBERED}: no plateau to check)")
    return ok


def main():
    ws = tempfile.mkdtemp(prefix="moat-bench-")
    if os.environ.get("SOAK_ONLY"):
        svc = Service(ws, "template")
        ok = soak(svc)
        svc.close()
        shutil.rmtree(ws, ignore_errors=True)
        raise SystemExit(0 if ok else 1)
    oneshot = Service(ws, "oneshot")
    served_oneshot = oneshot.timed()
    oneshot.close()
    svc = Service(ws, "template")
    served = svc.timed()
    rows = [("moat serve execute /bin/true (template)", served),
            ("moat serve execute /bin/true (one-shot child)", served_oneshot),
            ("moat exec (contained, disabled) /bin/true",
             one_shot([MOAT, "exec", "--no-audit", "--policy", "workspace-contained", "--", "/bin/true"], ws))]
    if shutil.which("bwrap"):
        rows.append(("bwrap --unshare-all /bin/true",
                     one_shot(["bwrap", "--unshare-all", "--ro-bind", "/", "/", "--", "/bin/true"], ws)))
    print(f"moat: {MOAT}, {RUNS} runs each")
    print("| what | p50 ms | p99 ms |\n|---|---|---|")
    for name, xs in rows:
        print(f"| {name} | {statistics.median(xs) * 1e3:.2f} | {pct(xs, 0.99) * 1e3:.2f} |")
    if len(rows) > 3:
        ratio = statistics.median(served) / statistics.median(rows[3][1])
        print(f"\ntemplate execute p50 / bwrap p50 = {ratio:.2f} (target: at most 0.50)")

    ok = soak(svc)
    svc.close()
    shutil.rmtree(ws, ignore_errors=True)
    raise SystemExit(0 if ok else 1)


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""The window of a host replacing a protected file mid-run (ARCHITECTURE.md,
"A one-shot run's watch over narrowing mounts").

  host_replace.py MOAT TRIALS

Each trial: a workspace whose `.env` holds OLD; `moat exec --policy
workspace-write` runs a reader that reads `.env` in a tight loop and prints
any non-empty content; once it has started, the host renames a new `.env`
(NEW) over the old one and waits for moat to exit. Prints, over the trials:
the time from the host's rename to moat's exit (the run stopped and reaped,
an upper bound on how long the new file was visible), how many trials the
reader saw NEW at least once, and the most reads of NEW in one trial.
"""
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

READER = r"""
import os
open('ready', 'w').close()
while True:
    try:
        with open('.env', 'rb') as f:
            d = f.read()
    except OSError:
        continue
    if d:
        os.write(1, b'LEAK ' + d + b'\n')
"""


def trial(moat):
    ws = tempfile.mkdtemp(prefix="moat-replace-", dir="/var/tmp")
    try:
        with open(os.path.join(ws, ".env"), "w") as f:
            f.write("OLD")
        p = subprocess.Popen(
            [moat, "exec", "--policy", "workspace-write", "--", "/usr/bin/python3", "-c", READER],
            cwd=ws, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        ready = os.path.join(ws, "ready")
        start = time.monotonic()
        while not os.path.exists(ready):
            if p.poll() is not None or time.monotonic() - start > 60:
                p.kill()
                raise SystemExit("the reader never started: " + p.stderr.read().decode())
            time.sleep(0.002)
        time.sleep(0.01)  # let the reader reach its loop
        tmp = os.path.join(ws, ".env.tmp")
        with open(tmp, "w") as f:
            f.write("NEW")
        t0 = time.monotonic()
        os.rename(tmp, os.path.join(ws, ".env"))
        try:
            p.wait(timeout=30)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
            return None, -1
        t1 = time.monotonic()
        out = p.stdout.read().decode(errors="replace")
        if p.returncode != 125:
            raise SystemExit(f"exit {p.returncode}, not 125: {p.stderr.read().decode()}")
        return (t1 - t0) * 1000, out.count("LEAK NEW")
    finally:
        shutil.rmtree(ws, ignore_errors=True)


def main():
    moat, trials = sys.argv[1], int(sys.argv[2])
    ms, leaks = [], []
    for _ in range(trials):
        t, n = trial(moat)
        if t is None:
            raise SystemExit("moat did not stop the run within 30 s")
        ms.append(t)
        leaks.append(n)
    ms.sort()
    q = lambda f: ms[min(len(ms) - 1, int(f * len(ms)))]
    print(f"trials {trials}: rename -> moat exited (ms): min {ms[0]:.2f} median "
          f"{statistics.median(ms):.2f} p90 {q(0.9):.2f} p99 {q(0.99):.2f} max {ms[-1]:.2f}")
    seen = sum(1 for n in leaks if n)
    print(f"reads of the new file: trials with any {seen}/{trials}, most in one trial "
          f"{max(leaks)}, median {statistics.median(leaks)}")


main()

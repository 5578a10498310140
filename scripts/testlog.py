#!/usr/bin/env python3
"""Read libtest output (run with --show-output) for scripts/test-all.

summarize PHASE LOG ALLOWFILE SCOPE: append a human summary of the phase (passed,
    failed, every SKIP and note line with its test) to $TESTLOG_SUMMARY and
    print "passed failed skips notes unallowed_skips" on stdout.
noop LOG: list the tests that passed against the no-op stand-in; exit 1 if
    any of them is not named *_positive_control or *_contract.
"""
import os
import re
import sys

RESULT = re.compile(r"test result: \w+\. (\d+) passed; (\d+) failed")
HEADER = re.compile(r"^---- (\S+) stdout ----$")
PASSED = re.compile(r"^test (\S+) \.\.\. ok$")
ALLOWED_SUFFIXES = ("_positive_control", "_contract")


def lines(path):
    with open(path, errors="replace") as f:
        return f.read().splitlines()


SCOPES = ("any", "unprivileged")


def allowed_skips(path, scope):
    """Test names the allow-list accepts in a phase of SCOPE ("root" or
    "unprivileged"): lines `NAME | any|unprivileged | reason`, # comments."""
    names = set()
    if path and os.path.exists(path):
        for line in lines(path):
            line = line.split("#", 1)[0].strip()
            if not line:
                continue
            parts = [p.strip() for p in line.split("|", 2)]
            if len(parts) != 3 or parts[1] not in SCOPES or not parts[2]:
                sys.exit(f"{path}: every line needs `NAME | any|unprivileged | reason`: {line!r}")
            if parts[1] == "any" or parts[1] == scope:
                names.add(parts[0])
    return names


def summarize(phase, log, allow_file, scope):
    allowed = allowed_skips(allow_file, scope)
    passed = failed = 0
    current = "?"
    skips, notes = [], []
    for line in lines(log):
        m = RESULT.search(line)
        if m:
            passed += int(m.group(1))
            failed += int(m.group(2))
            continue
        m = HEADER.match(line)
        if m:
            current = m.group(1)
            continue
        s = line.strip()
        if s.startswith("SKIP:"):
            skips.append((current, s[5:].strip()))
        elif s.startswith("note:"):
            notes.append((current, s[5:].strip()))
    unallowed = [(t, r) for t, r in skips if t not in allowed]
    out = [f"{phase}: {passed} passed, {failed} failed, {len(skips)} SKIP, {len(notes)} note"]
    for t, r in skips:
        tag = "allowed" if t in allowed else "NOT ALLOWED"
        out.append(f"    SKIP ({tag}) {t}: {r}")
    for t, r in notes:
        out.append(f"    note {t}: {r}")
    summary = os.environ.get("TESTLOG_SUMMARY")
    if summary:
        with open(summary, "a") as f:
            f.write("\n".join(out) + "\n")
    else:
        print("\n".join(out), file=sys.stderr)
    print(passed, failed, len(skips), len(notes), len(unallowed))


RUNNING = re.compile(r"^running \d+ tests?$")


def outer_lines(path):
    """The per-case result lines libtest printed itself: those between its
    `running N tests` and the `successes:`/`failures:` sections or the
    `test result:` that follow. A failed case's captured output (dumped in
    `failures:`) is never read as a result, so a nested run's
    `test X ... ok` that a failing case dumps (containers_suite runs
    executables inside runc; it also indents what it dumps) cannot count
    as the outer case's pass."""
    results = False
    for line in lines(path):
        if RUNNING.match(line):
            results = True
        elif line in ("failures:", "successes:") or line.startswith("test result:"):
            results = False
        elif results:
            yield line


def noop(log):
    passing = sorted({m.group(1) for l in outer_lines(log) if (m := PASSED.match(l))})
    bad = [t for t in passing if not t.endswith(ALLOWED_SUFFIXES)]
    print(f"{len(passing)} case(s) passed against the no-op stand-in:")
    for t in passing:
        mark = "ok (named so)" if t not in bad else "NOT A CONTROL: a security case passed with no sandbox"
        print(f"    {t}: {mark}")
    if bad:
        print(f"{len(bad)} case(s) pass without any sandbox but are not named "
              f"*_positive_control or *_contract: {' '.join(bad)}")
        return 1
    return 0


if __name__ == "__main__":
    cmd = sys.argv[1] if len(sys.argv) > 1 else ""
    if cmd == "summarize" and len(sys.argv) == 6:
        summarize(sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5])
    elif cmd == "noop" and len(sys.argv) == 3:
        sys.exit(noop(sys.argv[2]))
    else:
        sys.exit(__doc__)

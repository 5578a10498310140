#!/usr/bin/env bash
# Audit benchmark:
#  1. `moat audit verify` on a generated 100,000-line log (target > 200k lines/s),
#     median of RUNS runs of the shipped (static) binary; if that binary has no
#     `audit` subcommand yet, the library's verify through examples/audit_bench.
#  2. One append of a typical run's three events (policy.resolved,
#     execution.started, execution.finished) as one locked write: median of
#     APPENDS appends to the same 100,000-line log.
# Env: LINES (default 100000), RUNS (default 7), APPENDS (default 1000),
#      OUT_DIR (default target/bench).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
LINES="${LINES:-100000}"
RUNS="${RUNS:-7}"
APPENDS="${APPENDS:-1000}"
OUT_DIR="${OUT_DIR:-$ROOT/target/bench}"
mkdir -p "$OUT_DIR"
cd "$ROOT"

cargo build --release -p moat-audit --examples >&2
GEN="$ROOT/target/release/examples/audit_gen"
BENCH="$ROOT/target/release/examples/audit_bench"
MOAT="$(bash "$ROOT/scripts/build-release")"

LOG_DIR="$(mktemp -d /var/tmp/moat-bench-audit-XXXXXX)"
trap 'rm -rf "$LOG_DIR"' EXIT
LOG="$LOG_DIR/audit.jsonl"
"$GEN" "$LOG" "$LINES"
echo "log: $LINES lines, $(( $(stat -c %s "$LOG") / 1000 )) kB  kernel: $(uname -r)  cpus: $(nproc)"

if "$MOAT" audit verify --help >/dev/null 2>&1; then
    "$MOAT" audit verify --log "$LOG"        # warm the page cache; prints "ok: …"
    times=()
    for _ in $(seq "$RUNS"); do
        t0=$(date +%s%N)
        "$MOAT" audit verify --log "$LOG" >/dev/null
        t1=$(date +%s%N)
        times+=($(( (t1 - t0) / 1000 )))
    done
    median_us=$(printf '%s\n' "${times[@]}" | sort -n | sed -n "$(( (RUNS + 1) / 2 ))p")
    rate=$(( LINES * 1000000 / median_us ))
    echo "moat audit verify: median $(( median_us / 1000 )).$(( median_us % 1000 / 100 )) ms over $RUNS runs = $rate lines/s (whole process)"
else
    echo "($MOAT has no 'audit' subcommand yet: timing the library's verify instead)"
    "$BENCH" verify "$LOG" >/dev/null    # warm the page cache
    for _ in $(seq "$RUNS"); do "$BENCH" verify "$LOG"; done | sort -t= -k2 -n | sed -n "$(( (RUNS + 1) / 2 ))p" \
        | sed 's/^/median run: /'
fi

"$BENCH" append "$LOG" "$APPENDS"
"$BENCH" verify "$LOG" >/dev/null && echo "chain still intact after $APPENDS appends"

# ---------------------------------------------------------------------------
# 3. What the audit log costs one `moat exec -- true` (static release binary):
#    default (log under $HOME/.local/state/moat) vs --no-audit, both commands
#    in one hyperfine run; prints the median difference (target < 0.3 ms).
#    HOME is a scratch directory on /var/tmp. Env: EXEC_RUNS (default 300).
EXEC_RUNS="${EXEC_RUNS:-300}"
if command -v hyperfine >/dev/null; then
    A_DIR="$(mktemp -d /var/tmp/moat-bench-audit-exec-XXXXXX)"
    trap 'rm -rf "$LOG_DIR" "$A_DIR"' EXIT
    mkdir -p "$A_DIR/home" "$A_DIR/ws"
    (
        cd "$A_DIR/ws"
        HOME="$A_DIR/home" hyperfine -N --style basic --warmup 20 --runs "$EXEC_RUNS" \
            --export-json "$A_DIR/exec.json" \
            -n no-audit "$MOAT exec --no-audit -- true" \
            -n audit "$MOAT exec -- true" >&2
    )
    python3 - "$A_DIR/exec.json" <<'PY'
import json, sys
r = {x["command"]: x for x in json.load(open(sys.argv[1]))["results"]}
n, a = r["no-audit"], r["audit"]
ms = lambda s: s * 1000
print(f"exec true, median of {len(n['times'])} runs: --no-audit {ms(n['median']):.3f} ms, "
      f"audited {ms(a['median']):.3f} ms (mean {ms(n['mean']):.3f} / {ms(a['mean']):.3f})")
diff = ms(a["median"] - n["median"])
print(f"audit adds {diff:.3f} ms median ({ms(a['mean'] - n['mean']):.3f} ms mean) per run; "
      f"target < 0.3 ms: {'met' if diff < 0.3 else 'NOT met'}")
PY
    HOME="$A_DIR/home" "$MOAT" audit verify
else
    echo "hyperfine not installed: exec cost not measured" >&2
fi

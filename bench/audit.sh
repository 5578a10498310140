#!/usr/bin/env bash
# Audit benchmark. Prints, and writes to $OUT_DIR/audit.md, markdown rows
# `| measure | result (spread) | target: verdict |`:
#  1. `moat audit verify` on a generated LINES-line log, RUNS runs of the
#     shipped (static) binary: min/median/max lines/s (target > 200k lines/s).
#  2. One append of a typical run's three events as one locked write: the
#     median of APPENDS appends, over REPEATS repeats.
#  3. What the audit log costs one `moat exec -- true`: default vs
#     --no-audit in alternating rounds, median difference with a 95%
#     bootstrap CI (target < 0.3 ms).
#  4. The denial scan run on each command's stderr (`parse_denials`), on
#     hostile 1 MiB stderr shapes (audit_bench denials): the slowest shape's
#     median over 10 calls, REPEATS times (target <= DENIALS_MS, default
#     100 ms: linear in the input; a quadratic scan takes seconds).
# A verdict is "within noise" when the spread straddles the target.
# Env: LINES (100000), RUNS (7), APPENDS (1000), REPEATS (5),
#      EXEC_RUNS (300), DENIALS_MS (100), OUT_DIR (target/bench).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
LINES="${LINES:-100000}"
RUNS="${RUNS:-7}"
APPENDS="${APPENDS:-1000}"
REPEATS="${REPEATS:-5}"
EXEC_RUNS="${EXEC_RUNS:-300}"
DENIALS_MS="${DENIALS_MS:-100}"
OUT_DIR="${OUT_DIR:-$ROOT/target/bench}"
mkdir -p "$OUT_DIR"
MD="$OUT_DIR/audit.md"
AB="$ROOT/bench/ab.py"
cd "$ROOT"

cargo build --release -q -p moat-audit --examples >&2
GEN="$ROOT/target/release/examples/audit_gen"
BENCH="$ROOT/target/release/examples/audit_bench"
MOAT="$(bash "$ROOT/scripts/build-release")"

LOG_DIR="$(mktemp -d /var/tmp/moat-bench-audit-XXXXXX)"
trap 'rm -rf "$LOG_DIR"' EXIT
LOG="$LOG_DIR/audit.jsonl"
"$GEN" "$LOG" "$LINES"
echo "log: $LINES lines, $(( $(stat -c %s "$LOG") / 1000 )) kB  kernel: $(uname -r)  cpus: $(nproc)" >&2

# 1. verify throughput (whole process, page cache warm).
"$MOAT" audit verify --log "$LOG" >&2
rates=()
for _ in $(seq "$RUNS"); do
    t0=$(date +%s%N)
    "$MOAT" audit verify --log "$LOG" >/dev/null
    t1=$(date +%s%N)
    rates+=($(( LINES * 1000000000 / (t1 - t0) )))
done

# 2. append latency: the median of APPENDS appends, REPEATS times.
appends=()
for _ in $(seq "$REPEATS"); do
    line="$("$BENCH" append "$LOG" "$APPENDS")"
    echo "$line" >&2
    appends+=("$(echo "$line" | sed -n 's/.*median \([0-9.]*\) us.*/\1/p')")
done
"$BENCH" verify "$LOG" >/dev/null && echo "chain still intact after the appends" >&2

# 4. the denial scan on hostile stderr (before 3, which takes longest).
denials=()
for _ in $(seq "$REPEATS"); do
    line="$("$BENCH" denials 10)"
    echo "$line" >&2
    denials+=("$(echo "$line" | sed -n 's/.*median \([0-9.]*\) ms.*/\1/p')")
done

# 3. audit cost per exec; HOME is a scratch directory on /var/tmp.
A_DIR="$LOG_DIR/exec"
mkdir -p "$A_DIR/home" "$A_DIR/ws"
(
    cd "$A_DIR/ws"
    HOME="$A_DIR/home" python3 "$AB" run "$OUT_DIR/audit-exec.json" "$EXEC_RUNS" 20 \
        no-audit "$MOAT exec --no-audit -- true" \
        audit "$MOAT exec -- true"
)
HOME="$A_DIR/home" "$MOAT" audit verify >&2

{
    echo "| measure | result (spread) | target: verdict |"
    echo "|---|---|---|"
    python3 "$AB" diff "$OUT_DIR/audit-exec.json" no-audit audit 0.3 \
        'audit cost per `moat exec -- true` (default vs `--no-audit`)'
    python3 "$AB" spread "\`moat audit verify\`, $LINES-line log" "lines/s" ">=" 200000 "${rates[@]}"
    python3 "$AB" spread "one audit append (3 events, flock + tail read + one write), median of $APPENDS" "µs" "<=" - "${appends[@]}"
    python3 "$AB" spread "\`parse_denials\` on a hostile 1 MiB stderr, slowest of 4 shapes, median of 10" "ms" "<=" "$DENIALS_MS" "${denials[@]}"
} | tee "$MD"

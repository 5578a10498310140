#!/usr/bin/env bash
# Launch benchmark: `moat exec -- true` at each level vs bwrap, unshare and
# bare `true`, timed in alternating rounds (bench/ab.py). Prints, and writes
# to $OUT_DIR/launch.md, a markdown table: min/median/max per command and
# each one's median ratio to bwrap with a 95% bootstrap interval and a
# verdict against the target (issue 11: workspace-contained with the network
# disabled ≤ 0.9× bwrap; TARGET and TARGET_ROW below are its one source):
# reached, not reached, or within noise.
# Env: RUNS (default 300), WARMUP (default 30), OUT_DIR (default target/bench).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
RUNS="${RUNS:-300}"
WARMUP="${WARMUP:-30}"
OUT_DIR="${OUT_DIR:-$ROOT/target/bench}"
mkdir -p "$OUT_DIR"
JSON="$OUT_DIR/launch.json"

for tool in bwrap unshare python3; do
    command -v "$tool" >/dev/null || { echo "missing $tool (apt-get install bubblewrap util-linux python3)" >&2; exit 1; }
done

# The shipped build: statically linked (see scripts/build-release).
MOAT="$(bash "$ROOT/scripts/build-release")"
TRUE="$(command -v true)"

WS="$(mktemp -d /var/tmp/moat-bench-ws-XXXXXX)"
trap 'rm -rf "$WS"' EXIT
# A scratch HOME: each run appends to the audit log under it.
mkdir -p "$WS/home" "$WS/ws"
export HOME="$WS/home"
cd "$WS/ws"
echo "workspace: $WS  rounds: $RUNS  warmup: $WARMUP  uid: $(id -u)  kernel: $(uname -r)  cpus: $(nproc)" >&2

BWRAP="bwrap --unshare-all --die-with-parent --ro-bind /usr /usr --symlink usr/bin /bin --symlink usr/lib /lib --symlink usr/lib64 /lib64 --proc /proc --dev /dev --tmpfs /tmp true"

python3 "$ROOT/bench/ab.py" run "$JSON" "$RUNS" "$WARMUP" \
    "moat read-only" "$MOAT exec --policy read-only -- $TRUE" \
    "moat workspace-write" "$MOAT exec --policy workspace-write -- $TRUE" \
    "moat workspace-contained" "$MOAT exec --policy workspace-contained -- $TRUE" \
    "moat danger-full-access" "$MOAT exec --policy danger-full-access -- $TRUE" \
    "bwrap minimal view" "$BWRAP" \
    "unshare -Urmpfiun" "unshare -Urmpfiun --mount-proc $TRUE" \
    "true" "$TRUE"

TARGET=0.9
TARGET_ROW="moat workspace-contained"
python3 "$ROOT/bench/ab.py" table "$JSON" "bwrap minimal view" "$TARGET" "$TARGET_ROW" | tee "$OUT_DIR/launch.md"
echo "raw samples: $JSON" >&2

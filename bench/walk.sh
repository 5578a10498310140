#!/usr/bin/env bash
# Workspace walk benchmark: the complete `.env` search moat does before every
# sandboxed run (and, at a writable level, the search for new git dirs after
# it), on generated trees, against `find TREE -name '.env*'` on the same tree
# (which also reads every directory with getdents and d_type and stats
# nothing). Prints, and writes to $OUT_DIR/walk.md, markdown rows
# `| measure | result (spread) | target: verdict |`.
#
# Per tree, five commands run in alternating rounds (bench/ab.py; warm page
# cache after WARMUP unmeasured rounds):
#   find                       find TREE -name '.env*'          (the reference)
#   ro-empty / ro              moat exec --policy read-only --no-audit --cwd EMPTY|TREE -- true
#   rw-empty / rw              the same at workspace-write
# The walk's cost is moat's median on the tree minus its median in an empty
# workspace (the sandbox's own start-up), as a multiple of find's median,
# with a 95% bootstrap interval over the paired rounds and a verdict against
# the target: read-only ≤ RO_TARGET × find (default 1.0: "about what find
# costs"), workspace-write ≤ RW_TARGET × find (default 2.0: two walks).
# "within noise" when the interval straddles the target.
#
#   bench/walk.sh [MOAT_BIN]   (default: the static release build, scripts/build-release)
# Env: RUNS (10), WARMUP (1), TREES ("10k 100k node_modules"), RO_TARGET,
#      RW_TARGET, OUT_DIR (target/bench).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
RUNS="${RUNS:-10}"
WARMUP="${WARMUP:-1}"
TREES="${TREES:-10k 100k node_modules}"
RO_TARGET="${RO_TARGET:-1.0}"
RW_TARGET="${RW_TARGET:-2.0}"
OUT_DIR="${OUT_DIR:-$ROOT/target/bench}"
mkdir -p "$OUT_DIR"
MD="$OUT_DIR/walk.md"
AB="$ROOT/bench/ab.py"
moat=${1:-${MOAT_BIN:-}}
if [ -z "$moat" ]; then
  moat="$(bash "$ROOT/scripts/build-release")"
fi
base=$(mktemp -d /var/tmp/moat-walk-XXXX)
trap 'rm -rf "$base"' EXIT

gen() { # gen DIR KIND
  python3 - "$1" "$2" <<'PY'
import os, sys
root, kind = sys.argv[1], sys.argv[2]
os.makedirs(root, exist_ok=True)
def mk(p): os.makedirs(os.path.join(root, p), exist_ok=True)
if kind == "10k":          # 100 x 100 directories
    for a in range(100):
        for b in range(100): mk(f"d{a}/e{b}")
elif kind == "100k":       # 100 x 100 x 10 directories
    for a in range(100):
        for b in range(100):
            for c in range(10): mk(f"d{a}/e{b}/f{c}")
elif kind == "node_modules":  # a JS app: 1500 packages, 4 dirs each, nested deps
    for p in range(1500):
        for s in ("lib", "dist", "src", "node_modules/dep/lib"): mk(f"node_modules/pkg{p}/{s}")
    for a in range(50): mk(f"src/components/c{a}")
else:
    sys.exit(f"unknown tree kind {kind}")
open(os.path.join(root, ".env"), "w").write("X=1\n")
PY
}

mkdir -p "$base/empty"
echo "moat: $moat  rounds: $RUNS  warmup: $WARMUP  uid: $(id -u)  kernel: $(uname -r)  cpus: $(nproc)  load: $(cut -d' ' -f1-3 /proc/loadavg)" >&2
rows=()
for kind in $TREES; do
  d=$base/$kind; gen "$d" "$kind"
  n=$(find "$d" -type d | wc -l)
  json="$OUT_DIR/walk-$kind.json"
  python3 "$AB" run "$json" "$RUNS" "$WARMUP" \
    find "find $d -name .env*" \
    ro-empty "$moat exec --policy read-only --no-audit --cwd $base/empty -- true" \
    ro "$moat exec --policy read-only --no-audit --cwd $d -- true" \
    rw-empty "$moat exec --policy workspace-write --no-audit --cwd $base/empty -- true" \
    rw "$moat exec --policy workspace-write --no-audit --cwd $d -- true"
  rows+=("$(python3 "$AB" over "$json" find ro-empty ro "$RO_TARGET" "walk before a read-only run, $kind tree ($n dirs)")")
  rows+=("$(python3 "$AB" over "$json" find rw-empty rw "$RW_TARGET" "walks around a workspace-write run, $kind tree ($n dirs)")")
done
{
  echo "| measure | result (spread) | target: verdict |"
  echo "|---|---|---|"
  printf '%s\n' "${rows[@]}"
} | tee "$MD"

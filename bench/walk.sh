#!/usr/bin/env bash
# Measures moat's workspace walk (the complete `.env` search done before
# every sandboxed run) on generated trees, against `find` on the same tree.
#
#   bench/walk.sh [MOAT_BIN]      (default: target/release/moat, else target/debug/moat)
#
# For each tree: the median of RUNS runs of
#   moat exec --policy read-only --no-audit -- true        (the walk before the run)
#   moat exec --policy workspace-write --no-audit -- true  (+ the search for new git dirs after it)
# minus the same run in an empty workspace (the sandbox's own start-up),
# next to `find TREE -name '.env*'` (which also reads every directory with
# getdents and d_type, and stats nothing). Warm page cache: both are
# measured after one unmeasured run.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
moat=${1:-${MOAT_BIN:-}}
if [ -z "$moat" ]; then
  if [ -x "$here/target/release/moat" ]; then moat=$here/target/release/moat; else moat=$here/target/debug/moat; fi
fi
RUNS=${RUNS:-5}
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
open(os.path.join(root, ".env"), "w").write("X=1\n")
PY
}

ms() { # median wall time in ms of "$@" over RUNS runs (after one warm-up)
  "$@" >/dev/null 2>&1 || true
  local t=()
  for _ in $(seq "$RUNS"); do
    local s=$(date +%s%N); "$@" >/dev/null 2>&1 || true; local e=$(date +%s%N)
    t+=($(( (e - s) / 1000 )))
  done
  printf '%s\n' "${t[@]}" | sort -n | awk '{a[NR]=$1} END {printf "%.1f", a[int((NR+1)/2)]/1000}'
}

run_ro() { (cd "$1" && "$moat" exec --policy read-only --no-audit -- true); }
run_rw() { (cd "$1" && "$moat" exec --policy workspace-write --no-audit -- true); }
run_find() { find "$1" -name '.env*' -print; }

mkdir -p "$base/empty"
empty_ro=$(ms run_ro "$base/empty"); empty_rw=$(ms run_rw "$base/empty")
echo "moat: $moat  (load: $(cut -d' ' -f1-3 /proc/loadavg))"
echo "sandbox start-up in an empty workspace: ${empty_ro} ms read-only, ${empty_rw} ms workspace-write (subtracted below)"
printf '%-14s %8s %10s %8s %12s %8s %8s\n' tree dirs "find ms" "ro ms" "ro/find" "rw ms" "rw/find"
sub() { awk -v a="$1" -v b="$2" 'BEGIN {w=a-b; if (w<0) w=0; printf "%.1f", w}'; }
div() { awk -v w="$1" -v f="$2" 'BEGIN {if (f>0) printf "%.2f", w/f; else print "-"}'; }
for kind in 10k 100k node_modules; do
  d=$base/$kind; gen "$d" "$kind"
  n=$(find "$d" -type d | wc -l)
  f=$(ms run_find "$d")
  ro=$(sub "$(ms run_ro "$d")" "$empty_ro"); rw=$(sub "$(ms run_rw "$d")" "$empty_rw")
  printf '%-14s %8s %10s %8s %12s %8s %8s\n' "$kind" "$n" "$f" "$ro" "$(div "$ro" "$f")" "$rw" "$(div "$rw" "$f")"
done

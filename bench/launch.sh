#!/usr/bin/env bash
# Launch benchmark: `moat exec -- true` at each level vs bwrap, unshare and
# bare `true`, in ONE hyperfine run. Prints a markdown table of medians.
# Env: RUNS (default 300), WARMUP (default 30), OUT_DIR (default target/bench).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
RUNS="${RUNS:-300}"
WARMUP="${WARMUP:-30}"
OUT_DIR="${OUT_DIR:-$ROOT/target/bench}"
mkdir -p "$OUT_DIR"
JSON="$OUT_DIR/launch.json"

for tool in hyperfine bwrap unshare python3; do
    command -v "$tool" >/dev/null || { echo "missing $tool (apt-get install hyperfine bubblewrap util-linux python3)" >&2; exit 1; }
done

# The shipped build: statically linked (see scripts/build-release).
MOAT="$(bash "$ROOT/scripts/build-release")"
TRUE="$(command -v true)"

WS="$(mktemp -d /var/tmp/moat-bench-ws-XXXXXX)"
trap 'rm -rf "$WS"' EXIT
cd "$WS"
echo "workspace: $WS  runs: $RUNS  warmup: $WARMUP  uid: $(id -u)  kernel: $(uname -r)"

BWRAP="bwrap --unshare-all --die-with-parent --ro-bind /usr /usr --symlink usr/bin /bin --symlink usr/lib /lib --symlink usr/lib64 /lib64 --proc /proc --dev /dev --tmpfs /tmp true"

hyperfine -N --warmup "$WARMUP" --runs "$RUNS" --export-json "$JSON" \
    -n "moat read-only" "$MOAT exec --policy read-only -- true" \
    -n "moat workspace-write" "$MOAT exec --policy workspace-write -- true" \
    -n "moat workspace-contained" "$MOAT exec --policy workspace-contained -- true" \
    -n "moat workspace-contained --network disabled" "$MOAT exec --policy workspace-contained --network disabled -- true" \
    -n "moat danger-full-access" "$MOAT exec --policy danger-full-access -- true" \
    -n "bwrap minimal view" "$BWRAP" \
    -n "unshare -Urmpfiun" "unshare -Urmpfiun --mount-proc $TRUE" \
    -n "true" "$TRUE"

python3 - "$JSON" <<'PY'
import json, sys
res = json.load(open(sys.argv[1]))["results"]
base = next((r["median"] for r in res if r["command"].startswith("bwrap")), None)
print()
print("| command | median (ms) | mean (ms) | stddev (ms) | vs bwrap |")
print("|---|---:|---:|---:|---:|")
for r in res:
    ratio = f"{r['median'] / base:.2f}x" if base else "n/a"
    print(f"| {r['command']} | {r['median']*1000:.2f} | {r['mean']*1000:.2f} | {r['stddev']*1000:.2f} | {ratio} |")
PY
echo
echo "raw results: $JSON"

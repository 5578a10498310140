#!/usr/bin/env bash
# Benchmark of moat's network proxy on loopback, without the moat CLI:
# (b) 1 GiB through a CONNECT tunnel vs a direct connection (target >= 0.70),
# (c) p50/p99 of 1,000 small HTTP requests through the proxy vs direct.
# Usage: bench/proxy.sh [BYTES] [REQUESTS]
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
cargo build --release -q -p moat-proxy --example bench
target/release/examples/bench "${1:-1073741824}" "${2:-1000}"

# ---------------------------------------------------------------------------
# (a) launch overhead of `--network proxy` over `--network disabled`, through
# the moat CLI (the static release binary), both commands in one hyperfine
# run. Target: < 2 ms extra. Both use --no-audit so only the network setup
# differs; HOME is a scratch directory. Env: LAUNCH_RUNS (default 300).
LAUNCH_RUNS="${LAUNCH_RUNS:-300}"
MOAT="$(bash scripts/build-release)"
command -v hyperfine >/dev/null || { echo "hyperfine not installed: (a) skipped" >&2; exit 0; }
A_DIR="$(mktemp -d /var/tmp/moat-bench-proxy-XXXXXX)"
trap 'rm -rf "$A_DIR"' EXIT
mkdir -p "$A_DIR/home" "$A_DIR/ws"
(
    cd "$A_DIR/ws"
    HOME="$A_DIR/home" hyperfine -N --style basic --warmup 20 --runs "$LAUNCH_RUNS" \
        --export-json "$A_DIR/launch.json" \
        -n disabled "$MOAT exec --no-audit --network disabled -- true" \
        -n proxy "$MOAT exec --no-audit --network proxy -- true" >&2
)
python3 - "$A_DIR/launch.json" <<'PY'
import json, sys
r = {x["command"]: x for x in json.load(open(sys.argv[1]))["results"]}
d, p = r["disabled"], r["proxy"]
ms = lambda s: s * 1000
print(f"(a) launch, median of {len(d['times'])} runs: disabled {ms(d['median']):.2f} ms, "
      f"proxy {ms(p['median']):.2f} ms (mean {ms(d['mean']):.2f} / {ms(p['mean']):.2f}, "
      f"stddev {ms(d['stddev']):.2f} / {ms(p['stddev']):.2f})")
diff = ms(p["median"] - d["median"])
print(f"(a) --network proxy adds {diff:.2f} ms median ({ms(p['mean'] - d['mean']):.2f} ms mean); "
      f"target < 2 ms: {'met' if diff < 2 else 'NOT met'}")
PY

#!/usr/bin/env bash
# Benchmark of moat's network proxy. Prints, and writes to $OUT_DIR/proxy.md,
# markdown rows `| measure | result (spread) | target: verdict |`:
# (a) launch overhead of `--network proxy` over `--network disabled`
#     (the static release moat, alternating rounds, 95% bootstrap CI;
#     target < 2 ms);
# (b) BYTES through a CONNECT tunnel vs a direct loopback connection,
#     REPEATS runs of the proxy crate's example (each the best of 3
#     alternating transfers), min/median/max of the ratio (target ≥ 0.70);
# (c) p50/p99 added to REQUESTS small HTTP requests, over the same repeats.
# A verdict is "within noise" when the spread straddles the target.
# Env: BYTES (default 268435456), REQUESTS (1000), REPEATS (5),
#      LAUNCH_RUNS (300), OUT_DIR (target/bench).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
BYTES="${BYTES:-268435456}"
REQUESTS="${REQUESTS:-1000}"
REPEATS="${REPEATS:-5}"
LAUNCH_RUNS="${LAUNCH_RUNS:-300}"
OUT_DIR="${OUT_DIR:-$ROOT/target/bench}"
mkdir -p "$OUT_DIR"
MD="$OUT_DIR/proxy.md"
AB="$ROOT/bench/ab.py"

cargo build --release -q -p moat-proxy --example bench >&2
MOAT="$(bash scripts/build-release)"

# (a) launch overhead, through the moat CLI. Both use --no-audit so only the
# network setup differs; HOME is a scratch directory.
A_DIR="$(mktemp -d /var/tmp/moat-bench-proxy-XXXXXX)"
trap 'rm -rf "$A_DIR"' EXIT
mkdir -p "$A_DIR/home" "$A_DIR/ws"
(
    cd "$A_DIR/ws"
    HOME="$A_DIR/home" python3 "$AB" run "$OUT_DIR/proxy-launch.json" "$LAUNCH_RUNS" 20 \
        disabled "$MOAT exec --no-audit --network disabled -- true" \
        proxy "$MOAT exec --no-audit --network proxy -- true"
)

# (b), (c): REPEATS whole runs of the example.
ratios=() p50=() p99=()
for i in $(seq "$REPEATS"); do
    out="$(target/release/examples/bench "$BYTES" "$REQUESTS")"
    echo "$out" >&2
    ratios+=("$(echo "$out" | sed -n 's/^| (b).*| \([0-9.]*\) (target.*/\1/p')")
    p50+=("$(echo "$out" | sed -n 's/^| (c).*p50 .*| +\(-\?[0-9]*\) µs |$/\1/p')")
    p99+=("$(echo "$out" | sed -n 's/^| (c).*p99 .*| +\(-\?[0-9]*\) µs |$/\1/p')")
done

{
    echo "| measure | result (spread) | target: verdict |"
    echo "|---|---|---|"
    python3 "$AB" diff "$OUT_DIR/proxy-launch.json" disabled proxy 2 \
        'launch: `--network proxy` over `--network disabled`, `moat exec -- true`'
    python3 "$AB" spread "$(( BYTES >> 20 )) MiB through a CONNECT tunnel, ratio to a direct loopback connection" "×" ">=" 0.70 "${ratios[@]}"
    python3 "$AB" spread "$REQUESTS small HTTP requests through the proxy, p50 added" "µs" "<=" - "${p50[@]}"
    python3 "$AB" spread "$REQUESTS small HTTP requests through the proxy, p99 added" "µs" "<=" - "${p99[@]}"
} | tee "$MD"

#!/usr/bin/env bash
# Benchmark of moat's network proxy on loopback, without the moat CLI:
# (b) 1 GiB through a CONNECT tunnel vs a direct connection (target >= 0.70),
# (c) p50/p99 of 1,000 small HTTP requests through the proxy vs direct.
# Usage: bench/proxy.sh [BYTES] [REQUESTS]
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
cargo build --release -q -p moat-proxy --example bench
exec target/release/examples/bench "${1:-1073741824}" "${2:-1000}"

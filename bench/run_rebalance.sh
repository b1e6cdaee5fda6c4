#!/usr/bin/env bash
# The rebalancing experiment (issue: placement and scheduling): a skewed
# embedding workload on 3 servers, each behind its own link shaped by tc,
# run with the rebalancer off and on; prints throughput before and after
# and writes OUT/timeline.csv, OUT/rebalance.png and OUT/report.md.
# Needs root (network namespaces, tc). bench/rebalance_experiment.py says how.
#
#   bench/run_rebalance.sh [BUILD_DIR] [-- EXPERIMENT FLAGS]
#
# Environment: OUT (default runs/rebalance-<time>).
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BUILD=$(realpath -m "${TESSERA_BUILD_DIR:-$ROOT/build}")
if [ $# -gt 0 ] && [ "$1" != "--" ]; then BUILD=$(realpath -m "$1"); shift; fi
[ "${1:-}" = "--" ] && shift
OUT=$(realpath -m "${OUT:-$ROOT/runs/rebalance-$(date +%Y%m%d-%H%M%S)}")
mkdir -p "$OUT"
# shellcheck source=bench/lib.sh
source "$ROOT/bench/lib.sh"
bench_build run_rebalance.sh "$BUILD" "$OUT/build.log" tessera-coordinator tessera-server tessera-skew-bench
exec /usr/bin/python3 "$ROOT/bench/rebalance_experiment.py" --build "$BUILD" --out "$OUT" "$@"

#!/usr/bin/env bash
# The fault and partition matrix across network-namespace hosts on shaped
# links (bench/partition_matrix.py says what each row does and measures):
# detection, failover and recovery times, the throughput dip, the audit.
# Needs root and a build tree; takes about 5 minutes.
#   bench/run_partition_matrix.sh [RESULTS_DIR]      (default runs/partition-matrix-DATE)
# Settings: ROWS=a,b,... (default all), MBIT=1000 (each host's link, tc tbf).
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-runs/partition-matrix-$(date +%Y%m%d-%H%M%S)}
export TESSERA_BUILD_DIR=${TESSERA_BUILD_DIR:-$PWD/build}
args=(--out "$OUT" --mbit "${MBIT:-1000}")
[ -n "${ROWS:-}" ] && args+=(--rows "$ROWS")
exec /usr/bin/python3 bench/partition_matrix.py "${args[@]}"

#!/usr/bin/env bash
# Pushes of wide rows in pieces against whole rows and raw ZeroMQ, interleaved.
#
#   bench/run_push_pieces.sh [BUILD_DIR]
#
# Rounds of: Tessera pushes with transfer.row_piece_bytes=PIECE_BYTES (rows wider
# than that go in pieces the server updates as they arrive), Tessera pushes
# with transfer.row_piece_bytes=0 (whole rows), then raw ZeroMQ
# (bench/raw_zmq_bench --keep_allocations_mapped) — each a full run of
# configs/bench_push_pull.yaml over TCP loopback (shm.enabled=false), 1
# server, 1 worker, sequential and 8 in flight. Interleaving the three
# in every round keeps a slow spell of a shared machine from landing on one
# side only. Prints one Markdown table: MB/s per round, and each Tessera
# result divided by the raw result of the same round.
#
# Environment: ROUNDS (4), SIZE (bytes per row, 16777216), PIECE_BYTES
# (2097152), REPEATS (5), SKIP_BUILD=1 to run the binaries in BUILD_DIR as
# they are, KEEP=1 to keep the run directories (printed at the end).
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BUILD=$(realpath -m "${1:-${TESSERA_BUILD_DIR:-$ROOT/build}}")
PYTHON=/usr/bin/python3
ROUNDS=${ROUNDS:-4}
SIZE=${SIZE:-16777216}
PIECE_BYTES=${PIECE_BYTES:-2097152}
REPEATS=${REPEATS:-5}

WORK=$(mktemp -d /tmp/tessera-pieces.XXXXXX)
if [ "${KEEP:-0}" != 1 ]; then trap 'rm -rf "$WORK"' EXIT; fi
# shellcheck source=bench/lib.sh
source "$ROOT/bench/lib.sh"
if [ "${SKIP_BUILD:-0}" != 1 ]; then
  bench_build run_push_pieces.sh "$BUILD" "$WORK/build.log" raw_zmq_bench tessera-push-pull-bench \
    tessera-coordinator tessera-server
fi

for round in $(seq 1 "$ROUNDS"); do
  for variant in "pieces:$PIECE_BYTES" "whole:0"; do
    IFS=: read -r name parts <<<"$variant"
    echo "round $round/$ROUNDS: Tessera pushes, transfer.row_piece_bytes=$parts ..." >&2
    bench_push_pull_run run_push_pieces.sh "$BUILD" "$WORK/$name-$round" --set shm.enabled=false \
      --set "transfer.row_piece_bytes=$parts" --set "worker.args.sizes=\"$SIZE\"" --set 'worker.args.ops="push"' \
      --set 'worker.args.modes="sequential,inflight8"' --set "worker.args.repeats=$REPEATS"
  done
  echo "round $round/$ROUNDS: raw ZeroMQ ..." >&2
  bench_raw_run run_push_pieces.sh "$BUILD" "$WORK/raw-$round.json" --sizes "$SIZE" \
    --modes sequential,inflight8 --repeats "$REPEATS" --keep_allocations_mapped
done

"$PYTHON" - "$WORK" "$ROUNDS" "$SIZE" "$PIECE_BYTES" <<'PY'
import json
import sys

work, rounds, size, piece = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])

def tessera(run):
    summary = json.load(open(f"{work}/{run}/summary.json"))
    return {r["mode"]: r["median_mbps"] for r in summary["worker_reports"][0]["report"]["results"]}

print(f"| {size >> 20} MiB pushes, round | pieces of {piece >> 10} KiB | whole rows | raw ZeroMQ "
      "| pieces/raw | whole/raw |")
print("|---|---:|---:|---:|---:|---:|")
for mode, label in (("sequential", "sequential"), ("inflight8", "8 in flight")):
    for r in range(1, rounds + 1):
        raw = {x["mode"]: x["median_mbps"] for x in json.load(open(f"{work}/raw-{r}.json"))["results"]}[mode]
        p, w = tessera(f"pieces-{r}")[mode], tessera(f"whole-{r}")[mode]
        print(f"| {label} {r} | {p:,.0f} | {w:,.0f} | {raw:,.0f} | {p / raw:.2f} | {w / raw:.2f} |")
print()
print("MB/s of payload (1 MB = 10^6 bytes), the median of each run's repeats; a ratio divides by the raw")
print("ZeroMQ run of the same round.")
PY
if [ "${KEEP:-0}" = 1 ]; then echo "results kept in $WORK" >&2; fi

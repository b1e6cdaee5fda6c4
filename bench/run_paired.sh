#!/usr/bin/env bash
# Tessera push/pull against raw ZeroMQ over TCP loopback, compared only where
# both ran with the machine's CPUs placed the same way.
#
#   bench/run_paired.sh [BUILD_DIR]
#
# Why: on a virtual machine the host moves the two CPUs between cores that
# share a cache and cores that do not, for seconds at a time, and loopback
# transfers change speed with it several-fold (raw ZeroMQ at 1 MiB, 8 in
# flight: about 6,000-7,500 MB/s one way, about 1,700 MB/s the other). A
# ratio of two runs that caught different placements measures the host, not
# Tessera. Both programs here probe the placement before and after every
# repeat (bench/cpu_pair_probe.h), and bench/paired_report.py compares each
# placement's steady repeats only with the same placement's.
#
# Rounds of: raw ZeroMQ (bench/raw_zmq_bench --keep_allocations_mapped, once
# plain and once for each receiver work in WORKS), and Tessera
# (tessera-push-pull-bench through the launcher, 1 server, 1 worker,
# configs/bench_push_pull.yaml with shm.enabled=false), in alternating order
# (odd rounds raw first). Prints one Markdown table: Tessera against plain
# raw, and against raw doing the same work with each payload (pushes:
# accumulate, the server's update; pulls: copy, the worker's copy into the
# caller's buffer).
#
# Environment: ROUNDS (4), SIZES (1048576,16777216), OPS
# (push,pull,pullview), MODES (sequential,inflight8,stream), REPEATS (3),
# MIN_SECONDS (0.5), WORKS (accumulate,copy; empty for plain raw only),
# SKIP_BUILD=1 to run the binaries in BUILD_DIR as they are, KEEP=1 to keep
# the results (printed at the end). The probe uses the
# first two CPUs this script may run on; on a machine with more, pin the
# script to two (taskset -c 0,1 bench/run_paired.sh) so that the probe
# measures the CPUs the benchmark runs on.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BUILD=$(realpath -m "${1:-${TESSERA_BUILD_DIR:-$ROOT/build}}")
PYTHON=/usr/bin/python3
ROUNDS=${ROUNDS:-4}
SIZES=${SIZES:-1048576,16777216}
OPS=${OPS:-push,pull,pullview}
MODES=${MODES:-sequential,inflight8,stream}
REPEATS=${REPEATS:-3}
MIN_SECONDS=${MIN_SECONDS:-0.5}
WORKS=${WORKS-accumulate,copy}
for work in ${WORKS//,/ }; do
  if [ "$work" != accumulate ] && [ "$work" != copy ]; then
    echo "run_paired.sh: WORKS holds '$work'; each must be accumulate or copy (empty: plain raw only)" >&2
    exit 2
  fi
done

WORK=$(mktemp -d /tmp/tessera-paired.XXXXXX)
if [ "${KEEP:-0}" != 1 ]; then trap 'rm -rf "$WORK"' EXIT; fi
# shellcheck source=bench/lib.sh
source "$ROOT/bench/lib.sh"
if [ "${SKIP_BUILD:-0}" != 1 ]; then
  bench_build run_paired.sh "$BUILD" "$WORK/build.log" raw_zmq_bench tessera-push-pull-bench \
    tessera-coordinator tessera-server
fi

# raw_once NAME ARG...: one run of the baseline into $WORK/NAME.json.
raw_once() {
  local name=$1
  shift
  bench_raw_run run_paired.sh "$BUILD" "$WORK/$name.json" --sizes "$SIZES" --modes "$MODES" \
    --repeats "$REPEATS" --min_seconds "$MIN_SECONDS" --keep_allocations_mapped "$@"
}

run_raw() {
  echo "round $1/$ROUNDS: raw ZeroMQ ..." >&2
  raw_once "raw-$1"
  local work
  for work in ${WORKS//,/ }; do
    echo "round $1/$ROUNDS: raw ZeroMQ + $work ..." >&2
    raw_once "raw-$work-$1" --receiver_work "$work"
  done
}

run_tessera() {
  echo "round $1/$ROUNDS: Tessera ..." >&2
  bench_push_pull_run run_paired.sh "$BUILD" "$WORK/tessera-$1" --set shm.enabled=false \
    --set "worker.args.sizes=\"$SIZES\"" --set "worker.args.ops=\"$OPS\"" --set "worker.args.modes=\"$MODES\"" \
    --set "worker.args.repeats=$REPEATS" --set "worker.args.min_seconds=$MIN_SECONDS"
}

for round in $(seq 1 "$ROUNDS"); do
  if [ $((round % 2)) = 1 ]; then
    run_raw "$round"
    run_tessera "$round"
  else
    run_tessera "$round"
    run_raw "$round"
  fi
done

"$PYTHON" "$ROOT/bench/paired_report.py" "$WORK" "$ROUNDS"
if [ "${KEEP:-0}" = 1 ]; then echo "results kept in $WORK" >&2; fi

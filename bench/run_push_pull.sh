#!/usr/bin/env bash
# Push/pull throughput of Tessera against raw ZeroMQ, on this machine.
#
#   bench/run_push_pull.sh [BUILD_DIR]
#
# Builds the targets it needs, runs the raw ZeroMQ baseline (bench/raw_zmq_bench,
# two processes) four times: with glibc's default allocator settings; with
# those of Tessera's binaries (large blocks kept in an untrimmed heap, see
# common/memory.h), which the ratios compare against; and with those plus the
# receiver adding each payload into a row of floats (the work a Tessera server
# does for a push), and copying it into the next of 8 buffers (the work a
# worker's Pull does with each reply). Then it runs the Tessera driver (tessera-push-pull-bench:
# 1 server, 1 worker, through launcher/tessera-launch with
# configs/bench_push_pull.yaml) four times: with the same-host shared-memory
# path off (every frame over TCP loopback); the same for pushes only, with
# transfer.row_piece_bytes 0 (rows pushed whole, not in the default 2 MiB
# pieces); on but with pull values copied
# through the ring (shm.cross_memory=false: frames of 64 KiB and more go
# through rings); and on as by default (pull values lent by the server and
# read in place by the worker, one copy); and bench/memcpy_bench
# (single-thread memcpy bandwidth, the baseline of the same-host goal).
# It prints two Markdown tables of medians. The first compares Tessera over
# TCP with raw ZeroMQ, like with like: sequential with sequential, 8 in flight
# with 8 in flight, and the raw one-way PUSH/PULL stream with Tessera pushes
# 64 in flight. The second compares the Tessera runs with memcpy.
#
# Environment: REPEATS (default 5), MIN_SECONDS (0.5), MIN_MESSAGES (20),
# SIZES (4096,1048576,16777216), KEEP=1 to keep the raw results and the run
# directory (printed at the end), SKIP_BUILD=1 to run the binaries already in
# BUILD_DIR as they are (e.g. a saved copy of bench/, server/ and
# coordinator/ from an older tree, to compare against).
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BUILD=$(realpath -m "${1:-${TESSERA_BUILD_DIR:-$ROOT/build}}")
PYTHON=/usr/bin/python3
REPEATS=${REPEATS:-5}
MIN_SECONDS=${MIN_SECONDS:-0.5}
MIN_MESSAGES=${MIN_MESSAGES:-20}
SIZES=${SIZES:-4096,1048576,16777216}

# Raw results and the run directory; removed at the end unless KEEP=1.
WORK=$(mktemp -d /tmp/tessera-bench.XXXXXX)
if [ "${KEEP:-0}" != 1 ]; then trap 'rm -rf "$WORK"' EXIT; fi
if [ "${SKIP_BUILD:-0}" != 1 ]; then
  # shellcheck source=bench/lib.sh
  source "$ROOT/bench/lib.sh"
  bench_build run_push_pull.sh "$BUILD" "$WORK/build.log" raw_zmq_bench memcpy_bench \
    tessera-push-pull-bench tessera-coordinator tessera-server
fi

# name: receiver work, extra flags
for variant in "default:none:" "mapped:none:--keep_allocations_mapped" "mapped-acc:accumulate:--keep_allocations_mapped" \
  "mapped-copy:copy:--keep_allocations_mapped"; do
  IFS=: read -r name work extra <<<"$variant"
  echo "raw ZeroMQ baseline ($name) ..." >&2
  # shellcheck disable=SC2086
  "$BUILD/bench/raw_zmq_bench" --sizes "$SIZES" --repeats "$REPEATS" --min_seconds "$MIN_SECONDS" \
    --min_messages "$MIN_MESSAGES" --receiver_work "$work" $extra --json "$WORK/raw-$name.json"
done

echo "memcpy baseline ..." >&2
"$BUILD/bench/memcpy_bench" --sizes "$SIZES" --repeats "$REPEATS" --min_seconds "$MIN_SECONDS" \
  --json "$WORK/memcpy.json"

# run: run directory name, shared memory on or off, pull values lent or not,
# the ops measured (the same-host table compares pushes and pulls only), and
# transfer.row_piece_bytes if not the default (run-whole: pushes of whole
# rows, no pieces, for the "whole rows" column)
for variant in "run:false:false:push,pull,pushpull,pullview:" "run-whole:false:false:push:0" \
               "run-ring:true:false:push,pull:" "run-shm:true:true:push,pull:"; do
  IFS=: read -r run shm lend ops parts <<<"$variant"
  parts_flag=()
  if [ -n "$parts" ]; then parts_flag=(--set "transfer.row_piece_bytes=$parts"); fi
  echo "Tessera push/pull (1 server, 1 worker, shm.enabled=$shm, shm.cross_memory=$lend${parts:+, transfer.row_piece_bytes=$parts}) ..." >&2
  if ! "$PYTHON" "$ROOT/launcher/tessera-launch" local --config "$ROOT/configs/bench_push_pull.yaml" \
      --build-dir "$BUILD" --run-dir "$WORK/$run" --quiet --timeout 1200 "${parts_flag[@]}" \
      --set "worker.program=$BUILD/bench/tessera-push-pull-bench" --set "shm.enabled=$shm" --set "shm.cross_memory=$lend" \
      --set "worker.args.sizes=\"$SIZES\"" --set "worker.args.ops=\"$ops\"" --set "worker.args.repeats=$REPEATS" \
      --set "worker.args.min_seconds=$MIN_SECONDS" --set "worker.args.min_messages=$MIN_MESSAGES" >&2; then
    echo "run_push_pull.sh: the Tessera run failed; logs in $WORK/$run/logs" >&2
    trap - EXIT
    exit 1
  fi
done

"$PYTHON" - "$WORK" <<'PY'
import json
import sys

work = sys.argv[1]
def tessera_results(run):
    summary = json.load(open(f"{work}/{run}/summary.json"))
    return {(r["size"], r["op"], r["mode"]): r["median_mbps"]
            for r in summary["worker_reports"][0]["report"]["results"]}

tessera = tessera_results("run")
tessera_whole = tessera_results("run-whole")
tessera_ring = tessera_results("run-ring")
tessera_shm = tessera_results("run-shm")
memcpy = {r["size"]: r["median_mbps"] for r in json.load(open(f"{work}/memcpy.json"))["results"]}
raw = {}
for name in ("default", "mapped", "mapped-acc", "mapped-copy"):
    data = json.load(open(f"{work}/raw-{name}.json"))
    sizes = data["sizes"]
    raw[name] = {(r["size"], r["mode"]): r["median_mbps"] for r in data["results"]}

def size_name(n):
    return f"{n >> 20} MiB" if n >= 1 << 20 else f"{n >> 10} KiB"

def fmt(v):
    return "–" if v is None else f"{v:,.0f}"

def ratio(a, b):
    return "–" if a is None or not b else f"{a / b:.2f}"

print("| size | mode | raw ZMQ, default malloc | raw ZMQ | raw ZMQ + accumulate | raw ZMQ + copy | Tessera push "
      "| Tessera push, whole rows | Tessera pull | Tessera pull, view | Tessera push+pull | push/raw "
      "| whole/raw | push/(raw+acc) | pull/raw | pull/(raw+copy) | view/raw |")
print("|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
for size in sizes:
    for label, mode in (("sequential", "sequential"), ("8 in flight", "inflight8"), ("stream", "stream")):
        default = raw["default"].get((size, mode))
        base = raw["mapped"].get((size, mode))
        base_acc = raw["mapped-acc"].get((size, mode))
        base_copy = raw["mapped-copy"].get((size, mode))
        push, pull, view, both = (tessera.get((size, op, mode)) for op in ("push", "pull", "pullview", "pushpull"))
        whole = tessera_whole.get((size, "push", mode))
        if label == "stream":
            label = "stream (raw PUSH/PULL; Tessera 64 pushes in flight)"
        print(f"| {size_name(size)} | {label} | {fmt(default)} | {fmt(base)} | {fmt(base_acc)} | {fmt(base_copy)} | "
              f"{fmt(push)} | {fmt(whole)} | {fmt(pull)} | {fmt(view)} | {fmt(both)} | {ratio(push, base)} | "
              f"{ratio(whole, base)} | {ratio(push, base_acc)} | {ratio(pull, base)} | {ratio(pull, base_copy)} | "
              f"{ratio(view, base)} |")
print()
print("MB/s of payload (1 MB = 10^6 bytes), medians. 'raw ZMQ', 'raw ZMQ + accumulate' (the receiver adds each")
print("payload into a row, as a server applies a push) and 'raw ZMQ + copy' (it copies each payload into the next")
print("of 8 buffers, as a worker's Pull fills the caller's buffer) run with the allocator settings of Tessera's")
print("binaries (--keep_allocations_mapped); the ratios compare with those. 'pull' is")
print("Worker::Pull (rows copied into the caller's buffer); 'pull, view' is Worker::PullView (rows left in the")
print("message they arrived in, as the raw receiver gets them). 'push' runs with the default transfer.row_piece_bytes")
print("(2 MiB: rows wider than that go in pieces the server updates one by one); 'push, whole rows' with 0.")
print()
print("| size | mode | memcpy (1 thread) | push, TCP | push, shm | pull, TCP | pull, shm ring | pull, shm lent "
      "| push shm/memcpy | pull ring/memcpy | pull lent/memcpy |")
print("|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
for size in sizes:
    for label, mode in (("sequential", "sequential"), ("8 in flight", "inflight8")):
        base = memcpy.get(size)
        push, pull = (tessera.get((size, op, mode)) for op in ("push", "pull"))
        push_shm, pull_shm = (tessera_shm.get((size, op, mode)) for op in ("push", "pull"))
        pull_ring = tessera_ring.get((size, "pull", mode))
        print(f"| {size_name(size)} | {label} | {fmt(base)} | {fmt(push)} | {fmt(push_shm)} | {fmt(pull)} | "
              f"{fmt(pull_ring)} | {fmt(pull_shm)} | {ratio(push_shm, base)} | {ratio(pull_ring, base)} | "
              f"{ratio(pull_shm, base)} |")
print()
print("Same host: the Tessera driver with the shared-memory path off (TCP loopback), on with pull values")
print("through the ring (shm.cross_memory=false) and on as by default (pull values lent: the worker copies")
print("them out of the server with process_vm_readv), against single-thread memcpy bandwidth")
print("(bench/memcpy_bench) measured in the same run. 'push, shm' is from the default run.")
PY
if [ "${KEEP:-0}" = 1 ]; then echo "results kept in $WORK" >&2; fi

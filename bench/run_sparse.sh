#!/usr/bin/env bash
# Embedding-table benchmarks, on this machine:
#
#   bench/run_sparse.sh [BUILD_DIR]
#
# 1. In one process, one core (bench/sparse_lookup_bench): Table::ReadRows
#    against a plain absl::flat_hash_map::find + row copy loop over the same
#    Zipf(1.1) ids from 10M, for dims 16 and 64; and the resident memory a
#    row really costs against Table::RowBytes.
# 2. Over TCP loopback: sparse push and pull throughput of one server with 1
#    and 2 worker processes (tessera-sparse-bench through tessera-launch),
#    batches of 8192 ids drawn Zipf(1.1) from 10M ids, deduplicated on the
#    worker, 4 requests in flight; then raw ZeroMQ (bench/raw_zmq_bench, 8
#    in flight) at the same message sizes (the mean payload of one request).
#    Prints rows/s and payload bytes/s, and the ratio to raw ZeroMQ.
#
# Environment: SECONDS_EACH (default 3), DIMS (16,64), SHM (1: the default
# same-host shared-memory path carries the large frames; 0: everything over
# TCP, like the baseline), CROSS_MEMORY (1: the default, pull values lent and
# read in place; 0: through the rings), KEEP=1 keeps the results,
# SKIP_BUILD=1 uses the binaries in BUILD_DIR as they are.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BUILD=$(realpath -m "${1:-${TESSERA_BUILD_DIR:-$ROOT/build}}")
PYTHON=/usr/bin/python3
SECONDS_EACH=${SECONDS_EACH:-3}
DIMS=${DIMS:-16,64}
SHM=${SHM:-1}
CROSS_MEMORY=${CROSS_MEMORY:-1}
case "$CROSS_MEMORY" in 0) LEND=false; LEND_NAME="pull values through the rings" ;;
  1) LEND=true; LEND_NAME="pull values lent, read in place" ;;
  *) echo "run_sparse.sh: CROSS_MEMORY must be 0 or 1, got '$CROSS_MEMORY'" >&2; exit 2 ;; esac
case "$SHM" in 0) SHM_ENABLED=false; PATH_NAME="TCP loopback (shm off)" ;;
  1) SHM_ENABLED=true
     PATH_NAME="the same-host path (shared-memory rings for frames >= 64 KiB, $LEND_NAME; headers over TCP)" ;;
  *) echo "run_sparse.sh: SHM must be 0 or 1, got '$SHM'" >&2; exit 2 ;; esac

WORK=$(mktemp -d /tmp/tessera-sparse.XXXXXX)
if [ "${KEEP:-0}" != 1 ]; then trap 'rm -rf "$WORK"' EXIT; fi
if [ "${SKIP_BUILD:-0}" != 1 ]; then
  # shellcheck source=bench/lib.sh
  source "$ROOT/bench/lib.sh"
  bench_build run_sparse.sh "$BUILD" "$WORK/build.log" sparse_lookup_bench tessera-sparse-bench raw_zmq_bench \
    tessera-coordinator tessera-server
fi

echo "in-process lookups and memory per row ..." >&2
taskset -c 0 "$BUILD/bench/sparse_lookup_bench" --dims "$DIMS" --json "$WORK/lookup.json" >"$WORK/lookup.md"

for workers in 1 2; do
  echo "Tessera sparse push/pull, 1 server, $workers worker(s) ..." >&2
  if ! "$PYTHON" "$ROOT/launcher/tessera-launch" local --config "$ROOT/configs/bench_sparse.yaml" \
      --build-dir "$BUILD" --run-dir "$WORK/run-$workers" --quiet --timeout 600 --set "cluster.workers=$workers" --set "shm.enabled=$SHM_ENABLED" --set "shm.cross_memory=$LEND" \
      --set "worker.program=$BUILD/bench/tessera-sparse-bench" \
      --set "worker.args.dims=\"$DIMS\"" --set "worker.args.seconds=$SECONDS_EACH" >&2; then
    echo "run_sparse.sh: the Tessera run failed; logs in $WORK/run-$workers/logs" >&2
    trap - EXIT
    exit 1
  fi
done

# Raw ZeroMQ at the mean request payload of each (dim): from the 1-worker run.
SIZES=$("$PYTHON" - "$WORK" <<'PY'
import json, sys
s = json.load(open(f"{sys.argv[1]}/run-1/summary.json"))
sizes = set()
for r in s["worker_reports"][0]["report"]["results"]:
    sizes.add(int(r["unique_per_batch"] * (r["dim"] * 4 + 8)) // 4 * 4)
print(",".join(str(x) for x in sorted(sizes)))
PY
)
echo "raw ZeroMQ at $SIZES bytes ..." >&2
"$BUILD/bench/raw_zmq_bench" --sizes "$SIZES" --modes inflight8 --repeats 5 --min_seconds 0.5 \
  --keep_allocations_mapped --json "$WORK/raw.json" 2>/dev/null

cat "$WORK/lookup.md"
echo
"$PYTHON" - "$WORK" "$PATH_NAME" <<'PY'
import json, sys
work = sys.argv[1]
raw = {r["size"]: r["median_mbps"] * 1e6 for r in json.load(open(f"{work}/raw.json"))["results"]}
print(f"Sparse push/pull over {sys.argv[2]}; raw ZeroMQ over TCP loopback. 1 server (batches of 8192 ids, Zipf(1.1) over 10M ids, deduplicated;")
print("4 requests in flight per worker). Bytes are payload: 8-byte keys + 4-byte floats.\n")
print("| dim | workers | op | unique rows/request | rows/s | MB/s | raw ZeroMQ MB/s (same size) | ratio |")
print("|---:|---:|---|---:|---:|---:|---:|---:|")
for workers in (1, 2):
    s = json.load(open(f"{work}/run-{workers}/summary.json"))
    rows = {}
    for rep in s["worker_reports"]:
        for r in rep["report"]["results"]:
            key = (r["dim"], r["op"])
            agg = rows.setdefault(key, {"rows": 0.0, "bytes": 0.0, "unique": r["unique_per_batch"]})
            agg["rows"] += r["rows_per_s"]
            agg["bytes"] += r["payload_bytes_per_s"]
    for (dim, op), a in sorted(rows.items()):
        size = int(a["unique"] * (dim * 4 + 8)) // 4 * 4
        base = raw.get(size)
        ratio = f"{a['bytes'] / base:.2f}" if base else "–"
        print(f"| {dim} | {workers} | {op} | {a['unique']:.0f} | {a['rows']:,.0f} | {a['bytes'] / 1e6:,.0f} | "
              f"{(base or 0) / 1e6:,.0f} | {ratio} |")
PY
if [ "${KEEP:-0}" = 1 ]; then echo "results kept in $WORK" >&2; fi

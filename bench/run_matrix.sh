#!/usr/bin/env bash
# The performance matrix (issue 30), in one command:
#
#   bench/run_matrix.sh [BUILD_DIR]
#
# Cells: dense rows (tessera-push-pull-bench, configs/bench_push_pull.yaml:
# 1 server, 1 worker, one row per size) for every size, op (push, pull,
# pullview) and mode (sequential, inflight8, stream; stream is pushes only,
# 64 in flight), and sparse rows (tessera-sparse-bench,
# configs/bench_sparse.yaml: batches of 8192 Zipf ids deduplicated, 4
# requests in flight) for dims 16 and 64, push and pull; each over TCP
# loopback (shm.enabled=false) and over the same-host path (shm.enabled=true,
# as by default). Baselines: raw ZeroMQ over TCP loopback (bench/raw_zmq_bench,
# with Tessera's allocator settings) in the same mode and at the same size (for
# sparse rows: 8 in flight at the mean request payload, as bench/run_sparse.sh),
# raw ZeroMQ sequential (the 4 KiB, 8-in-flight goal), single-thread memcpy
# (bench/memcpy_bench) for the same-host path, and the same cell over TCP
# for the shared-memory cells.
#
# It runs ROUNDS interleaved rounds. In a round, each group (dense, sparse)
# runs its baselines and its Tessera runs back to back (Tessera first in odd
# rounds, the baselines first in even ones), so that each round's ratio
# compares runs made close in time; a round measures each cell once (one
# repeat), and the spread of a ratio is its min-max over the rounds. One
# launcher run per (kind, transport, round) measures all of that kind's cells.
# Then bench/matrix_report.py prints the table (a cell below its goal is
# marked; a cell that failed to run is shown as failed) and writes the plot.
#
# The rings: configs/bench_push_pull.yaml sizes them at 256 MiB, enough for 8
# requests of 16 MiB in flight; 8 of 64 MiB need 512 MiB (with less, the
# excess goes over TCP and paces the rest, which is not the cell's path),
# so shm.ring_bytes is raised to the smallest power of two that holds 8 of
# the largest size. The servers' other limits already allow it
# (limits.max_message_mb 256, max_mb_in_flight_per_peer 1024).
#
# Environment: ROUNDS (3), SIZES (4096,262144,1048576,16777216,67108864),
# OPS (push,pull,pullview), MODES (sequential,inflight8,stream),
# KINDS (dense,sparse), TRANSPORTS (tcp,shm), DIMS (16,64), MIN_SECONDS (0.3:
# each dense measurement lasts at least this...), MIN_MESSAGES (5: ...and this
# many ops), SPARSE_SECONDS (1: each sparse measurement), WORK (the directory
# for the raw results, the run directories, table.md and perf_matrix.png;
# default a new /tmp/tessera-matrix.XXXXXX, kept), PLOT (the plot's path,
# default WORK/perf_matrix.png), SKIP_BUILD=1 to run the binaries in
# BUILD_DIR as they are.
set -euo pipefail

case "${1:-}" in
  -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'; exit 0 ;;
  -*) echo "run_matrix.sh: unknown option '$1' (the only argument is a build directory; --help explains)" >&2; exit 2 ;;
esac

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BUILD=$(realpath -m "${1:-${TESSERA_BUILD_DIR:-$ROOT/build}}")
PYTHON=/usr/bin/python3
REPORT="$ROOT/bench/matrix_report.py"
ROUNDS=${ROUNDS:-3}
SIZES=${SIZES:-4096,262144,1048576,16777216,67108864}
OPS=${OPS:-push,pull,pullview}
MODES=${MODES:-sequential,inflight8,stream}
KINDS=${KINDS:-dense,sparse}
TRANSPORTS=${TRANSPORTS:-tcp,shm}
DIMS=${DIMS:-16,64}
MIN_SECONDS=${MIN_SECONDS:-0.3}
MIN_MESSAGES=${MIN_MESSAGES:-5}
SPARSE_SECONDS=${SPARSE_SECONDS:-1}

has() {  # has LIST ITEM: ITEM is in the comma-separated LIST
  case ",$1," in *",$2,"*) return 0 ;; *) return 1 ;; esac
}
for t in ${TRANSPORTS//,/ }; do
  has tcp,shm "$t" || { echo "run_matrix.sh: TRANSPORTS: unknown transport '$t'" >&2; exit 2; }
done
for k in ${KINDS//,/ }; do
  has dense,sparse "$k" || { echo "run_matrix.sh: KINDS: unknown kind '$k'" >&2; exit 2; }
done

if [ -n "${WORK:-}" ]; then mkdir -p "$WORK"; else WORK=$(mktemp -d /tmp/tessera-matrix.XXXXXX); fi
WORK=$(realpath "$WORK")
PLOT=${PLOT:-$WORK/perf_matrix.png}
RESULTS="$WORK/results.jsonl"
: >"$RESULTS"
START=$(date +%s)
echo "run_matrix.sh: results in $WORK" >&2

if [ "${SKIP_BUILD:-0}" != 1 ]; then
  # shellcheck source=bench/lib.sh
  source "$ROOT/bench/lib.sh"
  echo "building ..." >&2
  bench_build run_matrix.sh "$BUILD" "$WORK/build.log" raw_zmq_bench memcpy_bench tessera-push-pull-bench \
    tessera-sparse-bench tessera-coordinator tessera-server
fi

# Raw ZeroMQ modes: the same as Tessera's, plus sequential for the 4 KiB,
# 8-in-flight goal (raw ZeroMQ sending the same requests one by one).
RAW_MODES=$MODES
if has "$MODES" inflight8 && ! has "$MODES" sequential; then RAW_MODES="sequential,$MODES"; fi

# Rings that hold 8 requests of the largest size in flight (see above).
MAX_SIZE=$(tr ',' '\n' <<<"$SIZES" | sort -n | tail -1)
RING=268435456
while [ "$RING" -lt $((8 * MAX_SIZE)) ]; do RING=$((RING * 2)); done

COMMIT=$(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo unknown)
CHANGED=$(git -C "$ROOT" status --porcelain --untracked-files=no 2>/dev/null | awk '{print $2}' | paste -sd, || true)
"$PYTHON" - "$WORK/meta.json" <<PY
import json, sys
ints = lambda s: [int(x) for x in s.split(",") if x]
strs = lambda s: [x for x in s.split(",") if x]
json.dump({"rounds": $ROUNDS, "sizes": ints("$SIZES"), "ops": strs("$OPS"), "modes": strs("$MODES"),
           "kinds": strs("$KINDS"), "transports": strs("$TRANSPORTS"), "dims": ints("$DIMS"),
           "min_seconds": $MIN_SECONDS, "min_messages": $MIN_MESSAGES, "sparse_seconds": $SPARSE_SECONDS,
           "ring_bytes": $RING, "build": "$BUILD", "commit": "$COMMIT", "changed": strs("$CHANGED"),
           "date": "$(date -u +%Y-%m-%dT%H:%MZ)"}, open(sys.argv[1], "w"), indent=1)
PY

elapsed() { local s=$(($(date +%s) - START)); printf '%d:%02d' $((s / 60)) $((s % 60)); }
say() { echo "[$(elapsed)] round $ROUND/$ROUNDS: $*" >&2; }

tessera_run() {  # KIND TRANSPORT
  local kind=$1 transport=$2 run="$WORK/round-$ROUND/$1-$2" shm=false config program args
  [ "$transport" = shm ] && shm=true
  if [ "$kind" = dense ]; then
    config=configs/bench_push_pull.yaml program=tessera-push-pull-bench
    args=(--set "shm.ring_bytes=$RING" --set "worker.args.sizes=\"$SIZES\"" --set "worker.args.ops=\"$OPS\""
          --set "worker.args.modes=\"$MODES\"" --set "worker.args.repeats=1"
          --set "worker.args.min_seconds=$MIN_SECONDS" --set "worker.args.min_messages=$MIN_MESSAGES")
    say "Tessera dense over $transport: sizes $SIZES, ops $OPS, modes $MODES ..."
  else
    config=configs/bench_sparse.yaml program=tessera-sparse-bench
    args=(--set "worker.args.dims=\"$DIMS\"" --set "worker.args.seconds=$SPARSE_SECONDS")
    say "Tessera sparse over $transport: dims $DIMS, push and pull ..."
  fi
  if ! "$PYTHON" "$ROOT/launcher/tessera-launch" local --config "$ROOT/$config" --build-dir "$BUILD" \
      --run-dir "$run" --quiet --timeout 900 --set "worker.program=$BUILD/bench/$program" \
      --set "shm.enabled=$shm" "${args[@]}" >"$run.launch.log" 2>&1; then
    say "Tessera $kind over $transport FAILED (launcher output: $run.launch.log; logs in $run/logs)"
  fi
  "$PYTHON" "$REPORT" add "$RESULTS" --round "$ROUND" --source tessera --kind "$kind" --transport "$transport" "$run"
}

raw_run() {  # KIND SIZES MODES
  local json="$WORK/round-$ROUND/raw-$1.json"
  say "raw ZeroMQ ($1 baseline): sizes $2, modes $3 ..."
  if "$BUILD/bench/raw_zmq_bench" --sizes "$2" --modes "$3" --repeats 1 --min_seconds "$MIN_SECONDS" \
      --min_messages "$MIN_MESSAGES" --keep_allocations_mapped --json "$json" 2>"${json%.json}.log"; then
    "$PYTHON" "$REPORT" add "$RESULTS" --round "$ROUND" --source raw --kind "$1" "$json"
  else
    say "raw ZeroMQ FAILED (log: ${json%.json}.log)"
    "$PYTHON" "$REPORT" fail "$RESULTS" --round "$ROUND" --source raw --kind "$1" "raw_zmq_bench failed; log ${json%.json}.log"
  fi
}

memcpy_run() {
  local json="$WORK/round-$ROUND/memcpy.json"
  say "memcpy baseline: sizes $SIZES ..."
  if "$BUILD/bench/memcpy_bench" --sizes "$SIZES" --repeats 1 --min_seconds "$MIN_SECONDS" --json "$json" \
      >/dev/null 2>&1; then
    "$PYTHON" "$REPORT" add "$RESULTS" --round "$ROUND" --source memcpy "$json"
  else
    "$PYTHON" "$REPORT" fail "$RESULTS" --round "$ROUND" --source memcpy "memcpy_bench failed"
  fi
}

dense_baselines() {
  raw_run dense "$SIZES" "$RAW_MODES"
  if has "$TRANSPORTS" shm; then memcpy_run; fi
}

sparse_baselines() {
  local sizes
  sizes=$("$PYTHON" "$REPORT" sparse-sizes "$RESULTS")
  if [ -z "$sizes" ]; then
    say "no sparse run has finished yet: no sizes for the raw ZeroMQ sparse baseline"
    "$PYTHON" "$REPORT" fail "$RESULTS" --round "$ROUND" --source raw --kind sparse "no sparse sizes known"
    return
  fi
  raw_run sparse "$sizes" inflight8
}

tessera_group() {  # KIND: its runs over each transport, in alternating order
  local order=$TRANSPORTS
  if [ $((ROUND % 2)) = 0 ]; then order=$(tr ',' '\n' <<<"$TRANSPORTS" | tac | paste -sd,); fi
  for t in ${order//,/ }; do tessera_run "$1" "$t"; done
}

for ROUND in $(seq 1 "$ROUNDS"); do
  mkdir -p "$WORK/round-$ROUND"
  for kind in ${KINDS//,/ }; do
    if [ $((ROUND % 2)) = 1 ]; then
      tessera_group "$kind"
      "${kind}_baselines"
    else
      "${kind}_baselines"
      tessera_group "$kind"
    fi
  done
done

echo "[$(elapsed)] report ..." >&2
"$PYTHON" "$REPORT" report "$WORK/meta.json" "$RESULTS" --plot "$PLOT" | tee "$WORK/table.md"
echo "run_matrix.sh: done in $(elapsed); table $WORK/table.md, plot $PLOT, raw results $RESULTS" >&2

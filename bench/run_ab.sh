#!/usr/bin/env bash
# Two builds of Tessera against each other (A/B), push/pull over TCP loopback.
#
#   bench/run_ab.sh BEFORE_BUILD_DIR AFTER_BUILD_DIR
#
# Rounds of: raw ZeroMQ (from AFTER), then the two trees' tessera-push-pull-bench
# (1 server, 1 worker, configs/bench_push_pull.yaml with shm.enabled=false,
# each tree with its own server and coordinator), the two in alternating
# order. For every size, mode and op it prints the median over rounds of
# after/before, counting a round only when every probe of both runs (the
# CPU pair probe, bench/cpu_pair_probe.h) was below NEAR_NS: the two
# trees then ran with the CPUs placed near each other (docs/benchmarks.md,
# "The VM's slow state"). Build BEFORE from an older commit, e.g.
#   git worktree add /tmp/before COMMIT && cmake -S /tmp/before -B /tmp/before-build -G Ninja \
#     -DCMAKE_BUILD_TYPE=RelWithDebInfo && ninja -C /tmp/before-build tessera-push-pull-bench \
#     tessera-server tessera-coordinator
#
# Environment: ROUNDS (8), SIZES (4096,1048576,16777216), OPS (push,pull),
# MODES (sequential,inflight8), REPEATS (3), MIN_SECONDS (0.5), NEAR_NS
# (150), KEEP=1 to keep the results (printed at the end), SET (launcher
# overrides for both trees), SET_BEFORE and SET_AFTER (for one tree each).
# A setting against its default in one build: the same directory twice,
#   SET_BEFORE="coalesce.enabled=false" bench/run_ab.sh build build
set -euo pipefail

if [ $# -ne 2 ]; then
  echo "usage: bench/run_ab.sh BEFORE_BUILD_DIR AFTER_BUILD_DIR" >&2
  exit 2
fi
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BEFORE=$(realpath -m "$1")
AFTER=$(realpath -m "$2")
PYTHON=/usr/bin/python3
ROUNDS=${ROUNDS:-8}
SIZES=${SIZES:-4096,1048576,16777216}
OPS=${OPS:-push,pull}
MODES=${MODES:-sequential,inflight8}
REPEATS=${REPEATS:-3}
MIN_SECONDS=${MIN_SECONDS:-0.5}
NEAR_NS=${NEAR_NS:-150}
for dir in "$BEFORE" "$AFTER"; do
  for bin in bench/tessera-push-pull-bench server/tessera-server coordinator/tessera-coordinator; do
    if [ ! -x "$dir/$bin" ]; then
      echo "run_ab.sh: $dir/$bin is missing: build it first" >&2
      exit 2
    fi
  done
done
if [ ! -x "$AFTER/bench/raw_zmq_bench" ]; then
  echo "run_ab.sh: $AFTER/bench/raw_zmq_bench is missing: build it first" >&2
  exit 2
fi

# shellcheck source=bench/lib.sh
source "$ROOT/bench/lib.sh"
WORK=$(mktemp -d /tmp/tessera-ab.XXXXXX)
if [ "${KEEP:-0}" != 1 ]; then trap 'rm -rf "$WORK"' EXIT; fi

# SET: extra launcher overrides for both trees, space-separated (one
# launcher drives both, so a setting the older server lacks must be set to
# what it understands, e.g. SET="limits.max_table_mb=0" before `auto`).
EXTRA=()
for o in ${SET:-}; do EXTRA+=(--set "$o"); done
EXTRA_BEFORE=()
for o in ${SET_BEFORE:-}; do EXTRA_BEFORE+=(--set "$o"); done
EXTRA_AFTER=()
for o in ${SET_AFTER:-}; do EXTRA_AFTER+=(--set "$o"); done

run_tessera() {  # BUILD_DIR RUN_DIR [--set KEY=VALUE ...]
  local build=$1 run=$2
  shift 2
  bench_push_pull_run run_ab.sh "$build" "$run" --set shm.enabled=false \
    --set "worker.args.sizes=\"$SIZES\"" --set "worker.args.ops=\"$OPS\"" --set "worker.args.modes=\"$MODES\"" \
    --set "worker.args.repeats=$REPEATS" --set "worker.args.min_seconds=$MIN_SECONDS" "${EXTRA[@]}" "$@"
}

for round in $(seq 1 "$ROUNDS"); do
  echo "round $round/$ROUNDS ..." >&2
  bench_raw_run run_ab.sh "$AFTER" "$WORK/raw-$round.json" --sizes "$SIZES" --modes "$MODES" \
    --repeats "$REPEATS" --min_seconds "$MIN_SECONDS" --keep_allocations_mapped
  if [ $((round % 2)) = 1 ]; then
    run_tessera "$AFTER" "$WORK/after-$round" "${EXTRA_AFTER[@]}"
    run_tessera "$BEFORE" "$WORK/before-$round" "${EXTRA_BEFORE[@]}"
  else
    run_tessera "$BEFORE" "$WORK/before-$round" "${EXTRA_BEFORE[@]}"
    run_tessera "$AFTER" "$WORK/after-$round" "${EXTRA_AFTER[@]}"
  fi
done

"$PYTHON" - "$WORK" "$ROUNDS" "$NEAR_NS" <<'PY'
import json
import statistics
import sys

work, rounds, near = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])

def results(run):
    summary = json.load(open(f"{work}/{run}/summary.json"))
    return {(x["size"], x["mode"], x["op"]): x for x in summary["worker_reports"][0]["report"]["results"]}

ratios = {}
for r in range(1, rounds + 1):
    after, before = results(f"after-{r}"), results(f"before-{r}")
    for key, a in after.items():
        b = before.get(key)
        if b is None or max(a["probe_ns"] + b["probe_ns"]) >= near or min(a["probe_ns"] + b["probe_ns"]) <= 0:
            continue
        ratios.setdefault(key, []).append(statistics.median(a["mbps"]) / statistics.median(b["mbps"]))

print("| size | mode | op | after/before (median) | rounds counted | per round |")
print("|---:|---|---|---:|---:|---|")
for (size, mode, op), v in sorted(ratios.items()):
    print(f"| {size} | {mode} | {op} | {statistics.median(v):.2f} | {len(v)} of {rounds} | "
          f"{' '.join(f'{x:.2f}' for x in v)} |")
print()
print(f"A round counts for a cell when every CPU pair probe of both runs was below {near:g} ns.")
if not ratios:
    print("No round counted: the CPUs were never placed near each other for both runs (try more ROUNDS).")
PY
if [ "${KEEP:-0}" = 1 ]; then echo "results kept in $WORK" >&2; fi

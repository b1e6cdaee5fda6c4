#!/usr/bin/env bash
# The DLRM example through Tessera against plain PyTorch, on this machine:
#
#   bench/run_dlrm.sh [BUILD_DIR]
#
# Each round runs, back to back, with the same data, model and options
# (configs/dlrm.yaml's worker.args, with TRAIN_EXAMPLES and MAX_CARDINALITY):
# - bench/dlrm_plain.py: one plain PyTorch process, local embeddings, with
#   1 and with 2 torch threads;
# - examples/dlrm.py through tessera-launch (2 servers, 2 workers, one torch
#   thread each) with --prefetch off (the plain loop), 1 and 0
#   (tessera.torch.Prefetcher's staleness).
# It prints, per round, examples/s of training (evaluations not counted;
# the two workers' rates added up), the test AUC, and the ratio to the
# plain process (the first of PLAIN_THREADS) measured in the same round.
#
# Environment: ROUNDS (default 2), PLAIN_THREADS (the plain process's torch
# threads, "1 2"; the ratio is to the first), TRAIN_EXAMPLES (2000000),
# MAX_CARDINALITY (3000; the generator's own is 1000000), ADMIT_AFTER
# (configs/dlrm.yaml's, 0: Tessera's feature admission, an id's row made at
# its N-th push; the plain process has no admission and makes every row),
# KEEP=1 keeps the run directories, SKIP_BUILD=1 uses the binaries in
# BUILD_DIR as they are.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BUILD=$(realpath -m "${1:-${TESSERA_BUILD_DIR:-$ROOT/build}}")
PYTHON=/usr/bin/python3
ROUNDS=${ROUNDS:-2}
PLAIN_THREADS=${PLAIN_THREADS:-1 2}
TRAIN_EXAMPLES=${TRAIN_EXAMPLES:-2000000}
MAX_CARDINALITY=${MAX_CARDINALITY:-3000}
ADMIT_AFTER=${ADMIT_AFTER:-0}
for v in ROUNDS TRAIN_EXAMPLES MAX_CARDINALITY ADMIT_AFTER; do
  if ! [[ ${!v} =~ ^[0-9]+$ ]]; then
    echo "run_dlrm.sh: $v must be a whole number, got '${!v}'" >&2
    exit 2
  fi
done
# shellcheck source=bench/lib.sh
source "$ROOT/bench/lib.sh"

OUT=$(mktemp -d /tmp/tessera-dlrm-bench.XXXXXX)
if [ "${KEEP:-0}" != 1 ]; then trap 'rm -rf "$OUT"' EXIT; fi
if [ "${SKIP_BUILD:-0}" != 1 ]; then
  bench_build "$0" "$BUILD" "$OUT/build.log" _tessera tessera-server tessera-coordinator
fi

# configs/dlrm.yaml's worker.args as --key value, for the plain process.
mapfile -t ARGS < <("$PYTHON" - "$ROOT/configs/dlrm.yaml" <<'EOF'
import sys, yaml
args = yaml.safe_load(open(sys.argv[1]))["worker"]["args"]
for k, v in args.items():
    if k in ("train_examples", "max_cardinality", "prefetch", "admit_after"):
        continue
    print(f"--{k}"); print(v)
EOF
)

for round in $(seq 1 "$ROUNDS"); do
  for threads in $PLAIN_THREADS; do
    echo "round $round: plain PyTorch, $threads thread(s)" >&2
    TESSERA_BUILD_DIR=$BUILD "$PYTHON" "$ROOT/bench/dlrm_plain.py" "${ARGS[@]}" --threads "$threads" \
      --train_examples "$TRAIN_EXAMPLES" --max_cardinality "$MAX_CARDINALITY" \
      | sed -n 's/^DLRM_PLAIN_RESULT //p' >"$OUT/r$round-plain-$threads.json"
  done
  for prefetch in off 1 0; do
    echo "round $round: Tessera, prefetch $prefetch" >&2
    if ! "$PYTHON" "$ROOT/launcher/tessera-launch" local --config "$ROOT/configs/dlrm.yaml" --build-dir "$BUILD" \
        --run-dir "$OUT/r$round-tessera-$prefetch" --quiet --timeout 900 \
        --set "worker.args.train_examples=$TRAIN_EXAMPLES" --set "worker.args.max_cardinality=$MAX_CARDINALITY" \
        --set "worker.args.admit_after=$ADMIT_AFTER" \
        --set "worker.args.prefetch=\"$prefetch\"" >"$OUT/r$round-tessera-$prefetch.log" 2>&1; then
      echo "$0: the Tessera run failed; logs in $OUT/r$round-tessera-$prefetch" >&2
      trap - EXIT
      exit 1
    fi
  done
done

"$PYTHON" - "$OUT" "$ROUNDS" $PLAIN_THREADS <<'EOF'
import json, sys
from pathlib import Path
out, rounds, plain_threads = Path(sys.argv[1]), int(sys.argv[2]), [int(t) for t in sys.argv[3:]]
print(f"| round | run | examples/s | test AUC | truth AUC | vs plain, {plain_threads[0]} thread(s) |")
print("|---|---|---|---|---|---|")
for r in range(1, rounds + 1):
    rows = []
    for threads in plain_threads:
        p = json.loads((out / f"r{r}-plain-{threads}.json").read_text())
        rows.append((f"plain PyTorch, {threads} thread{'s' if threads > 1 else ''}",
                     p["train_examples_per_second"], p["test_auc"], p["truth_auc"]))
    for prefetch in ("off", "1", "0"):
        s = json.loads((out / f"r{r}-tessera-{prefetch}" / "summary.json").read_text())
        reports = [w["report"] for w in s["worker_reports"]]
        name = "Tessera, plain loop" if prefetch == "off" else f"Tessera, prefetch (staleness {prefetch})"
        rows.append((name, sum(x["train_examples_per_second"] for x in reports),
                     min(x["test_auc"] for x in reports), reports[0]["truth_auc"]))
    base = rows[0][1]
    for name, rate, auc, truth in rows:
        print(f"| {r} | {name} | {rate:,.0f} | {auc:.4f} | {truth:.4f} | {rate / base:.2f} |")
EOF

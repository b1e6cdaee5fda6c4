#!/usr/bin/env bash
# The straggler experiment: logistic regression on 4 workers, one of them
# computing at 2x the step time of the others, under BSP, SSP(3) and ASP
# (configs/straggler.yaml). Runs every model under each straggler model
# (rotating: the slow worker changes every step; fixed: always the same one),
# then writes a Markdown table and a plot of test loss against training time.
#
#   bench/run_straggler.sh [BUILD_DIR]
#
# Environment: REPEATS (default 1; the table shows medians), SCENARIOS
# (default "rotating fixed"), MODELS (default "bsp ssp asp"), OUT (default
# runs/straggler-<time>): where the run directories, straggler.md,
# straggler.json and straggler.png go. Extra launcher overrides can be given
# in SET, e.g. SET="worker.args.step_ms=20 worker.args.staleness=1".
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BUILD=$(realpath -m "${1:-${TESSERA_BUILD_DIR:-$ROOT/build}}")
PYTHON=/usr/bin/python3
REPEATS=${REPEATS:-1}
SCENARIOS=${SCENARIOS:-rotating fixed}
MODELS=${MODELS:-bsp ssp asp}
OUT=$(realpath -m "${OUT:-$ROOT/runs/straggler-$(date +%Y%m%d-%H%M%S)}")

mkdir -p "$OUT"
# shellcheck source=bench/lib.sh
source "$ROOT/bench/lib.sh"
bench_build run_straggler.sh "$BUILD" "$OUT/build.log" tessera-logreg tessera-coordinator tessera-server

extra=()
for kv in ${SET:-}; do extra+=(--set "$kv"); done
for scenario in $SCENARIOS; do
  for model in $MODELS; do
    for ((r = 1; r <= REPEATS; r++)); do
      run="$OUT/$scenario-$model-$r"
      echo "straggler experiment: $scenario straggler, $model, repeat $r of $REPEATS ..." >&2
      if ! "$PYTHON" "$ROOT/launcher/tessera-launch" local --config "$ROOT/configs/straggler.yaml" \
          --build-dir "$BUILD" --run-dir "$run" --quiet --timeout 600 \
          --set "worker.args.straggler=$scenario" --set "worker.args.consistency=$model" \
          "${extra[@]}" >"$run.launch.log" 2>&1; then
        tail -20 "$run.launch.log" >&2
        echo "run_straggler.sh: the $scenario/$model run failed; logs in $run/logs" >&2
        exit 1
      fi
    done
  done
done
"$PYTHON" "$ROOT/bench/straggler_report.py" "$OUT"

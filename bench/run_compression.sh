#!/usr/bin/env bash
# Gradient compression end to end: configs/compression.yaml (dense-weight
# logistic regression, 2 servers, 4 workers, BSP) once per codec, with every
# process inside a network namespace whose loopback is shaped to RATE (default
# 100mbit) by a tc token-bucket filter: all of the job's traffic shares one
# 100 Mbit/s link. Prints a table of wall time, wire bytes and final test loss
# against the uncompressed run. Needs root (ip netns, tc).
#
#   bench/run_compression.sh [BUILD_DIR]
#
# Environment: RATE (tc rate, default 100mbit; "none" runs on the plain
# loopback without a namespace), OUT (default runs/compression-<time>),
# VARIANTS (default: see below; each NAME=PUSH_SPEC/PULL_SPEC), SET (extra
# launcher overrides, space-separated KEY=VALUE).
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BUILD=$(realpath -m "${1:-${TESSERA_BUILD_DIR:-$ROOT/build}}")
PYTHON=/usr/bin/python3
RATE=${RATE:-100mbit}
OUT=$(realpath -m "${OUT:-$ROOT/runs/compression-$(date +%Y%m%d-%H%M%S)}")
VARIANTS=${VARIANTS:-"none=/ fp16=fp16/ int8=qsgd/ topk1%+ef=topk:ratio=0.01/ topk1%-noef=topk:ratio=0.01,ef=false/ onebit+ef=onebit/ topk1%+ef,fp16-pulls=topk:ratio=0.01/fp16"}

mkdir -p "$OUT"
# shellcheck source=bench/lib.sh
source "$ROOT/bench/lib.sh"
bench_build run_compression.sh "$BUILD" "$OUT/build.log" tessera-logreg tessera-coordinator tessera-server

NETNS=()
if [ "$RATE" != none ]; then
  if [ "$(id -u)" -ne 0 ]; then
    echo "run_compression.sh: shaping the link needs root (ip netns, tc); or run with RATE=none" >&2
    exit 2
  fi
  NS="tessera-bw-$$"
  ip netns add "$NS"
  trap 'ip netns del "$NS" 2>/dev/null || true' EXIT
  ip netns exec "$NS" ip link set lo up
  # Loopback's MTU is 64 KiB: the bucket must hold a few whole packets.
  ip netns exec "$NS" tc qdisc add dev lo root tbf rate "$RATE" burst 256kb latency 200ms
  echo "network namespace $NS: loopback shaped to $RATE" >&2
  NETNS=(ip netns exec "$NS")
fi

extra=()
for kv in ${SET:-}; do extra+=(--set "$kv"); done
for variant in $VARIANTS; do
  name=${variant%%=*}
  specs=${variant#*=}
  push=${specs%%/*}
  pull=${specs#*/}
  run="$OUT/run-$(echo "$name" | tr -c 'A-Za-z0-9.+-' '_')"
  echo "compression: $name (push \"$push\", pull \"$pull\") ..." >&2
  if ! "${NETNS[@]}" "$PYTHON" "$ROOT/launcher/tessera-launch" local --config "$ROOT/configs/compression.yaml" \
      --build-dir "$BUILD" --run-dir "$run" --quiet --timeout 900 \
      --set "worker.args.compression=\"$push\"" --set "worker.args.pull_compression=\"$pull\"" \
      "${extra[@]}" >"$run.launch.log" 2>&1; then
    tail -20 "$run.launch.log" >&2
    echo "run_compression.sh: the $name run failed; logs in $run/logs" >&2
    exit 1
  fi
  echo "$name	$push	$pull	$run" >>"$OUT/variants.tsv"
done
"$PYTHON" "$ROOT/bench/compression_report.py" "$OUT" "$RATE"

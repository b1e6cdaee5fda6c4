#!/usr/bin/env bash
# Codec throughput on one core, as ratios to a plain memory-read pass
# measured in the same run.
#
#   bench/run_codec_bench.sh [BUILD_DIR]
#
# Configures and builds a Release build in BUILD_DIR (default
# build-compress-rel) if needed, runs bench/codec_bench (16M floats per
# tensor) REPEATS times with the benchmarks interleaved at random, and prints
# one Markdown table of medians: benchmark, GB/s of fp32 input, ratio to the
# read pass. Environment: KERNELS (portable, avx2 or avx512: caps the
# kernel table, passed as codec_bench --cpu-kernels; default the widest the
# CPU has), REPEATS (default 5), MIN_TIME (seconds per
# benchmark and repetition, default 0.2), FILTER (a benchmark regex),
# KEEP=1 keeps the JSON (path printed).
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BUILD=$(realpath -m "${1:-$ROOT/build-compress-rel}")
PYTHON=/usr/bin/python3
REPEATS=${REPEATS:-5}
MIN_TIME=${MIN_TIME:-0.2}
FILTER=${FILTER:-.}
KERNEL_FLAGS=()
if [ -n "${KERNELS:-}" ]; then KERNEL_FLAGS=(--cpu-kernels="$KERNELS"); fi

BUILD_LOG=$(mktemp --suffix=.log)
# shellcheck source=bench/lib.sh
source "$ROOT/bench/lib.sh"
BENCH_BUILD_TYPE=Release BENCH_CONFIGURE_FLAGS="-DTESSERA_BUILD_TESTS=OFF" \
  bench_build run_codec_bench.sh "$BUILD" "$BUILD_LOG" codec_bench
rm -f "$BUILD_LOG"
BIN="$BUILD/bench/codec_bench"
[ -x "$BIN" ] || { echo "run_codec_bench: $BIN was not built (is libbenchmark-dev installed?)" >&2; exit 1; }

JSON=$(mktemp --suffix=.json)
# Single core: pin to one CPU when taskset exists.
PIN=()
if command -v taskset >/dev/null; then PIN=(taskset -c 0); fi
"${PIN[@]}" "$BIN" "${KERNEL_FLAGS[@]}" --benchmark_filter="$FILTER" --benchmark_min_time="$MIN_TIME" \
  --benchmark_repetitions="$REPEATS" --benchmark_enable_random_interleaving=true \
  --benchmark_format=json --benchmark_out="$JSON" --benchmark_out_format=json >/dev/null 2>"$JSON.err" ||
  { cat "$JSON.err" >&2; rm -f "$JSON" "$JSON.err"; exit 1; }
rm -f "$JSON.err"

ORDER=$("$BIN" --benchmark_filter="$FILTER" --benchmark_list_tests | tr '\n' ' ')
"$PYTHON" - "$JSON" "$REPEATS" "$ORDER" <<'PY'
import json, statistics, sys
from collections import defaultdict
data = json.load(open(sys.argv[1]))
rates = defaultdict(list)
for b in data["benchmarks"]:
    if b.get("run_type") == "aggregate" or "error_occurred" in b and b["error_occurred"]:
        continue
    rates[b["run_name"]].append(b["bytes_per_second"] / 1e9)
med = {k: statistics.median(v) for k, v in rates.items()}
base = med.get("read_pass")
ctx = data["context"]
print(f"{ctx['num_cpus']} CPUs at {ctx['mhz_per_cpu']} MHz; "
      f"median of {sys.argv[2]} repetitions; 16M floats; single thread; "
      f"{ctx.get('kernels', '?')} kernels")
print()
print("| benchmark | GB/s of fp32 input | ratio to read pass |")
print("|---|---:|---:|")
for name in sys.argv[3].split():  # registration order
    if name not in med:
        continue
    ratio = med[name] / base if base else float("nan")
    print(f"| {name} | {med[name]:.2f} | {ratio:.2f} |")
PY
if [ "${KEEP:-0}" = 1 ]; then echo; echo "raw results: $JSON"; else rm -f "$JSON"; fi

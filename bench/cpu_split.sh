#!/usr/bin/env bash
# Where the CPU time of a benchmark goes, by thread group, over a window in
# the middle of its run:
#
#   bench/cpu_split.sh [--delay S] [--window S] -- COMMAND [ARGS...]
#
# Runs COMMAND in the background, waits --delay seconds (default 6: past
# start-up and warm-up), records the scheduler's events of the whole
# machine for --window seconds (default 2) with `perf sched record`, waits
# for COMMAND to end, and prints, per thread group (ZeroMQ's I/O threads
# "ZMQbg/IO", each Tessera binary's own threads, raw_zmq_bench, ...), the
# CPU time it ran in the window and its context switches, and the share of
# the machine's CPU time left idle. Divide by the bytes moved in the window
# (the benchmark's MB/s times the window) for CPU seconds per GB.
#
# COMMAND must run past delay + window. Needs perf and the right to trace
# the scheduler (root, or kernel.perf_event_paranoid <= 1).
# Example (docs/benchmarks.md, "Where the time goes at 1 MiB over TCP"):
#   bench/cpu_split.sh -- build/bench/raw_zmq_bench --sizes 1048576 --modes inflight8 \
#     --repeats 20 --min_seconds 0.5 --keep_allocations_mapped
set -euo pipefail

usage() { sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'; }
DELAY=6
WINDOW=2
while [ $# -gt 0 ]; do
  case "$1" in
    -h|--help) usage; exit 0 ;;
    --delay) DELAY=$2; shift 2 ;;
    --window) WINDOW=$2; shift 2 ;;
    --) shift; break ;;
    *) echo "cpu_split.sh: unknown option '$1' (--help)" >&2; exit 2 ;;
  esac
done
if [ $# -eq 0 ]; then
  echo "cpu_split.sh: no command given (--help)" >&2
  exit 2
fi
if ! command -v perf >/dev/null; then
  echo "cpu_split.sh: perf is not installed (apt-get install linux-perf)" >&2
  exit 2
fi
WORK=$(mktemp -d /tmp/tessera-cpu-split.XXXXXX)
trap 'rm -rf "$WORK"' EXIT

"$@" >"$WORK/out" 2>&1 &
pid=$!
sleep "$DELAY"
if ! kill -0 "$pid" 2>/dev/null; then
  echo "cpu_split.sh: the command ended before the window began; its output:" >&2
  cat "$WORK/out" >&2
  exit 1
fi
read -r _ u n s i w q sq st _ </proc/stat
perf sched record -o "$WORK/sched.data" -- sleep "$WINDOW" >/dev/null 2>&1
read -r _ u2 n2 s2 i2 w2 q2 sq2 st2 _ </proc/stat
still=yes
kill -0 "$pid" 2>/dev/null || still=no
rc=0
wait "$pid" || rc=$?
total=$(((u2 + n2 + s2 + i2 + w2 + q2 + sq2 + st2) - (u + n + s + i + w + q + sq + st)))
idle=$(((i2 + w2) - (i + w)))
echo "command: $*"
echo "exit status: $rc"
if [ "$still" = no ]; then echo "warning: the command ended within the window: the split covers its end" >&2; fi
echo "window: $WINDOW s on $(nproc) CPUs; idle: $((100 * idle / (total > 0 ? total : 1)))% of the machine's CPU time"
echo
echo "| thread group | CPU ms in the window | context switches |"
echo "|---|---:|---:|"
perf sched latency -i "$WORK/sched.data" 2>/dev/null |
  awk -F'|' 'NF >= 4 && $2 ~ /ms/ {
    name = $1; gsub(/^ +| +$/, "", name); sub(/:.*/, "", name)
    ms = $2; gsub(/[^0-9.]/, "", ms); sw = $3; gsub(/[^0-9]/, "", sw)
    if (name == "" || name == "Task") next
    t[name] += ms; c[name] += sw
  } END { for (k in t) if (t[k] >= 1) printf "| %s | %.0f | %d |\n", k, t[k], c[k] }' | sort -t'|' -k3 -rn
echo
echo "the command's output:"
tail -n 20 "$WORK/out"

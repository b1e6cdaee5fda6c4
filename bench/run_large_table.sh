#!/usr/bin/env bash
# A table larger than the servers' memory, on this machine:
#
#   bench/run_large_table.sh [BUILD_DIR]
#
# Runs configs/bench_large_table.yaml through tessera-launch: 4 servers
# (replication 2) and 2 workers fill one Adagrad table (dim 16) with IDS
# distinct ids, check sampled rows bit for bit, and run Zipf(1.1) training
# steps over all of them (bench/large_table_bench.cc). Each server's memory
# budget for the table is a quarter of its share: IDS * REPLICATION / SERVERS
# rows at BYTES_PER_ROW resident bytes a row (189, measured for Adagrad
# dim 16 with a budget, docs/embeddings.md), divided by 4; the rest of its
# rows live in its disk tier under DISK_DIR.
#
# While it runs, every 2 s, it records each server's resident anonymous
# memory (RssAnon: the heap and the table, not the mapped files) and the
# disk tier's size. At the end it prints one table: per server the rows it
# held, how many on disk, its budget and its peak RssAnon; then the workers'
# fill rate, the check, and the training steps' rate. It fails if the rows
# held are not IDS * REPLICATION or a server's peak RssAnon passed its
# budget plus OVERHEAD_MB (the process's own memory: transport buffers,
# code, the store's fixed part).
#
# Environment: IDS (100000000), SERVERS (4), WORKERS (2), REPLICATION (2),
# SECONDS_EACH (30: training steps), BYTES_PER_ROW (189), OVERHEAD_MB (400),
# DISK_DIR (a disk directory beside the run directory), STORE (bucket | log | rocks), KEEP=1 keeps the run
# directory, SKIP_BUILD=1 uses the binaries in BUILD_DIR as they are.
# Needs about IDS * REPLICATION * 200 bytes of free disk (22 GB for 10^8):
# it checks before it starts.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BUILD=$(realpath -m "${1:-${TESSERA_BUILD_DIR:-$ROOT/build}}")
PYTHON=/usr/bin/python3
IDS=${IDS:-100000000}
SERVERS=${SERVERS:-4}
WORKERS=${WORKERS:-2}
REPLICATION=${REPLICATION:-2}
SECONDS_EACH=${SECONDS_EACH:-30}
BYTES_PER_ROW=${BYTES_PER_ROW:-189}
OVERHEAD_MB=${OVERHEAD_MB:-400}
STORE=${STORE:-bucket}
for v in IDS SERVERS WORKERS REPLICATION SECONDS_EACH BYTES_PER_ROW OVERHEAD_MB; do
  if ! [[ ${!v} =~ ^[0-9]+$ ]] || [ "${!v}" -eq 0 ]; then
    echo "run_large_table.sh: $v must be a positive whole number, got '${!v}'" >&2
    exit 2
  fi
done
case "$STORE" in bucket | log | rocks) ;; *) echo "run_large_table.sh: STORE must be bucket, log or rocks, got '$STORE'" >&2; exit 2 ;; esac

WORK=$(mktemp -d "${TMPDIR:-/var/tmp}/tessera-large-table.XXXXXX")
if [ "${KEEP:-0}" != 1 ]; then trap 'rm -rf "$WORK"' EXIT; fi
DISK_DIR=$(realpath -m "${DISK_DIR:-$WORK/disk}")
mkdir -p "$DISK_DIR"

ROWS_HELD=$((IDS * REPLICATION))
SHARE_ROWS=$((ROWS_HELD / SERVERS))
BUDGET=$((SHARE_ROWS * BYTES_PER_ROW / 4))
NEED=$((ROWS_HELD * 200))
FREE=$(df --output=avail -B1 "$DISK_DIR" | tail -1 | tr -d ' ')
if [ "$FREE" -lt "$NEED" ]; then
  echo "run_large_table.sh: $DISK_DIR has $((FREE >> 30)) GiB free; $IDS ids with replication $REPLICATION need" \
    "about $((NEED >> 30)) GiB (set DISK_DIR or a smaller IDS)" >&2
  exit 1
fi

if [ "${SKIP_BUILD:-0}" != 1 ]; then
  # shellcheck source=bench/lib.sh
  source "$ROOT/bench/lib.sh"
  bench_build run_large_table.sh "$BUILD" "$WORK/build.log" tessera-large-table-bench tessera-coordinator \
    tessera-server
fi

echo "run_large_table.sh: $IDS ids x $REPLICATION copies on $SERVERS servers: $SHARE_ROWS rows each," \
  "budget $((BUDGET >> 20)) MiB each (a quarter of $SHARE_ROWS x $BYTES_PER_ROW B), the rest in $DISK_DIR" >&2
"$PYTHON" "$ROOT/launcher/tessera-launch" local --config "$ROOT/configs/bench_large_table.yaml" \
  --build-dir "$BUILD" --run-dir "$WORK/run" --timeout 14400 \
  --set "cluster.servers=$SERVERS" --set "cluster.workers=$WORKERS" --set "cluster.replication=$REPLICATION" \
  --set "disk.dir=$DISK_DIR" --set "disk.store=$STORE" \
  --set "worker.program=$BUILD/bench/tessera-large-table-bench" --set "worker.args.ids=$IDS" \
  --set "worker.args.memory_budget_bytes=$BUDGET" --set "worker.args.seconds=$SECONDS_EACH" \
  >"$WORK/launch.log" 2>&1 &
LAUNCH=$!

# Samples: "server-R RSS_ANON_KB" lines, and the disk tier's bytes.
: >"$WORK/rss.txt"
: >"$WORK/disk.txt"
shown=""
while kill -0 "$LAUNCH" 2>/dev/null; do
  for pid in $(pgrep -f "tessera-server .*--disk-dir $DISK_DIR" || true); do
    name=$(tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -o -- '--name [^ ]*' | cut -d' ' -f2 || true)
    kb=$(awk '/^RssAnon:/ {print $2}' "/proc/$pid/status" 2>/dev/null || true)
    if [ -n "$name" ] && [ -n "$kb" ]; then echo "$name $kb" >>"$WORK/rss.txt"; fi
  done
  du -sb "$DISK_DIR" 2>/dev/null | cut -f1 >>"$WORK/disk.txt" || true
  line=$(grep -h '"phase":"fill"' "$WORK"/run/logs/worker-0*.log 2>/dev/null | tail -1 || true)
  if [ -n "$line" ] && [ "$line" != "$shown" ]; then echo "  worker-0: ${line#*TESSERA_PROGRESS }" >&2; shown=$line; fi
  sleep 2
done
if ! wait "$LAUNCH"; then
  tail -20 "$WORK/launch.log" >&2
  echo "run_large_table.sh: the run failed; logs in $WORK/run/logs" >&2
  trap - EXIT
  exit 1
fi

"$PYTHON" - "$WORK" "$IDS" "$REPLICATION" "$BUDGET" "$OVERHEAD_MB" "$BYTES_PER_ROW" <<'EOF'
import json, re, sys
from pathlib import Path
work, ids, replication, budget, overhead_mb, bytes_per_row = Path(sys.argv[1]), *map(int, sys.argv[2:])
logs = work / "run" / "logs"
peak = {}
for line in (work / "rss.txt").read_text().split("\n"):
    if line.strip():
        name, kb = line.split()
        peak[name] = max(peak.get(name, 0), int(kb) * 1024)
disk_peak = max([int(x) for x in (work / "disk.txt").read_text().split()] or [0])
rows_total, failures = 0, []
print(f"| server | rows held | on disk | in memory | budget (MiB) | peak RssAnon (MiB) | moved to disk | brought back |")
print("|---|---|---|---|---|---|---|---|")
for log in sorted(logs.glob("server-*.log")):
    name = log.stem
    m = None
    for m in re.finditer(r"table 300: (\d+) rows, (\d+) of them on disk \((\d+) bytes of files\); (\d+) rows moved "
                         r"to disk, (\d+) brought back", log.read_text()):
        pass
    if m is None:
        failures.append(f"{name}: no end line for table 300")
        continue
    rows, on_disk, _, moved, back = map(int, m.groups())
    rows_total += rows
    rss = peak.get(name, 0)
    print(f"| {name} | {rows:,} | {on_disk:,} | {rows - on_disk:,} | {budget / 2**20:.0f} | {rss / 2**20:.0f} | "
          f"{moved:,} | {back:,} |")
    if rss > budget + overhead_mb * 2**20:
        failures.append(f"{name}: peak RssAnon {rss / 2**20:.0f} MiB > budget {budget / 2**20:.0f} MiB + "
                        f"{overhead_mb} MiB")
results = []
for log in sorted(logs.glob("worker-*.log")):
    for line in log.read_text().split("\n"):
        if "TESSERA_RESULT " in line:
            results.append(json.loads(line.split("TESSERA_RESULT ", 1)[1]))
print()
print(f"rows held: {rows_total:,} (ids {ids:,} x {replication} copies); disk tier at its largest: "
      f"{disk_peak / 2**30:.1f} GiB")
for i, r in enumerate(results):
    f, c, z = r["fill"], r["check"], r["zipf"]
    print(f"worker-{i}: fill {f['rows']:,} rows in {f['seconds']:.0f} s ({f['rows_per_s']:.3g} rows/s); "
          f"check {c['rows']:,} sampled rows equal; Zipf steps {z['steps_per_s']:.3g}/s, {z['rows_per_s']:.3g} rows/s "
          f"({z['unique_per_step']:.0f} unique rows a step)")
if rows_total != ids * replication:
    failures.append(f"rows held {rows_total:,}, expected {ids * replication:,}")
if len(results) == 0:
    failures.append("no worker result")
for f in failures:
    print("FAILED:", f, file=sys.stderr)
sys.exit(1 if failures else 0)
EOF

#!/usr/bin/env bash
# The fault-matrix experiment: the audit workload (tests/audit/audit_job.yaml:
# 3 servers, replication 2, 3 workers, BSP; servers in audit mode) once per
# fault scenario, each run checked by tests/audit/audit_check.py, then a
# table of detection, failover, throughput dip, recovery and the audit
# verdict (bench/fault_matrix_report.py) and one timeline per scenario.
#
#   bench/run_fault_matrix.sh [BUILD_DIR]
#
# Scenarios (the launcher's `faults:` list, docs/fault_injection.md):
#   baseline           no fault (the reference throughput)
#   e1e2-kill-server   SIGKILL server-1 at 2 s (primary of some shards, backup of others)
#   e3-pause-server    SIGSTOP server-1 for 1.5 s at 2 s (past its 0.5 s lease: deposed)
#   e5-message-faults  TESSERA_FAULTS=$E5_FAULTS for every process, the whole job;
#                      (workers and servers resend on their learned timers); E5_CLOCKS clocks
#   e5-loss-1, e5-loss-5, e5-loss-10
#                      1%, 5% and 10% of messages dropped on every link (seed=3,drop=P,side=send),
#                      the whole job, E5_CLOCKS clocks: how throughput falls with the loss rate
#   e7-restart-worker  restart worker-1 at 2 s (on_worker_loss: wait, lease 1 s, heartbeat 0.2 s)
#   server-restart     restart server-1 at 2 s, kill server-2 at 5 s (copies re-made on the rejoined server)
#   e8-coordinator-failover  kill server-1 at 2 s and the leading coordinator at 2.55 s; the coordinator's
#                      state in etcd (started by this script on loopback, /usr/bin/etcd) and one standby
#   e9-restore         kill server-1 and server-2 together at 2 s: the shards whose both copies were on
#                      them are restored on server-0 from the newest checkpoint (every 0.3 s,
#                      on_shard_loss: restore); the pushes acknowledged after it are lost by design and
#                      the audit lists exactly which (audit.json: lost_to_restore_pushes)
#
# Environment: OUT (default runs/fault_matrix-<date>): run
# directories under OUT/runs, report.md, report.json, fault_<scenario>.png,
# fault_matrix.png. CLOCKS (default 2000, about 10 s a run), E5_CLOCKS
# (default 100), E5_FAULTS (default seed=11,drop=0.02,dup=0.02,reorder=0.05,side=send),
# SCENARIOS (default: all of the above), REPEATS (default 1; the table shows
# medians), TIMEOUT (seconds per run, default 180), SKIP_BUILD=1 (use the
# binaries in BUILD_DIR as they are), DOCS_PNG (also write the all-scenario
# figure there, e.g. docs/img/fault_matrix.png), SET (extra launcher
# overrides for every run, e.g. SET="timeouts.server_lease_seconds=1").
# A run whose job or audit fails does not stop the matrix: the report shows
# it, and the script exits 1 after writing the report.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BUILD=$(realpath -m "${1:-${TESSERA_BUILD_DIR:-$ROOT/build}}")
PYTHON=/usr/bin/python3
CLOCKS=${CLOCKS:-2000}
E5_CLOCKS=${E5_CLOCKS:-100}
E5_FAULTS=${E5_FAULTS:-seed=11,drop=0.02,dup=0.02,reorder=0.05,side=send}
SCENARIOS=${SCENARIOS:-baseline e1e2-kill-server e3-pause-server e5-message-faults e5-loss-1 e5-loss-5 e5-loss-10 e7-restart-worker server-restart e8-coordinator-failover e9-restore}
REPEATS=${REPEATS:-1}
TIMEOUT=${TIMEOUT:-180}
OUT=$(realpath -m "${OUT:-$ROOT/runs/fault_matrix-$(date +%Y%m%d-%H%M%S)}")
WORKLOAD=$BUILD/tests/audit/tessera-audit-workload

mkdir -p "$OUT/runs"
if [ "${SKIP_BUILD:-0}" != 1 ]; then
  # shellcheck source=bench/lib.sh
  source "$ROOT/bench/lib.sh"
  bench_build run_fault_matrix.sh "$BUILD" "$OUT/build.log" tessera-audit-workload tessera-server tessera-coordinator
fi
for binary in "$WORKLOAD" "$BUILD/server/tessera-server" "$BUILD/coordinator/tessera-coordinator"; do
  if [ ! -x "$binary" ]; then
    echo "run_fault_matrix.sh: $binary is missing (build it, or run without SKIP_BUILD=1)" >&2
    exit 1
  fi
done

# An etcd on loopback for the scenarios that keep the coordinator's state there,
# started the first time one needs it (ETCD_URL), stopped when the script ends.
ETCD_URL=""
ETCD_PID=""
stop_etcd() { if [ -n "$ETCD_PID" ]; then kill "$ETCD_PID" 2>/dev/null || true; wait "$ETCD_PID" 2>/dev/null || true; fi; }
trap stop_etcd EXIT
start_etcd() {
  [ -n "$ETCD_URL" ] && return 0
  if [ ! -x /usr/bin/etcd ]; then
    echo "run_fault_matrix.sh: /usr/bin/etcd is missing (scripts/setup.sh installs etcd-server)" >&2
    exit 1
  fi
  local ports client peer
  ports=$("$PYTHON" -c 'import socket
s=[socket.socket() for _ in range(2)]
[x.bind(("127.0.0.1", 0)) for x in s]
print(*[x.getsockname()[1] for x in s])')
  read -r client peer <<<"$ports"
  ETCD_URL="http://127.0.0.1:$client"
  rm -rf "$OUT/etcd"
  mkdir -p "$OUT/etcd"
  /usr/bin/etcd --name fault-matrix --data-dir "$OUT/etcd/data" --listen-client-urls "$ETCD_URL" \
    --advertise-client-urls "$ETCD_URL" --listen-peer-urls "http://127.0.0.1:$peer" \
    --initial-advertise-peer-urls "http://127.0.0.1:$peer" --initial-cluster "fault-matrix=http://127.0.0.1:$peer" \
    >"$OUT/etcd/etcd.log" 2>&1 &
  ETCD_PID=$!
  for _ in $(seq 100); do
    if "$PYTHON" -c 'import sys, urllib.request
urllib.request.urlopen(urllib.request.Request(sys.argv[1] + "/v3/kv/range", data=b"{\"key\": \"AA==\"}"), timeout=1)' \
        "$ETCD_URL" 2>/dev/null; then
      return 0
    fi
    sleep 0.2
  done
  echo "run_fault_matrix.sh: etcd did not come up (see $OUT/etcd/etcd.log)" >&2
  exit 1
}

# scenario NAME: sets TITLE, ARGS (launcher overrides) and MSG_FAULTS.
scenario() {
  MSG_FAULTS=""
  ARGS=(--set "worker.args.clocks=$CLOCKS")
  case $1 in
    baseline)
      TITLE="baseline (no fault)" ;;
    e1e2-kill-server)
      TITLE="E1/E2: kill server-1"
      ARGS+=(--set 'faults=[{target: server-1, action: kill, at_seconds: 2}]') ;;
    e3-pause-server)
      TITLE="E3: pause server-1 1.5 s"
      ARGS+=(--set 'faults=[{target: server-1, action: pause, at_seconds: 2, duration_seconds: 1.5}]') ;;
    e5-message-faults)
      TITLE="E5: message faults"
      MSG_FAULTS=$E5_FAULTS
      ARGS=(--set "worker.args.clocks=$E5_CLOCKS") ;;
    e5-loss-1|e5-loss-5|e5-loss-10)
      local percent=${1#e5-loss-}
      TITLE="E5: ${percent}% of messages lost"
      MSG_FAULTS="seed=3,drop=$("$PYTHON" -c "print($percent / 100)"),side=send"
      ARGS=(--set "worker.args.clocks=$E5_CLOCKS") ;;
    e7-restart-worker)
      TITLE="E7: restart worker-1"
      ARGS+=(--set cluster.on_worker_loss=wait --set timeouts.lease_seconds=1 --set timeouts.heartbeat_seconds=0.2
             --set 'faults=[{target: worker-1, action: restart, at_seconds: 2}]') ;;
    server-restart)
      TITLE="server restart, then another server killed"
      ARGS+=(--set 'faults=[{target: server-1, action: restart, at_seconds: 2}, {target: server-2, action: kill, at_seconds: 5}]') ;;
    e8-coordinator-failover)
      TITLE="E8: kill server-1, then the leading coordinator (etcd, 1 standby)"
      start_etcd
      ARGS+=(--set "coordinator.etcd=$ETCD_URL" --set coordinator.standbys=1
             --set 'faults=[{target: server-1, action: kill, at_seconds: 2}, {target: coordinator, action: kill, at_seconds: 2.55}]') ;;
    e9-restore)
      TITLE="E9: kill server-1 and server-2 together (every copy of some shards; restore from checkpoints)"
      ARGS+=(--set cluster.on_shard_loss=restore --set checkpoints.dir=ckpt --set checkpoints.every_seconds=0.3
             --set 'faults=[{target: server-1, action: kill, at_seconds: 2}, {target: server-2, action: kill, at_seconds: 2}]') ;;
    *)
      echo "run_fault_matrix.sh: unknown scenario $1 (known: baseline e1e2-kill-server e3-pause-server" \
           "e5-message-faults e5-loss-1 e5-loss-5 e5-loss-10 e7-restart-worker server-restart" \
           "e8-coordinator-failover e9-restore)" >&2
      exit 2 ;;
  esac
}

json_string() { "$PYTHON" -c 'import json, sys; print(json.dumps(sys.argv[1]))' "$1"; }

extra=()
for kv in ${SET:-}; do extra+=(--set "$kv"); done
failures=0
for name in $SCENARIOS; do
  scenario "$name"
  for ((r = 1; r <= REPEATS; r++)); do
    dir="$OUT/runs/$name-$r"
    rm -rf "$dir"
    mkdir -p "$dir/records" "$dir/audit"
    printf '{"scenario": "%s", "title": %s, "message_faults": %s, "repeat": %d}\n' "$name" \
      "$(json_string "$TITLE")" "$(if [ -n "$MSG_FAULTS" ]; then json_string "$MSG_FAULTS"; else echo null; fi)" \
      "$r" >"$dir/scenario.json"
    echo "fault matrix: $TITLE, run $r of $REPEATS ..." >&2
    env_faults=()
    if [ -n "$MSG_FAULTS" ]; then env_faults=(TESSERA_FAULTS="$MSG_FAULTS"); fi
    # A failed job is a result here, not the end of the experiment: the report says so.
    if ! env "${env_faults[@]}" TESSERA_AUDIT_DIR="$dir/audit" \
        "$PYTHON" "$ROOT/launcher/tessera-launch" local --config "$ROOT/tests/audit/audit_job.yaml" \
        --build-dir "$BUILD" --run-dir "$dir/run" --quiet --timeout "$TIMEOUT" \
        --set "worker.program=$WORKLOAD" --set "worker.args.records=$dir/records" \
        "${ARGS[@]}" "${extra[@]}" >"$dir/launch.log" 2>&1; then
      tail -5 "$dir/launch.log" >&2
      echo "run_fault_matrix.sh: the $name run $r did not end ok; logs in $dir/run/logs" >&2
      failures=$((failures + 1))
    fi
    if ! "$PYTHON" "$ROOT/tests/audit/audit_check.py" --records "$dir/records" --audit "$dir/audit" \
        --json "$dir/audit.json" >"$dir/audit_check.txt" 2>&1; then
      failures=$((failures + 1))
    fi
    head -1 "$dir/audit_check.txt" >&2
  done
done
docs=()
if [ -n "${DOCS_PNG:-}" ]; then docs=(--docs-png "$(realpath -m "$DOCS_PNG")"); fi
"$PYTHON" "$ROOT/bench/fault_matrix_report.py" "$OUT" "${docs[@]}"
if [ "$failures" -gt 0 ]; then
  echo "run_fault_matrix.sh: $failures job(s) or audit(s) failed (see the report in $OUT)" >&2
  exit 1
fi

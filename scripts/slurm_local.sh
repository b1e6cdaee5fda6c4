#!/usr/bin/env bash
# Starts or stops a one-node Slurm cluster on this machine (munged,
# slurmctld, slurmd), for the launcher's tests and for trying
# `tessera-launch slurm` by hand. No systemd: the daemons are started
# directly. Needs root and the packages slurm-wlm and munge
# (scripts/setup.sh installs them).
#
#   scripts/slurm_local.sh start DIR   write DIR/slurm.conf, start the daemons,
#                                      wait until a step runs; prints
#                                      SLURM_CONF=DIR/slurm.conf
#   scripts/slurm_local.sh stop DIR    stop what `start DIR` started
#
# Clients need SLURM_CONF=DIR/slurm.conf in their environment. slurmctld and
# slurmd listen on free ports picked at start, so this cluster does not
# collide with another on the machine. munged is the system's (socket in
# /run/munge); it is started only if none answers, and then stopped by `stop`.
# Exit status of start: 0 ready; 3 the daemons cannot run here (the reason
# is on stderr; a test should skip); 1 anything else.
set -uo pipefail

die() { echo "slurm_local: $2" >&2; exit "$1"; }

free_port() {
  /usr/bin/python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}

stop_pid_file() {  # TERM, then KILL after 5 s (slurmd may ignore TERM after a failed step)
  local file=$1 pid
  [ -f "$file" ] || return 0
  pid=$(cat "$file" 2>/dev/null) || return 0
  [ -n "$pid" ] || return 0
  kill -TERM "$pid" 2>/dev/null || return 0
  for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || return 0; sleep 0.1; done
  kill -KILL "$pid" 2>/dev/null || true
}

start() {
  local dir=$1
  [ "$(id -u)" -eq 0 ] || die 3 "needs root (slurmd runs steps as any user)"
  for program in /usr/sbin/munged /usr/sbin/slurmctld /usr/sbin/slurmd /usr/bin/srun; do
    [ -x "$program" ] || die 3 "$program is missing (scripts/setup.sh installs slurm-wlm and munge)"
  done
  mkdir -p "$dir/ctld" "$dir/d"
  dir=$(cd "$dir" && pwd)

  if ! munge -n 2>/dev/null | unmunge >/dev/null 2>&1; then
    mkdir -p /run/munge && chown munge: /run/munge
    runuser -u munge -- /usr/sbin/munged 2>"$dir/munged.err" || die 3 "munged does not start: $(cat "$dir/munged.err")"
    touch "$dir/munged.started"
    for _ in $(seq 50); do munge -n 2>/dev/null | unmunge >/dev/null 2>&1 && break; sleep 0.1; done
    munge -n 2>/dev/null | unmunge >/dev/null 2>&1 || die 3 "munged started but does not answer"
  fi

  cat >"$dir/slurm.conf" <<CONF
ClusterName=tessera-test
SlurmctldHost=localhost(127.0.0.1)
SlurmctldPort=$(free_port)
SlurmdPort=$(free_port)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CryptoType=crypto/munge
MpiDefault=none
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SwitchType=switch/none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
ReturnToService=2
SlurmdParameters=config_overrides
StateSaveLocation=$dir/ctld
SlurmdSpoolDir=$dir/d
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd.pid
SlurmctldLogFile=$dir/slurmctld.log
SlurmdLogFile=$dir/slurmd.log
NodeName=localhost NodeAddr=127.0.0.1 CPUs=8 RealMemory=4000 State=UNKNOWN
PartitionName=debug Nodes=localhost Default=YES MaxTime=INFINITE State=UP
CONF
  export SLURM_CONF=$dir/slurm.conf
  /usr/sbin/slurmctld -f "$SLURM_CONF" 2>"$dir/slurmctld.err" || die 3 "slurmctld does not start: $(tail -3 "$dir/slurmctld.err" "$dir/slurmctld.log" 2>/dev/null)"
  /usr/sbin/slurmd -f "$SLURM_CONF" -N localhost 2>"$dir/slurmd.err" || die 3 "slurmd does not start: $(tail -3 "$dir/slurmd.err" "$dir/slurmd.log" 2>/dev/null)"
  for _ in $(seq 100); do
    if timeout 10 srun -n1 --immediate=5 true >/dev/null 2>&1; then
      echo "SLURM_CONF=$SLURM_CONF"
      return 0
    fi
    sleep 0.2
  done
  die 3 "the daemons started but no step runs within 20 s: $(tail -3 "$dir/slurmctld.log" "$dir/slurmd.log" 2>/dev/null)"
}

stop() {
  local dir=$1
  stop_pid_file "$dir/slurmd.pid"
  stop_pid_file "$dir/slurmctld.pid"
  if [ -f "$dir/munged.started" ]; then
    stop_pid_file /run/munge/munged.pid
    rm -f "$dir/munged.started"
  fi
}

case "${1:-}" in
  start) [ $# -eq 2 ] || die 1 "usage: $0 start DIR"; start "$2" ;;
  stop) [ $# -eq 2 ] || die 1 "usage: $0 stop DIR"; stop "$2" ;;
  *) die 1 "usage: $0 start|stop DIR" ;;
esac

"""What followed a process fault, read from the job's logs.

The C++ processes log `YYYY-mm-dd HH:MM:SS.mmm NAME LEVEL message` (local
time, milliseconds), and the launcher keeps each process's lines in
RUN/logs/NAME.log prefixed `[NAME] `. After a job with faults (faults.py),
`analyze` measures from the fault's wall-clock time to:

  detection   the coordinator's first `lost <role> <rank> (...)` line;
  failover    (servers) the first worker line `first push acknowledged on
              shard map epoch E`, E being the map epoch the coordinator's
              lost line announced (`... fail over to their backups (map
              epoch E)`), or a later one;
  rereplication  (servers) the coordinator's last `server A is in sync with
              server B on K shard copies (map epoch E')` line (E' >= E)
              that brings the copies in sync to the N of the lost line's
              `N lost copies re-made on other servers` (0 when it re-made
              none: the figure is then the detection);
  rejoin      (restarts; also any worker under on_worker_loss: wait) the
              coordinator's `server R rejoined from ...` / `worker R
              rejoined from ...` line.

Figures whose line is missing are None, and `note` says which line was
missing. Nothing here knows about processes or files beyond reading them.
"""

from __future__ import annotations

import datetime
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Optional

#: Log timestamps have milliseconds, truncated: a line may read up to this
#: much earlier than the (microsecond) moment it describes.
TIMESTAMP_SLACK_SECONDS = 0.001
#: A paused process that comes back before its lease runs out is not lost;
#: a `lost` line later than this after its SIGCONT is not the pause's doing.
PAUSE_DETECTION_SLACK_SECONDS = 1.0

_LINE_RE = re.compile(r"^\[(?P<process>[^\]]+)\] (?P<stamp>\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2}\.\d{3}) "
                      r"(?P<logger>\S+) (?P<level>\S+) (?P<message>.*)$")
_LOST_RE = re.compile(r"\blost (?P<role>server|worker) (?P<rank>\d+) \(")
_FAILOVER_RE = re.compile(r"fail over to their backups \(map epoch (?P<epoch>\d+)\)")
_REMADE_RE = re.compile(r"; (?P<copies>\d+) lost copies re-made on other servers")
_IN_SYNC_RE = re.compile(r"^server \d+ is in sync with server \d+ on (?P<copies>\d+) shard copies "
                         r"\(map epoch (?P<epoch>\d+)\)")
_TAKEOVER_RE = re.compile(r"^won the leadership of job ")
_ACK_RE = re.compile(r"^first push acknowledged on shard map epoch (?P<epoch>\d+)\b")
_REJOIN_RE = re.compile(r"^(?P<role>server|worker) (?P<rank>\d+) rejoined from ")
_BACK_RE = re.compile(r"^(?P<role>server|worker) (?P<rank>\d+) \(.*\) is back after ")


@dataclass(frozen=True)
class LogLine:
    """One timestamped line of a process's log."""

    process: str  # "coordinator", "server-1", "worker-0"
    time: float  # Unix seconds
    level: str
    message: str


def parse_line(text: str) -> Optional[LogLine]:
    """A `[NAME] YYYY-mm-dd HH:MM:SS.mmm LOGGER LEVEL message` line (local
    time), or None for any other line."""
    match = _LINE_RE.match(text.rstrip("\n"))
    if not match:
        return None
    try:
        stamp = datetime.datetime.strptime(match["stamp"], "%Y-%m-%d %H:%M:%S.%f")
    except ValueError:
        return None
    return LogLine(match["process"], stamp.timestamp(), match["level"], match["message"])


def parse_lines(lines: Iterable[str]) -> list:
    """The timestamped lines among `lines`, in time order (stable)."""
    parsed = [p for p in (parse_line(line) for line in lines) if p is not None]
    return sorted(parsed, key=lambda p: p.time)


def read_logs(log_dir: Path) -> list:
    """Every timestamped line of RUN/logs/*.log but the launcher's, in time order."""
    lines: list = []
    for path in sorted(Path(log_dir).glob("*.log")):
        if path.name == "launcher.log":
            continue
        try:
            lines += path.read_text(encoding="utf-8", errors="replace").splitlines()
        except OSError:
            continue
    return parse_lines(lines)


def _is_coordinator(process: str) -> bool:
    """The coordinator, or one of its standbys (coordinator-S), which may lead by now."""
    return process == "coordinator" or process.startswith("coordinator-")


def lost_in_message(message: str, role: str, rank: int) -> bool:
    """Whether a coordinator message (or whole log line) declares `role rank` lost."""
    return any(m["role"] == role and int(m["rank"]) == rank for m in _LOST_RE.finditer(message))


def _first(lines: list, start: float, end: float, test) -> Optional[tuple]:
    """(line, match) of the first line in [start, end) for which test(line)
    returns something truthy."""
    for line in lines:
        if line.time < start:
            continue
        if line.time >= end:
            return None
        found = test(line)
        if found:
            return line, found
    return None


def _seconds(line: Optional[LogLine], t0: float) -> Optional[float]:
    return None if line is None else round(max(0.0, line.time - t0), 3)


def _coordinator_figures(lines: list, action: str, t0: float, start: float, until: float,
                         job_ok: Optional[bool]) -> dict:
    """analyze() for a fault of the coordinator: whether a standby took over."""
    out: dict = {"detection_seconds": None}
    notes: list = []
    takeover = _first(lines, start, until,
                      lambda l: l.process.startswith("coordinator-") and _TAKEOVER_RE.match(l.message))
    if takeover:
        out["detection_seconds"] = _seconds(takeover[0], t0)
        out["recovered"] = job_ok
        notes.append(f"{takeover[0].process} took the leadership over (detection: its `won the leadership` "
                     "line); recovered is whether the job still ended ok")
    elif action == "kill":
        out["recovered"] = False
        notes.append("nothing takes over from a killed coordinator (no standby won the leadership)")
    else:
        out["recovered"] = job_ok
        notes.append("the coordinator was not taken over; recovered is whether the job still ended ok")
    out["note"] = "; ".join(notes)
    return out


def _server_figures(out: dict, notes: list, lines: list, lost, target: str, action: str, t0: float,
                    rank: int, until: float) -> None:
    """analyze() for a server the coordinator declared lost (`lost`, its
    line): failover, re-replication and, for a restart, the rejoin; into
    `out` and `notes`."""
    epoch_match = _FAILOVER_RE.search(lost.message)
    if epoch_match is None:
        out["recovered"] = False
        notes.append(f"the coordinator did not fail {target} over: {lost.message}")
    else:
        epoch = int(epoch_match["epoch"])
        out["failover_epoch"] = epoch

        def ack(line):
            m = _ACK_RE.match(line.message) if line.process.startswith("worker-") else None
            return m if m and int(m["epoch"]) >= epoch else None

        first_ack = _first(lines, lost.time - TIMESTAMP_SLACK_SECONDS, float("inf"), ack)
        if first_ack is None:
            out["recovered"] = False
            notes.append(f"no worker logged 'first push acknowledged on shard map epoch {epoch}' "
                         "(the workers may have pushed nothing more)")
        else:
            line, m = first_ack
            out["failover_seconds"] = _seconds(line, t0)
            out["recovered"] = True
            if int(m["epoch"]) != epoch:
                notes.append(f"the first acknowledgement was on map epoch {m['epoch']} (a later failover "
                             "came first)")
            per_worker: dict = {}
            for l in lines:
                if l.time >= lost.time - TIMESTAMP_SLACK_SECONDS and l.process not in per_worker and ack(l):
                    per_worker[l.process] = l
            last = max(per_worker.values(), key=lambda l: l.time)
            out["failover_seconds_last_worker"] = _seconds(last, t0)
        remade = _REMADE_RE.search(lost.message)
        wanted = int(remade["copies"]) if remade else 0
        if wanted == 0:
            out["rereplication_seconds"] = out["detection_seconds"]
        else:
            synced = 0
            for l in lines:
                if l.time < lost.time - TIMESTAMP_SLACK_SECONDS or not _is_coordinator(l.process):
                    continue
                m = _IN_SYNC_RE.match(l.message)
                if m and int(m["epoch"]) >= epoch:
                    synced += int(m["copies"])
                    if synced >= wanted:
                        out["rereplication_seconds"] = _seconds(l, t0)
                        break
            if out["rereplication_seconds"] is None:
                notes.append(f"only {synced} of the {wanted} re-made copies were reported in sync")
    if action == "restart":
        rejoin = _first(lines, lost.time - TIMESTAMP_SLACK_SECONDS, until, lambda l: (
            _is_coordinator(l.process) and (m := _REJOIN_RE.match(l.message))
            and m["role"] == "server" and int(m["rank"]) == rank))
        if rejoin is None:
            out["recovered"] = False
            notes.append(f"no 'server {rank} rejoined' line from the coordinator (the new process was "
                         "refused, or the job ended first)")
        else:
            out["rejoin_seconds"] = _seconds(rejoin[0], t0)


def _worker_figures(out: dict, notes: list, lines: list, lost, target: str, action: str, t0: float,
                    rank: int, until: float, on_worker_loss: str) -> None:
    """analyze() for a worker the coordinator declared lost (`lost`, its
    line): whether the job went on or the worker rejoined; into `out` and
    `notes`."""
    if "goes on without it" in lost.message:
        out["recovered"] = True
    else:
        out["recovered"] = False
    if "rejoin_seconds" in out:
        rejoin = _first(lines, lost.time - TIMESTAMP_SLACK_SECONDS, until, lambda l: (
            _is_coordinator(l.process) and (m := _REJOIN_RE.match(l.message))
            and m["role"] == "worker" and int(m["rank"]) == rank))
        back = _first(lines, lost.time - TIMESTAMP_SLACK_SECONDS, until, lambda l: (
            _is_coordinator(l.process) and (m := _BACK_RE.match(l.message))
            and m["role"] == "worker" and int(m["rank"]) == rank)) if action == "pause" else None
        if rejoin is not None:
            out["rejoin_seconds"] = _seconds(rejoin[0], t0)
            out["recovered"] = True
        elif back is not None:
            out["recovered"] = True
            notes.append(f"{target} came back after the pause and kept its place; nothing rejoined")
        else:
            notes.append(f"no 'worker {rank} rejoined' line from the coordinator")
    elif not out["recovered"]:
        notes.append(f"the coordinator did not go on without {target} (on_worker_loss: {on_worker_loss}): "
                     f"{lost.message}")


def analyze(fault: dict, lines: list, on_worker_loss: str = "stop", until: float = float("inf"),
            job_ok: Optional[bool] = None) -> dict:
    """The figures of one fault that fired.

    fault: "target" (coordinator, server-R, worker-R), "action" (kill,
    pause, restart), "unix_time" (when the signal went out) and, for a
    pause, "duration_seconds". lines: parse_lines/read_logs output.
    until: Unix time of the next fault on the same target (its lines are
    not this one's). job_ok: the job's verdict, for faults of the
    coordinator. Returns detection_seconds, recovered and note, plus
    failover_seconds, failover_seconds_last_worker and failover_epoch for
    servers, and rejoin_seconds for restarts and for workers under
    on_worker_loss: wait. A server restart has recovered when it failed
    over and the new process rejoined.
    """
    target, action, t0 = fault["target"], fault["action"], fault["unix_time"]
    role, _, rank_text = target.partition("-")
    start = t0 - TIMESTAMP_SLACK_SECONDS
    out: dict = {"detection_seconds": None}
    notes: list = []
    if role == "coordinator":
        return _coordinator_figures(lines, action, t0, start, until, job_ok)
    rank = int(rank_text)
    if role == "server":
        out.update(failover_seconds=None, failover_seconds_last_worker=None, failover_epoch=None,
                   rereplication_seconds=None)
    wants_rejoin = role == "worker" and (action == "restart" or on_worker_loss == "wait")
    if wants_rejoin or (role == "server" and action == "restart"):
        out["rejoin_seconds"] = None

    detect_end = until
    if action == "pause":
        detect_end = min(until, t0 + fault["duration_seconds"] + PAUSE_DETECTION_SLACK_SECONDS)
    found = _first(lines, start, detect_end,
                   lambda l: _is_coordinator(l.process) and lost_in_message(l.message, role, rank))
    lost = found[0] if found else None
    if lost is None:
        if action == "pause":
            out["recovered"] = True
            notes.append(f"the coordinator did not declare {target} lost: paused "
                         f"{fault['duration_seconds']:g} s, within its lease")
        else:
            out["recovered"] = False
            notes.append(f"no 'lost {role} {rank}' line from the coordinator after the fault "
                         "(the job may have ended first)")
        if "rejoin_seconds" in out:
            notes.append("so no rejoin either")
        if role == "server":
            notes.append("so no failover either")
        out["note"] = "; ".join(notes)
        return out
    out["detection_seconds"] = _seconds(lost, t0)

    if role == "server":
        _server_figures(out, notes, lines, lost, target, action, t0, rank, until)
    else:
        _worker_figures(out, notes, lines, lost, target, action, t0, rank, until, on_worker_loss)
    out["note"] = "; ".join(notes) or None
    return out


def analyze_all(records: list, lines: list, on_worker_loss: str = "stop", job_ok: Optional[bool] = None) -> list:
    """Each fault record (FaultScheduler.records()) with its figures added;
    a fault that did not fire gets None figures and its skip reason as note."""
    fired = sorted((r for r in records if r.get("unix_time") is not None), key=lambda r: r["unix_time"])
    out = []
    for record in records:
        record = dict(record)
        if record.get("unix_time") is None:
            record.update(detection_seconds=None, recovered=None,
                          note=record.get("skipped") or "it did not fire")
        else:
            later = [r["unix_time"] for r in fired
                     if r["target"] == record["target"] and r["unix_time"] > record["unix_time"]]
            record.update(analyze(record, lines, on_worker_loss, min(later, default=float("inf")), job_ok))
        out.append(record)
    return out

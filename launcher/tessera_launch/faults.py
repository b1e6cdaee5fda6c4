"""Process faults: a schedule of kills, pauses and restarts (config `faults`).

A job config may list faults (configs/README.md, docs/fault_injection.md):

    faults:
      - {target: server-1, action: kill, at_seconds: 2}
      - {target: worker-1, action: pause, at_step: 100, step_of: worker-0, duration_seconds: 0.3}

`validate_faults` checks the list (config.py calls it, with the validator's
error reporter) and makes a FaultSpec of each entry. While the job runs, a
FaultScheduler hooked into the Supervisor fires each fault when it is due:
`at_seconds` after every process of the job was started, or at the first
progress record of a worker (any, or `step_of`) with step >= `at_step`.

  kill     SIGKILL to the target's process group. The supervisor does not
           count the exit as a failure of the job: the coordinator judges it
           (replication fails a server over, on_worker_loss says what a lost
           worker means). A killed coordinator ends the job, unless it is
           restarted (below).
  pause    SIGSTOP to the group, SIGCONT `duration_seconds` later.
  restart  kill, then the same command line again (same rank, same
           arguments, the same log appended to), `restart_delay_seconds`
           after the coordinator has declared the target lost (its `lost
           server R` / `lost worker R` line): only then does the coordinator
           let a new process take the rank (a server rejoins empty and is
           given copies; a worker, under on_worker_loss: wait, takes its
           place over). The coordinator is started again
           `restart_delay_seconds` after the kill: it takes the job over from
           its state file (--state-file), at the address it had, and the
           nodes go on (they wait out a silent coordinator for
           timeouts.coordinator_give_up_seconds).

Each fault, and what followed it (a resume, a restart), is appended to
RUN/events.jsonl as it happens; `records()` gives the summary's entries,
which backend.py completes with the figures fault_logs.py reads from the logs.
A fault whose target is not running when it is due is reported and skipped.
Every supervising back-end injects them: `local` signals its own
children; ssh, slurm and mpirun send the command to the carried process's
`tessera-launch role` through the carrier's control channel
(supervisor.py), which signals or restarts the process on its host.
"""

from __future__ import annotations

import datetime
import difflib
import json
import math
import re
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional

from . import fault_logs

ACTIONS = ("kill", "pause", "restart")
#: The keys of one fault entry, in the order they are written back.
FAULT_KEYS = ("target", "action", "at_seconds", "at_step", "step_of", "duration_seconds",
              "restart_delay_seconds")
DEFAULT_RESTART_DELAY_SECONDS = 0.5

_TARGET_RE = re.compile(r"^(server|worker)-(\d+)$")


@dataclass(frozen=True)
class FaultSpec:
    """One validated entry of `faults`; `index` is its place in the list."""

    index: int
    target: str
    action: str
    at_seconds: Optional[float] = None
    at_step: Optional[int] = None
    step_of: Optional[str] = None
    duration_seconds: Optional[float] = None
    restart_delay_seconds: Optional[float] = None

    @property
    def role(self) -> str:
        """"coordinator", "server" or "worker"."""
        return self.target.partition("-")[0]

    @property
    def rank(self) -> Optional[int]:
        role, _, rank = self.target.partition("-")
        return int(rank) if rank else None

    def to_dict(self) -> dict:
        """The entry as written in a config (keys that apply only)."""
        return {k: getattr(self, k) for k in FAULT_KEYS if getattr(self, k) is not None}

    def trigger(self) -> str:
        """"at 2 s", "at step 100", "at step 100 of worker-0"."""
        if self.at_seconds is not None:
            return f"at {self.at_seconds:g} s"
        return f"at step {self.at_step}" + (f" of {self.step_of}" if self.step_of else "")

    def describe(self) -> str:
        """"fault 0 (kill server-1 at 2 s)"."""
        extra = f" for {self.duration_seconds:g} s" if self.action == "pause" else ""
        return f"fault {self.index} ({self.action} {self.target}{extra} {self.trigger()})"


# --------------------------------------------------------------------------
# Validation
# --------------------------------------------------------------------------


def render_value(value: Any) -> str:
    """A value as it would read in YAML, for error messages."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, dict):
        return "a mapping"
    if isinstance(value, list):
        return "a list"
    return repr(value)


def _is_number(value: Any) -> bool:
    return not isinstance(value, bool) and isinstance(value, (int, float)) and math.isfinite(value)


def _process_problem(name: Any, cluster: dict, allow_coordinator: bool) -> Optional[str]:
    """What is wrong with `name` as a process of the job, or None."""
    kinds = "coordinator, server-R or worker-R" if allow_coordinator else "worker-R"
    if name == "coordinator" and allow_coordinator:
        return None
    match = _TARGET_RE.match(name) if isinstance(name, str) else None
    if not match or (match.group(1) == "server" and not allow_coordinator):
        return f"must be {kinds}, got {render_value(name)}"
    role, rank = match.group(1), int(match.group(2))
    count = cluster.get("servers" if role == "server" else "workers")
    if isinstance(count, int) and rank >= count:
        return f"{name} does not exist: the job has {count} {role}s ({role}-0 to {role}-{count - 1})"
    return None


def validate_faults(raw: Any, cluster: dict, error: Callable[[tuple, str], None]) -> list:
    """Checks the `faults` list against the validated cluster section and
    returns a FaultSpec per entry. Every problem goes to error(path,
    message), path like ("faults", 0, "target"), the message naming the
    entry and key (`faults[0].target ...`)."""
    if raw is None:
        return []
    if not isinstance(raw, list):
        error(("faults",), "faults must be a list of faults, e.g. [{target: server-1, action: kill, "
                           f"at_seconds: 2}}], got {render_value(raw)}")
        return []
    specs = []
    for index, entry in enumerate(raw):
        spec = _validate_entry(index, entry, cluster, error)
        if spec is not None:
            specs.append(spec)
    return specs


def _validate_entry(index: int, entry: Any, cluster: dict,
                    error: Callable[[tuple, str], None]) -> Optional[FaultSpec]:
    name = f"faults[{index}]"
    here = ("faults", index)
    if not isinstance(entry, dict):
        error(here, f"{name} must be a mapping with target, action and at_seconds or at_step, "
                    f"got {render_value(entry)}")
        return None
    problems = []

    def bad(key: Optional[str], message: str) -> None:
        problems.append(key)
        error(here + ((key,) if key else ()), message)

    for key in entry:
        if key not in FAULT_KEYS:
            hint = difflib.get_close_matches(str(key), FAULT_KEYS, n=1)
            suggestion = f"; did you mean {name}.{hint[0]}?" if hint else ""
            bad(key, f"unknown key {name}.{key}{suggestion} (known: {', '.join(FAULT_KEYS)})")

    target = entry.get("target")
    if "target" not in entry:
        bad(None, f"{name}.target is required (coordinator, server-R or worker-R)")
    else:
        problem = _process_problem(target, cluster, allow_coordinator=True)
        if problem:
            bad("target", f"{name}.target {problem}")

    action = entry.get("action")
    if "action" not in entry:
        bad(None, f"{name}.action is required ({' | '.join(ACTIONS)})")
    elif action not in ACTIONS:
        bad("action", f"{name}.action must be one of {' | '.join(ACTIONS)}, got {render_value(action)}")

    at_seconds, at_step = entry.get("at_seconds"), entry.get("at_step")
    if "at_seconds" in entry and "at_step" in entry:
        bad("at_step", f"{name} takes at_seconds or at_step, not both")
    elif "at_seconds" not in entry and "at_step" not in entry:
        bad(None, f"{name} needs at_seconds (seconds after every process of the job started) or at_step "
                  "(a worker's step)")
    if "at_seconds" in entry and not (_is_number(at_seconds) and at_seconds >= 0):
        bad("at_seconds", f"{name}.at_seconds must be a non-negative number (seconds after every process of "
                          f"the job started), got {render_value(at_seconds)}")
    if "at_step" in entry and (isinstance(at_step, bool) or not isinstance(at_step, int) or at_step < 0):
        bad("at_step", f"{name}.at_step must be a non-negative integer (a worker's step), got {render_value(at_step)}")

    step_of = entry.get("step_of")
    if "step_of" in entry:
        if "at_step" not in entry:
            bad("step_of", f"{name}.step_of goes with at_step (whose steps count)")
        problem = _process_problem(step_of, cluster, allow_coordinator=False)
        if problem:
            bad("step_of", f"{name}.step_of {problem}")

    duration = entry.get("duration_seconds")
    if action == "pause" and "duration_seconds" not in entry:
        bad(None, f"{name}.duration_seconds is required for pause (seconds between SIGSTOP and SIGCONT)")
    if "duration_seconds" in entry:
        if action in ACTIONS and action != "pause":
            bad("duration_seconds", f"{name}.duration_seconds applies to pause only (action is {action})")
        elif not (_is_number(duration) and duration > 0):
            bad("duration_seconds", f"{name}.duration_seconds must be a positive number (seconds), "
                                    f"got {render_value(duration)}")

    delay = entry.get("restart_delay_seconds")
    if "restart_delay_seconds" in entry:
        if action in ACTIONS and action != "restart":
            bad("restart_delay_seconds", f"{name}.restart_delay_seconds applies to restart only "
                                         f"(action is {action})")
        elif not (_is_number(delay) and delay >= 0):
            bad("restart_delay_seconds", f"{name}.restart_delay_seconds must be a non-negative number "
                                         f"(seconds), got {render_value(delay)}")

    if (action == "restart" and isinstance(target, str) and target.startswith("worker-")
            and cluster.get("on_worker_loss") not in (None, "wait")):
        bad("action", f"{name}: restarting {target} needs cluster.on_worker_loss: wait (it is "
                      f"{cluster.get('on_worker_loss')}): only then does the coordinator keep a lost worker's "
                      "place for a new process")
    if problems:
        return None
    return FaultSpec(index=index, target=target, action=action,
                     at_seconds=float(at_seconds) if at_seconds is not None else None,
                     at_step=at_step, step_of=step_of,
                     duration_seconds=float(duration) if duration is not None else None,
                     restart_delay_seconds=(float(delay) if delay is not None else DEFAULT_RESTART_DELAY_SECONDS)
                     if action == "restart" else None)


# --------------------------------------------------------------------------
# Running the schedule
# --------------------------------------------------------------------------


def wall_time_text(unix: float) -> str:
    """ISO 8601 local time with milliseconds and the UTC offset."""
    return datetime.datetime.fromtimestamp(unix).astimezone().isoformat(timespec="milliseconds")


@dataclass
class _Fault:
    """A fault's state while the job runs."""

    spec: FaultSpec
    state: str = "waiting"  # waiting, paused, restarting, done, skipped
    step_trigger: Optional[str] = None  # "worker-0 reported step 103"
    fired_at: Optional[float] = None  # clock()
    fired_unix: Optional[float] = None
    pid: Optional[int] = None
    skipped: Optional[str] = None
    resume_at: Optional[float] = None  # pause: clock() of SIGCONT due
    resumed_at: Optional[float] = None
    lost_seen_at: Optional[float] = None  # worker restart: the coordinator declared it lost
    restarted_at: Optional[float] = None
    restart_pid: Optional[int] = None
    restart_note: Optional[str] = None
    extra: dict = field(default_factory=dict)


class FaultScheduler:
    """Fires a job's faults through a Supervisor.

    attach() hooks it into the supervisor (a timer, progress and line
    observers); arm() starts the clock of `at_seconds` (call it once every
    process has been started); finish() settles what never fired. Times in
    events and records: `seconds` since arm(), `elapsed` since `origin` (the
    clock() reading progress.jsonl's `elapsed` counts from, so that the
    report's plots share one axis).
    """

    def __init__(self, faults, sup, events_path: Optional[Path], origin: float,
                 clock: Callable[[], float] = time.monotonic, wall_clock: Callable[[], float] = time.time):
        self.faults = [_Fault(spec) for spec in faults]
        self.sup = sup
        self.events_path = events_path
        self.origin = origin
        self._clock = clock
        self._wall_clock = wall_clock
        self.armed_at: Optional[float] = None
        self.armed_unix: Optional[float] = None

    # -- hooks ----------------------------------------------------------------

    def attach(self) -> None:
        self.sup.timers.append(self.tick)
        self.sup.progress_observers.append(self._on_progress)
        self.sup.line_observers.append(self._on_line)

    def arm(self) -> None:
        """Every process of the job has been started: `at_seconds` counts from now."""
        self.armed_at, self.armed_unix = self._clock(), self._wall_clock()
        plan = "; ".join(f.spec.describe() for f in self.faults)
        self.sup.console.say(f"fault schedule armed ({len(self.faults)}): {plan}")
        self.tick()

    def _on_progress(self, name: str, rank: int, payload: dict) -> None:
        step = payload.get("step")
        if not _is_number(step):
            return
        for f in self.faults:
            spec = f.spec
            if (f.state == "waiting" and spec.at_step is not None and f.step_trigger is None
                    and step >= spec.at_step and spec.step_of in (None, name)):
                f.step_trigger = f"{name} reported step {step:g}"

    def _on_line(self, name: str, text: str) -> None:
        """Watches the coordinator declare a restarted process lost."""
        if name != "coordinator":
            return
        for f in self.faults:
            if f.state == "restarting" and f.lost_seen_at is None:
                if fault_logs.lost_in_message(text, f.spec.role, f.spec.rank):
                    f.lost_seen_at = self._clock()

    # -- the timer --------------------------------------------------------------

    def tick(self) -> float:
        """Fires what is due; returns the seconds until something may be due
        (inf: nothing timed is pending)."""
        if self.armed_at is None or self.sup.outcome is not None:
            return math.inf
        now = self._clock()
        next_due = math.inf
        for f in self.faults:
            spec = f.spec
            if f.state == "waiting":
                if spec.at_seconds is not None:
                    due = self.armed_at + spec.at_seconds
                    if now >= due:
                        self._fire(f, f"{spec.at_seconds:g} s after every process started")
                    else:
                        next_due = min(next_due, due - now)
                elif f.step_trigger is not None:
                    self._fire(f, f.step_trigger)
            if f.state == "paused":
                if now >= f.resume_at:
                    self._resume(f)
                else:
                    next_due = min(next_due, f.resume_at - now)
            if f.state == "restarting":
                next_due = min(next_due, self._maybe_restart(f, now))
        return next_due

    def _fire(self, f: _Fault, why: str) -> None:
        spec, name = f.spec, f.spec.target
        if not self.sup.is_running(name):
            f.state, f.skipped = "skipped", f"{name} {self.sup.describe_state(name)} when it was due"
            self.sup.console.say(f"{spec.describe()}: {f.skipped}; skipped")
            self._event(f, "skipped", f"fault {spec.index} skipped: {f.skipped}", self._clock(), skipped=f.skipped)
            return
        if spec.action == "pause":
            f.pid = self.sup.signal_process(name, signal.SIGSTOP)
        else:
            if spec.action == "restart":
                self.sup.prepare_restart(name)
            self.sup.expect_fault_exit(name, f"fault {spec.index}: {spec.action}",
                                       tolerate=spec.role != "coordinator" or spec.action == "restart")
            f.pid = self.sup.signal_process(name, signal.SIGKILL)
        f.fired_at, f.fired_unix = self._clock(), self._wall_clock()
        f.extra["trigger"] = why
        signame = "SIGSTOP" if spec.action == "pause" else "SIGKILL"
        self.sup.console.say(f"{spec.describe()}: {signame} to {name} (pid {f.pid}) at "
                             f"{f.fired_at - self.armed_at:.3f} s ({why})")
        self._event(f, "fault", f"fault {spec.index}: {spec.action} {name}", f.fired_at, trigger=why)
        if spec.action == "pause":
            f.state, f.resume_at = "paused", f.fired_at + spec.duration_seconds
        elif spec.action == "restart":
            f.state = "restarting"
            if spec.role == "coordinator":  # nobody declares it lost: start it again after the delay
                f.lost_seen_at = f.fired_at
        else:
            f.state = "done"

    def _resume(self, f: _Fault) -> None:
        name = f.spec.target
        f.resumed_at = self._clock()
        f.state = "done"
        if self.sup.signal_process(name, signal.SIGCONT) is None:
            self.sup.console.say(f"fault {f.spec.index}: {name} ended while paused")
            return
        self.sup.console.say(f"fault {f.spec.index}: SIGCONT to {name} after {f.resumed_at - f.fired_at:.3f} s")
        self._event(f, "resume", f"fault {f.spec.index}: {name} resumed", f.resumed_at)

    def _maybe_restart(self, f: _Fault, now: float) -> float:
        """Starts the target again once it has exited and its delay has
        passed; returns the seconds until it may be time (inf: waiting on a line)."""
        spec, name = f.spec, f.spec.target
        if f.lost_seen_at is None:
            return math.inf  # the coordinator has not declared it lost yet
        due = f.lost_seen_at + spec.restart_delay_seconds
        if now < due:
            return due - now
        if self.sup.is_running(name):
            return 0.05  # not reaped yet
        f.state = "done"
        if not self.sup.restart(name):
            f.restart_note = "not started again: the job had ended"
            return math.inf
        f.restarted_at, f.restart_pid = self._clock(), self.sup.pid_of(name)
        declared = ("" if spec.role == "coordinator" else
                    f", {f.restarted_at - f.lost_seen_at:.3f} s after the coordinator declared it lost")
        pid = f"pid {f.restart_pid}" if f.restart_pid is not None else "on its host, through its carrier"
        self.sup.console.say(f"fault {spec.index}: started {name} again ({pid}), "
                             f"{f.restarted_at - f.fired_at:.3f} s after the kill{declared}")
        self._event(f, "restart", f"fault {spec.index}: {name} started again", f.restarted_at,
                    pid=f.restart_pid)
        return math.inf

    # -- records ---------------------------------------------------------------

    def _event(self, f: _Fault, kind: str, what: str, at: float, **more) -> None:
        if self.events_path is None:
            return
        record = {"elapsed": round(at - self.origin, 3), "time": round(self._unix_of(at), 3), "what": what,
                  "kind": kind, "fault": f.spec.index, "target": f.spec.target, "action": f.spec.action}
        record.update(more)
        with open(self.events_path, "a", encoding="utf-8") as out:
            out.write(json.dumps(record) + "\n")

    def _unix_of(self, at: float) -> float:
        """A clock() reading as Unix time (by the offset at arm())."""
        if self.armed_at is None:
            return self._wall_clock()
        return self.armed_unix + (at - self.armed_at)

    def finish(self) -> None:
        """The job has ended: what never fired is skipped, with the reason."""
        for f in self.faults:
            if f.state == "waiting":
                f.state = "skipped"
                f.skipped = ("the job ended before it was due" if self.armed_at is not None
                             else "the job ended before every process had started")
            elif f.state == "restarting":
                f.state = "done"
                f.restart_note = ("not started again: the coordinator never declared it lost"
                                  if f.lost_seen_at is None else "not started again: the job ended first")
            elif f.state == "paused":
                f.state = "done"  # the supervisor's stop sent SIGCONT

    def records(self) -> list:
        """One dict per fault: what was done and when (summary.json's
        "faults", before the figures from the logs are added)."""
        out = []
        for f in self.faults:
            spec = f.spec
            record = {"index": spec.index, "target": spec.target, "action": spec.action,
                      "trigger": f.extra.get("trigger") or spec.trigger(), "fired": f.fired_at is not None,
                      "skipped": f.skipped, "time": None, "unix_time": None, "seconds": None, "elapsed": None,
                      "pid": f.pid}
            if spec.action == "pause":
                record["duration_seconds"] = spec.duration_seconds
                record["resumed_seconds"] = (round(f.resumed_at - f.fired_at, 3)
                                             if f.resumed_at is not None else None)
            if spec.action == "restart":
                record["restart_delay_seconds"] = spec.restart_delay_seconds
                record["restarted_seconds"] = (round(f.restarted_at - f.fired_at, 3)
                                               if f.restarted_at is not None else None)
                record["restarted_pid"] = f.restart_pid
                if f.restart_note:
                    record["restart_note"] = f.restart_note
            if f.fired_at is not None:
                record.update(time=wall_time_text(f.fired_unix), unix_time=round(f.fired_unix, 6),
                              seconds=round(f.fired_at - self.armed_at, 3),
                              elapsed=round(f.fired_at - self.origin, 3))
            out.append(record)
        return out

"""What the launcher shows and records while a job runs: the terminal
(Console: the launcher's own lines, every process's prefixed lines, and
launcher.log) and the workers' progress (ProgressTracker: the one-line
progress reports and RUNDIR/progress.jsonl). Used by supervisor.py,
backend.py (run_job), role.py and faults.py.
"""

from __future__ import annotations

import json
import math
import sys
import time
from pathlib import Path
from typing import Callable, Optional, TextIO


class Console:
    """The launcher's terminal output, optionally mirrored to a log file.

    `say` is for the launcher's own messages (always shown, always logged),
    `process_line` for a line of a child's output (shown unless
    echo_processes is False). A terminal that goes away (closed pipe) only
    silences the terminal side; the run goes on.
    """

    def __init__(self, stream: TextIO = None, log_path: Optional[Path] = None, echo_processes: bool = True):
        self.stream = stream if stream is not None else sys.stdout
        self.echo_processes = echo_processes
        self._log = open(log_path, "a", encoding="utf-8", buffering=1) if log_path else None

    def say(self, text: str, tag: str = "launch") -> None:
        line = f"[{tag}] {text}"
        self._write(line)
        if self._log:
            self._log.write(line + "\n")

    def block(self, lines) -> None:
        """Plain lines (the final report): terminal and log, no prefix."""
        for line in lines:
            self._write(line)
            if self._log:
                self._log.write(line + "\n")

    def note(self, text: str) -> None:
        """A launcher message for the log file only (e.g. full command lines)."""
        if self._log:
            self._log.write(f"[launch] {text}\n")

    def process_line(self, line: str) -> None:
        if self.echo_processes:
            self._write(line)

    def _write(self, line: str) -> None:
        if self.stream is None:
            return
        try:
            self.stream.write(line + "\n")
            self.stream.flush()
        except (BrokenPipeError, ValueError, OSError):
            self.stream = None

    def close(self) -> None:
        if self._log:
            self._log.close()
            self._log = None


def _number(value) -> Optional[float]:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    return float(value)


class ProgressTracker:
    """Collects TESSERA_PROGRESS records from workers.

    Every record is appended at once to a JSON-lines file as the worker's
    object plus "time" (Unix seconds), "elapsed" (seconds since the tracker
    was made) and "worker" (rank). `due_report` returns a one-line summary of
    the latest record of every worker (epoch: the highest; step: the sum,
    i.e. steps done by the whole job; loss: the mean; steps/s: steps done
    since the last report, a worker's first record being its base) at most once per `interval` seconds, the first one `interval`
    after the first record, and only when something new arrived.
    """

    def __init__(self, jsonl_path: Optional[Path], interval: float = 1.0,
                 clock: Callable[[], float] = time.monotonic, wall_clock: Callable[[], float] = time.time):
        self.interval = interval
        self._clock = clock
        self._wall_clock = wall_clock
        self._started = clock()
        self.started = self._started  # the clock() reading `elapsed` counts from
        self._file = open(jsonl_path, "a", encoding="utf-8", buffering=1) if jsonl_path else None
        self.latest: dict = {}  # rank -> last payload
        self.records = 0
        self._fresh = False
        self._last_report_at: Optional[float] = None  # set by the first record
        self._steps_at_last_report: dict = {}  # rank -> step, the base of steps/s

    def record(self, rank: int, payload: dict) -> dict:
        """Stores one worker's progress object; returns the record written."""
        now = self._clock()
        entry = dict(payload)
        entry.update(time=round(self._wall_clock(), 3), elapsed=round(now - self._started, 3), worker=rank)
        if self._file:
            self._file.write(json.dumps(entry) + "\n")
        self.latest[rank] = payload
        self.records += 1
        self._fresh = True
        if self._last_report_at is None:  # the rate is measured from here on
            self._last_report_at = now
        self._steps_at_last_report.setdefault(rank, _number(payload.get("step")) or 0.0)
        return entry

    def due_report(self) -> Optional[str]:
        """The progress line if one is due now, else None."""
        now = self._clock()
        if not self._fresh or now - self._last_report_at < self.interval:
            return None
        current = {rank: _number(p.get("step")) or 0.0 for rank, p in self.latest.items()}
        done = sum(current[rank] - self._steps_at_last_report[rank] for rank in current)
        rate = done / (now - self._last_report_at)
        self._last_report_at, self._steps_at_last_report, self._fresh = now, current, False
        return self._format(sum(current.values()), rate, now - self._started)

    def _format(self, steps: float, rate: float, elapsed: float) -> str:
        parts = []
        epochs = [e for e in (_number(p.get("epoch")) for p in self.latest.values()) if e is not None]
        if epochs:
            parts.append(f"epoch {int(max(epochs))}")
        parts.append(f"step {int(steps)}")
        losses = [x for x in (_number(p.get("loss")) for p in self.latest.values()) if x is not None]
        if losses:
            parts.append(f"loss {sum(losses) / len(losses):.4g}")
        parts.append(f"{rate:.1f} steps/s")
        minutes, seconds = divmod(int(elapsed), 60)
        parts.append(f"elapsed {minutes}:{seconds:02d}")
        parts.append(f"{len(self.latest)} worker{'s' if len(self.latest) != 1 else ''} reporting")
        return " | ".join(parts)

    def close(self) -> None:
        if self._file:
            self._file.close()
            self._file = None

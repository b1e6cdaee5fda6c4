"""Process supervision: run a set of processes as one job.

A Supervisor starts processes (each in its own session and process group, and
on Linux with PR_SET_PDEATHSIG=SIGKILL so that none outlives a launcher that
is killed outright), streams each one's stdout and stderr line by line,
prefixed with its name, to the terminal and to LOG_DIR/<name>.log, parses the
worker line protocol (TESSERA_PROGRESS / TESSERA_RESULT) and applies one
policy:

  * the first process that exits non-zero or is killed by a signal ends the
    job: the others get a short settle time (1 s) to exit by themselves, as
    failures cascade (a coordinator that saw a server die exits too, and
    should not be mistaken for a process the launcher stopped); then every
    process still running is stopped and the job has failed;
  * SIGINT, SIGTERM or SIGHUP to the launcher ends the job the same way (a
    second one skips the grace period);
  * a timeout ends the job, naming who was still running;
  * when every process has exited with status 0, the job has completed.

Stopping means SIGTERM (and SIGCONT, for a group a fault has paused) to each
process group, then SIGKILL to the groups still alive after the grace period.
When a process exits, whatever is left of its process group is killed too, so
no grandchild outlives its parent's exit.

A process may carry others: `mpirun`, `srun` or `ssh` starting job processes
elsewhere through `tessera-launch role` (role.py). A carrier's output holds
its members' lines as `[NAME] text`, `[NAME] TESSERA_PID PID` each time a
member starts and `[NAME] TESSERA_EXIT CODE` when it exits; the supervisor
routes each member's lines to its own log, parses its worker protocol, and
applies the policy above to the members as if they were its own children:
a member's fate is its own, whatever carries it. A carrier that ends is
judged by its members: a member that had started and reported no exit is
lost with it (its may_fail decides, as for an exit of its own); the carrier
itself fails the job only if it ends badly before a member started (ssh
could not connect, srun found no resources). Members also announce facts as
`[NAME] TAG payload` lines (NOTICE_TAGS), kept in `notices`.

The launcher talks back to members through their carrier's control channel
(ProcessSpec.control: the carrier's stdin, or a file per member in a
directory every host sees), one line per command, `TESSERA_CONTROL NAME
COMMAND` (role.py): `signal SIGNAME`, `hold` (stay after the next exit, for
a restart) and `restart`. So faults (signal_process, restart) reach a
member on any host as they reach a child here.

Hooks for a fault schedule (faults.py): `timers` run at every turn of the
loop and say when they want to run again; `line_observers` and
`progress_observers` see every line and progress record of a job process;
`signal_process`, `expect_fault_exit` and `restart` act on a process by name.
A process whose exit a fault announced is, like a may_fail process, the
coordinator's to judge.

Everything runs on the calling thread (one selector loop, no reader threads),
which keeps preexec_fn safe and output ordering simple. A Supervisor that
handles signals must be used from the main thread, as a context manager.
"""

from __future__ import annotations

import collections
import ctypes
import json
import math
import os
import selectors
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable, Optional, TextIO

from .console import Console, ProgressTracker
from .processes import (ADDRESS_TAG, CONTROL_STDIN, CONTROL_TAG, EXIT_TAG, NOTICE_TAGS, PID_TAG, PROGRESS_TAG,
                        RESULT_TAG, SUMMARY_TAG, Member, Outcome, ProcessSpec, control_line, describe_exit)

# Console and ProgressTracker (console.py), the protocol's tags and the
# process types (processes.py) moved out of this module; they stay
# importable from here.
__all__ = [
    "Supervisor", "MAX_LINE_BYTES",
    "Console", "ProgressTracker",
    "ADDRESS_TAG", "CONTROL_STDIN", "CONTROL_TAG", "EXIT_TAG", "NOTICE_TAGS", "PID_TAG", "PROGRESS_TAG",
    "RESULT_TAG", "SUMMARY_TAG", "Member", "Outcome", "ProcessSpec", "control_line", "describe_exit",
]


#: Longest line kept whole; longer output is split into pieces of this size.
MAX_LINE_BYTES = 1 << 20

_STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
_PR_SET_PDEATHSIG = 1


def _load_libc():
    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL(None, use_errno=True)
    except OSError:
        return None


_LIBC = _load_libc()


def _child_setup(parent_pid: int) -> None:
    """Runs in the child between fork and exec: ask the kernel to SIGKILL us
    when the launcher dies, and die now if it already has (the race between
    fork and prctl)."""
    if _LIBC is not None:
        _LIBC.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent_pid:
        os.kill(os.getpid(), signal.SIGKILL)


class _Output:
    """Where one job process's lines go: its log file and its last lines."""

    def __init__(self, name: str, rank: Optional[int], log: TextIO, tail_lines: int):
        self.name = name
        self.rank = rank
        self.log = log
        self.tail = collections.deque(maxlen=tail_lines)
        self.warned_malformed = False


class _Managed:
    """A started process and the state of its output pipe."""

    def __init__(self, spec: ProcessSpec, popen: subprocess.Popen, output: _Output):
        self.spec = spec
        self.popen = popen
        self.output = output
        self.fd = popen.stdout.fileno()
        self.pipe_open = True
        self.pending = bytearray()
        self.returncode: Optional[int] = None
        self.members = {m.name: m for m in spec.members}

    @property
    def alive(self) -> bool:
        return self.returncode is None

    def signal_group(self, signum: int) -> None:
        """Signals the process group (its pgid is its pid: own session)."""
        try:
            os.killpg(self.popen.pid, signum)
        except (ProcessLookupError, PermissionError):
            pass


_WAKEUP = object()


class Supervisor:
    """Runs the processes of one job; see the module docstring for the policy.

    Use as a context manager: entering installs the signal handlers (when
    handle_signals is set), leaving stops whatever still runs and restores
    them. Not thread-safe; call everything from one thread.
    """

    def __init__(self, log_dir: Optional[Path], console: Optional[Console] = None,
                 progress: Optional[ProgressTracker] = None, grace_seconds: float = 3.0,
                 settle_seconds: float = 1.0, handle_signals: bool = True, tail_lines: int = 20,
                 clock: Callable[[], float] = time.monotonic,
                 abandon_check: Optional[Callable[[], Optional[str]]] = None):
        """log_dir: where <name>.log files go (None: no log files).
        abandon_check: called at every turn of the loop; a reason it returns
        ends the job like a signal would (status "interrupted")."""
        self.log_dir = Path(log_dir) if log_dir is not None else None
        if self.log_dir is not None:
            self.log_dir.mkdir(parents=True, exist_ok=True)
        self.abandon_check = abandon_check
        self.notices: dict = {}  # job process name -> {tag: payload text}
        self._outputs: dict = {}  # job process name -> _Output
        self._member_codes: dict = {}  # member name -> exit code it reported
        self._member_pids: dict = {}  # member name -> its pid (TESSERA_PID), while started
        self._carrier_of: dict = {}  # member name -> the _Managed carrying it
        self.console = console or Console()
        self.progress = progress
        self.grace_seconds = grace_seconds
        self.settle_seconds = settle_seconds
        self.handle_signals = handle_signals
        self.tail_lines = tail_lines
        self.results: dict = {}  # process name -> TESSERA_RESULT object
        self.tolerated_failures: dict = {}  # name -> exit code, for may_fail processes
        self._clock = clock
        self._started_at = clock()
        self.timers: list = []  # () -> seconds until it wants to run again (inf: no wish), every turn
        self.line_observers: list = []  # (name, text) for every line of a job process
        self.progress_observers: list = []  # (name, rank, payload) for every progress record
        self._fault_exits: dict = {}  # name -> (note, tolerate): a fault is about to end this process
        self._processes: dict = {}  # name -> _Managed, in start order
        self._never_started: list = []
        self._selector = selectors.DefaultSelector()
        self._outcome: Optional[Outcome] = None
        self._stopped = False
        self._signals: list = []
        self._kill_now = False
        self._saved_handlers: dict = {}
        self._saved_wakeup_fd: Optional[int] = None
        self._wakeup_pipe: Optional[tuple] = None

    # -- context management and signals ------------------------------------

    def __enter__(self) -> "Supervisor":
        if self.handle_signals:
            read_end, write_end = os.pipe()
            os.set_blocking(read_end, False)
            os.set_blocking(write_end, False)
            self._wakeup_pipe = (read_end, write_end)
            self._selector.register(read_end, selectors.EVENT_READ, _WAKEUP)
            self._saved_wakeup_fd = signal.set_wakeup_fd(write_end, warn_on_full_buffer=False)
            for signum in _STOP_SIGNALS:
                self._saved_handlers[signum] = signal.signal(signum, self._on_signal)
        return self

    def __exit__(self, *exc_info) -> None:
        try:
            if any(m.alive for m in self._processes.values()):
                self.stop("failed", "the launcher is exiting")
        finally:
            self._restore_signals()
            self._close_pipes()
            self._selector.close()

    def _on_signal(self, signum, _frame) -> None:
        self._signals.append(signum)

    def _restore_signals(self) -> None:
        for signum, handler in self._saved_handlers.items():
            signal.signal(signum, handler)
        self._saved_handlers.clear()
        if self._wakeup_pipe:
            signal.set_wakeup_fd(self._saved_wakeup_fd if self._saved_wakeup_fd is not None else -1)
            self._selector.unregister(self._wakeup_pipe[0])
            for fd in self._wakeup_pipe:
                os.close(fd)
            self._wakeup_pipe = None

    # -- public API ----------------------------------------------------------

    @property
    def outcome(self) -> Optional[Outcome]:
        """How the job ended; None while it has not."""
        return self._outcome

    def running_names(self) -> list:
        """Job processes still running: processes of our own, and members
        that have not reported their exit (a carrier whose members are all
        done but that still runs is named itself)."""
        names = []
        for name, managed in self._processes.items():
            if not managed.alive:
                continue
            pending = [m for m in managed.members
                       if m not in self._member_codes and m not in self._never_started]
            names += pending if pending else [name]
        return names

    def members_started(self) -> bool:
        """Whether every carried member has started, exited, or will not be
        started (True when there are none)."""
        return all(name in self._member_pids or name in self._member_codes or name in self._never_started
                   or not carrier.alive for name, carrier in self._carrier_of.items())

    def exit_codes(self) -> dict:
        """name -> exit code (None: not started or still running). A member
        that reported no exit has its carrier's exit code."""
        codes = {}
        for name, managed in self._processes.items():
            codes[name] = managed.returncode
            for member in managed.members:
                codes[member] = self._member_codes.get(member, managed.returncode)
        codes.update({name: None for name in self._never_started})
        return codes

    def results_by_rank(self) -> dict:
        """Worker rank -> its TESSERA_RESULT object, for workers that printed one."""
        return {self._outputs[name].rank: result for name, result in self.results.items()}

    def tail(self, name: str) -> list:
        """The last lines (up to tail_lines) a process printed."""
        output = self._outputs.get(name)
        return list(output.tail) if output else []

    def _open_output(self, name: str, rank: Optional[int]) -> _Output:
        path = self.log_dir / f"{name}.log" if self.log_dir is not None else os.devnull
        output = _Output(name, rank, open(path, "a", encoding="utf-8", buffering=1), self.tail_lines)
        self._outputs[name] = output
        return output

    def is_running(self, name: str) -> bool:
        """Whether the process called `name` runs: a process of the
        launcher's own, or a carried member that has started (TESSERA_PID)
        and not reported its exit, while its carrier runs."""
        managed = self._processes.get(name)
        if managed is not None:
            return managed.alive
        carrier = self._carrier_of.get(name)
        return (carrier is not None and carrier.alive and name in self._member_pids
                and name not in self._member_codes)

    def pid_of(self, name: str) -> Optional[int]:
        """The pid of process `name` (a member's on its own host); None if unknown."""
        managed = self._processes.get(name)
        if managed is not None:
            return managed.popen.pid
        return self._member_pids.get(name)

    def describe_state(self, name: str) -> str:
        """"is running (pid N)", "had already exited with status 0", "had
        already been killed by SIGKILL", "was not started"."""
        managed = self._processes.get(name)
        if managed is None and name in self._carrier_of:  # a member
            running, code = self.is_running(name), self._member_codes.get(name)
        elif managed is None:
            return "was not started"
        else:
            running, code = managed.alive, managed.returncode
        if running:
            return f"is running (pid {self.pid_of(name)})"
        if code is None:
            return "was not started"
        return "had already " + describe_exit(code).replace("was killed", "been killed")

    def signal_process(self, name: str, signum: int) -> Optional[int]:
        """Sends `signum` to the process group of the running process
        `name` (through its carrier's control channel for a member); returns
        its pid, or None if it is not running."""
        managed = self._processes.get(name)
        if managed is None and self.is_running(name):
            if not self._control(name, f"signal {signal.Signals(signum).name}"):
                return None
            return self._member_pids.get(name)
        if managed is None or not managed.alive:
            return None
        managed.signal_group(signum)
        return managed.popen.pid

    def prepare_restart(self, name: str) -> None:
        """A restart of `name` follows its next exit: a member's carrier is
        told to stay for it (`hold`); a process of our own needs nothing."""
        if name not in self._processes and name in self._carrier_of:
            self._control(name, "hold")

    def _control(self, name: str, command: str) -> bool:
        """Sends a command to member `name` through its carrier's control
        channel; False if it cannot go (no channel, the carrier is gone)."""
        carrier = self._carrier_of.get(name)
        if carrier is None or not carrier.alive or carrier.spec.control is None:
            return False
        line = control_line(name, command)
        try:
            if carrier.spec.control == CONTROL_STDIN:
                if carrier.popen.stdin is None:
                    return False
                carrier.popen.stdin.write(line.encode())
                carrier.popen.stdin.flush()
            else:
                with open(Path(carrier.spec.control) / f"{name}.control", "a", encoding="utf-8") as out:
                    out.write(line)
        except (BrokenPipeError, ValueError, OSError) as e:
            self.console.say(f"cannot send '{command}' to {name} through {carrier.spec.name}: {e}")
            return False
        return True

    def expect_fault_exit(self, name: str, note: str, tolerate: bool = True) -> None:
        """The next exit of `name` is a fault's doing (`note` says which):
        with `tolerate` it is the coordinator's to judge, as for a may_fail
        process; without, it still ends the job, with the note in the reason."""
        self._fault_exits[name] = (note, tolerate)

    def restart(self, name: str) -> bool:
        """Starts the process `name` again, with the same spec, after it has
        exited; its output goes on in the same log. False, starting nothing,
        while it runs or once the job has ended."""
        managed = self._processes.get(name)
        if managed is None and name in self._carrier_of:
            carrier = self._carrier_of[name]
            if (self._outcome is not None or not carrier.alive or name not in self._member_codes
                    or not self._control(name, "restart")):
                return False
            del self._member_codes[name]
            self._member_pids.pop(name, None)
            return True
        if managed is None or managed.alive or self._outcome is not None:
            return False
        self._read(managed, until_blocked=True)
        self._close_pipe(managed)
        old_output = self._outputs.pop(name)
        del self._processes[name]
        if not self.start(managed.spec):
            return False
        self._outputs[name].tail.extend(old_output.tail)
        return True

    def start(self, spec: ProcessSpec) -> bool:
        """Starts a process. Returns False, without starting it, once the job
        has ended; a process that cannot be executed ends the job (failed)."""
        if self._outcome is not None:
            return False
        if spec.name in self._processes or spec.name in self._outputs:
            raise ValueError(f"duplicate process name {spec.name!r}")
        output = self._open_output(spec.name, spec.rank)
        try:
            popen = subprocess.Popen(
                spec.argv,
                stdin=subprocess.PIPE if spec.keep_stdin else subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                env={**os.environ, **spec.env},
                cwd=spec.cwd,
                start_new_session=True,
                preexec_fn=lambda parent=os.getpid(): _child_setup(parent),
            )
        except OSError as e:
            output.log.close()
            self._never_started.append(spec.name)
            reason = f"could not start {spec.name}: {e.strerror or e}: {spec.argv[0]}"
            self.console.say(reason)
            self._outcome = Outcome("failed", reason, culprit=spec.name)
            return False
        managed = _Managed(spec, popen, output)
        for member in spec.members:
            self._carrier_of[member.name] = managed
        os.set_blocking(managed.fd, False)
        self._selector.register(managed.fd, selectors.EVENT_READ, managed)
        self._processes[spec.name] = managed
        self.console.say(f"started {spec.name} (pid {popen.pid})")
        self.console.note(f"{spec.name}: {shlex.join(spec.argv)}")
        return True

    def note_skipped(self, name: str) -> None:
        """Records a process deliberately not started (exit code None)."""
        self._never_started.append(name)

    def wait_until(self, predicate: Callable[[], bool], timeout: Optional[float]) -> str:
        """Supervises until predicate() holds ("satisfied"), `timeout` seconds
        pass ("timeout"), or the job ends or nothing runs any more ("ended").
        A failure seen meanwhile stops everything before returning."""
        deadline = None if timeout is None else self._clock() + timeout
        while True:
            if self._outcome is not None:
                self._stop_all()
                return "ended"
            if predicate():
                return "satisfied"
            if not any(m.alive for m in self._processes.values()):
                return "ended"
            now = self._clock()
            if deadline is not None and now >= deadline:
                return "timeout"
            self._pump(0.25 if deadline is None else min(0.25, deadline - now))

    def run(self, timeout: Optional[float] = None, leader=None,
            leader_grace: float = 10.0) -> Outcome:
        """Supervises until the job ends and returns its Outcome.

        timeout:      seconds from now after which everything is stopped
                      (status "timeout", naming who was still running).
        leader:       the process whose exit 0 means the job is done (or a
                      list of such processes: the first to exit 0); the
                      others then get `leader_grace` seconds to exit on their
                      own before they are stopped (and listed as stragglers).
        """
        deadline = None if timeout is None else self._clock() + timeout
        leaders = [leader] if isinstance(leader, str) else list(leader or [])
        leader_done_at = None
        while self._outcome is None:
            alive = self.running_names()
            if not alive:
                self._outcome = Outcome("completed", "every process exited with status 0")
                break
            now = self._clock()
            if deadline is not None and now >= deadline:
                self._outcome = Outcome(
                    "timeout",
                    f"timed out after {self.elapsed():.1f} s; still running: {', '.join(alive)}",
                    still_running=alive,
                )
                break
            finished = [name for name in leaders if self.exit_codes().get(name) == 0]
            if finished:
                leader_done_at = leader_done_at if leader_done_at is not None else now
                if now - leader_done_at >= leader_grace:
                    self.console.say(
                        f"{', '.join(alive)} still running {leader_grace:g} s after {finished[0]} finished; stopping")
                    self._outcome = Outcome("completed", f"{finished[0]} finished", stragglers=alive)
                    break
            waits = [0.25]
            if deadline is not None:
                waits.append(deadline - now)
            if leader_done_at is not None:
                waits.append(leader_done_at + leader_grace - now)
            self._pump(max(0.0, min(waits)))
        self._stop_all()
        return self._outcome

    def stop(self, status: str, reason: str, culprit: Optional[str] = None) -> Outcome:
        """Ends the job now (unless it already ended) with the given status
        and reason, stopping every process. Returns the Outcome."""
        if self._outcome is None:
            self._outcome = Outcome(status, reason, culprit=culprit)
        self._stop_all()
        return self._outcome

    def elapsed(self) -> float:
        return self._clock() - self._started_at

    # -- the event loop ------------------------------------------------------

    def _run_timers(self) -> float:
        """Runs every timer; the seconds until the soonest wants to run again."""
        return min((timer() for timer in list(self.timers)), default=math.inf)

    def _pump(self, max_wait: float) -> None:
        """One turn: run the timers, read output, notice signals and exits,
        report progress."""
        max_wait = min(max_wait, self._run_timers())
        for key, _ in self._selector.select(max(0.0, max_wait)):
            if key.data is _WAKEUP:
                self._drain_wakeup()
            else:
                self._read(key.data)
        self._handle_signals()
        if self.abandon_check is not None and self._outcome is None:
            reason = self.abandon_check()
            if reason:
                self.console.say(f"{reason}; stopping")
                self._outcome = Outcome("interrupted", reason)
        self._reap()
        self._run_timers()
        if self.progress is not None:
            report = self.progress.due_report()
            if report:
                self.console.say(report, tag="progress")

    def _drain_wakeup(self) -> None:
        try:
            while os.read(self._wakeup_pipe[0], 512):
                pass
        except BlockingIOError:
            pass

    def _handle_signals(self) -> None:
        while self._signals:
            signum = self._signals.pop(0)
            name = signal.Signals(signum).name
            if self._outcome is None:
                self.console.say(f"received {name}; stopping the job (again to kill at once)")
                self._outcome = Outcome("interrupted", f"the launcher received {name}", signal=signum)
            elif not self._kill_now:
                self.console.say(f"received {name} again; killing everything now")
                self._kill_now = True

    def _reap(self) -> None:
        for managed in list(self._processes.values()):
            if managed.alive and self._has_exited(managed):
                self._on_exit(managed)

    @staticmethod
    def _has_exited(managed: _Managed) -> bool:
        """Whether the process has exited, leaving it unreaped (a zombie keeps
        its pid and process group id from being reused)."""
        try:
            return os.waitid(os.P_PID, managed.popen.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
        except ChildProcessError:
            return True

    def _on_exit(self, managed: _Managed) -> None:
        managed.signal_group(signal.SIGKILL)  # whatever it left behind
        managed.returncode = managed.popen.wait()
        if managed.popen.stdin is not None:
            try:
                managed.popen.stdin.close()
            except OSError:
                pass
        self._read(managed, until_blocked=True)
        if managed.members:
            self._judge_carrier_exit(managed)
        else:
            self._judge_exit(managed.spec.name, managed.returncode, managed.spec.may_fail)

    def _judge_carrier_exit(self, managed: _Managed) -> None:
        """A carrier ended: its members' fates decide (see the module docstring)."""
        code, name = managed.returncode, managed.spec.name
        pending = [m for m in managed.members.values()
                   if m.name not in self._member_codes and m.name not in self._never_started]
        started = [m for m in pending if m.name in self._member_pids]
        if code != 0 or pending:
            self.console.say(f"{name} (carrying {', '.join(managed.members)}) {describe_exit(code)}")
        for member in started:  # lost with their carrier: each is judged as if it had exited so
            self._member_codes[member.name] = code
            self._judge_exit(member.name, code, member.may_fail, f"lost with its carrier {name}")
        if code != 0 and len(started) < len(pending):  # the carrier failed before them
            self._judge_exit(name, code, False)

    def _judge_exit(self, name: str, code: int, may_fail: bool, context: Optional[str] = None) -> None:
        """Applies the policy to a job process (or member) that exited."""
        note, tolerate = self._fault_exits.pop(name, (None, False))
        why = f" ({'; '.join(x for x in (context, note) if x)})" if note or context else ""
        self.console.say(f"{name} {describe_exit(code)}{why}")
        if code != 0 and (may_fail or tolerate):
            self.tolerated_failures[name] = code
            self.console.say(f"{name} failed; the coordinator decides what follows (on_worker_loss, replication)")
            return
        if code != 0 and self._outcome is None:
            self._outcome = Outcome("failed", f"{name} {describe_exit(code)}{why}", culprit=name, culprit_code=code)

    def _stop_all(self) -> None:
        """After a process failure, wait up to settle_seconds for others to
        exit by themselves; then SIGTERM every live process group, SIGKILL
        those alive after the grace period, and wait for all to be reaped.
        Idempotent."""
        if self._stopped:
            return
        self._stopped = True
        if self._outcome.culprit_code is not None:  # a process failed: let the cascade settle
            self._wait_for_exits(self.settle_seconds)
        alive = [m for m in self._processes.values() if m.alive]
        self._outcome.stopped = self.running_names()
        if alive:
            grace = {m.spec.name: self.grace_seconds if m.spec.stop_grace is None else m.spec.stop_grace
                     for m in alive}
            names = ", ".join(m.spec.name for m in alive)
            self.console.say(f"stopping {names} (SIGTERM, then SIGKILL after {max(grace.values()):g} s)")
            for managed in alive:
                managed.signal_group(signal.SIGTERM)
                managed.signal_group(signal.SIGCONT)  # a paused group would not act on SIGTERM
            started = self._clock()
            for seconds in sorted(set(grace.values())):
                self._wait_for_exits(max(0.0, started + seconds - self._clock()))
                stubborn = [m for m in self._processes.values() if m.alive and grace[m.spec.name] <= seconds
                            or m.alive and self._kill_now]
                for managed in stubborn:
                    self.console.say(f"{managed.spec.name} is still running; sending SIGKILL")
                    managed.signal_group(signal.SIGKILL)
            self._wait_for_exits(10.0, ignore_kill_now=True)
        self._close_pipes()
        if self.progress is not None:
            report = self.progress.due_report()
            if report:
                self.console.say(report, tag="progress")
        self._outcome.exit_codes = self.exit_codes()

    def _wait_for_exits(self, seconds: float, ignore_kill_now: bool = False) -> None:
        deadline = self._clock() + seconds
        while any(m.alive for m in self._processes.values()):
            if self._kill_now and not ignore_kill_now:
                return
            now = self._clock()
            if now >= deadline:
                return
            self._pump(min(0.05, deadline - now))

    # -- output --------------------------------------------------------------

    def _read(self, managed: _Managed, until_blocked: bool = False) -> None:
        """Reads what the pipe holds (one chunk, or until it would block)."""
        while managed.pipe_open:
            try:
                data = os.read(managed.fd, 65536)
            except BlockingIOError:
                return
            if not data:
                self._close_pipe(managed)
                return
            managed.pending += data
            self._split_lines(managed)
            if not until_blocked:
                return

    def _split_lines(self, managed: _Managed) -> None:
        while True:
            newline = managed.pending.find(b"\n")
            if newline < 0:
                if len(managed.pending) < MAX_LINE_BYTES:
                    return
                newline = MAX_LINE_BYTES
                chunk, managed.pending = managed.pending[:newline], managed.pending[newline:]
            else:
                chunk, managed.pending = managed.pending[:newline], managed.pending[newline + 1:]
            self._handle_line(managed, bytes(chunk).decode("utf-8", errors="replace").rstrip("\r"))

    def _close_pipe(self, managed: _Managed) -> None:
        if not managed.pipe_open:
            return
        managed.pipe_open = False
        self._selector.unregister(managed.fd)
        if managed.pending:
            text = bytes(managed.pending).decode("utf-8", errors="replace").rstrip("\r")
            managed.pending = bytearray()
            self._handle_line(managed, text)
        managed.popen.stdout.close()
        managed.output.log.close()
        for member in managed.members:
            if member in self._outputs:
                self._outputs[member].log.close()

    def _close_pipes(self) -> None:
        for managed in self._processes.values():
            if managed.pipe_open:
                self._read(managed, until_blocked=True)
                self._close_pipe(managed)

    def _handle_line(self, managed: _Managed, text: str) -> None:
        """Routes one line of a process's output: a member's line (carriers)
        to that member, anything else to the process itself."""
        if managed.members and text.startswith("["):
            name, sep, rest = text[1:].partition("] ")
            if not sep and text.endswith("]"):
                name, sep, rest = text[1:-1], True, ""
            member = managed.members.get(name) if sep else None
            if member is not None:
                self._handle_member_line(member, rest)
                return
        self._handle_output_line(managed.output, text)

    def _handle_member_line(self, member: Member, text: str) -> None:
        output = self._outputs.get(member.name) or self._open_output(member.name, member.rank)
        for tag in NOTICE_TAGS:
            if text.startswith(tag + " "):
                self.notices.setdefault(member.name, {})[tag] = text[len(tag) + 1:]
                output.log.write(f"[{member.name}] {text}\n")
                return
        if text.startswith(PID_TAG + " "):
            pid = text[len(PID_TAG) + 1:].strip()
            if pid.isdigit():
                self._member_pids[member.name] = int(pid)
            output.log.write(f"[{member.name}] {text}\n")
            return
        if text.startswith(EXIT_TAG + " ") and member.name not in self._member_codes:
            try:
                code = int(text[len(EXIT_TAG) + 1:])
            except ValueError:
                pass
            else:
                self._member_codes[member.name] = code
                self._judge_exit(member.name, code, member.may_fail)
                return
        self._handle_output_line(output, text)

    def _handle_output_line(self, output: _Output, text: str) -> None:
        """Logs one line of a job process's output, and acts on the worker
        line protocol."""
        name = output.name
        prefixed = f"[{name}] {text}"
        output.log.write(prefixed + "\n")
        for observe in self.line_observers:
            observe(name, text)
        if output.rank is not None:
            if text.startswith(PROGRESS_TAG):
                payload = self._protocol_payload(output, text, PROGRESS_TAG)
                if payload is not None:
                    if self.progress is not None:
                        self.progress.record(output.rank, payload)
                    for observe in self.progress_observers:
                        observe(name, output.rank, payload)
                    return  # progress lines stay off the terminal
            elif text.startswith(RESULT_TAG):
                payload = self._protocol_payload(output, text, RESULT_TAG)
                if payload is not None:
                    self.results[name] = payload
        output.tail.append(text)
        self.console.process_line(prefixed)

    def _protocol_payload(self, output: _Output, text: str, tag: str) -> Optional[dict]:
        """The JSON object after `tag`, or None (with one warning per process)
        when the line is not `TAG {json object}`."""
        rest = text[len(tag):]
        if rest[:1] in (" ", "\t"):
            try:
                payload = json.loads(rest)
            except ValueError:
                payload = None
            if isinstance(payload, dict):
                return payload
        if not output.warned_malformed:
            output.warned_malformed = True
            self.console.say(f"{output.name}: malformed {tag} line (expected '{tag} {{json object}}'); "
                             "treating it as log text")
        return None

"""What a Supervisor is handed and gives back, and the line protocol of
carried processes.

ProcessSpec (a process to start, and the job processes it carries: Member),
Outcome (how a job ended) and describe_exit; the tags of the lines a job
process, a carrier and `tessera-launch role` exchange with the supervisor
(supervisor.py's docstring describes the protocol) and control_line, the
form of a command to a carried process. Used by supervisor.py, role.py (the
other end of the protocol), backend.py and local.py (the specs they start),
faults.py and summary.py (the outcome).
"""

from __future__ import annotations

import signal
from dataclasses import dataclass, field
from typing import Optional


PROGRESS_TAG = "TESSERA_PROGRESS"
RESULT_TAG = "TESSERA_RESULT"
#: A member of a carrier exited: `[NAME] TESSERA_EXIT CODE` (negative: signal).
EXIT_TAG = "TESSERA_EXIT"
#: Facts a carried process announces: the coordinator's address once bound,
#: and its summary file's content at the end (when its run directory is not
#: this machine's).
ADDRESS_TAG = "TESSERA_ADDRESS"
SUMMARY_TAG = "TESSERA_SUMMARY"
NOTICE_TAGS = (ADDRESS_TAG, SUMMARY_TAG)
#: A member started: `[NAME] TESSERA_PID PID` (its pid on its host).
PID_TAG = "TESSERA_PID"
#: A command from the launcher to a member: `TESSERA_CONTROL NAME COMMAND`.
CONTROL_TAG = "TESSERA_CONTROL"
#: ProcessSpec.control for commands written to the carrier's stdin.
CONTROL_STDIN = "stdin"


def describe_exit(code: Optional[int]) -> str:
    """'exited with status 3', 'was killed by SIGKILL', 'was not started'."""
    if code is None:
        return "was not started"
    if code >= 0:
        return f"exited with status {code}"
    try:
        name = signal.Signals(-code).name
    except ValueError:
        name = f"signal {-code}"
    return f"was killed by {name}"


@dataclass
class ProcessSpec:
    """One process of a job.

    name:  prefixes its output and names its log file (e.g. "server-0").
    argv:  the command; argv[0] is executed directly (no shell).
    rank:  set for worker programs: their TESSERA_PROGRESS and TESSERA_RESULT
           lines are parsed (and progress lines kept off the terminal).
    env:   variables added to the launcher's environment.
    cwd:   working directory (default: the launcher's).
    may_fail: its failure is reported but does not end the job (workers
           under on_worker_loss: continue or wait, where the coordinator decides).
    members: job processes this one carries (a launcher like mpirun or ssh);
           see the module docstring. The carrier itself is then plumbing:
           only its own failure before its members report counts.
    keep_stdin: stdin is a pipe the supervisor holds open (and never writes)
           instead of /dev/null, so that a remote side sees end-of-file the
           moment the launcher or this process goes away.
    stop_grace: seconds between SIGTERM and SIGKILL for this process
           (default: the supervisor's); carriers need their members' grace
           and more.
    control: how commands reach the members of a carrier (see the module
           docstring): CONTROL_STDIN (keep_stdin must be set), or a
           directory every member's host sees, where the command lines for
           member NAME are appended to NAME.control. None: no commands.
    """

    name: str
    argv: list
    rank: Optional[int] = None
    env: dict = field(default_factory=dict)
    cwd: Optional[str] = None
    may_fail: bool = False
    members: list = field(default_factory=list)
    keep_stdin: bool = False
    stop_grace: Optional[float] = None
    control: Optional[object] = None


def control_line(name: str, command: str) -> str:
    """The line that carries `command` to member `name`."""
    return f"{CONTROL_TAG} {name} {command}\n"


@dataclass(frozen=True)
class Member:
    """A job process started by a carrier process (ProcessSpec.members);
    rank and may_fail mean what they mean in ProcessSpec."""

    name: str
    rank: Optional[int] = None
    may_fail: bool = False


@dataclass
class Outcome:
    """How a job ended.

    status:        "completed" (every process exited 0), "failed",
                   "timeout" or "interrupted".
    reason:        one line for a human.
    culprit:       the process whose failure ended the job, if any.
    culprit_code:  its exit code (negative: killed by that signal).
    exit_codes:    name -> exit code, None for a process never started.
    still_running: at a timeout, who was still running.
    signal:        for "interrupted", the signal the launcher received.
    stragglers:    processes stopped because they did not exit within the
                   grace after the leader finished.
    stopped:       processes the supervisor stopped (SIGTERM/SIGKILL) when
                   the job ended; their exit codes are a consequence, not a
                   cause.
    """

    status: str
    reason: str
    culprit: Optional[str] = None
    culprit_code: Optional[int] = None
    exit_codes: dict = field(default_factory=dict)
    still_running: list = field(default_factory=list)
    signal: Optional[int] = None
    stragglers: list = field(default_factory=list)
    stopped: list = field(default_factory=list)

"""`tessera-launch role`: one job process, started by a carrier.

Back-ends that do not start job processes themselves (mpirun, srun, ssh)
start this instead, once per process. It runs the process as a child under a
Supervisor of its own (so the child gets the same treatment as under the
local back-end: own process group, SIGTERM then SIGKILL, death with its
parent), and writes to stdout what the launcher's Supervisor expects of a
carrier (supervisor.py): every line of the child as `[NAME] text`, the
coordinator's address as `[coordinator] TESSERA_ADDRESS ADDR` once it is
bound, and at the end `[NAME] TESSERA_EXIT CODE`.

It writes `[NAME] TESSERA_PID PID` each time it starts the child. It exits
0 once it has reported the child's exit, whatever that was: the child's
fate travels in the TESSERA_EXIT line, and the carrier must not take it for
its own (mpirun and srun --kill-on-bad-exit would end every other rank of
the job when one rank exits non-zero). It exits non-zero only when it
could not even say which process it runs.

It stops its child when it is told to (SIGTERM, SIGINT, SIGHUP), when the
process that started it goes away (mpirun, slurmstepd or sshd exited: its
parent pid changes), and with --watch-stdin when its stdin reaches
end-of-file (the ssh connection to the launcher is gone).

Commands from the launcher (supervisor.py, "control channel") come as
lines `TESSERA_CONTROL NAME COMMAND` on stdin (--watch-stdin: ssh) or in the
file RUNDIR/control/NAME.control (by rank: mpirun, srun, whose run directory
every node shares); lines for other names are ignored:

  signal SIGNAME   send SIGNAME (SIGKILL, SIGSTOP, SIGCONT, ...) to the
                   child's process group (the faults kill and pause)
  hold             after the child's next exit, report it and wait for
                   `restart` instead of ending (the fault restart)
  restart          start the child again, same command line, same output

Two ways to say what to run:

  explicit (ssh):   role --name NAME [--announce-address FILE]
                         [--report-summary FILE] [--probe ADDR] [--mkdir DIR]
                         -- ARGV...
  by rank (mpirun, srun):
                    role --rank-from mpi|slurm --run-dir RUNDIR --build-dir DIR
                         [--skip NAME ...] [--debug]
      The rank (OMPI_COMM_WORLD_RANK, SLURM_PROCID, ...) picks the process:
      rank 0 is the coordinator, ranks 1..C its standbys
      (coordinator.standbys), then the servers, then the workers
      (local.carried_names). RUNDIR, on a file system every node shares,
      holds config.yaml, written by the launcher; the coordinator writes
      its address file there and the others wait for it (at most
      timeouts.assemble_seconds), then check that the address answers.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import sys
import time
from pathlib import Path
from typing import Optional

from . import REPO_ROOT
from .config import load_config
from .console import Console
from .job import (Binaries, RunLayout, carried_names, process_argv, process_env, read_address, resolve_build_dir,
                  resolve_host)
from .processes import ADDRESS_TAG, CONTROL_TAG, EXIT_TAG, PID_TAG, SUMMARY_TAG, ProcessSpec
from .supervisor import Supervisor

#: The tessera-launch program; carriers run `PYTHON LAUNCHER role ...`.
LAUNCHER = REPO_ROOT / "launcher" / "tessera-launch"

#: Where each way of starting ranks puts a process's rank and the number of ranks.
RANK_VARIABLES = {
    "mpi": (("OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK"), ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE")),
    "slurm": (("SLURM_PROCID",), ("SLURM_NTASKS", "SLURM_NPROCS")),
}

#: Seconds a server or worker keeps trying to open a TCP connection to the
#: coordinator's address before it reports it unreachable.
PROBE_SECONDS = 10.0

EXIT_SETUP = 2


def role_command(job, rank_from: str, python: str = sys.executable) -> list:
    """The command every rank of an mpirun or srun job runs."""
    argv = [python, str(LAUNCHER), "role", "--rank-from", rank_from, "--run-dir", str(job.layout.root),
            "--build-dir", str(job.binaries.coordinator.parent.parent)]
    for name in job.skips:
        argv += ["--skip", name]
    return argv + (["--debug"] if job.debug else [])


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--name", help="explicit: the process's name (coordinator, server-R, worker-R)")
    parser.add_argument("--rank-from", choices=sorted(RANK_VARIABLES),
                        help="by rank: take the rank from the environment of this launcher of ranks")
    parser.add_argument("--run-dir", help="by rank: the shared run directory (holds config.yaml)")
    parser.add_argument("--build-dir", help="by rank: the build tree")
    parser.add_argument("--skip", action="append", default=[], metavar="NAME",
                        help="by rank: exit 0 at once if this rank is NAME")
    parser.add_argument("--debug", action="store_true", help="by rank: pass --debug")
    parser.add_argument("--announce-address", metavar="FILE",
                        help="print the address written to FILE as TESSERA_ADDRESS once it appears")
    parser.add_argument("--report-summary", metavar="FILE",
                        help="at the end, print FILE's JSON content as TESSERA_SUMMARY")
    parser.add_argument("--probe", metavar="ADDR",
                        help="explicit: first check that a TCP connection to the coordinator ADDR opens")
    parser.add_argument("--mkdir", action="append", default=[], metavar="DIR",
                        help="create DIR (and its parents) first")
    parser.add_argument("--env", action="append", default=[], metavar="KEY=VALUE",
                        help="set a variable in the child's environment")
    parser.add_argument("--watch-stdin", action="store_true",
                        help="stop the child when stdin reaches end-of-file")
    parser.add_argument("--grace", type=float, default=3.0, help="seconds between SIGTERM and SIGKILL")
    parser.add_argument("argv", nargs=argparse.REMAINDER, help="explicit: -- the command")


def main_role(args: argparse.Namespace) -> int:
    """Runs one job process; returns this program's exit status."""
    watcher = _Control(args.watch_stdin)
    for directory in args.mkdir:
        Path(directory).mkdir(parents=True, exist_ok=True)
    argv = args.argv[1:] if args.argv[:1] == ["--"] else args.argv
    env = dict(item.partition("=")[::2] for item in args.env)
    if args.rank_from:
        return _run_by_rank(args, env, watcher)
    if not args.name or not argv:
        print("tessera-launch role: error: give --name NAME -- ARGV, or --rank-from", flush=True)
        return EXIT_SETUP
    problem = probe(args.probe, PROBE_SECONDS) if args.probe else None
    if problem:
        return _fail(args.name, f"cannot reach the coordinator at {args.probe} from {socket.gethostname()}: "
                                f"{problem}")
    announce = Path(args.announce_address) if args.announce_address else None
    summary = Path(args.report_summary) if args.report_summary else None
    return run_child(args.name, argv, env, watcher, announce, summary, args.grace)


class _Control:
    """The launcher's side of this process: commands for it (stdin lines
    with watch_stdin, or lines appended to a control file) and the signs
    that it has been left alone (its parent changed, or with watch_stdin
    its stdin reached end-of-file). Called as the Supervisor's
    abandon_check, at every turn of its loop."""

    def __init__(self, watch_stdin: bool):
        self.parent = os.getppid()
        self.watch_stdin = watch_stdin
        self.name: Optional[str] = None  # commands for this member only
        self.control_file: Optional[Path] = None
        self._file_offset = 0
        self._pending = b""
        self._closed = False
        self.commands: list = []  # (command, argument) not yet acted on
        if watch_stdin:
            os.set_blocking(sys.stdin.fileno(), False)

    def _take(self, data: bytes) -> None:
        self._pending += data
        *lines, self._pending = self._pending.split(b"\n")
        for raw in lines:
            words = raw.decode("utf-8", errors="replace").split()
            if len(words) >= 3 and words[0] == CONTROL_TAG and words[1] == self.name:
                self.commands.append((words[2], words[3] if len(words) > 3 else ""))

    def _read(self) -> None:
        if self.watch_stdin and not self._closed:
            try:
                while True:
                    data = os.read(sys.stdin.fileno(), 4096)
                    if not data:
                        self._closed = True
                        break
                    self._take(data)
            except BlockingIOError:
                pass
        if self.control_file is not None:
            try:
                with open(self.control_file, "rb") as f:
                    f.seek(self._file_offset)
                    data = f.read()
            except OSError:
                data = b""
            if data:
                self._file_offset += len(data)
                self._take(data)

    def __call__(self) -> Optional[str]:
        self._read()
        if os.getppid() != self.parent:
            return "the process that started this one is gone"
        if self._closed:
            return "the connection to the launcher is closed"
        return None


def _emit(name: str, text: str) -> None:
    """One member line on stdout; a closed stdout is ignored."""
    try:
        sys.stdout.write(f"[{name}] {text}\n")
        sys.stdout.flush()
    except (BrokenPipeError, ValueError, OSError):
        pass


#: Seconds between two looks at the control channel.
CONTROL_POLL_SECONDS = 0.05


def run_child(name: str, argv: list, env: dict, watcher: _Control, announce: Optional[Path],
              summary: Optional[Path], grace: float) -> int:
    """Runs the child (again after each exit the launcher holds it for),
    reporting its pid, its exit and, for the coordinator, its address and
    summary. Returns 0: everything the launcher needs was reported."""
    watcher.name = name
    while True:
        held = {"hold": False}  # set by a `hold` command while this child runs
        with Supervisor(None, Console(sys.stdout), grace_seconds=grace, settle_seconds=0,
                        abandon_check=watcher) as sup:

            def act() -> float:
                while watcher.commands:
                    command, argument = watcher.commands.pop(0)
                    if command == "signal":
                        try:
                            sup.signal_process(name, signal.Signals[argument])
                        except KeyError:
                            _emit(name, f"ERROR unknown signal {argument!r} from the launcher")
                    elif command == "hold":
                        held["hold"] = True
                return CONTROL_POLL_SECONDS

            sup.timers.append(act)
            if sup.start(ProcessSpec(name, argv, env={"PYTHONUNBUFFERED": "1", **env})):
                _emit(name, f"{PID_TAG} {sup.pid_of(name)}")
                if announce is not None:
                    if sup.wait_until(lambda: read_address(announce) is not None, None) == "satisfied":
                        _emit(name, f"{ADDRESS_TAG} {read_address(announce)}")
                    announce = None  # once: a restarted coordinator keeps its address
            outcome = sup.run()
        code = outcome.exit_codes.get(name)
        if outcome.status == "interrupted" or not held["hold"]:
            break
        _emit(name, f"{EXIT_TAG} {code if code is not None else 127}")
        if not _wait_for_restart(watcher):
            return 0
    if summary is not None:
        try:
            data = json.loads(summary.read_text(encoding="utf-8"))
            _emit(name, f"{SUMMARY_TAG} {json.dumps(data, separators=(',', ':'))}")
        except (OSError, ValueError):
            pass
    _emit(name, f"{EXIT_TAG} {code if code is not None else 127}")
    return 0


def _wait_for_restart(watcher: _Control) -> bool:
    """Waits for `restart` (True) while nothing tells this process to end
    (False: a stop signal, or the launcher is gone)."""
    stop = []
    previous = {s: signal.signal(s, lambda signum, _frame: stop.append(signum))
                for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)}
    try:
        while not stop and watcher() is None:
            while watcher.commands:
                command, _ = watcher.commands.pop(0)
                if command == "restart":
                    return True
            time.sleep(CONTROL_POLL_SECONDS)
        return False
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


def rank_from_environment(kind: str, environ=os.environ) -> tuple:
    """(rank, size) as the launcher of ranks set them; raises ValueError."""
    rank_names, size_names = RANK_VARIABLES[kind]
    values = []
    for names in (rank_names, size_names):
        found = next((environ[n] for n in names if n in environ), None)
        if found is None or not found.isdigit():
            raise ValueError(f"none of {', '.join(names)} is set to a number")
        values.append(int(found))
    return values[0], values[1]


def _fail(name: str, message: str) -> int:
    """Reports a member that could not start; 0: its fate is reported."""
    _emit(name, f"ERROR {message}")
    _emit(name, f"{EXIT_TAG} 1")
    return 0


def _run_by_rank(args: argparse.Namespace, env: dict, watcher: _Control) -> int:
    if not args.run_dir:
        print("tessera-launch role: error: --rank-from needs --run-dir", flush=True)
        return EXIT_SETUP
    layout = RunLayout(Path(args.run_dir).resolve())
    try:
        config = load_config(layout.config)
        rank, size = rank_from_environment(args.rank_from)
    except Exception as e:  # noqa: BLE001 - any problem ends this rank with a message
        print(f"tessera-launch role: error: {e}", flush=True)
        return EXIT_SETUP
    names = carried_names(config)
    if size != len(names) or rank >= len(names):
        print(f"tessera-launch role: error: started as rank {rank} of {size}, but the job has {len(names)} "
              f"processes (1 coordinator, {config.coordinator.standbys} standbys, {config.cluster.servers} servers, "
              f"{config.cluster.workers} workers)",
              flush=True)
        return EXIT_SETUP
    name = names[rank]
    if name in args.skip:
        print(f"[launch] not starting {name} (--skip)", flush=True)
        return 0
    watcher.control_file = layout.control_file(name)
    binaries = Binaries.locate(resolve_build_dir(args.build_dir), config.worker.program)
    host = resolve_host(config.cluster.host)
    # The host's name joins the shared-memory host identity (--host_id,
    # transport/transport_flags.h).
    node = os.environ.get("SLURMD_NODENAME") or socket.gethostname()
    env = {**env, **process_env(config, layout, binaries)}
    if name.startswith("coordinator"):  # the coordinator, or a standby (coordinator-S)
        argv = process_argv(config, binaries, layout, name, "", args.debug, host, host_id=node)
        announce = layout.address_file if name == "coordinator" else None
        return run_child(name, argv, env, watcher, announce, None, args.grace)
    address = _wait_for_address(layout.address_file, config.timeouts.assemble_seconds, watcher)
    if address is None:
        return _fail(name, f"no coordinator address in {layout.address_file} after "
                           f"{config.timeouts.assemble_seconds:g} s (is the run directory on a file system "
                           "every node shares?)")
    problem = probe(address, min(PROBE_SECONDS, config.timeouts.assemble_seconds))
    if problem:
        return _fail(name, f"cannot reach the coordinator at {address} from {socket.gethostname()}: {problem}")
    argv = process_argv(config, binaries, layout, name, address, args.debug, host, bind_workers=True, host_id=node)
    return run_child(name, argv, env, watcher, None, None, args.grace)


def _wait_for_address(path: Path, seconds: float, watcher: _Control) -> Optional[str]:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and watcher() is None:
        address = read_address(path)
        if address:
            return address
        time.sleep(0.1)
    return None


def probe(address: str, seconds: float) -> Optional[str]:
    """None if a TCP connection to a tcp:// address opens within `seconds`
    (ipc addresses are not probed), else why not."""
    if not address.startswith("tcp://"):
        return None
    host, _, port = address[len("tcp://"):].rpartition(":")
    deadline = time.monotonic() + seconds
    while True:
        try:
            with socket.create_connection((host.strip("[]"), int(port)), timeout=2):
                return None
        except (OSError, ValueError) as e:
            if time.monotonic() >= deadline:
                return getattr(e, "strerror", None) or str(e)
        time.sleep(0.2)

"""The `local` back-end: a whole job as processes on this machine.

Order of events (docs/launcher.md has the user's view):
  1. load and validate the config, check the skip list and the binaries;
     any problem raises ConfigError or SetupError before anything starts;
  2. make the run directory and write the resolved config.yaml into it;
  3. start the coordinator and wait (at most timeouts.assemble_seconds) for
     it to write its address file;
  4. start the servers, then the workers, each told the coordinator's
     address, leaving out the processes named by --skip;
  5. supervise until the coordinator finishes, something fails, the job
     times out or the launcher is interrupted;
  6. write summary.json, print the final block, return the exit code.
"""

from __future__ import annotations

import datetime
import os
import re
import shlex
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional, TextIO

from . import REPO_ROOT
from .config import JobConfig, load_config
from .summary import build_summary, format_report, read_coordinator_summary, write_summary
from .supervisor import Console, ProcessSpec, ProgressTracker, Supervisor

#: Exit codes of tessera-launch.
EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2  # bad config, arguments or setup: nothing was started
EXIT_TIMEOUT = 124

#: Seconds every process gets between SIGTERM and SIGKILL.
STOP_GRACE_SECONDS = 3.0
#: Seconds servers and workers get to exit by themselves after the
#: coordinator has finished, before they are stopped.
SHUTDOWN_GRACE_SECONDS = 10.0
#: Added to the assemble time to form the servers' --connect-timeout, so
#: that the coordinator, which knows who is missing, reports first.
CONNECT_TIMEOUT_MARGIN_SECONDS = 5.0
#: Longest path of a Unix domain socket (sun_path less the terminating NUL).
MAX_IPC_PATH = 107

_SKIP_RE = re.compile(r"^(server|worker)-(\d+)$")


class SetupError(Exception):
    """The job cannot be set up (missing binary, bad --skip, unusable run
    directory); nothing was started."""


@dataclass
class LocalOptions:
    """The `tessera-launch local` arguments."""

    config: str
    run_dir: Optional[str] = None
    build_dir: Optional[str] = None
    overrides: list = field(default_factory=list)
    skip: list = field(default_factory=list)
    timeout: Optional[float] = None
    quiet: bool = False
    debug: bool = False
    dry_run: bool = False
    stream: Optional[TextIO] = None  # the terminal; default sys.stdout


# --------------------------------------------------------------------------
# Where things are
# --------------------------------------------------------------------------


def resolve_build_dir(flag: Optional[str], environ=os.environ) -> Path:
    """--build-dir, else $TESSERA_BUILD_DIR, else <repo>/build."""
    if flag:
        return Path(flag).resolve()
    if environ.get("TESSERA_BUILD_DIR"):
        return Path(environ["TESSERA_BUILD_DIR"]).resolve()
    return REPO_ROOT / "build"


@dataclass(frozen=True)
class Binaries:
    """The three executables a job runs."""

    coordinator: Path
    server: Path
    program: Path

    @classmethod
    def locate(cls, build_dir: Path, program: str) -> "Binaries":
        """Binaries in the build tree; a program containing '/' is a path
        (relative to the current directory) and is used as is."""
        program_path = Path(program).resolve() if "/" in program else build_dir / "examples" / program
        return cls(
            coordinator=build_dir / "coordinator" / "tessera-coordinator",
            server=build_dir / "server" / "tessera-server",
            program=program_path,
        )

    def problems(self) -> list:
        """One line per binary that is missing or not executable."""
        found = []
        for role, path in (("coordinator", self.coordinator), ("server", self.server),
                           ("worker program", self.program)):
            if not path.is_file():
                found.append(f"{role} not found: {path}")
            elif not os.access(path, os.X_OK):
                found.append(f"{role} is not executable: {path}")
        return found


class RunLayout:
    """The paths inside a run directory (docs/launcher.md, "Run directory").
    The root is absolute for a real run, since the paths are handed to
    processes."""

    def __init__(self, root: Path):
        self.root = Path(root)
        self.config = self.root / "config.yaml"
        self.address_file = self.root / "coordinator.address"
        self.coordinator_summary = self.root / "coordinator-summary.json"
        self.progress = self.root / "progress.jsonl"
        self.summary = self.root / "summary.json"
        self.logs = self.root / "logs"
        self.launcher_log = self.logs / "launcher.log"
        self.sockets = self.root / "sock"

    def socket(self, name: str) -> Path:
        return self.sockets / f"{name}.sock"


def create_run_dir(requested: Optional[str], job_name: str, now: datetime.datetime) -> Path:
    """Makes the run directory: `requested` (which must not exist or be
    empty), else runs/<job>-<YYYYmmdd-HHMMSS> under the current directory,
    with -2, -3, ... appended if that exists already."""
    if requested:
        path = Path(requested)
        if path.exists() and (not path.is_dir() or any(path.iterdir())):
            raise SetupError(f"run directory {path} exists and is not empty; choose another --run-dir")
        path.mkdir(parents=True, exist_ok=True)
        return path
    base = Path("runs") / f"{job_name}-{now.strftime('%Y%m%d-%H%M%S')}"
    path, suffix = base, 1
    while True:
        try:
            path.mkdir(parents=True)
            return path
        except FileExistsError:
            suffix += 1
            path = base.with_name(f"{base.name}-{suffix}")


def parse_skips(names, config: JobConfig) -> list:
    """Validates --skip names (server-I or worker-I, with I in range)."""
    skips = []
    for name in names:
        match = _SKIP_RE.match(name)
        if not match:
            raise SetupError(f"--skip {name}: expected server-INDEX or worker-INDEX (the coordinator cannot be skipped)")
        role, index = match.group(1), int(match.group(2))
        count = config.cluster.servers if role == "server" else config.cluster.workers
        if index >= count:
            raise SetupError(f"--skip {name}: the job has {count} {role}s ({role}-0 to {role}-{count - 1})")
        if name not in skips:
            skips.append(name)
    return skips


# --------------------------------------------------------------------------
# Command lines (the process contract, docs/launcher.md)
# --------------------------------------------------------------------------


def _seconds(value: float) -> str:
    """A number of seconds as a flag value: "30", "0.5"."""
    return str(int(value)) if float(value).is_integer() else repr(float(value))


def _flag_value(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def bind_address(config: JobConfig, layout: RunLayout, name: str) -> str:
    """tcp://HOST:0 (the OS picks the port), or ipc://RUNDIR/sock/NAME.sock."""
    if config.cluster.transport == "tcp":
        return f"tcp://{config.cluster.host}:0"
    path = layout.socket(name)
    if len(str(path)) > MAX_IPC_PATH:
        raise SetupError(f"ipc socket path too long ({len(str(path))} > {MAX_IPC_PATH} bytes): {path}; "
                         "use a shorter --run-dir")
    return f"ipc://{path}"


def coordinator_argv(config: JobConfig, binaries: Binaries, layout: RunLayout, debug: bool) -> list:
    t = config.timeouts
    argv = [
        str(binaries.coordinator),
        "--bind", bind_address(config, layout, "coordinator"),
        "--address-file", str(layout.address_file),
        "--servers", str(config.cluster.servers),
        "--workers", str(config.cluster.workers),
        "--vshards", str(config.cluster.vshards),
        "--assemble-timeout", _seconds(t.assemble_seconds),
        "--heartbeat-interval", _seconds(t.heartbeat_seconds),
        "--lease", _seconds(t.lease_seconds),
        "--on-worker-loss", config.cluster.on_worker_loss,
        "--rejoin-timeout", _seconds(t.rejoin_seconds),
        "--summary-file", str(layout.coordinator_summary),
        "--name", "coordinator",
    ]
    return argv + (["--debug"] if debug else [])


def server_argv(config: JobConfig, binaries: Binaries, layout: RunLayout, rank: int,
                address: str, debug: bool) -> list:
    name = f"server-{rank}"
    argv = [
        str(binaries.server),
        "--coordinator", address,
        "--rank", str(rank),
        "--bind", bind_address(config, layout, name),
        "--name", name,
        "--connect-timeout", _seconds(config.timeouts.assemble_seconds + CONNECT_TIMEOUT_MARGIN_SECONDS),
    ]
    return argv + (["--debug"] if debug else [])


def worker_argv(config: JobConfig, binaries: Binaries, layout: RunLayout, rank: int, address: str) -> list:
    name = f"worker-{rank}"
    argv = [str(binaries.program), "--coordinator", address, "--rank", str(rank), "--name", name]
    if config.cluster.transport == "ipc":
        argv += ["--bind", bind_address(config, layout, name)]
    for key, value in config.worker.args.items():
        argv += [f"--{key}", _flag_value(value)]
    return argv


# --------------------------------------------------------------------------
# Running
# --------------------------------------------------------------------------


def _read_address(path: Path) -> Optional[str]:
    try:
        address = path.read_text(encoding="utf-8").strip()
    except OSError:
        return None
    return address if address.startswith(("tcp://", "ipc://")) else None


def _remaining(deadline: Optional[float]) -> Optional[float]:
    return None if deadline is None else max(0.0, deadline - time.monotonic())


def _start_coordinator(sup: Supervisor, config: JobConfig, binaries: Binaries, layout: RunLayout,
                       debug: bool, deadline: Optional[float]) -> Optional[str]:
    """Starts the coordinator and waits for its address; None if the job
    ended instead (the supervisor's outcome says why)."""
    if not sup.start(ProcessSpec("coordinator", coordinator_argv(config, binaries, layout, debug))):
        return None
    assemble = config.timeouts.assemble_seconds
    remaining = _remaining(deadline)
    limit = assemble if remaining is None else min(assemble, remaining)
    waited = sup.wait_until(layout.address_file.exists, limit)
    if waited == "satisfied":
        address = _read_address(layout.address_file)
        if address:
            sup.console.say(f"coordinator is at {address}")
            return address
        sup.stop("failed", f"the coordinator wrote an invalid address to {layout.address_file}", "coordinator")
    elif waited == "timeout" and remaining is not None and remaining <= assemble:
        sup.stop("timeout", f"timed out after {sup.elapsed():.1f} s; still running: coordinator")
    elif waited == "timeout":
        sup.stop("failed", f"the coordinator did not write its address file within {assemble:g} s", "coordinator")
    elif sup.outcome is None:  # it exited with status 0 before writing
        sup.stop("failed", "the coordinator exited before writing its address file", "coordinator")
    return None


def _start_cluster(sup: Supervisor, config: JobConfig, binaries: Binaries, layout: RunLayout,
                   address: str, skips: list, debug: bool) -> None:
    env = {"PYTHONUNBUFFERED": "1"}
    specs = [ProcessSpec(f"server-{r}", server_argv(config, binaries, layout, r, address, debug), env=env)
             for r in range(config.cluster.servers)]
    specs += [ProcessSpec(f"worker-{r}", worker_argv(config, binaries, layout, r, address), rank=r, env=env,
                       may_fail=config.cluster.on_worker_loss in ("continue", "wait"))
              for r in range(config.cluster.workers)]
    for spec in specs:
        if spec.name in skips:
            sup.console.say(f"not starting {spec.name} (--skip)")
            sup.note_skipped(spec.name)
        elif not sup.start(spec):
            return


def _print_plan(config: JobConfig, binaries: Binaries, skips: list, console: Console, debug: bool) -> None:
    """--dry-run: the command lines that would run."""
    layout = RunLayout(Path("RUNDIR"))
    address = "<coordinator-address>"
    console.say(f"dry run of job {config.job.name}: nothing is started")
    for problem in binaries.problems():
        console.say(f"warning: {problem}")
    plan = [("coordinator", coordinator_argv(config, binaries, layout, debug))]
    plan += [(f"server-{r}", server_argv(config, binaries, layout, r, address, debug))
             for r in range(config.cluster.servers)]
    plan += [(f"worker-{r}", worker_argv(config, binaries, layout, r, address))
             for r in range(config.cluster.workers)]
    for name, argv in plan:
        note = "  # skipped" if name in skips else ""
        console.block([f"{name}: {shlex.join(argv)}{note}"])


def process_names(config: JobConfig) -> list:
    """Every process of the job, in start order."""
    return (["coordinator"] + [f"server-{r}" for r in range(config.cluster.servers)]
            + [f"worker-{r}" for r in range(config.cluster.workers)])


def _prepare_run_dir(requested: Optional[str], config: JobConfig, now: datetime.datetime) -> RunLayout:
    """Creates the run directory with logs/ (and sock/ for ipc) and the
    resolved config.yaml. Raises SetupError, leaving nothing behind, if the
    ipc socket paths would be too long."""
    layout = RunLayout(create_run_dir(requested, config.job.name, now).resolve())
    if config.cluster.transport == "ipc":
        try:
            for name in process_names(config):
                bind_address(config, layout, name)
        except SetupError:
            layout.root.rmdir()
            raise
        layout.sockets.mkdir()
    layout.logs.mkdir()
    layout.config.write_text(config.to_yaml(), encoding="utf-8")
    return layout


def _exit_code(summary: dict, outcome) -> int:
    if summary["status"] == "ok":
        return EXIT_OK
    if outcome.status == "interrupted" and outcome.signal:
        return 128 + outcome.signal
    if outcome.status == "timeout":
        return EXIT_TIMEOUT
    return EXIT_FAILED


def _tails_for_report(sup: Supervisor, outcome) -> dict:
    """Whose last lines the failure report shows: the culprit's, and the
    coordinator's if it failed by itself or the job timed out (it knows
    whom it was waiting for)."""
    names = [outcome.culprit] if outcome.culprit else []
    coordinator_failed = (outcome.exit_codes.get("coordinator") not in (0, None)
                          and "coordinator" not in outcome.stopped)
    if (coordinator_failed or outcome.status == "timeout") and "coordinator" not in names:
        names.append("coordinator")
    return {name: sup.tail(name)[-10:] for name in names}


def run_local(options: LocalOptions) -> int:
    """Runs one job on this machine; returns the launcher's exit code.

    Raises ConfigError or SetupError (nothing started) for bad input.
    """
    config = load_config(options.config, options.overrides)
    skips = parse_skips(options.skip, config)
    binaries = Binaries.locate(resolve_build_dir(options.build_dir), config.worker.program)
    stream = options.stream if options.stream is not None else sys.stdout
    if options.dry_run:
        _print_plan(config, binaries, skips, Console(stream), options.debug)
        return EXIT_OK
    problems = binaries.problems()
    if problems:
        raise SetupError("\n".join(problems) + "\n(build the project, or point --build-dir / "
                         "TESSERA_BUILD_DIR at a build tree)")

    started_wall = datetime.datetime.now().astimezone()
    started = time.monotonic()
    layout = _prepare_run_dir(options.run_dir, config, started_wall)
    deadline = None if options.timeout is None else started + options.timeout

    console = Console(stream, layout.launcher_log, echo_processes=not options.quiet)
    tracker = ProgressTracker(layout.progress)
    try:
        console.say(f"job {config.job.name}: {config.cluster.servers} servers, {config.cluster.workers} "
                    f"workers over {config.cluster.transport}; run directory {layout.root}")
        outcome, tails, results = _supervise(config, binaries, layout, skips, options, deadline, console, tracker)
        coordinator, coordinator_error = read_coordinator_summary(layout.coordinator_summary)
        summary = build_summary(
            job_name=config.job.name, run_dir=layout.root, config_source=config.source,
            worker_count=config.cluster.workers, server_count=config.cluster.servers,
            outcome=outcome, coordinator=coordinator, coordinator_error=coordinator_error,
            results_by_rank=results, wall_seconds=time.monotonic() - started,
            started_at=started_wall.isoformat(timespec="seconds"),
            finished_at=datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
            skipped=skips,
        )
        write_summary(summary, layout.summary)
        console.block(format_report(summary, tails if summary["status"] != "ok" else None))
        return _exit_code(summary, outcome)
    finally:
        tracker.close()
        console.close()


def _supervise(config: JobConfig, binaries: Binaries, layout: RunLayout, skips: list,
               options: LocalOptions, deadline: Optional[float], console: Console,
               tracker: ProgressTracker) -> tuple:
    """Starts and supervises the job until it ends. Returns (Outcome with an
    exit code for every process of the job, last lines to show by process
    name, TESSERA_RESULT objects by worker rank)."""
    with Supervisor(layout.logs, console, tracker, grace_seconds=STOP_GRACE_SECONDS) as sup:
        address = _start_coordinator(sup, config, binaries, layout, options.debug, deadline)
        if address is None:
            outcome = sup.outcome
        else:
            _start_cluster(sup, config, binaries, layout, address, skips, options.debug)
            outcome = sup.run(timeout=_remaining(deadline), leader="coordinator",
                              leader_grace=SHUTDOWN_GRACE_SECONDS)
        outcome.exit_codes = {name: outcome.exit_codes.get(name) for name in process_names(config)}
        return outcome, _tails_for_report(sup, outcome), sup.results_by_rank()

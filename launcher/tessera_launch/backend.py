"""Running a job: what every supervising back-end shares.

`run_job` is what every supervising back-end shares; a Backend says only how
the processes start (local.LocalBackend; mpirun.py, slurm.py and ssh.py for
the others). The back-ends that start job processes through a carrier
(mpirun, srun, ssh running `tessera-launch role`; supervisor.py) do it with
launch_carried and wait for the coordinator with await_announced_address.
The job, its run directory and its command lines come from job.py; the
rules the supervision follows (grace periods, who may fail, exit codes)
from policy.py. Used by cli.py, local.py, mpirun.py, slurm.py and ssh.py.

Order of events (docs/launcher.md has the user's view):
  1. load and validate the config, check the skip list and the binaries;
     any problem raises ConfigError or SetupError before anything starts;
  2. make the run directory and write the resolved config.yaml into it;
  3. start the coordinator and wait (at most timeouts.assemble_seconds) for
     it to write its address file;
  4. start the servers, then the workers, each told the coordinator's
     address, leaving out the processes named by --skip;
  5. supervise until the coordinator finishes, something fails, the job
     times out or the launcher is interrupted, firing the config's faults
     (faults.py) on the way, once every process has started;
  6. write summary.json (with what followed each fault, read from the logs
     by fault_logs.py), print the final block, return the exit code.
"""

from __future__ import annotations

import abc
import datetime
import shlex
import sys
import time
from pathlib import Path
from typing import Optional

from .console import Console, ProgressTracker
from .fault_logs import analyze_all, read_logs
from .faults import FaultScheduler
from .job import (Job, LocalOptions, SetupError, coordinator_names, describe_transport, load_job, process_argv,
                  process_names, time_left, start_run, transport_flags, worker_rank)
from .policy import (CARRIER_STOP_GRACE_SECONDS, EXIT_OK, SHUTDOWN_GRACE_SECONDS, STOP_GRACE_SECONDS, exit_code,
                     may_fail)
from .processes import ADDRESS_TAG, CONTROL_STDIN, SUMMARY_TAG, Member, ProcessSpec
from .summary import build_summary, format_report, read_coordinator_summary, write_summary, write_text_atomically
from .supervisor import Supervisor


class Backend(abc.ABC):
    """How a job's processes are started. run_job does everything else:
    config, run directory, supervision, summary. Subclasses may override
    `check` and `plan` and must define `launch`."""

    #: The subcommand.
    name = "local"

    def check(self, job: Job) -> None:
        """Raises SetupError for anything that would stop the job from
        starting; runs before the run directory is made (job.layout is then
        a placeholder). Default: the binaries must be here."""
        problems = job.binaries.problems()
        if problems:
            raise SetupError("\n".join(problems) + "\n(build the project, or point --build-dir / "
                             "TESSERA_BUILD_DIR at a build tree)")

    def plan(self, job: Job) -> list:
        """--dry-run: (name, argv) of everything that would be started."""
        return [(name, process_argv(job.config, job.binaries, job.layout, name, "<coordinator-address>",
                                    job.debug))
                for name in process_names(job.config)]

    @abc.abstractmethod
    def launch(self, sup: Supervisor, job: Job) -> None:
        """Starts the job's processes under `sup`; returns when they are
        started or the job has already ended (sup.outcome is then set)."""


def launch_carried(sup: Supervisor, job: Job, carrier: str, argv: list, members: list,
                   env: Optional[dict] = None, keep_stdin: bool = False, control=None) -> bool:
    """Starts a carrier (see supervisor.py) for the job processes named in
    `members`; those named by --skip are recorded as skipped. `control`:
    the carrier's control channel (CONTROL_STDIN, or the run directory's
    control/ directory, made here). False if the job has ended."""
    for name in members:
        if name in job.skips:
            sup.note_skipped(name)
    carried = [Member(name, worker_rank(name), may_fail(job.config, name)) for name in members
               if name not in job.skips]
    if control is not None and control != CONTROL_STDIN:
        Path(control).mkdir(parents=True, exist_ok=True)
    return sup.start(ProcessSpec(carrier, argv, env=dict(env or {}), members=carried, keep_stdin=keep_stdin,
                                 stop_grace=CARRIER_STOP_GRACE_SECONDS, control=control))


def await_announced_address(sup: Supervisor, job: Job, how: str) -> Optional[str]:
    """Waits (at most timeouts.assemble_seconds, or what is left of
    --timeout) for the coordinator to announce its address through its
    carrier; ends the job, failed, if it does not. `how` names what starts
    the coordinator, for the message."""
    def announced():
        return sup.notices.get("coordinator", {}).get(ADDRESS_TAG)

    assemble = job.config.timeouts.assemble_seconds
    remaining = time_left(job.deadline)
    limit = assemble if remaining is None else min(assemble, remaining)
    waited = sup.wait_until(lambda: announced() is not None, limit)
    if waited == "satisfied":
        sup.console.say(f"coordinator is at {announced()}")
        return announced()
    if waited == "timeout" and remaining is not None and remaining <= assemble:
        sup.stop("timeout", f"timed out after {sup.elapsed():.1f} s; still running: "
                            f"{', '.join(sup.running_names())}")
    elif waited == "timeout":
        sup.stop("failed", f"the coordinator was not running within {assemble:g} s ({how}); see "
                           f"{job.layout.logs}", "coordinator")
    elif sup.outcome is None:
        sup.stop("failed", f"the coordinator ended before announcing its address ({how})", "coordinator")
    return None


def _print_plan(backend: Backend, job: Job, console: Console) -> None:
    """--dry-run: the command lines that would run."""
    console.say(f"dry run of job {job.config.job.name} ({backend.name}): nothing is started")
    for problem in job.binaries.problems():
        console.say(f"warning: {problem}")
    flags = transport_flags(job.config, job.layout)
    console.block(["transport flags of every process (also in the command lines below): "
                   + (shlex.join(flags) if flags else "none (the binaries' defaults)")])
    for name, argv in backend.plan(job):
        note = "  # skipped" if name in job.skips else ""
        console.block([f"{name}: {shlex.join(argv)}{note}"])
    for spec in job.config.faults:
        console.block([f"{spec.describe()}"])


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


def run_job(options: LocalOptions, backend: Backend) -> int:
    """Runs one job through `backend`; returns the launcher's exit code.

    Raises ConfigError or SetupError (nothing started) for bad input.
    """
    job = load_job(options)
    stream = options.stream if options.stream is not None else sys.stdout
    if options.dry_run:
        _print_plan(backend, job, Console(stream))
        return EXIT_OK
    backend.check(job)

    started = time.monotonic()
    started_wall = start_run(job, options.run_dir, options.existing_run_dir)
    config, layout = job.config, job.layout
    job.deadline = None if options.timeout is None else started + options.timeout

    console = Console(stream, layout.launcher_log, echo_processes=not options.quiet)
    tracker = ProgressTracker(layout.progress)
    try:
        console.say(f"job {config.job.name}: {config.cluster.servers} servers, {config.cluster.workers} "
                    f"workers over {describe_transport(config)} ({backend.name}); run directory {layout.root}")
        if not config.security.curve:
            console.say("warning: security.curve is false: the job's ports are open to anyone who can reach "
                        "them (docs/security.md)")
        outcome, tails, results, faults = _supervise(backend, job, options, console, tracker)
        coordinator, coordinator_error = read_coordinator_summary(layout.coordinator_summary)
        summary = build_summary(
            job_name=config.job.name, run_dir=layout.root, config_source=config.source,
            worker_count=config.cluster.workers, server_count=config.cluster.servers,
            outcome=outcome, coordinator=coordinator, coordinator_error=coordinator_error,
            results_by_rank=results, wall_seconds=time.monotonic() - started,
            started_at=started_wall.isoformat(timespec="seconds"),
            finished_at=datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
            skipped=job.skips,
        )
        if faults:
            summary["faults"] = analyze_all(faults, read_logs(layout.logs), config.cluster.on_worker_loss,
                                            job_ok=summary["status"] == "ok")
        write_summary(summary, layout.summary)
        console.block(format_report(summary, tails if summary["status"] != "ok" else None))
        return exit_code(summary, outcome)
    finally:
        tracker.close()
        console.close()


def _supervise(backend: Backend, job: Job, options: LocalOptions, console: Console,
               tracker: ProgressTracker) -> tuple:
    """Starts and supervises the job until it ends. Returns (Outcome with an
    exit code for every process of the job, last lines to show by process
    name, TESSERA_RESULT objects by worker rank, the config's faults as
    FaultScheduler.records()). A coordinator summary announced by a carried
    coordinator (whose run directory is elsewhere) is written to this run
    directory."""
    with Supervisor(job.layout.logs, console, tracker, grace_seconds=STOP_GRACE_SECONDS) as sup:
        scheduler = None
        if job.config.faults:
            scheduler = FaultScheduler(job.config.faults, sup, job.layout.events, tracker.started)
            scheduler.attach()
        backend.launch(sup, job)
        if scheduler is not None and sup.outcome is None:
            # Carried processes start on their hosts a moment after their
            # carriers: `at_seconds` counts from when every one has.
            sup.wait_until(sup.members_started, job.config.timeouts.assemble_seconds)
        outcome = sup.outcome
        if outcome is None:
            if scheduler is not None:
                scheduler.arm()
            outcome = sup.run(timeout=time_left(job.deadline), leader=coordinator_names(job.config),
                              leader_grace=SHUTDOWN_GRACE_SECONDS)
        else:
            sup.stop(outcome.status, outcome.reason)
        if scheduler is not None:
            scheduler.finish()
        outcome.exit_codes = {name: outcome.exit_codes.get(name) for name in process_names(job.config)}
        announced = sup.notices.get("coordinator", {}).get(SUMMARY_TAG)
        if announced is not None:
            write_text_atomically(job.layout.coordinator_summary, announced + "\n")
        faults = scheduler.records() if scheduler is not None else []
        return outcome, _tails_for_report(sup, outcome), sup.results_by_rank(), faults

"""The `local` back-end: a whole job on this machine.

Every process is a child of the launcher (LocalBackend): the coordinator
first, whose address the launcher reads from its address file in the run
directory, then its standbys, the servers and the workers. Everything else
is shared with the other supervising back-ends: the config, the run
directory and the command lines (job.py), the run and its summary
(backend.run_job), the rules the supervision follows (policy.py). Used by
cli.py (`tessera-launch local`).
"""

from __future__ import annotations

from typing import Optional

from .backend import Backend, run_job
from .job import (Job, LocalOptions, coordinator_names, process_argv, process_env, process_names, read_address,
                  time_left, worker_rank)
from .policy import may_fail
from .processes import ProcessSpec
from .supervisor import Supervisor

# Names that moved to job.py, policy.py and backend.py, still importable from
# here for code that imports them from tessera_launch.local (the launcher's
# tests, tests/launcher_e2e). The package's own modules import them from
# where they live.
from .backend import await_announced_address, launch_carried
from .job import (Binaries, RunLayout, SetupError, bind_address, carried_names, coordinator_argv, load_job,
                  resolve_build_dir, resolve_host, server_argv, start_run, transport_flags,
                  with_launcher_environment, worker_argv)
from .policy import EXIT_FAILED, EXIT_OK, EXIT_TIMEOUT, EXIT_USAGE, refuse_faults

__all__ = [
    # this module's own
    "LocalBackend", "run_local",
    # re-exported
    "Backend", "Job", "LocalOptions", "await_announced_address", "launch_carried", "run_job", "Binaries",
    "RunLayout", "SetupError", "bind_address", "carried_names", "coordinator_argv", "coordinator_names",
    "load_job", "process_argv", "process_env", "process_names", "read_address", "resolve_build_dir",
    "resolve_host", "server_argv", "start_run", "transport_flags", "with_launcher_environment", "worker_argv",
    "worker_rank", "may_fail", "EXIT_FAILED", "EXIT_OK", "EXIT_TIMEOUT", "EXIT_USAGE", "refuse_faults",
]


class LocalBackend(Backend):
    """Every process a child of the launcher, on this machine."""

    name = "local"

    def plan(self, job: Job) -> list:
        standbys = [(name, process_argv(job.config, job.binaries, job.layout, name, "", job.debug))
                    for name in coordinator_names(job.config)[1:]]
        plan = super().plan(job)
        return plan[:1] + standbys + plan[1:]

    def launch(self, sup: Supervisor, job: Job) -> None:
        address = _start_coordinator(sup, job)
        if address is None:
            return
        for name in coordinator_names(job.config)[1:]:
            argv = process_argv(job.config, job.binaries, job.layout, name, "", job.debug)
            if not sup.start(ProcessSpec(name, argv, env=process_env(job.config, job.layout, job.binaries),
                                         may_fail=may_fail(job.config, name))):
                return
        _start_cluster(sup, job, address)


def _start_coordinator(sup: Supervisor, job: Job) -> Optional[str]:
    """Starts the coordinator and waits for its address; None if the job
    ended instead (the supervisor's outcome says why)."""
    config, layout = job.config, job.layout
    if not sup.start(ProcessSpec("coordinator", process_argv(config, job.binaries, layout, "coordinator", "", job.debug),
                                 env=process_env(config, layout, job.binaries), may_fail=may_fail(config, "coordinator"))):
        return None
    assemble = config.timeouts.assemble_seconds
    remaining = time_left(job.deadline)
    limit = assemble if remaining is None else min(assemble, remaining)
    waited = sup.wait_until(layout.address_file.exists, limit)
    if waited == "satisfied":
        address = read_address(layout.address_file)
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


def _start_cluster(sup: Supervisor, job: Job, address: str) -> None:
    env = {"PYTHONUNBUFFERED": "1", **process_env(job.config, job.layout, job.binaries)}
    for name in process_names(job.config)[1:]:
        if name in job.skips:
            sup.console.say(f"not starting {name} (--skip)")
            sup.note_skipped(name)
            continue
        argv = process_argv(job.config, job.binaries, job.layout, name, address, job.debug)
        if not sup.start(ProcessSpec(name, argv, rank=worker_rank(name), env=env,
                                     may_fail=may_fail(job.config, name))):
            return


def run_local(options: LocalOptions) -> int:
    """Runs one job on this machine; returns the launcher's exit code."""
    return run_job(options, LocalBackend())

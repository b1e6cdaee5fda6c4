"""The supervision policy: the rules every back-end's job is judged by.

Whichever back-end starts the processes, the launcher ends and judges a job
the same way: the grace periods it gives processes to stop (their own, a
carrier's, and the servers' and workers' after the coordinator finished),
which processes may die without failing the job (may_fail: a process the
coordinator judges or replaces), what a back-end that does not supervise
its processes must refuse (refuse_faults), and the launcher's exit codes.
The Supervisor (supervisor.py) applies the rules to processes; it knows no
jobs. Used by backend.py (run_job, launch_carried), local.py, slurm.py,
kubernetes.py, doctor.py and cli.py.
"""

from __future__ import annotations

from .config import JobConfig
from .job import SetupError, worker_rank

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
#: Seconds between SIGTERM and SIGKILL for a carrier (mpirun, srun, ssh):
#: its members' own grace and some for the carrier to pass it on.
CARRIER_STOP_GRACE_SECONDS = STOP_GRACE_SECONDS + 5.0


def may_fail(config: JobConfig, name: str) -> bool:
    """Whether the process's failure is the coordinator's to judge (workers
    under on_worker_loss: continue or wait; servers when their shards have
    backups: the coordinator fails them over, or fails the job if a shard
    lost every copy)."""
    if worker_rank(name) is not None:
        return config.cluster.on_worker_loss in ("continue", "wait")
    if name.startswith("coordinator"):
        return config.coordinator.standbys > 0  # another takes over
    return (name.startswith("server-") and config.cluster.replication > 1 and config.cluster.servers > 1)


def refuse_faults(backend_name: str, config: JobConfig) -> None:
    """For a back-end that does not supervise the job's processes
    (kubernetes; every Backend here does): raises SetupError if the config
    has faults or standby coordinators, which need a supervising launcher."""
    if config.coordinator.standbys:
        raise SetupError(f"coordinator.standbys is {config.coordinator.standbys}, but {backend_name} does not "
                         "start standby coordinators; set it to 0 (the coordinator still keeps its state in etcd) "
                         "or run the job with local, ssh, slurm or mpirun")
    if config.faults:
        raise SetupError(f"the config lists {len(config.faults)} fault(s) (faults:), but {backend_name} does not "
                         "supervise the job's processes and cannot inject process faults; remove them or run the "
                         "job with local, ssh, slurm or mpirun")


def exit_code(summary: dict, outcome) -> int:
    """The launcher's exit code for a job that ran: its summary's status
    and how it ended (Outcome)."""
    if summary["status"] == "ok":
        return EXIT_OK
    if outcome.status == "interrupted" and outcome.signal:
        return 128 + outcome.signal
    if outcome.status == "timeout":
        return EXIT_TIMEOUT
    return EXIT_FAILED

"""The `mpirun` back-end: the whole job as one Open MPI launch.

One `mpirun -np N` starts `tessera-launch role --rank-from mpi` N times
(N = 1 + standby coordinators + servers + workers); rank 0 becomes the
coordinator, then the standbys, the servers and the workers
(job.carried_names, role.py). The ranks find the coordinator through its
address file in the run directory, which must therefore be on a file system
every host shares (always true on one host); the launcher's commands to
them (faults) go through files in RUNDIR/control/ (supervisor.py). The
processes do not use MPI themselves; mpirun only places and starts them.
"""

from __future__ import annotations

import os
import shutil
import socket
from pathlib import Path

from .backend import Backend, await_announced_address, launch_carried
from .job import Job, SetupError, carried_names
from .role import role_command
from .supervisor import Supervisor


class MpirunBackend(Backend):
    name = "mpirun"

    def check(self, job: Job) -> None:
        super().check(job)
        check_mpirun(job)

    def command(self, job: Job) -> list:
        settings = job.config.mpirun
        argv = [settings.command, "-np", str(len(carried_names(job.config)))]
        if settings.hostfile:
            argv += ["--hostfile", str(Path(settings.hostfile).resolve())]
        return argv + list(settings.args) + role_command(job, "mpi")

    def plan(self, job: Job) -> list:
        return [("mpirun", self.command(job))] + super().plan(job)

    def launch(self, sup: Supervisor, job: Job) -> None:
        if launch_carried(sup, job, "mpirun", self.command(job), carried_names(job.config), mpirun_env(),
                          control=job.layout.control):
            await_announced_address(sup, job, "started by mpirun as rank 0")


def check_mpirun(job: Job) -> None:
    """Raises SetupError when mpirun.command is not on PATH or
    mpirun.hostfile does not exist."""
    settings = job.config.mpirun
    if shutil.which(settings.command) is None:
        raise SetupError(f"{settings.command} not found on PATH (mpirun.command); install Open MPI "
                         "(scripts/setup.sh installs openmpi-bin)")
    if settings.hostfile and not Path(settings.hostfile).is_file():
        raise SetupError(f"mpirun.hostfile {settings.hostfile}: no such file")


def mpirun_env() -> dict:
    """What mpirun's environment needs on top of ours: Open MPI refuses to
    run as root unless told that it is meant."""
    return {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"} if os.geteuid() == 0 else {}


def hostfile_hosts(path: str) -> list:
    """The distinct host names of an Open MPI hostfile (`node1 slots=4`
    lines, `#` comments), in file order."""
    hosts = []
    for line in Path(path).read_text(encoding="utf-8").splitlines():
        words = line.split("#", 1)[0].split()
        if words and words[0] not in hosts:
            hosts.append(words[0])
    return hosts


def per_host_command(job: Job, command: list) -> tuple:
    """(argv, hosts): one mpirun rank on every host of mpirun.hostfile (this
    machine without one), each running `command`."""
    settings = job.config.mpirun
    hosts = hostfile_hosts(settings.hostfile) if settings.hostfile else [socket.gethostname()]
    argv = [settings.command, "-np", str(len(hosts)), "--map-by", "ppr:1:node"]
    if settings.hostfile:
        argv += ["--hostfile", str(Path(settings.hostfile).resolve())]
    return argv + list(settings.args) + command, len(hosts)

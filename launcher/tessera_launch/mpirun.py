"""The `mpirun` back-end: the whole job as one Open MPI launch.

One `mpirun -np N` starts `tessera-launch role --rank-from mpi` N times
(N = 1 + servers + workers); rank 0 becomes the coordinator, ranks 1..S the
servers, the rest the workers (role.py). The ranks find the coordinator
through its address file in the run directory, which must therefore be on a
file system every host shares (always true on one host). The processes do
not use MPI themselves; mpirun only places and starts them.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from .local import Backend, Job, SetupError, await_announced_address, launch_carried, process_names
from .role import role_command
from .supervisor import Supervisor


class MpirunBackend(Backend):
    name = "mpirun"

    def check(self, job: Job) -> None:
        super().check(job)
        settings = job.config.mpirun
        if shutil.which(settings.command) is None:
            raise SetupError(f"{settings.command} not found on PATH (mpirun.command); install Open MPI "
                             "(scripts/setup.sh installs openmpi-bin)")
        if settings.hostfile and not Path(settings.hostfile).is_file():
            raise SetupError(f"mpirun.hostfile {settings.hostfile}: no such file")

    def command(self, job: Job) -> list:
        settings = job.config.mpirun
        argv = [settings.command, "-np", str(len(process_names(job.config)))]
        if settings.hostfile:
            argv += ["--hostfile", str(Path(settings.hostfile).resolve())]
        return argv + list(settings.args) + role_command(job, "mpi")

    def plan(self, job: Job) -> list:
        return [("mpirun", self.command(job))] + super().plan(job)

    def launch(self, sup: Supervisor, job: Job) -> None:
        # Open MPI refuses to run as root unless told that it is meant.
        env = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"} if os.geteuid() == 0 else {}
        if launch_carried(sup, job, "mpirun", self.command(job), process_names(job.config), env):
            await_announced_address(sup, job, "started by mpirun as rank 0")

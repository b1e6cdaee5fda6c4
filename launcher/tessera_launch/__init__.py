"""tessera_launch: starts and supervises Tessera jobs.

Modules:
  config      load, override and validate a job config (YAML)
  supervisor  run a set of processes, prefix and log their output, follow
              progress, stop everything on the first failure
  summary     turn what a run left behind into summary.json
  local       running a job (run_job, shared by every supervising back-end),
              the process command lines, and the `local` back-end
  mpirun      the `mpirun` back-end: the job as the ranks of one mpirun
  slurm       the `slurm` back-end: one srun step, or a job for sbatch
  ssh         the `ssh` back-end: a hostfile, a process per ssh connection
  kubernetes  the `kubernetes` back-end: manifests, applied with kubectl
  role        `tessera-launch role`: one job process under a carrier
  doctor      `tessera-launch doctor`: a preflight check of the job's hosts
  cli         the `tessera-launch` command line
"""

from pathlib import Path

__version__ = "0.1.0"

#: The repository this launcher belongs to (launcher/tessera_launch/ is two
#: levels below it). The default build tree is REPO_ROOT / "build".
REPO_ROOT = Path(__file__).resolve().parents[2]

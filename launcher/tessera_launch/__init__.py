"""tessera_launch: starts and supervises Tessera jobs.

Modules:
  cli         the `tessera-launch` command line
  config      load a job config (YAML) and apply --set overrides; re-exports
              the config_* modules' names:
  config_schema    every key: its check, default and doc (SCHEMA)
  config_sections  the resolved config: JobConfig and its sections
  config_validate  validate raw config data against the schema
  config_yaml      the YAML loader that keeps line numbers
  job         the job: options, binaries, run directory, and the process
              contract (every process's command line; the only module that
              knows the binaries' flags)
  policy      the supervision policy every back-end shares: grace periods,
              which processes may fail, exit codes
  backend     run_job and Backend: running a job, shared by every
              supervising back-end; launch_carried for carrier back-ends
  supervisor  run a set of processes, prefix and log their output, stop
              everything on the first failure
  processes   ProcessSpec, Member, Outcome, and the carriers' line protocol
  console     terminal output (Console) and worker progress (ProgressTracker)
  summary     turn what a run left behind into summary.json
  local       the `local` back-end: every process a child of the launcher
  mpirun      the `mpirun` back-end: the job as the ranks of one mpirun
  slurm       the `slurm` back-end: one srun step, or a job for sbatch
  ssh         the `ssh` back-end: a hostfile, a process per ssh connection
  kubernetes  the `kubernetes` back-end: manifests, applied with kubectl
  role        `tessera-launch role`: one job process under a carrier
  doctor      `tessera-launch doctor`: a preflight check of the job's hosts
  faults, fault_logs  process faults, and what followed them in the logs
  plan, report, admin  `tessera-launch plan`, `report`, `admin`
"""

from pathlib import Path

__version__ = "0.1.0"

#: The repository this launcher belongs to (launcher/tessera_launch/ is two
#: levels below it). The default build tree is REPO_ROOT / "build".
REPO_ROOT = Path(__file__).resolve().parents[2]

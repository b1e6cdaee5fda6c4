"""The `slurm` back-end: the job as one Slurm step, or a submitted batch job.

`tessera-launch slurm` runs one `srun --ntasks N` (N = 1 + standby
coordinators + servers + workers), inside the current allocation
(SLURM_JOB_ID set) or a new one; every task runs `tessera-launch role
--rank-from slurm`, which picks its process by SLURM_PROCID (0: the
coordinator, then the standbys, the servers and the workers:
job.carried_names) and binds on its node (cluster.host: auto). The tasks
meet through the coordinator's address file in the run directory, which
must be on a file system every node shares; the launcher's commands to
them (faults) go through files in RUNDIR/control/ (supervisor.py).

`tessera-launch slurm --submit` makes the run directory, writes
RUNDIR/job.sbatch, whose one command is `tessera-launch slurm --in-run-dir
RUNDIR` (the above, inside the batch allocation), and submits it with
`sbatch`; `--wait` waits for the job and reports its summary.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import subprocess
import sys

from .backend import Backend, await_announced_address, launch_carried, run_job
from .job import Job, LocalOptions, RunLayout, SetupError, carried_names, load_job, start_run
from .policy import EXIT_FAILED, EXIT_OK
from .role import LAUNCHER, role_command
from .summary import format_report
from .supervisor import Supervisor


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--submit", action="store_true",
                        help="write RUNDIR/job.sbatch and submit it with sbatch instead of running srun here")
    parser.add_argument("--wait", action="store_true",
                        help="with --submit: wait for the batch job to end, print its summary, and exit "
                             "with the job's status")
    parser.add_argument("--in-run-dir", metavar="RUNDIR", help=argparse.SUPPRESS)


class SlurmBackend(Backend):
    name = "slurm"

    def check(self, job: Job) -> None:
        super().check(job)
        check_srun()

    def command(self, job: Job) -> list:
        settings = job.config.slurm
        argv = ["srun", "--ntasks", str(len(carried_names(job.config))), "--kill-on-bad-exit=1",
                "--job-name", job.config.job.name]
        if "SLURM_JOB_ID" not in os.environ:  # srun makes the allocation itself
            argv += allocation_options(job)
        return argv + list(settings.srun_args) + role_command(job, "slurm")

    def plan(self, job: Job) -> list:
        return [("srun", self.command(job))] + super().plan(job)

    def launch(self, sup: Supervisor, job: Job) -> None:
        if launch_carried(sup, job, "srun", self.command(job), carried_names(job.config),
                          control=job.layout.control):
            await_announced_address(sup, job, "started by srun as task 0")


def check_srun() -> None:
    if shutil.which("srun") is None:
        raise SetupError("srun not found on PATH: is this a Slurm cluster (scripts/setup.sh installs "
                         "slurm-wlm)?")


def per_node_command(job: Job, command: list, environ=os.environ) -> tuple:
    """(argv, nodes): one srun task on every node of the current allocation
    (SLURM_JOB_NUM_NODES), or of a new one of slurm.nodes nodes (1 if not
    set; with slurm.partition and slurm.time_limit), each running
    `command`."""
    settings = job.config.slurm
    inside = "SLURM_JOB_ID" in environ
    count = (environ.get("SLURM_JOB_NUM_NODES") or environ.get("SLURM_NNODES")) if inside else None
    nodes = int(count) if count and count.isdigit() else (settings.nodes or 1)
    argv = ["srun", "--nodes", str(nodes), "--ntasks", str(nodes), "--ntasks-per-node", "1",
            "--kill-on-bad-exit=0", "--job-name", f"{job.config.job.name}-doctor"]
    if not inside:
        argv += [option for option in allocation_options(job) if not option.startswith("--nodes=")]
    return argv + list(settings.srun_args) + command, nodes


def allocation_options(job: Job) -> list:
    """--partition, --time, --nodes as the slurm section sets them."""
    settings, options = job.config.slurm, []
    if settings.partition:
        options.append(f"--partition={settings.partition}")
    if settings.time_limit:
        options.append(f"--time={settings.time_limit}")
    if settings.nodes:
        options.append(f"--nodes={settings.nodes}")
    return options


def batch_script(job: Job, options: LocalOptions, python: str = sys.executable) -> str:
    """The sbatch script of a job whose run directory exists."""
    root = job.layout.root
    lines = ["#!/bin/sh", f"# Tessera job {job.config.job.name}, written by tessera-launch slurm --submit",
             f"#SBATCH --job-name={job.config.job.name}",
             f"#SBATCH --ntasks={len(carried_names(job.config))}",
             f"#SBATCH --output={root / 'logs' / 'sbatch.out'}",
             f"#SBATCH --chdir={root}"]
    lines += [f"#SBATCH {option}" for option in allocation_options(job) + list(job.config.slurm.sbatch_args)]
    argv = [python, str(LAUNCHER), "slurm", "--in-run-dir", str(root), "--config", str(job.layout.config),
            "--build-dir", str(job.binaries.coordinator.parent.parent), "--quiet"]
    for name in job.skips:
        argv += ["--skip", name]
    if options.timeout is not None:
        argv += ["--timeout", repr(options.timeout)]
    if options.debug:
        argv.append("--debug")
    return "\n".join(lines + ["exec " + shlex.join(argv)]) + "\n"


def run(options: LocalOptions, args: argparse.Namespace) -> int:
    """`tessera-launch slurm`: srun here, inside a run directory made by
    --submit, or --submit."""
    if args.in_run_dir:
        options.run_dir, options.existing_run_dir = args.in_run_dir, True
        return run_job(options, SlurmBackend())
    if not args.submit:
        if args.wait:
            raise SetupError("--wait goes with --submit")
        return run_job(options, SlurmBackend())
    return submit(options, args.wait)


def submit(options: LocalOptions, wait: bool) -> int:
    job = load_job(options)
    Backend.check(SlurmBackend(), job)
    if shutil.which("sbatch") is None:
        raise SetupError("sbatch not found on PATH: is this a Slurm cluster?")
    if options.dry_run:
        print(batch_script(job, options), end="")
        return EXIT_OK
    start_run(job, options.run_dir)
    script = job.layout.root / "job.sbatch"
    script.write_text(batch_script(job, options), encoding="utf-8")
    argv = ["sbatch", "--parsable"] + (["--wait"] if wait else []) + [str(script)]
    print(f"[launch] {shlex.join(argv)}", flush=True)
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    job_id = proc.stdout.readline().strip().split(";")[0]  # sbatch --wait prints the id at once
    if job_id:
        (job.layout.root / "slurm-job-id").write_text(job_id + "\n", encoding="utf-8")
        print(f"[launch] submitted batch job {job_id}; run directory {job.layout.root}", flush=True)
    _, errors = proc.communicate()
    if not job_id:
        raise SetupError(f"sbatch failed (status {proc.returncode}): {errors.strip()}")
    if not wait:
        return EXIT_OK
    return report_finished(job.layout)


def report_finished(layout: RunLayout) -> int:
    """After a batch job: print its summary; the exit status says whether it is ok."""
    try:
        summary = json.loads(layout.summary.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        print(f"[launch] the batch job left no summary in {layout.root}; see {layout.logs / 'sbatch.out'}",
              flush=True)
        return EXIT_FAILED
    for line in format_report(summary):
        print(line)
    return EXIT_OK if summary["status"] == "ok" else EXIT_FAILED

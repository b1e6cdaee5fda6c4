"""The tessera-launch command line: argument parsing and exit codes."""

from __future__ import annotations

import argparse
import signal
import sys

from . import __version__
from .config import ConfigError
from . import admin, doctor, kubernetes, plan, report, role, slurm, ssh
from .backend import run_job
from .job import LocalOptions, SetupError
from .local import LocalBackend
from .mpirun import MpirunBackend
from .policy import EXIT_USAGE

_MAIN_DESCRIPTION = """\
Start and supervise a Tessera job: a coordinator, parameter servers and
worker processes, described by a YAML job config (see configs/README.md).
Each back-end runs the job somewhere else; `tessera-launch COMMAND --help`
explains one.
"""

_EXIT_CODES = """\
exit status:
  0    the job finished and the coordinator reported status ok
  1    the job failed (a process failed, or the coordinator reported failure)
  2    bad arguments, config or setup: nothing was started
  124  --timeout expired
  128+N  the launcher was stopped by signal N (130: Ctrl-C, 143: SIGTERM)
"""

_LOCAL_DESCRIPTION = """\
Run a whole job on this machine. Starts the coordinator, waits for it to
publish its address, then starts the servers and workers. Every process's
output is shown prefixed with its name ([server-0] ...) and saved in
RUNDIR/logs/<name>.log; workers' progress is summarized once per second and
saved in RUNDIR/progress.jsonl. The first process that fails, a timeout, or
Ctrl-C stops everything (SIGTERM, then SIGKILL after 3 s). At the end
RUNDIR/summary.json holds the result, and its key numbers are printed.
"""

_LOCAL_EPILOG = """\
examples:
  tessera-launch local --config configs/local.yaml
  tessera-launch local --config configs/local.yaml --set cluster.workers=4 --set worker.args.epochs=1
  tessera-launch local --config configs/local.yaml --skip server-1   # fault injection: a server never starts

""" + _EXIT_CODES + """
docs/launcher.md describes the run directory, summary.json and the flags
each process receives.
"""


_MPIRUN_DESCRIPTION = """\
Run a job under Open MPI: one mpirun starts every process of the job as a
rank (0: the coordinator, 1..S: the servers, then the workers). The ranks
meet through the run directory, which must be on a file system every host
shares. Settings: the `mpirun` section of the config (command, hostfile,
args). Output, progress, supervision and the summary are as with `local`.
"""

_SLURM_DESCRIPTION = """\
Run a job under Slurm. Without --submit: one srun step starts every process
of the job as a task (SLURM_PROCID 0: the coordinator, 1..S: the servers,
then the workers), inside the current allocation or a new one. With
--submit: write RUNDIR/job.sbatch, which runs this command inside the
allocation, and submit it with sbatch (--wait: until it ends). The run
directory must be on a file system every node shares. Settings: the `slurm`
section of the config.
"""

_SSH_DESCRIPTION = """\
Run a job on hosts reached over ssh. A hostfile (--hostfile or ssh.hostfile)
lists the hosts, the roles each may take and its slots; every process runs
over its own ssh connection, with its output streamed back into RUNDIR/logs.
Every host must have the launcher, Python and the build tree (at the same
paths, or as the `ssh` section says). A host that cannot be reached, or
lacks a binary, is reported before anything starts.
"""

_KUBERNETES_DESCRIPTION = """\
Write Kubernetes manifests for a job: a ConfigMap with the job config, the
coordinator as a Deployment with a Service, the servers as a StatefulSet
with a headless Service, the workers as an indexed Job. --apply hands them
to kubectl. Settings: the `kubernetes` section of the config (namespace,
image, build_dir, port).
"""


def _positive_seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of seconds, got {text!r}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be positive, got {text!r}")
    return value


def _add_common(parser: argparse.ArgumentParser, skip: bool = True) -> None:
    """Arguments every back-end takes."""
    parser.add_argument("--config", required=True, metavar="FILE", help="the job config (YAML)")
    parser.add_argument("--run-dir", metavar="DIR",
                        help="where logs and the summary go; must not exist or be empty "
                             "(default: runs/<job.name>-<YYYYmmdd-HHMMSS>)")
    parser.add_argument("--build-dir", metavar="DIR",
                        help="the CMake build tree holding the binaries "
                             "(default: $TESSERA_BUILD_DIR, else <repo>/build)")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY.PATH=VALUE",
                        help="override a config value, e.g. cluster.servers=4 or worker.args.epochs=1; "
                             "VALUE is read as YAML; repeatable, later ones win")
    parser.add_argument("--debug", action="store_true",
                        help="pass --debug to the coordinator and the servers")
    if skip:
        parser.add_argument("--skip", action="append", default=[], metavar="ROLE-INDEX",
                            help="fault injection: do not start this process (server-I or worker-I), to check "
                                 "that the coordinator detects and names it; repeatable")


def _add_supervised(parser: argparse.ArgumentParser) -> None:
    """Arguments of the back-ends that supervise the job from here."""
    _add_common(parser)
    parser.add_argument("--timeout", type=_positive_seconds, metavar="SEC",
                        help="stop the whole job after SEC seconds, naming who was still running "
                             "(default: no limit)")
    parser.add_argument("--quiet", action="store_true",
                        help="do not show the processes' output (it is still saved in RUNDIR/logs); "
                             "show only the launcher's messages, progress and the final summary")
    parser.add_argument("--dry-run", action="store_true",
                        help="validate the config and print the command lines; start nothing")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="tessera-launch", description=_MAIN_DESCRIPTION, epilog=_EXIT_CODES,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    def command(name, help_text, description, epilog=_EXIT_CODES):
        return commands.add_parser(name, help=help_text, description=description, epilog=epilog,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)

    _add_supervised(command("local", "run a job on this machine", _LOCAL_DESCRIPTION, _LOCAL_EPILOG))
    _add_supervised(command("mpirun", "run a job as the ranks of one mpirun", _MPIRUN_DESCRIPTION))
    slurm_parser = command("slurm", "run a job as a Slurm step, or submit it with sbatch", _SLURM_DESCRIPTION)
    _add_supervised(slurm_parser)
    slurm.add_arguments(slurm_parser)
    ssh_parser = command("ssh", "run a job on hosts reached over ssh", _SSH_DESCRIPTION)
    _add_supervised(ssh_parser)
    ssh.add_arguments(ssh_parser)
    kube_parser = command("kubernetes", "write (and apply) Kubernetes manifests for a job",
                          _KUBERNETES_DESCRIPTION)
    _add_common(kube_parser, skip=False)
    kubernetes.add_arguments(kube_parser)
    doctor.add_arguments(command("doctor", "check the hosts a job would use before running it (RDMA, memlock, "
                                 "reachability, CUDA)", doctor.DESCRIPTION, doctor.EPILOG))
    plan.add_arguments(command("plan", "suggest the number of servers and virtual shards for a model, "
                               "and show the arithmetic", plan.DESCRIPTION, plan.EPILOG))
    admin.add_arguments(command("drain", "drain a server of a running job and remove it (its shards move to "
                                "the other servers while training goes on)", admin.DESCRIPTION, admin.EPILOG))
    report.add_arguments(command("report", "turn a run directory into plots and a Markdown page",
                                 report.__doc__.split("\n\n", 1)[1], ""))
    role.add_arguments(commands.add_parser(
        "role", help="internal: one job process, started by mpirun, srun or ssh (docs/launcher.md)"))
    return parser


def _job_options(args) -> LocalOptions:
    return LocalOptions(
        config=args.config, run_dir=args.run_dir, build_dir=args.build_dir, overrides=args.overrides,
        skip=getattr(args, "skip", []), timeout=getattr(args, "timeout", None), quiet=getattr(args, "quiet", False),
        debug=args.debug, dry_run=getattr(args, "dry_run", False))


def main(argv=None) -> int:
    """Runs tessera-launch; returns its exit status."""
    args = build_parser().parse_args(argv)
    try:
        if args.command == "report":
            return report.run(args)
        if args.command == "doctor":
            return doctor.run(args)
        if args.command == "plan":
            return plan.run(args)
        if args.command == "drain":
            return admin.run(args)
        if args.command == "role":
            return role.main_role(args)
        if args.command == "kubernetes":
            return kubernetes.run(_job_options(args), args)
        if args.command == "slurm":
            return slurm.run(_job_options(args), args)
        backends = {"local": LocalBackend, "mpirun": MpirunBackend, "ssh": lambda: ssh.SshBackend(args.hostfile)}
        return run_job(_job_options(args), backends[args.command]())
    except (ConfigError, SetupError, report.ReportError, plan.PlanError) as e:
        for line in str(e).splitlines():
            print(f"tessera-launch: error: {line}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:  # before any process started
        return 128 + signal.SIGINT

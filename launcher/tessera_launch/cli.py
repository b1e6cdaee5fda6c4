"""The tessera-launch command line: argument parsing and exit codes."""

from __future__ import annotations

import argparse
import signal
import sys

from . import __version__
from .config import ConfigError
from .local import EXIT_USAGE, LocalOptions, SetupError, run_local

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


def _positive_seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of seconds, got {text!r}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be positive, got {text!r}")
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="tessera-launch", description=_MAIN_DESCRIPTION, epilog=_EXIT_CODES,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    local = commands.add_parser(
        "local", help="run a job on this machine", description=_LOCAL_DESCRIPTION,
        epilog=_LOCAL_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    local.add_argument("--config", required=True, metavar="FILE", help="the job config (YAML)")
    local.add_argument("--run-dir", metavar="DIR",
                       help="where logs and the summary go; must not exist or be empty "
                            "(default: runs/<job.name>-<YYYYmmdd-HHMMSS>)")
    local.add_argument("--build-dir", metavar="DIR",
                       help="the CMake build tree holding the binaries "
                            "(default: $TESSERA_BUILD_DIR, else <repo>/build)")
    local.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY.PATH=VALUE",
                       help="override a config value, e.g. cluster.servers=4 or worker.args.epochs=1; "
                            "VALUE is read as YAML; repeatable, later ones win")
    local.add_argument("--skip", action="append", default=[], metavar="ROLE-INDEX",
                       help="fault injection: do not start this process (server-I or worker-I), to check "
                            "that the coordinator detects and names it; repeatable")
    local.add_argument("--timeout", type=_positive_seconds, metavar="SEC",
                       help="stop the whole job after SEC seconds, naming who was still running "
                            "(default: no limit)")
    local.add_argument("--quiet", action="store_true",
                       help="do not show the processes' output (it is still saved in RUNDIR/logs); "
                            "show only the launcher's messages, progress and the final summary")
    local.add_argument("--debug", action="store_true",
                       help="pass --debug to the coordinator and the servers")
    local.add_argument("--dry-run", action="store_true",
                       help="validate the config and print the command lines; start nothing")
    return parser


def main(argv=None) -> int:
    """Runs tessera-launch; returns its exit status."""
    args = build_parser().parse_args(argv)
    try:
        if args.command == "local":
            return run_local(LocalOptions(
                config=args.config, run_dir=args.run_dir, build_dir=args.build_dir,
                overrides=args.overrides, skip=args.skip, timeout=args.timeout,
                quiet=args.quiet, debug=args.debug, dry_run=args.dry_run))
    except (ConfigError, SetupError) as e:
        for line in str(e).splitlines():
            print(f"tessera-launch: error: {line}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:  # before any process started
        return 128 + signal.SIGINT
    raise AssertionError(f"unhandled command {args.command}")

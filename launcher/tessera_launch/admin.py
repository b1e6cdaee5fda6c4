"""`tessera-launch drain`: drain a server of a running job and remove it.

Reads the coordinator's address (RUN/coordinator.address) and the job key
(RUN/job.keys, or --keys) from the job's run directory and runs
`tessera-admin drain` from the build tree with them. The server's shard
copies move to the other servers one at a time while training goes on;
then the server is removed from the job and stops (exit status 0), and the
launcher counts its exit as in order. docs/design.md, "Draining a server".
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from .job import resolve_build_dir

DESCRIPTION = __doc__.split("\n\n", 1)[1]
EPILOG = """exit status (that of tessera-admin):
  0  the drain started (with --wait: the server was drained and removed)
  1  the coordinator refused (the reason is printed: e.g. too few servers would be left)
  2  bad arguments, or no running job in the run directory
  3  no answer from the coordinator
  4  --wait ran out of time
"""


class AdminError(Exception):
    """A run directory or build tree that cannot serve the request."""


def add_arguments(parser) -> None:
    parser.add_argument("--run-dir", required=True, metavar="DIR",
                        help="the running job's run directory (tessera-launch ... --run-dir)")
    parser.add_argument("--server", required=True, type=int, metavar="RANK", help="the rank of the server to drain")
    parser.add_argument("--wait", action="store_true", help="wait until the server is removed, printing progress")
    parser.add_argument("--timeout", type=float, default=600, metavar="SEC",
                        help="with --wait, give up after SEC seconds (default: 600)")
    parser.add_argument("--keys", metavar="FILE",
                        help="the job's key file, if not RUN/job.keys (security.keys_file)")
    parser.add_argument("--build-dir", metavar="DIR",
                        help="the CMake build tree holding tessera-admin (default: $TESSERA_BUILD_DIR, else <repo>/build)")


def command(args, environ=os.environ) -> tuple[list, dict]:
    """The tessera-admin command line and environment for `args`."""
    run_dir = Path(args.run_dir)
    address_file = run_dir / "coordinator.address"
    if not address_file.is_file() or not address_file.read_text().strip():
        raise AdminError(f"{address_file} is missing or empty: is {run_dir} the run directory of a running job?")
    if args.server < 0:
        raise AdminError(f"--server must be a server rank (0 or more), not {args.server}")
    binary = resolve_build_dir(args.build_dir, environ) / "coordinator" / "tessera-admin"
    if not binary.is_file():
        raise AdminError(f"{binary} not found: build the project first (scripts/test.sh or cmake --build build)")
    argv = [str(binary), "drain", "--coordinator", address_file.read_text().strip(), "--server", str(args.server)]
    if args.wait:
        argv += ["--wait", "--timeout", str(args.timeout)]
    env = dict(environ)
    keys = Path(args.keys) if args.keys else run_dir / "job.keys"
    if args.keys and not keys.is_file():
        raise AdminError(f"--keys {keys}: no such file")
    if keys.is_file():
        argv += ["--job_keys", str(keys.resolve())]
    return argv, env


def run(args) -> int:
    try:
        argv, env = command(args)
    except AdminError as e:
        print(f"tessera-launch: error: {e}", file=sys.stderr)
        return 2
    return subprocess.run(argv, env=env).returncode

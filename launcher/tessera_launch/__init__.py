"""tessera_launch: starts and supervises Tessera jobs.

Modules:
  config      load, override and validate a job config (YAML)
  supervisor  run a set of processes, prefix and log their output, follow
              progress, stop everything on the first failure
  summary     turn what a run left behind into summary.json
  local       the `local` back-end: a whole job on this machine
  cli         the `tessera-launch` command line
"""

from pathlib import Path

__version__ = "0.1.0"

#: The repository this launcher belongs to (launcher/tessera_launch/ is two
#: levels below it). The default build tree is REPO_ROOT / "build".
REPO_ROOT = Path(__file__).resolve().parents[2]

#!/usr/bin/env bash
# Installs what is missing (apt), builds, and trains sparse logistic regression
# on a synthetic click log with 2 servers and 2 workers on this machine.
# Extra arguments go to the launcher, e.g. --set worker.args.epochs=5
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
scripts/build.sh
exec launcher/tessera-launch local --config configs/local.yaml "$@"

#!/usr/bin/env bash
# Installs what is missing (apt), builds, and runs the whole test suite with ctest.
# Usage: scripts/test.sh [ctest arguments...]   e.g. scripts/test.sh -R Cluster
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
scripts/build.sh
BUILD_DIR=${TESSERA_BUILD_DIR:-build}
cd "$BUILD_DIR"
ctest --output-on-failure --timeout 600 -j "$(nproc)" "$@"

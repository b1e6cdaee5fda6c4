#!/usr/bin/env bash
# Installs what is missing (apt), builds, and runs the whole test suite with
# ctest; then, for the whole suite, fuzzes each fuzz target for a bounded
# time (scripts/fuzz.sh; TESSERA_FUZZ_SECONDS per target, default 20; 0 skips).
# Usage: scripts/test.sh [ctest arguments...]   e.g. scripts/test.sh -R Cluster
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
scripts/build.sh
BUILD_DIR=${TESSERA_BUILD_DIR:-build}
(cd "$BUILD_DIR" && ctest --output-on-failure --timeout 600 -j "$(nproc)" "$@")
FUZZ_SECONDS=${TESSERA_FUZZ_SECONDS:-20}
if [ $# -eq 0 ] && [ "$FUZZ_SECONDS" != 0 ]; then
  scripts/fuzz.sh "$FUZZ_SECONDS"
fi

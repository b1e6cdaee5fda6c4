#!/usr/bin/env bash
# Installs what is missing (apt), builds, and runs the whole test suite with
# ctest; then, for the whole suite, the sanitizer tier (scripts/sanitize.sh
# ci: every pure core's unit tests and the simulator under ASan+UBSan, the
# transports, in-process clusters and a few jobs of real processes under TSan;
# TESSERA_SANITIZE_CI=0 skips it) and a bounded fuzzing of each fuzz target
# (scripts/fuzz.sh; TESSERA_FUZZ_SECONDS per target, default 20; 0 skips).
# Usage: scripts/test.sh [ctest arguments...]   e.g. scripts/test.sh -R Cluster
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
scripts/build.sh
BUILD_DIR=${TESSERA_BUILD_DIR:-build}
(cd "$BUILD_DIR" && ctest --output-on-failure --timeout 600 -j "$(nproc)" "$@")
if [ $# -eq 0 ] && [ "${TESSERA_SANITIZE_CI:-1}" != 0 ]; then
  scripts/sanitize.sh ci
fi
FUZZ_SECONDS=${TESSERA_FUZZ_SECONDS:-20}
if [ $# -eq 0 ] && [ "$FUZZ_SECONDS" != 0 ]; then
  scripts/fuzz.sh "$FUZZ_SECONDS"
fi

#!/usr/bin/env bash
# The sanitizer tier: the whole test suite under AddressSanitizer and
# UndefinedBehaviorSanitizer, and the threaded parts (transports, the
# coordinator session, server and worker shells, in-process clusters) under
# ThreadSanitizer. No suppressions for the project's own code (scripts/tsan.supp
# holds one for libzmq, which is not instrumented).
#
#   scripts/sanitize.sh [asan|tsan|all]     (default all)
#
# Builds into build-asan/ and build-tsan/ (CUDA off), then runs ctest there.
# Takes several times as long as scripts/test.sh; not part of it.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
WHICH=${1:-all}
"$ROOT/scripts/setup.sh"
JOBS=$(nproc)

configure() {  # DIR SANITIZERS
  if [ ! -f "$1/build.ninja" ]; then
    cmake -S "$ROOT" -B "$1" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DTESSERA_SANITIZE="$2" \
      -DTESSERA_CUDA=OFF -DTESSERA_BUILD_BENCH=OFF >/dev/null
  fi
}

status=0
if [ "$WHICH" = all ] || [ "$WHICH" = asan ]; then
  configure "$ROOT/build-asan" address,undefined
  cmake --build "$ROOT/build-asan" -j "$JOBS"
  # halt_on_error: an UBSan report fails its test; leaks are reported at exit.
  (cd "$ROOT/build-asan" && UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
     ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 TESSERA_BUILD_DIR="$ROOT/build-asan" \
     ctest --output-on-failure --timeout 1200 -j "$JOBS") || status=1
fi
if [ "$WHICH" = all ] || [ "$WHICH" = tsan ]; then
  configure "$ROOT/build-tsan" thread
  cmake --build "$ROOT/build-tsan" -j "$JOBS" --target transport_conformance_test fault_transport_test curve_test \
    inproc_cluster_test bad_requests_test auth_test etcd_client_test etcd_leadership_test server_core_test \
    shm_transport_test shm_ring_test device_staging_test caller_delivery_test
  # The threaded parts: transports (ZeroMQ, in-process, fault wrapper, shared
  # memory), GPU staging's pipeline against an in-process cluster, the
  # etcd keep-alive thread, and whole jobs in one process (coordinator,
  # server and worker shells with their threads).
  # scripts/tsan.supp: third-party code only (libzmq's CURVE hand-off, which TSan cannot see).
  (cd "$ROOT/build-tsan" && TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1:suppressions="$ROOT/scripts/tsan.supp" \
     ctest --output-on-failure --timeout 1200 -j "$JOBS" \
       -R 'Transport|Curve|JobKeyFile|InProcCluster|BadRequests|AuthTest|Etcd|ServerCore|Replication|Consistency|Shm|Staging|CallerDelivery') \
    || status=1
fi
exit $status

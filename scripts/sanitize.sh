#!/usr/bin/env bash
# The sanitizer tier: the whole test suite under AddressSanitizer and
# UndefinedBehaviorSanitizer, and the threaded parts (transports, the
# coordinator session, server and worker shells, in-process clusters) under
# ThreadSanitizer. No suppressions for the project's own code (scripts/tsan.supp
# holds one for libzmq, which is not instrumented).
#
#   scripts/sanitize.sh [asan|tsan|all|ci]     (default all)
#
# asan, tsan, all: build into build-asan/ and build-tsan/ (CUDA off), then
# run ctest there; several times as long as scripts/test.sh, not part of it.
#
# `ci` is the tier scripts/test.sh runs, sized to CI's time on 2 cores:
# every pure core's unit tests (common, compress, coordinator, session,
# checkpoints, row index, server, worker with its request tracker,
# consistency) and the simulator over 300 seeds (message loss, failovers,
# moves: all the cores together) under ASan+UBSan, built at -O0 with line
# tables into build-asan-ci/ (about 90 files; at -O2 -g they took three
# times as long), with assertions on. Test binaries are run directly (a
# partial build leaves ctest's other tests unbuilt). The fuzz step of
# scripts/test.sh covers the codecs, checkpoints, server requests and the
# shared-memory ring under ASan+UBSan too. Then, under TSan at -O1 into
# build-tsan-ci/, the transports (ZeroMQ, in-process, fault wrapper, shared
# memory, caller delivery) and whole jobs in one process (the in-process
# clusters and the bad-request table over real sockets: the coordinator,
# server and worker shells with all their threads). Not in `ci`, for time:
# the multi-process tests under a sanitizer (`asan`, `tsan`).
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
if [ "$WHICH" = ci ]; then
  TESTS=(common/common_test common/sparse_batch_test compress/compress_test coordinator/coordinator_core_test
    node/session_core_test server/checkpoint_test server/row_index_test server/server_core_test
    worker/request_tracker_test worker/worker_core_test tests/consistency/consistency_test)
  DIR=$ROOT/build-asan-ci
  if [ ! -f "$DIR/build.ninja" ]; then
    cmake -S "$ROOT" -B "$DIR" -G Ninja -DCMAKE_BUILD_TYPE=None "-DCMAKE_CXX_FLAGS=-O0 -g1" \
      -DTESSERA_SANITIZE=address,undefined -DTESSERA_CUDA=OFF -DTESSERA_BUILD_BENCH=OFF >/dev/null
  fi
  names=()
  for t in "${TESTS[@]}"; do names+=("$(basename "$t")"); done
  cmake --build "$DIR" -j "$JOBS" --target "${names[@]}" tessera-sim
  export UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1
  run() {  # NAME COMMAND...: runs it, its output to DIR/NAME.log; prints the end of it on failure
    local name=$1 start=$SECONDS
    shift
    local log="$DIR/${name%% *}.log"
    if "$@" >"$log" 2>&1; then
      echo "sanitize ci: $name passed ($((SECONDS - start)) s)"
    else
      echo "sanitize ci: $name FAILED; the end of $log:"
      tail -n 80 "$log"
      status=1
    fi
  }
  for t in "${TESTS[@]}"; do run "$(basename "$t") (ASan+UBSan)" "$DIR/$t" --gtest_brief=1; done
  run "tessera-sim (ASan+UBSan, 300 seeds)" "$DIR/tests/sim/tessera-sim" --first-seed 1 --seeds 300
  # Threads under TSan (-O1, build-tsan-ci/). The shared-
  # memory tests that fork a reader process are left out: TSan cannot follow
  # a fork of a threaded process (its own threads included).
  TDIR=$ROOT/build-tsan-ci
  if [ ! -f "$TDIR/build.ninja" ]; then
    cmake -S "$ROOT" -B "$TDIR" -G Ninja -DCMAKE_BUILD_TYPE=None "-DCMAKE_CXX_FLAGS=-O1 -g1" \
      -DTESSERA_SANITIZE=thread -DTESSERA_CUDA=OFF -DTESSERA_BUILD_BENCH=OFF >/dev/null
  fi
  cmake --build "$TDIR" -j "$JOBS" --target transport_conformance_test fault_transport_test shm_transport_test \
    caller_delivery_test inproc_cluster_test bad_requests_test
  export TSAN_OPTIONS="halt_on_error=1:second_deadlock_stack=1:suppressions=$ROOT/scripts/tsan.supp"
  DIR=$TDIR
  for t in transport/transport_conformance_test transport/fault_transport_test transport/caller_delivery_test \
    tests/cluster/inproc_cluster_test tests/cluster/bad_requests_test; do
    run "$(basename "$t") (TSan)" "$TDIR/$t" --gtest_brief=1
  done
  run "shm_transport_test (TSan)" "$TDIR/transport/shm_transport_test" --gtest_brief=1 \
    --gtest_filter=-ShmTransportTest.NoLendingWhenEitherSideTurnsItOff:ShmTransportTest.TheLendsOfAReaderWhoseProcessEndedAreReclaimed:ShmTransportTest.AReaderReplacedAtItsAddressKeepsItsLendsUntilItsProcessEnds
  exit $status
fi
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

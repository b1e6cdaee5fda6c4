#!/usr/bin/env bash
# The sanitizer tier: the whole test suite under AddressSanitizer and
# UndefinedBehaviorSanitizer, and the threaded parts (transports, the
# coordinator session, server and worker shells, in-process clusters, whole
# jobs of real processes) under ThreadSanitizer. No suppressions for the
# project's own code (scripts/tsan.supp holds libzmq's CURVE decryption in
# libsodium, and spdlog's: libraries that are not instrumented).
#
#   scripts/sanitize.sh [asan|tsan|all|ci]     (default all)
#
# asan, tsan, all: build into build-asan/ and build-tsan/ (CUDA off), then
# run ctest there (tsan: the threaded tests only, then the jobs of real
# processes below); several times as long as scripts/test.sh, not part of it.
#
# `ci` is the tier scripts/test.sh runs, sized to CI's time on 2 cores:
# every pure core's unit tests (common, compress, coordinator, session,
# checkpoints, row index, server, worker with its request tracker,
# consistency), the ZeroMQ and shared-memory transports, the in-process
# clusters, the batch format of coalesced messages and the bad-request table over real sockets and the simulator over 300 seeds (message loss, failovers,
# moves: all the cores together) under ASan+UBSan, built at -O0 with line
# tables into build-asan-ci/ (about 90 files; at -O2 -g they took three
# times as long), with assertions on. Test binaries are run directly (a
# partial build leaves ctest's other tests unbuilt). The fuzz step of
# scripts/test.sh covers the codecs, checkpoints, server requests and the
# shared-memory ring under ASan+UBSan too. Then, under TSan at -O1 into
# build-tsan-ci/, every test binary that starts threads: the transports
# (ZeroMQ, CURVE, in-process, fault wrapper, shared memory, caller
# delivery), GPU staging's pipeline, the buffer pool, the etcd leadership
# keep-alive, and whole jobs in one process (the in-process clusters,
# transfer priorities, the consistency tests, authentication and the
# bad-request table over real sockets: the coordinator, server and worker
# shells with all their threads). Then whole jobs of real
# processes through tessera-launch, with tessera-coordinator,
# tessera-server, tessera-keys and the worker programs (tessera-logreg, the
# consistency and audit workloads) built with TSan there (tsan_jobs below):
# a server SIGKILLed mid-job with replication 2 (tests/consistency/
# test_failover.py, BSP: every pull exact), shards moved under load and
# then 2%/2%/5% of all messages dropped/duplicated/reordered, each checked
# by the audit (tests/audit/test_audit.py), and the logistic-regression
# example over the shared-memory rings with lent pull replies, scraped over
# HTTP (tests/launcher_e2e/test_metrics.py). Every one of these jobs
# authenticates with CURVE (the launcher's default). A TSan report in any
# process of a job fails its test. On the 2-core CI machine the jobs add
# about 2 minutes (their binaries' build 50 s, the jobs 60 s). Not in `ci`,
# for time: the other multi-process tests under a sanitizer (`asan` runs
# them all).
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
LOG_DIR=$ROOT
targets() {  # PATH...: the build targets of test binaries given by their paths in a build tree
  for t in "$@"; do basename "$t"; done
}
# run NAME COMMAND...: runs it, its output to LOG_DIR/NAME.log; prints the end
# of it on failure. A test that hangs fails after 20 minutes (a hung test
# must not hold CI until its own deadline).
run() {
  local name=$1 start=$SECONDS rc=0
  shift
  local log="$LOG_DIR/${name%% *}.log"
  timeout -k 10 1200 "$@" >"$log" 2>&1 || rc=$?
  if [ "$rc" = 0 ]; then
    echo "sanitize $WHICH: $name passed ($((SECONDS - start)) s)"
  else
    [ "$rc" = 124 ] && echo "(timed out after 1200 s)" >>"$log"
    echo "sanitize $WHICH: $name FAILED (exit status $rc); the end of $log:"
    tail -n 80 "$log"
    status=1
  fi
}

# Whole jobs of real processes for TSan: what they need built (the job key
# tool too: CURVE is on by default), and tsan_jobs DIR, which runs them from
# build tree DIR. The launcher hands its environment, TSAN_OPTIONS with it,
# to every process it starts. Each process writes its reports to
# DIR/tsan-reports/TEST.PID (log_path), so that a report fails the test even
# where the job goes on without the process that made it (a server that
# halts on a race is failed over like a killed one). The job logs stay in
# DIR/jobs/TEST (pytest's --basetemp).
JOB_BINARIES=(tessera-coordinator tessera-server tessera-keys tessera-logreg tessera-consistency-workload
  tessera-consistency-check tessera-audit-workload)
tsan_job() {  # DIR TEST PYTEST-ARGUMENTS...
  local dir=$1 name=$2
  shift 2
  rm -rf "$dir/tsan-reports/$name".* "$dir/jobs/$name"
  mkdir -p "$dir/tsan-reports" "$dir/jobs"
  LOG_DIR=$dir run "$name (TSan, real processes)" env TESSERA_BUILD_DIR="$dir" \
    TSAN_OPTIONS="$TSAN_OPTIONS:log_path=$dir/tsan-reports/$name" \
    /usr/bin/python3 -m pytest -q -p no:cacheprovider --basetemp "$dir/jobs/$name" "$@"
  if compgen -G "$dir/tsan-reports/$name.*" >/dev/null; then
    echo "sanitize $WHICH: $name: ThreadSanitizer reported in a process of the job ($dir/tsan-reports/):"
    head -n 60 "$dir/tsan-reports/$name".*
    status=1
  fi
}
tsan_jobs() {  # DIR
  # A server SIGKILLed mid-job, replication 2, BSP: the job ends ok, every pull exact.
  tsan_job "$1" failover "$ROOT/tests/consistency/test_failover.py" -k bsp
  # Shards moved under load; messages dropped, duplicated and reordered: the audit passes.
  tsan_job "$1" audit "$ROOT/tests/audit/test_audit.py" -k "(moved_under_load and memory) or (e5_ and 11)"
  # tessera-logreg over the shared-memory rings (frames of 4 KiB and more, pull replies lent), metrics scraped.
  tsan_job "$1" metrics "$ROOT/tests/launcher_e2e/test_metrics.py" --build-dir "$1" --source-dir "$ROOT"
}

if [ "$WHICH" = ci ]; then
  TESTS=(common/common_test common/sparse_batch_test compress/compress_test coordinator/coordinator_core_test
    node/session_core_test server/checkpoint_test server/row_index_test server/server_core_test
    server/server_parts_test server/cold_rows_test
    worker/request_tracker_test worker/worker_core_test tests/consistency/consistency_test
    transport/transport_conformance_test transport/shm_transport_test transport/coalescing_transport_test
    tests/cluster/inproc_cluster_test tests/cluster/bad_requests_test)
  DIR=$ROOT/build-asan-ci
  if [ ! -f "$DIR/build.ninja" ]; then
    cmake -S "$ROOT" -B "$DIR" -G Ninja -DCMAKE_BUILD_TYPE=None "-DCMAKE_CXX_FLAGS=-O0 -g1" \
      -DTESSERA_SANITIZE=address,undefined -DTESSERA_CUDA=OFF -DTESSERA_BUILD_BENCH=OFF >/dev/null
  fi
  cmake --build "$DIR" -j "$JOBS" --target $(targets "${TESTS[@]}") tessera-sim
  export UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1
  LOG_DIR=$DIR
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
  # Every test binary that starts threads (server_core_test's one thread
  # only drops a Buffer, which common_test's buffer tests do under TSan too).
  TSAN_TESTS=(transport/transport_conformance_test transport/fault_transport_test transport/caller_delivery_test
    transport/curve_test transport/coalescing_transport_test tests/cluster/inproc_cluster_test
    tests/cluster/bad_requests_test tests/cluster/auth_test tests/cluster/coalescing_test
    tests/cluster/transfer_priority_test tests/cluster/lost_server_queue_test tests/consistency/consistency_test
    worker/device_staging_test
    common/common_test coordinator/etcd_leadership_test)
  cmake --build "$TDIR" -j "$JOBS" --target $(targets "${TSAN_TESTS[@]}") shm_transport_test
  export TSAN_OPTIONS="halt_on_error=1:second_deadlock_stack=1:suppressions=$ROOT/scripts/tsan.supp"
  LOG_DIR=$TDIR
  for t in "${TSAN_TESTS[@]}"; do
    run "$(basename "$t") (TSan)" "$TDIR/$t" --gtest_brief=1
  done
  run "shm_transport_test (TSan)" "$TDIR/transport/shm_transport_test" --gtest_brief=1 \
    --gtest_filter=-ShmTransportTest.NoLendingWhenEitherSideTurnsItOff:ShmTransportTest.TheLendsOfAReaderWhoseProcessEndedAreReclaimed:ShmTransportTest.AReaderReplacedAtItsAddressKeepsItsLendsUntilItsProcessEnds
  cmake --build "$TDIR" -j "$JOBS" --target "${JOB_BINARIES[@]}"
  tsan_jobs "$TDIR"
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
    shm_transport_test shm_ring_test device_staging_test caller_delivery_test "${JOB_BINARIES[@]}"
  # The threaded parts: transports (ZeroMQ, in-process, fault wrapper, shared
  # memory), GPU staging's pipeline against an in-process cluster, the
  # etcd keep-alive thread, and whole jobs in one process (coordinator,
  # server and worker shells with their threads).
  # scripts/tsan.supp: third-party code only (libzmq's CURVE hand-off and spdlog's registry, which TSan cannot see).
  export TSAN_OPTIONS="halt_on_error=1:second_deadlock_stack=1:suppressions=$ROOT/scripts/tsan.supp"
  (cd "$ROOT/build-tsan" && ctest --output-on-failure --timeout 1200 -j "$JOBS" \
       -R 'Transport|Curve|JobKeyFile|InProcCluster|BadRequests|AuthTest|Etcd|ServerCore|Replication|Consistency|Shm|Staging|CallerDelivery') \
    || status=1
  tsan_jobs "$ROOT/build-tsan"  # the jobs of real processes of `ci`
fi
exit $status

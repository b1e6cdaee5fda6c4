# Shared by the bench/run_*.sh scripts (sourced, not run).

# bench_build SCRIPT BUILD LOG TARGET...: configures BUILD if it has never
# been configured (Ninja, $BENCH_BUILD_TYPE or RelWithDebInfo, plus
# $BENCH_CONFIGURE_FLAGS), builds the targets with the output in LOG, and on
# failure prints the end of LOG and exits 1 naming SCRIPT.
bench_build() {
  local script=$1 build=$2 log=$3
  shift 3
  local root
  root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
  if [ ! -f "$build/build.ninja" ] && [ ! -f "$build/Makefile" ]; then
    # shellcheck disable=SC2086
    cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE="${BENCH_BUILD_TYPE:-RelWithDebInfo}" \
      ${BENCH_CONFIGURE_FLAGS:-} >/dev/null
  fi
  if ! cmake --build "$build" --target "$@" >"$log" 2>&1; then
    tail -30 "$log" >&2
    echo "$script: the build failed (log above)" >&2
    exit 1
  fi
}

# bench_push_pull_run SCRIPT BUILD RUN_DIR [ARG...]: one launcher run of
# configs/bench_push_pull.yaml with BUILD's binaries (its
# tessera-push-pull-bench as the worker program), quiet, with the extra
# launcher arguments given (--set KEY=VALUE ...). On failure it says so,
# naming SCRIPT and the run's logs, keeps them (clears the EXIT trap) and
# exits 1.
bench_push_pull_run() {
  local script=$1 build=$2 run_dir=$3
  shift 3
  local root
  root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
  if ! /usr/bin/python3 "$root/launcher/tessera-launch" local --config "$root/configs/bench_push_pull.yaml" \
      --build-dir "$build" --run-dir "$run_dir" --quiet --timeout 1200 \
      --set "worker.program=$build/bench/tessera-push-pull-bench" "$@" >&2; then
    echo "$script: the Tessera run of $build failed; logs in $run_dir/logs" >&2
    trap - EXIT
    exit 1
  fi
}

# bench_raw_run SCRIPT BUILD JSON [ARG...]: one run of BUILD's raw ZeroMQ
# baseline (bench/raw_zmq_bench ARG... --json JSON), its progress lines in
# JSON's name with .log for .json. On failure it says so, naming SCRIPT,
# with the program's output, keeps the results (clears the EXIT trap) and
# exits 1.
bench_raw_run() {
  local script=$1 build=$2 json=$3
  shift 3
  local log=${json%.json}.log
  if ! "$build/bench/raw_zmq_bench" "$@" --json "$json" 2>"$log"; then
    echo "$script: raw_zmq_bench${*:+ $*} failed (log: $log):" >&2
    cat "$log" >&2
    trap - EXIT
    exit 1
  fi
}

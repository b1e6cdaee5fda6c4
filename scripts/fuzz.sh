#!/usr/bin/env bash
# Fuzzes the fuzz targets of tests/fuzz with libFuzzer, each for a bounded
# time, under AddressSanitizer and UndefinedBehaviorSanitizer.
#
#   scripts/fuzz.sh [SECONDS_PER_TARGET] [TARGET...]
#
# SECONDS_PER_TARGET defaults to 60; TARGET to all of server_request, codec,
# checkpoint, shm_ring and batch. Builds with clang into build-fuzz/ (TESSERA_FUZZ=ON). Each
# target starts from its corpus in tests/fuzz/corpus/<target> (read-only here)
# and keeps what it finds in build-fuzz/corpus/<target>. A crash stops the
# script with status 1 and leaves the input as build-fuzz/crashes/<target>-*:
# fix the bug, then copy the input into tests/fuzz/corpus/<target>/ so that
# the test suite (ctest fuzz_replay.<target>) replays it from then on.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
SECONDS_PER_TARGET=${1:-60}
shift || true
TARGETS=("$@")
[ ${#TARGETS[@]} -gt 0 ] || TARGETS=(server_request codec checkpoint shm_ring batch)
BUILD=${TESSERA_FUZZ_BUILD_DIR:-$ROOT/build-fuzz}

if ! command -v clang++ >/dev/null; then
  echo "fuzz.sh: clang++ is missing (scripts/setup.sh installs clang)" >&2
  exit 2
fi
if [ ! -f "$BUILD/build.ninja" ]; then
  cmake -S "$ROOT" -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ \
    -DCMAKE_C_FLAGS=-fsanitize=fuzzer-no-link -DCMAKE_CXX_FLAGS=-fsanitize=fuzzer-no-link \
    -DTESSERA_FUZZ=ON -DTESSERA_SANITIZE=address,undefined -DTESSERA_CUDA=OFF -DTESSERA_BUILD_BENCH=OFF >/dev/null
fi
cmake --build "$BUILD" --target $(printf '%s_fuzz ' "${TARGETS[@]}")

mkdir -p "$BUILD/crashes"
status=0
for t in "${TARGETS[@]}"; do
  mkdir -p "$BUILD/corpus/$t"
  echo "fuzz.sh: $t for ${SECONDS_PER_TARGET} s" >&2
  # halt_on_error: an UBSan report is a crash too.
  if ! UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 ASAN_OPTIONS=detect_leaks=1 \
      "$BUILD/tests/fuzz/${t}_fuzz" -seed=1 -max_total_time="$SECONDS_PER_TARGET" -timeout=10 -rss_limit_mb=2048 \
      -print_final_stats=1 -artifact_prefix="$BUILD/crashes/$t-" \
      "$BUILD/corpus/$t" "$ROOT/tests/fuzz/corpus/$t" 2>"$BUILD/$t.log"; then
    tail -40 "$BUILD/$t.log" >&2
    echo "fuzz.sh: $t crashed; the input is in $BUILD/crashes/ (log: $BUILD/$t.log)" >&2
    status=1
  else
    grep -E "stat::number_of_executed_units|stat::new_units_added" "$BUILD/$t.log" | sed "s/^/fuzz.sh: $t /" >&2
  fi
done
exit $status

#pragma once
// ProbeCpuPair: how close, in the machine's caches, two CPUs this process may
// run on are. Two threads, one pinned to each CPU, pass one cache line back
// and forth; the result is the median time of a round trip.
//
// Why the benchmarks record it: a virtual machine's CPUs are threads of the
// host, and the host may move them between cores that share a cache (round
// trips of tens of ns) and cores that do not (hundreds of ns). A transfer
// between two processes over loopback changes speed with that placement,
// several-fold, for raw ZeroMQ and Tessera alike. A benchmark that probes
// before and after each repeat lets its report compare a result only with a
// baseline measured with the CPUs placed the same way (bench/paired_report.py).
//
// Contract:
// - The pair is the first two CPUs of the calling thread's affinity mask, so
//   it says something about the benchmark only where its processes run on
//   those two CPUs (a 2-CPU machine, or processes pinned to them).
// - The caller's own affinity is not changed: the probe starts two threads
//   of its own and joins them before it returns.
// - Bounded time: each of `batches` batches stops after `round_trips`
//   round trips or `batch_budget` of wall time, whichever comes first (a CPU
//   busy with something else makes round trips slow, not endless); the
//   result is the median over batches of time per completed round trip.
// - Errors: FailedPrecondition when fewer than two CPUs are allowed;
//   Internal when a thread cannot be pinned; InvalidArgument for
//   round_trips or batches below 1.
#include <chrono>

#include "absl/status/statusor.h"

namespace tessera::bench {

struct CpuPairProbe {
  int cpu_a = -1;
  int cpu_b = -1;
  double round_trip_ns = 0;  // median over batches
};

absl::StatusOr<CpuPairProbe> ProbeCpuPair(int round_trips = 5000, int batches = 5,
                                          std::chrono::milliseconds batch_budget = std::chrono::milliseconds(20));

// For benchmark loops: ProbeCpuPair()'s round trip in ns with the default
// arguments, or -1 when the probe cannot run; the first failure in the
// process is reported once on stderr, prefixed with `program`.
double ProbeRoundTripNs(const char* program);

}  // namespace tessera::bench

#include "bench/cpu_pair_probe.h"

#include <pthread.h>
#include <sched.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"

namespace tessera::bench {
namespace {

using Clock = std::chrono::steady_clock;

bool PinTo(int cpu) {
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  return pthread_setaffinity_np(pthread_self(), sizeof(set), &set) == 0;
}

// The line the two threads pass: `turn` odd = the answering thread's move,
// even = the asking thread's. `stop` ends the answering thread's loop.
struct alignas(64) Line {
  std::atomic<uint64_t> turn{0};
  std::atomic<bool> stop{false};
};

}  // namespace

absl::StatusOr<CpuPairProbe> ProbeCpuPair(int round_trips, int batches, std::chrono::milliseconds batch_budget) {
  if (round_trips < 1 || batches < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("round_trips and batches must be at least 1, got ", round_trips, " and ", batches));
  }
  cpu_set_t allowed;
  CPU_ZERO(&allowed);
  if (pthread_getaffinity_np(pthread_self(), sizeof(allowed), &allowed) != 0) {
    return absl::InternalError("cannot read this thread's CPU affinity");
  }
  CpuPairProbe probe;
  for (int cpu = 0; cpu < CPU_SETSIZE && probe.cpu_b < 0; ++cpu) {
    if (!CPU_ISSET(cpu, &allowed)) continue;
    (probe.cpu_a < 0 ? probe.cpu_a : probe.cpu_b) = cpu;
  }
  if (probe.cpu_b < 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("the CPU pair probe needs two CPUs; this process may use ", CPU_COUNT(&allowed)));
  }

  Line line;
  std::atomic<int> pinned{0};  // +1 per thread pinned, or -100 when one failed
  std::vector<double> ns_per_round_trip;
  std::thread answerer([&] {
    if (!PinTo(probe.cpu_b)) {
      pinned.fetch_sub(100);
      return;
    }
    pinned.fetch_add(1);
    for (;;) {
      uint64_t t;
      while (((t = line.turn.load(std::memory_order_acquire)) & 1) == 0) {
        if (line.stop.load(std::memory_order_relaxed)) return;
      }
      line.turn.store(t + 1, std::memory_order_release);
    }
  });
  std::thread asker([&] {
    if (!PinTo(probe.cpu_a)) {
      pinned.fetch_sub(100);
      return;
    }
    pinned.fetch_add(1);
    while (pinned.load() == 1) {  // wait for the answerer (or its failure)
    }
    if (pinned.load() < 0) return;
    uint64_t turn = 0;
    for (int b = 0; b < batches; ++b) {
      const Clock::time_point start = Clock::now();
      const Clock::time_point deadline = start + batch_budget;
      int done = 0;
      while (done < round_trips) {
        line.turn.store(++turn, std::memory_order_release);  // odd: the answerer's move
        while (line.turn.load(std::memory_order_acquire) != turn + 1) {
        }
        ++turn;
        ++done;
        if ((done & 63) == 0 && Clock::now() > deadline) break;
      }
      const double ns = std::chrono::duration<double, std::nano>(Clock::now() - start).count();
      ns_per_round_trip.push_back(ns / done);
    }
  });
  asker.join();
  line.stop.store(true);
  answerer.join();
  if (pinned.load() < 0 || ns_per_round_trip.empty()) {
    return absl::InternalError(absl::StrCat("cannot pin the probe's threads to CPUs ", probe.cpu_a, " and ",
                                            probe.cpu_b));
  }
  std::sort(ns_per_round_trip.begin(), ns_per_round_trip.end());
  probe.round_trip_ns = ns_per_round_trip[ns_per_round_trip.size() / 2];
  return probe;
}

double ProbeRoundTripNs(const char* program) {
  absl::StatusOr<CpuPairProbe> probe = ProbeCpuPair();
  if (probe.ok()) return probe->round_trip_ns;
  static std::atomic<bool> reported{false};
  if (!reported.exchange(true)) {
    std::fprintf(stderr, "%s: no CPU placement probe (%s)\n", program, std::string(probe.status().message()).c_str());
  }
  return -1;
}

}  // namespace tessera::bench

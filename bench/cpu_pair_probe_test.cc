#include "bench/cpu_pair_probe.h"

#include <pthread.h>
#include <sched.h>

#include <thread>

#include "gtest/gtest.h"

namespace tessera::bench {
namespace {

int AllowedCpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (pthread_getaffinity_np(pthread_self(), sizeof(set), &set) != 0) return 0;
  return CPU_COUNT(&set);
}

TEST(CpuPairProbeTest, MeasuresARoundTripBetweenTheFirstTwoAllowedCpusAndLeavesTheCallerUnpinned) {
  if (AllowedCpus() < 2) GTEST_SKIP() << "needs two CPUs";
  cpu_set_t before;
  CPU_ZERO(&before);
  ASSERT_EQ(pthread_getaffinity_np(pthread_self(), sizeof(before), &before), 0);
  absl::StatusOr<CpuPairProbe> probe = ProbeCpuPair(/*round_trips=*/500, /*batches=*/3);
  ASSERT_TRUE(probe.ok()) << probe.status();
  EXPECT_GE(probe->cpu_a, 0);
  EXPECT_GT(probe->cpu_b, probe->cpu_a);
  EXPECT_TRUE(CPU_ISSET(probe->cpu_a, &before));
  EXPECT_TRUE(CPU_ISSET(probe->cpu_b, &before));
  // A round trip moves a cache line twice between CPUs: it takes time, and
  // (with a 20 ms budget per batch of at least 64 round trips) not seconds.
  EXPECT_GT(probe->round_trip_ns, 0.0);
  EXPECT_LT(probe->round_trip_ns, 20e6 / 64 * 2);
  cpu_set_t after;
  CPU_ZERO(&after);
  ASSERT_EQ(pthread_getaffinity_np(pthread_self(), sizeof(after), &after), 0);
  EXPECT_TRUE(CPU_EQUAL(&before, &after)) << "the probe changed the caller's affinity";
}

TEST(CpuPairProbeTest, OneAllowedCpuIsAFailedPrecondition) {
  absl::Status status;
  std::thread t([&] {
    cpu_set_t one;
    CPU_ZERO(&one);
    cpu_set_t allowed;
    CPU_ZERO(&allowed);
    pthread_getaffinity_np(pthread_self(), sizeof(allowed), &allowed);
    for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu) {
      if (CPU_ISSET(cpu, &allowed)) {
        CPU_SET(cpu, &one);
        break;
      }
    }
    ASSERT_EQ(pthread_setaffinity_np(pthread_self(), sizeof(one), &one), 0);
    status = ProbeCpuPair(100, 1).status();
  });
  t.join();
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition) << status;
  EXPECT_NE(status.message().find("two CPUs"), std::string::npos) << status;
}

TEST(CpuPairProbeTest, BadArgumentsAreRefused) {
  EXPECT_EQ(ProbeCpuPair(0, 1).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ProbeCpuPair(1, 0).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace tessera::bench

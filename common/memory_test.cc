#include "common/memory.h"

#include <gtest/gtest.h>
#include <sys/resource.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>

namespace tessera {
namespace {

TEST(CgroupMemoryLimitTest, ParsesLimitsAndKnowsWhenThereIsNone) {
  EXPECT_EQ(ParseCgroupMemoryLimit("1073741824\n"), uint64_t{1} << 30);
  EXPECT_EQ(ParseCgroupMemoryLimit("4096"), 4096u);
  EXPECT_EQ(ParseCgroupMemoryLimit("max\n"), std::nullopt) << "v2: no limit";
  EXPECT_EQ(ParseCgroupMemoryLimit("9223372036854771712\n"), std::nullopt) << "v1: no limit";
  EXPECT_EQ(ParseCgroupMemoryLimit(""), std::nullopt) << "unreadable";
  EXPECT_EQ(ParseCgroupMemoryLimit("12x\n"), std::nullopt);
  EXPECT_EQ(ParseCgroupMemoryLimit("-5"), std::nullopt);
  EXPECT_EQ(ParseCgroupMemoryLimit("0"), std::nullopt);
}

TEST(UsableMemoryTest, IsAtMostThePhysicalMemoryAndNeverZero) {
  const uint64_t physical = static_cast<uint64_t>(sysconf(_SC_PHYS_PAGES)) * static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
  const uint64_t usable = UsableMemoryBytes();
  EXPECT_GT(usable, 0u);
  EXPECT_LE(usable, physical);
}

}  // namespace
}  // namespace tessera

namespace tessera {
namespace {

// Minor page faults of the calling thread so far.
long ThreadMinorFaults() {
  rusage u{};
  getrusage(RUSAGE_THREAD, &u);
  return u.ru_minflt;
}

// Minor page faults, on a new thread, of touching 8 blocks of 16 MiB after
// a first thread had used and freed 8 such blocks.
long FaultsOfLargeBlocksReused() {
  constexpr size_t kBytes = size_t{16} << 20;
  constexpr int kBlocks = 8;
  auto use_some = [] {
    long faults = 0;
    std::thread t([&] {
      void* p[kBlocks];
      for (void*& b : p) b = std::malloc(kBytes);
      const long before = ThreadMinorFaults();
      for (void* b : p) {
        if (b != nullptr) std::memset(b, 1, kBytes);
      }
      faults = ThreadMinorFaults() - before;
      for (void* b : p) std::free(b);
    });
    t.join();
    return faults;
  };
  (void)use_some();  // the first round maps and faults its pages in
  return use_some();
}

// Large blocks freed by one thread come back warm to the next thread that
// asks for them: no page faults in again. Without one arena each new thread
// got an arena of its own, whose heaps hold at most 64 MiB and are unmapped
// as they empty, so 8 blocks of 16 MiB in use at once (8 pull views in
// flight) faulted every page in again each time (20,475 pages here).
// glibc fixes its arena limit when a second arena is made, so the setting
// must come before any other thread allocates (common/memory.h): the check
// runs in a fresh process (a death test re-executes this binary), not after
// whatever threads earlier tests of this binary started.
TEST(KeepLargeAllocationsMappedTest, LargeBlocksOfOtherThreadsComeBackWithoutFaults) {
  if (kSanitizedAllocator) GTEST_SKIP() << "built with a sanitizer, whose allocator replaces glibc's malloc";
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        if (!KeepLargeAllocationsMapped()) {
          std::fprintf(stderr, "mallopt refused the settings\n");
          std::exit(2);
        }
        const long faults = FaultsOfLargeBlocksReused();
        std::fprintf(stderr, "faults %ld\n", faults);
        std::exit(faults < 512 ? 0 : 1);
      },
      ::testing::ExitedWithCode(0), "faults")
      << "freed large blocks are not coming back warm to another thread";
}

}  // namespace
}  // namespace tessera

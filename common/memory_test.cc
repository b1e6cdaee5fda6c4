#include "common/memory.h"

#include <gtest/gtest.h>
#include <unistd.h>

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

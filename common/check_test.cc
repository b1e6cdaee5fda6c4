// Built with NDEBUG whatever the build type: TESSERA_CHECK must fire in
// release builds, TESSERA_DCHECK must not.
#ifndef NDEBUG
#define NDEBUG
#endif

#include "common/check.h"

#include <csignal>
#include <string>
#include <string_view>

#include "absl/strings/string_view.h"
#include "gtest/gtest.h"

namespace tessera {
namespace {

class CheckDeathTest : public ::testing::Test {
 protected:
  void SetUp() override { GTEST_FLAG_SET(death_test_style, "threadsafe"); }
};

TEST_F(CheckDeathTest, AFalseCheckAbortsWithTheConditionInReleaseBuilds) {
  EXPECT_DEATH(TESSERA_CHECK(false), "check failed: .*check_test\\.cc:[0-9]+: false");
  const int rows = 3;
  EXPECT_DEATH(TESSERA_CHECK(rows < 2), "rows < 2");
}

TEST_F(CheckDeathTest, AFalseCheckWithAMessageAbortsWithBoth) {
  EXPECT_DEATH(TESSERA_CHECK_MSG(false, "a literal"), "false: a literal");
  const std::string owned = "a std::string";
  EXPECT_DEATH(TESSERA_CHECK_MSG(1 == 2, owned), "1 == 2: a std::string");
  EXPECT_DEATH(TESSERA_CHECK_MSG(false, absl::string_view("a view")), "a view");
  EXPECT_DEATH(TESSERA_CHECK_MSG(false, std::string_view("a std view")), "a std view");
}

TEST_F(CheckDeathTest, TheProcessEndsWithSigabrt) {
  EXPECT_EXIT(TESSERA_CHECK(false), ::testing::KilledBySignal(SIGABRT), "false");
}

TEST(CheckTest, ATrueCheckEvaluatesItsConditionOnceAndNotItsMessage) {
  int evaluated = 0, message = 0;
  TESSERA_CHECK(++evaluated == 1);
  TESSERA_CHECK_MSG(++evaluated == 2, (++message, "never built"));
  EXPECT_EQ(evaluated, 2);
  EXPECT_EQ(message, 0);
}

TEST(CheckTest, ADcheckIsCompiledOutWithNdebug) {
  int evaluated = 0;
  TESSERA_DCHECK(++evaluated == 100);
  EXPECT_EQ(evaluated, 0);
}

}  // namespace
}  // namespace tessera

#include "examples/straggler.h"

#include <gtest/gtest.h>

#include <vector>

namespace tessera::examples {
namespace {

TEST(StragglerModelTest, NoneSlowsNobody) {
  StragglerModel m;
  for (uint64_t step = 0; step < 100; ++step)
    for (uint32_t w = 0; w < 4; ++w) EXPECT_EQ(m.Factor(w, 4, step), 1.0);
}

TEST(StragglerModelTest, FixedSlowsOnlyItsRankAtEveryStep) {
  StragglerModel m{.mode = StragglerModel::Mode::kFixed, .rank = 3, .slowdown = 2.0};
  for (uint64_t step = 0; step < 100; ++step) {
    for (uint32_t w = 0; w < 4; ++w) EXPECT_EQ(m.Factor(w, 4, step), w == 3 ? 2.0 : 1.0);
  }
}

TEST(StragglerModelTest, RotatingSlowsExactlyOneWorkerPerStepSpreadOverAll) {
  StragglerModel m{.mode = StragglerModel::Mode::kRotating, .slowdown = 2.0, .period = 5, .seed = 11};
  constexpr uint32_t kWorkers = 4;
  constexpr uint64_t kSteps = 40000;
  std::vector<uint64_t> slow_steps(kWorkers);
  for (uint64_t step = 0; step < kSteps; ++step) {
    int slow = 0;
    for (uint32_t w = 0; w < kWorkers; ++w) {
      if (m.Factor(w, kWorkers, step) == 2.0) {
        ++slow;
        ++slow_steps[w];
      }
    }
    ASSERT_EQ(slow, 1) << "step " << step;
    // The slow worker changes only at period boundaries.
    if (step % 5 != 0) {
      EXPECT_EQ(m.SlowWorker(kWorkers, step), m.SlowWorker(kWorkers, step - 1));
    }
  }
  // Each worker is slow about a quarter of the time: 2000 periods, binomial
  // standard deviation about 19 periods = 97 steps; allow 6 of them.
  for (uint32_t w = 0; w < kWorkers; ++w) EXPECT_NEAR(slow_steps[w], kSteps / kWorkers, 600.0) << "worker " << w;
}

TEST(StragglerModelTest, RejectsBadParameters) {
  EXPECT_FALSE(StragglerModel::ParseMode("sometimes").ok());
  EXPECT_TRUE(StragglerModel::ParseMode("rotating").ok());
  EXPECT_FALSE((StragglerModel{.mode = StragglerModel::Mode::kFixed, .rank = 4}).Validate(4).ok());
  EXPECT_FALSE((StragglerModel{.slowdown = 0.5}).Validate(4).ok());
  EXPECT_FALSE((StragglerModel{.mode = StragglerModel::Mode::kRotating, .period = 0}).Validate(4).ok());
  EXPECT_TRUE((StragglerModel{.mode = StragglerModel::Mode::kFixed, .rank = 3}).Validate(4).ok());
}

}  // namespace
}  // namespace tessera::examples

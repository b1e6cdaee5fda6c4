#include "server/clock_table.h"

#include <gtest/gtest.h>

namespace tessera {
namespace {

TEST(ClockTableTest, MinFollowsTheSlowestLiveWorker) {
  ClockTable t;
  EXPECT_EQ(t.min_clock(), ClockTable::kNoWorkers);
  t.Reset({{10, 0}, {11, 1}, {12, 2}});
  EXPECT_EQ(t.min_clock(), 0u);
  ASSERT_TRUE(t.Advance(10, 2).ok());
  ASSERT_TRUE(t.Advance(11, 1).ok());
  EXPECT_EQ(t.min_clock(), 0u);
  ASSERT_TRUE(t.Advance(12, 3).ok());
  EXPECT_EQ(t.min_clock(), 1u);
  EXPECT_EQ(t.DescribeBehind(3), "worker 1 (at clock 1), worker 0 (at clock 2)");
  t.Remove(11);
  EXPECT_EQ(t.min_clock(), 2u);
  t.Remove(10);
  t.Remove(12);
  EXPECT_EQ(t.min_clock(), ClockTable::kNoWorkers);
}

TEST(ClockTableTest, ClocksNeverGoBackwards) {
  ClockTable t;
  t.Reset({{1, 0}});
  ASSERT_TRUE(t.Advance(1, 5).ok());
  ASSERT_TRUE(t.Advance(1, 3).ok());  // a stale duplicate is ignored
  EXPECT_EQ(t.ClockOf(1), 5u);
}

TEST(ClockTableTest, UnknownAndDepartedWorkersAreErrors) {
  ClockTable t;
  t.Reset({{1, 0}});
  EXPECT_EQ(t.Advance(7, 1).code(), absl::StatusCode::kFailedPrecondition);
  t.Remove(1);
  auto s = t.Advance(1, 1);
  EXPECT_NE(s.message().find("worker 0 has left"), std::string::npos) << s;
}

TEST(ClockTableTest, AWorkerThatJoinsStartsAtTheHighestClockAnnouncedAndHoldsNobodyBack) {
  ClockTable t;
  t.Reset({{1, 0}, {2, 1}});
  ASSERT_TRUE(t.Advance(1, 7).ok());
  ASSERT_TRUE(t.Advance(2, 5).ok());
  EXPECT_EQ(t.Join(3, 2), 7u) << "worker 0 may have read everything below 7 as complete";
  EXPECT_EQ(t.min_clock(), 5u) << "the minimum does not drop";
  EXPECT_EQ(t.ClockOf(3), 7u);
  EXPECT_TRUE(t.IsLive(3));
  EXPECT_EQ(t.DescribeBehind(8), "worker 1 (at clock 5), worker 0 (at clock 7), worker 2 (at clock 7)");
  // Again: unchanged; the worker's own announcements move it on.
  ASSERT_TRUE(t.Advance(3, 9).ok());
  EXPECT_EQ(t.Join(3, 2), 9u);
  // One that left stays gone.
  t.Remove(3);
  EXPECT_EQ(t.Join(3, 2), 0u);
  EXPECT_FALSE(t.IsLive(3));
  // The fastest workers left: a newcomer still starts at the highest clock
  // announced here (worker 2 read at clock 9 what was stamped below 9 - s).
  EXPECT_EQ(t.highest_clock(), 9u);
  t.Remove(1);
  EXPECT_EQ(t.Join(5, 4), 9u);
  EXPECT_EQ(t.min_clock(), 5u);
  // With no worker live at all (found by the simulator: the job's workers
  // had all finished when one joined, and its pushes at clock 0 landed
  // below pulls answered at clock 3 and above), the same.
  t.Remove(2);
  t.Remove(5);
  EXPECT_EQ(t.min_clock(), ClockTable::kNoWorkers);
  EXPECT_EQ(t.Join(4, 3), 9u);
  EXPECT_EQ(t.min_clock(), 9u);
  EXPECT_EQ(t.Join(6, 5, /*test_at_zero=*/true), 0u) << "the negative control still starts at 0";
}

}  // namespace
}  // namespace tessera

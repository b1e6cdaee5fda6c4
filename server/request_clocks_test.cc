#include "server/request_clocks.h"

#include <gtest/gtest.h>

namespace tessera {
namespace {

TEST(RequestClocksTest, ClockFieldsMustBeInRangeAndHoldsWithinTheLimit) {
  proto::Envelope pull;
  pull.mutable_pull()->set_clock(kMaxClock - 1);
  pull.mutable_pull()->set_hold_timeout_ms(1000);
  EXPECT_TRUE(CheckClockFields(pull, 1 * kSeconds).ok());
  pull.mutable_pull()->set_hold_timeout_ms(1001);
  auto s = CheckClockFields(pull, 1 * kSeconds);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("pull asks to be held up to 1001 ms"), std::string::npos) << s;
  proto::Envelope push;
  push.mutable_push()->set_clock(kMaxClock);
  s = CheckClockFields(push, 1 * kSeconds);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("push clock 4611686018427387904 is out of range"), std::string::npos) << s;
  proto::Envelope advance;
  advance.mutable_clock_advance()->set_clock(kMaxClock + 5);
  EXPECT_FALSE(CheckClockFields(advance, 1 * kSeconds).ok());
  proto::Envelope other;  // no clock fields
  other.mutable_create_table();
  EXPECT_TRUE(CheckClockFields(other, 0).ok());
}

TEST(RequestClocksTest, StalenessAndTheClockAReaderNeeds) {
  proto::TableConfig c;
  c.set_consistency(proto::BSP);
  c.set_staleness(5);  // ignored under BSP
  EXPECT_EQ(Staleness(c), 0u);
  c.set_consistency(proto::SSP);
  EXPECT_EQ(Staleness(c), 5u);
  c.set_consistency(proto::ASP);
  EXPECT_EQ(Staleness(c), kUnboundedStaleness);
  EXPECT_EQ(RequiredMinClock(7, 0), 7u);
  EXPECT_EQ(RequiredMinClock(7, 5), 2u);
  EXPECT_EQ(RequiredMinClock(3, 5), 0u);  // saturates
  EXPECT_EQ(RequiredMinClock(1000, kUnboundedStaleness), 0u);
}

TEST(RequestClocksTest, APushMovesItsTableAtMostOnePastTheHighestClockHeard) {
  EXPECT_EQ(PushTableClock(4, 9), 4u);
  EXPECT_EQ(PushTableClock(10, 9), 10u);
  EXPECT_EQ(PushTableClock(uint64_t{1} << 40, 9), 10u);
}

TEST(RequestClocksTest, DistinctShardsAreSortedOnceEach) {
  const std::vector<uint32_t> v = {5, 1, 5, 3, 1, 0};
  EXPECT_EQ(DistinctShards(v, 8, [](uint32_t) { return true; }), (std::vector<uint32_t>{0, 1, 3, 5}));
  EXPECT_EQ(DistinctShards(v, 8, [](uint32_t s) { return s % 2 == 1; }), (std::vector<uint32_t>{1, 3, 5}));
}

}  // namespace
}  // namespace tessera

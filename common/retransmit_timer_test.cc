#include "common/retransmit_timer.h"

#include <gtest/gtest.h>

namespace tessera {
namespace {

RetransmitOptions Opts() {
  return RetransmitOptions{.initial = 300 * kMillis, .floor = 1 * kMillis, .ceiling = 1 * kSeconds,
                           .bytes_per_second = 0};
}

TEST(RetransmitTimerTest, InitialBeforeAnySample) {
  RetransmitTimer t(Opts());
  EXPECT_EQ(t.samples(), 0u);
  EXPECT_EQ(t.rto(), 300 * kMillis);
}

TEST(RetransmitTimerTest, FirstSampleSetsSmoothedAndHalfVariation) {
  RetransmitTimer t(Opts());
  t.Sample(4 * kMillis);
  EXPECT_EQ(t.smoothed(), 4 * kMillis);
  EXPECT_EQ(t.variation(), 2 * kMillis);
  EXPECT_EQ(t.rto(), 12 * kMillis);  // 4 + 4 x 2
}

TEST(RetransmitTimerTest, FollowsSteadyRoundTripsDown) {
  RetransmitTimer t(Opts());
  t.Sample(100 * kMillis);
  for (int i = 0; i < 200; ++i) t.Sample(3 * kMillis);
  // The variation decays towards 0 and the smoothed value towards 3 ms.
  EXPECT_NEAR(static_cast<double>(t.smoothed()), 3.0 * kMillis, 0.01 * kMillis);
  EXPECT_LT(t.rto(), 4 * kMillis);
  EXPECT_GE(t.rto(), 3 * kMillis);
}

TEST(RetransmitTimerTest, FollowsRoundTripsUpAndWidensWithJitter) {
  RetransmitTimer t(Opts());
  for (int i = 0; i < 50; ++i) t.Sample(2 * kMillis);
  const Nanos calm = t.rto();
  for (int i = 0; i < 50; ++i) t.Sample(i % 2 ? 2 * kMillis : 40 * kMillis);
  EXPECT_GT(t.rto(), 4 * calm) << "jitter widens the timer";
  EXPECT_GT(t.smoothed(), 10 * kMillis);
}

TEST(RetransmitTimerTest, ClampedToFloorAndCeiling) {
  RetransmitTimer t(Opts());
  for (int i = 0; i < 100; ++i) t.Sample(10'000);  // 10 us
  EXPECT_EQ(t.rto(), 1 * kMillis);
  RetransmitTimer slow(Opts());
  slow.Sample(5 * kSeconds);
  EXPECT_EQ(slow.rto(), 1 * kSeconds);
  slow.Sample(-7);  // counts as 0
  EXPECT_GE(slow.rto(), 1 * kMillis);
}

TEST(RetransmitTimerTest, BackoffDoublesUpToTheCeiling) {
  RetransmitTimer t(Opts());
  t.Sample(10 * kMillis);  // rto 30 ms
  EXPECT_EQ(t.After(0, 0), 30 * kMillis);
  EXPECT_EQ(t.After(1, 0), 60 * kMillis);
  EXPECT_EQ(t.After(3, 0), 240 * kMillis);
  EXPECT_EQ(t.After(6, 0), 1 * kSeconds);
  EXPECT_EQ(t.After(4'000'000'000u, 0), 1 * kSeconds) << "no overflow";
}

TEST(RetransmitTimerTest, BytesAddTheirTransferTime) {
  RetransmitOptions o = Opts();
  o.bytes_per_second = 100e6;
  RetransmitTimer t(o);
  t.Sample(10 * kMillis);
  EXPECT_EQ(t.After(0, 0), 30 * kMillis);
  EXPECT_EQ(t.After(0, 100'000'000), 30 * kMillis + 1 * kSeconds) << "100 MB at 100 MB/s";
  EXPECT_EQ(t.After(9, 10'000'000), 1 * kSeconds + 100 * kMillis) << "the allowance is not capped";
  EXPECT_GT(t.After(0, ~uint64_t{0}), 0) << "no overflow";
}

// A peer that gets through what it is sent slowly (a server moving rows to
// disk) teaches the timer its pace, and queued bytes are allowed that time:
// a part with 4 MB ahead of it at a server doing 4 MB/s is not resent at
// the ceiling plus 40 ms (100 MB/s) but waits about 2 s more.
TEST(RetransmitTimerTest, APeersSlowPaceIsLearnedAndAllowedForTheBytesAhead) {
  RetransmitOptions o = Opts();
  o.bytes_per_second = 100e6;
  RetransmitTimer t(o);
  EXPECT_EQ(t.rate(), 0.0);
  EXPECT_EQ(t.allowance_rate(), 100e6);
  // Small requests teach no pace, whatever their round trip.
  t.Sample(500 * kMillis, RetransmitTimer::kRateMinBytes - 1);
  EXPECT_EQ(t.rate(), 0.0);
  EXPECT_EQ(t.After(0, 4'000'000), t.rto() + 40 * kMillis);
  for (int i = 0; i < 20; ++i) t.Sample(1 * kSeconds, 4'000'000);
  EXPECT_DOUBLE_EQ(t.rate(), 4e6);
  EXPECT_DOUBLE_EQ(t.allowance_rate(), 2e6) << "half the pace learned";
  EXPECT_EQ(t.After(0, 4'000'000), t.rto() + 2 * kSeconds);
  EXPECT_EQ(t.After(0, 0), t.rto()) << "nothing ahead: the round trip's timer alone";
  // The pace moves by an eighth a sample, up as down.
  t.Sample(100 * kMillis, 4'000'000);  // 40 MB/s
  EXPECT_DOUBLE_EQ(t.rate(), 4e6 + (40e6 - 4e6) / 8);
}

TEST(RetransmitTimerTest, AFastPeerNeverShortensTheConfiguredAllowance) {
  RetransmitOptions o = Opts();
  o.bytes_per_second = 100e6;
  RetransmitTimer t(o);
  t.Sample(1 * kMillis, 10'000'000);  // 10 GB/s
  EXPECT_GT(t.rate(), 1e9);
  EXPECT_EQ(t.allowance_rate(), 100e6);
  EXPECT_EQ(t.After(0, 100'000'000), t.rto() + 1 * kSeconds);
  // With no allowance configured (0), none is learned either.
  o.bytes_per_second = 0;
  RetransmitTimer none(o);
  none.Sample(1 * kSeconds, 4'000'000);
  EXPECT_EQ(none.After(0, 4'000'000), none.rto());
}

}  // namespace
}  // namespace tessera

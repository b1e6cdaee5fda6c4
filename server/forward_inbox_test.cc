#include "server/forward_inbox.h"

#include <gtest/gtest.h>

namespace tessera {
namespace {

using Verdict = ForwardInbox::Verdict;

Message Forward(uint64_t stream, uint64_t position) {
  Message m;
  m.header.mutable_replicate()->set_stream(stream);
  m.header.mutable_replicate()->set_position(position);
  return m;
}

ForwardInbox::Decision Receive(ForwardInbox& in, uint32_t from, uint64_t stream, uint64_t position) {
  return in.Receive(from, stream, position, Forward(stream, position));
}

TEST(ForwardInboxTest, AppliesInOrderAndAcknowledgesResendsAgain) {
  ForwardInbox in;
  EXPECT_EQ(Receive(in, 7, 1, 1).verdict, Verdict::kApply);
  EXPECT_EQ(Receive(in, 7, 1, 2).verdict, Verdict::kApply);
  const auto again = Receive(in, 7, 1, 1);
  EXPECT_EQ(again.verdict, Verdict::kAckAgain);
  EXPECT_EQ(again.ack_position, 2u);  // everything up to 2 was taken
  EXPECT_EQ(Receive(in, 7, 1, 3).verdict, Verdict::kApply);
}

TEST(ForwardInboxTest, KeepsForwardsAheadOfAGapAndReportsEachGapOnce) {
  ForwardInbox in;
  ASSERT_EQ(Receive(in, 7, 1, 1).verdict, Verdict::kApply);
  auto d = Receive(in, 7, 1, 3);  // 2 is missing
  EXPECT_EQ(d.verdict, Verdict::kKept);
  EXPECT_TRUE(d.gap_notice);
  EXPECT_EQ(d.ack_position, 1u);
  d = Receive(in, 7, 1, 4);
  EXPECT_EQ(d.verdict, Verdict::kKept);
  EXPECT_FALSE(d.gap_notice);  // 2 was reported already
  EXPECT_EQ(in.kept(7), 2u);
  EXPECT_FALSE(in.TakeNext(7).has_value());  // 2 has not come
  ASSERT_EQ(Receive(in, 7, 1, 2).verdict, Verdict::kApply);
  auto next = in.TakeNext(7);
  ASSERT_TRUE(next.has_value());
  EXPECT_EQ(next->header.replicate().position(), 3u);
  ASSERT_EQ(in.Receive(7, 1, 3, *next).verdict, Verdict::kApply);
  next = in.TakeNext(7);
  ASSERT_TRUE(next.has_value());
  EXPECT_EQ(next->header.replicate().position(), 4u);
  ASSERT_EQ(in.Receive(7, 1, 4, *next).verdict, Verdict::kApply);
  EXPECT_FALSE(in.TakeNext(7).has_value());
  EXPECT_EQ(in.kept(7), 0u);
  // A new gap is reported again.
  EXPECT_TRUE(Receive(in, 7, 1, 6).gap_notice);
}

TEST(ForwardInboxTest, ANewStreamStartsAfreshAndAnOldOneIsIgnored) {
  ForwardInbox in;
  ASSERT_EQ(Receive(in, 7, 1, 1).verdict, Verdict::kApply);
  ASSERT_EQ(Receive(in, 7, 1, 5).verdict, Verdict::kKept);
  EXPECT_EQ(Receive(in, 7, 2, 1).verdict, Verdict::kApply);  // position 1 of stream 2
  EXPECT_EQ(in.kept(7), 0u);                                 // stream 1's early forward is gone
  EXPECT_EQ(Receive(in, 7, 1, 2).verdict, Verdict::kIgnore);
  EXPECT_EQ(Receive(in, 7, 2, 2).verdict, Verdict::kApply);
  // Another primary has its own stream.
  EXPECT_EQ(Receive(in, 8, 1, 2).verdict, Verdict::kKept);
  EXPECT_EQ(Receive(in, 8, 1, 1).verdict, Verdict::kApply);
}

TEST(ForwardInboxTest, KeepsAtMostTheBoundOfEarlyForwards) {
  ForwardInbox in;
  for (uint64_t p = 2; p < 2 + ForwardInbox::kMaxEarlyForwards + 10; ++p) Receive(in, 7, 1, p);
  EXPECT_EQ(in.kept(7), ForwardInbox::kMaxEarlyForwards);
}

}  // namespace
}  // namespace tessera

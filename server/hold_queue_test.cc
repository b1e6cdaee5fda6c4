#include "server/hold_queue.h"

#include <gtest/gtest.h>

namespace tessera {
namespace {

Message Request(const std::string& from, uint64_t id, uint64_t first = 0) {
  Message m;
  m.header.set_sender_address(from);
  m.header.set_request_id(id);
  m.header.set_first_request_id(first);
  m.header.mutable_pull()->set_clock(id);
  return m;
}

std::vector<uint64_t> Ids(const std::vector<HeldRequest>& held) {
  std::vector<uint64_t> ids;
  for (const HeldRequest& x : held) ids.push_back(x.request.header.request_id());
  return ids;
}

TEST(HoldQueueTest, ReleasesWhatTheMinClockAllowsInArrivalOrder) {
  HoldQueue q;
  q.Hold(Request("a", 1), 3, 0, 1000);
  q.Hold(Request("b", 2), 1, 0, 1000);
  q.Hold(Request("a", 3), 2, 0, 1000);
  EXPECT_TRUE(q.TakeReady(0).empty());
  EXPECT_EQ(Ids(q.TakeReady(2)), (std::vector<uint64_t>{2, 3}));
  EXPECT_EQ(q.size(), 1u);
  EXPECT_EQ(Ids(q.TakeReady(5)), (std::vector<uint64_t>{1}));
  EXPECT_EQ(q.size(), 0u);
}

TEST(HoldQueueTest, ExpiresAtTheDeadlineAndKeepsTheRest) {
  HoldQueue q;
  q.Hold(Request("a", 1), 9, 0, 100);
  q.Hold(Request("a", 2), 9, 10, 50);
  q.Hold(Request("a", 3), 9, 20, 200);
  EXPECT_TRUE(q.TakeExpired(49).empty());
  EXPECT_EQ(Ids(q.TakeExpired(100)), (std::vector<uint64_t>{1, 2}));
  const auto rest = q.TakeReady(9);
  ASSERT_EQ(rest.size(), 1u);
  EXPECT_EQ(rest[0].arrived, 20);
  EXPECT_EQ(rest[0].request.header.pull().clock(), 3u);  // the request itself comes back
}

TEST(HoldQueueTest, AResendRenamesTheHeldRequestInsteadOfHoldingItTwice) {
  HoldQueue q;
  q.Hold(Request("a", 7), 5, 0, 1000);
  EXPECT_FALSE(q.Renew("a", 0, 8, 10));  // not a resend
  EXPECT_FALSE(q.Renew("b", 7, 8, 10));  // another sender's id 7
  EXPECT_FALSE(q.Renew("a", 6, 8, 10));  // not held
  EXPECT_TRUE(q.Renew("a", 7, 8, 10));
  EXPECT_TRUE(q.Renew("a", 7, 9, 20));  // a second resend finds it by its first id
  EXPECT_EQ(q.size(), 1u);
  EXPECT_EQ(q.HeldFrom("a"), 1u);
  const auto out = q.TakeReady(5);
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].request.header.request_id(), 9u);
  EXPECT_EQ(out[0].request.header.first_request_id(), 7u);
  EXPECT_EQ(out[0].arrived, 20);
  EXPECT_EQ(out[0].deadline, 1000);  // the deadline stays
}

TEST(HoldQueueTest, CountsPerSender) {
  HoldQueue q;
  q.Hold(Request("a", 1), 1, 0, 10);
  q.Hold(Request("b", 2), 1, 0, 10);
  q.Hold(Request("a", 3), 1, 0, 10);
  EXPECT_EQ(q.HeldFrom("a"), 2u);
  EXPECT_EQ(q.HeldFrom("b"), 1u);
  EXPECT_EQ(q.HeldFrom("c"), 0u);
}

}  // namespace
}  // namespace tessera

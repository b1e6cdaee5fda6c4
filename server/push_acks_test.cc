#include "server/push_acks.h"

#include <gtest/gtest.h>

namespace tessera {
namespace {

Message Ack(uint64_t id) {
  Message m;
  m.header.set_request_id(id);
  m.header.mutable_ack();
  return m;
}

TEST(PushAcksTest, APushIsDoneWhenItsLastForwardIs) {
  PushAcks acks;
  acks.Wait(1, "w", Ack(11), 2, {3});
  EXPECT_EQ(acks.size(), 1u);
  EXPECT_FALSE(acks.Done(1, absl::OkStatus()).has_value());
  auto done = acks.Done(1, absl::OkStatus());
  ASSERT_TRUE(done.has_value());
  EXPECT_EQ(done->to, "w");
  EXPECT_EQ(done->reply.header.request_id(), 11u);
  EXPECT_TRUE(done->status.ok());
  EXPECT_EQ(acks.size(), 0u);
  EXPECT_FALSE(acks.Done(1, absl::OkStatus()).has_value());  // answered already
  EXPECT_FALSE(acks.Done(9, absl::OkStatus()).has_value());  // never here
}

TEST(PushAcksTest, TheFirstRejectionIsKept) {
  PushAcks acks;
  acks.Wait(1, "w", Ack(11), 3, {});
  EXPECT_FALSE(acks.Done(1, absl::FailedPreconditionError("first")).has_value());
  EXPECT_FALSE(acks.Done(1, absl::InvalidArgumentError("second")).has_value());
  auto done = acks.Done(1, absl::OkStatus());
  ASSERT_TRUE(done.has_value());
  EXPECT_EQ(done->status.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(done->status.message(), "first");
}

TEST(PushAcksTest, PushesThatTouchedAMovedShardAreHandedBack) {
  PushAcks acks;
  acks.Wait(1, "a", Ack(11), 1, {1, 2});
  acks.Wait(2, "b", Ack(12), 1, {3});
  acks.Wait(3, "", Ack(13), 1, {2, 4});
  auto taken = acks.TakeTouching([](uint32_t v) { return v == 2; });
  ASSERT_EQ(taken.size(), 2u);
  for (const auto& [w, shard] : taken) {
    EXPECT_EQ(shard, 2u);
    EXPECT_TRUE(w.reply.header.request_id() == 11 || w.reply.header.request_id() == 13);
  }
  EXPECT_EQ(acks.size(), 1u);
  auto all = acks.TakeAll();
  ASSERT_EQ(all.size(), 1u);
  EXPECT_EQ(all[0].to, "b");
  EXPECT_EQ(acks.size(), 0u);
}

}  // namespace
}  // namespace tessera

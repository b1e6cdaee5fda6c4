#include "worker/request_tracker.h"

#include <gtest/gtest.h>

namespace tessera {
namespace {

Message Ack(uint64_t id) {
  Message m;
  m.header.set_request_id(id);
  m.header.mutable_ack();
  return m;
}

Message Values(uint64_t id, std::vector<float> v) {
  Message m;
  m.header.set_request_id(id);
  m.header.mutable_pull_reply()->set_num_keys(v.size());
  m.frames.push_back(Buffer::CopyOf(v.data(), v.size() * sizeof(float)));
  return m;
}

Message Error(uint64_t id, const std::string& text) {
  Message m;
  m.header.set_request_id(id);
  m.header.mutable_error()->set_code(static_cast<int>(absl::StatusCode::kNotFound));
  m.header.mutable_error()->set_message(text);
  return m;
}

TEST(RequestTrackerTest, PushCompletesWhenEveryPartAcked) {
  RequestTracker t({"a", "b"});
  auto h = std::make_shared<int>(1);
  t.Begin(h, "push to table 1", {{1, 0, {}}, {2, 1, {}}}, 100);
  EXPECT_TRUE(t.OnReply(Ack(2)).empty());
  auto done = t.OnReply(Ack(1));
  ASSERT_EQ(done.size(), 1u);
  EXPECT_EQ(done[0].handle, h);
  EXPECT_TRUE(done[0].status.ok());
  EXPECT_EQ(t.in_flight(), 0u);
}

TEST(RequestTrackerTest, PullScattersRowsIntoTheCallersBuffer) {
  RequestTracker t({"a", "b"});
  std::vector<float> out(8, -1);
  RequestTracker::Scatter s0{0, {0, 3}, 2};  // keys 0 and 3 on server 0
  RequestTracker::Scatter s1{0, {1, 2}, 2};  // keys 1 and 2 on server 1
  t.Begin(std::make_shared<int>(0), "pull", {{10, 0, s0}, {11, 1, s1}}, 100, out, 2);
  EXPECT_TRUE(t.OnReply(Values(11, {10, 11, 20, 21})).empty());
  auto done = t.OnReply(Values(10, {0, 1, 30, 31}));
  ASSERT_EQ(done.size(), 1u);
  EXPECT_TRUE(done[0].status.ok()) << done[0].status;
  EXPECT_EQ(out, (std::vector<float>{0, 1, 10, 11, 20, 21, 30, 31}));
}

TEST(RequestTrackerTest, MalformedReplyFailsWithoutWritingOutside) {
  RequestTracker t({"a"});
  std::vector<float> out(2, -1);
  t.Begin(std::make_shared<int>(0), "pull", {{1, 0, {0, {}, 2}}}, 100, out, 1);
  auto done = t.OnReply(Values(1, {1, 2, 3, 4, 5}));  // too many values
  ASSERT_EQ(done.size(), 1u);
  EXPECT_EQ(done[0].status.code(), absl::StatusCode::kInternal);
  EXPECT_NE(done[0].status.message().find("server 0 (a)"), std::string::npos) << done[0].status;
  EXPECT_EQ(out, (std::vector<float>{-1, -1}));
}

TEST(RequestTrackerTest, ServerErrorIsReportedWithItsName) {
  RequestTracker t({"a", "b"});
  t.Begin(std::make_shared<int>(0), "push to table 9", {{1, 0, {}}, {2, 1, {}}}, 100);
  EXPECT_TRUE(t.OnReply(Error(2, "no table 9 on this server")).empty());
  auto done = t.OnReply(Ack(1));
  ASSERT_EQ(done.size(), 1u);
  EXPECT_EQ(done[0].status.code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(done[0].status.message(), "push to table 9: server 1 (b): no table 9 on this server");
}

TEST(RequestTrackerTest, TimeoutNamesTheSilentServersAndLateRepliesAreIgnored) {
  RequestTracker t({"a", "b", "c"});
  t.Begin(std::make_shared<int>(0), "pull from table 2", {{1, 0, {}}, {2, 1, {}}, {3, 2, {}}}, 100);
  t.OnReply(Ack(2));
  EXPECT_TRUE(t.Tick(99).empty());
  auto done = t.Tick(100);
  ASSERT_EQ(done.size(), 1u);
  EXPECT_EQ(done[0].status.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_NE(done[0].status.message().find("server 0 (a), server 2 (c)"), std::string::npos) << done[0].status;
  EXPECT_TRUE(t.OnReply(Ack(1)).empty());
  EXPECT_EQ(t.ignored_replies(), 1u);
}

TEST(RequestTrackerTest, FailAllCompletesEverything) {
  RequestTracker t({"a"});
  t.Begin(std::make_shared<int>(0), "push", {{1, 0, {}}}, 100);
  t.Begin(std::make_shared<int>(0), "pull", {{2, 0, {}}}, 100);
  auto done = t.FailAll(absl::UnavailableError("lost the coordinator"));
  EXPECT_EQ(done.size(), 2u);
  for (auto& c : done) EXPECT_EQ(c.status.code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(t.in_flight(), 0u);
}

}  // namespace
}  // namespace tessera

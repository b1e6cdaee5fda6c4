#include "server/answers.h"

#include <gtest/gtest.h>

#include "compress/row_compressor.h"

namespace tessera {
namespace {

Buffer Floats(std::vector<float> values) {
  Buffer b = Buffer::Allocate(values.size() * sizeof(float));
  std::copy(values.begin(), values.end(), b.AsMutable<float>().begin());
  return b;
}

TEST(AnswersTest, APullReplySaysItsRowsClocksAndStaleness) {
  proto::Pull pull;
  pull.set_num_keys(2);
  pull.set_clock(7);
  pull.set_whole(true);
  Message reply;
  uint64_t bytes_out = 5;
  ASSERT_TRUE(FillPullReply(pull, Floats({1, 2, 3, 4, 5, 6}), 4, 3000, nullptr, 0, reply, &bytes_out).ok());
  const proto::PullReply& pr = reply.header.pull_reply();
  EXPECT_EQ(pr.num_keys(), 2u);
  EXPECT_EQ(pr.width(), 3u);
  EXPECT_EQ(pr.min_clock(), 4u);
  EXPECT_EQ(pr.held_us(), 3u);
  EXPECT_EQ(pr.staleness(), 3u);
  EXPECT_EQ(pr.value_parts(), 0u);
  EXPECT_TRUE(reply.unsplit);
  ASSERT_EQ(reply.frames.size(), 1u);
  EXPECT_EQ(reply.frames[0].size(), 6 * sizeof(float));
  EXPECT_EQ(bytes_out, 5 + 6 * sizeof(float));

  Message fresh;  // the min clock is at the pull's clock, or there are no workers
  ASSERT_TRUE(FillPullReply(pull, Floats({1}), 7, 0, nullptr, 0, fresh, &bytes_out).ok());
  EXPECT_EQ(fresh.header.pull_reply().staleness(), 0u);
  Message alone;
  ASSERT_TRUE(FillPullReply(pull, Floats({1}), ClockTable::kNoWorkers, 0, nullptr, 0, alone, &bytes_out).ok());
  EXPECT_EQ(alone.header.pull_reply().staleness(), 0u);
}

TEST(AnswersTest, APullReplyWithACodecGoesAsEncodedParts) {
  auto spec = compress::ParsePullSpec("fp16");
  ASSERT_TRUE(spec.ok()) << spec.status();
  auto codec = compress::Codec::Create(*spec);
  ASSERT_TRUE(codec.ok()) << codec.status();
  proto::Pull pull;
  pull.set_num_keys(1);
  const size_t n = std::max<size_t>(spec->raw_below, 1) * 4;  // well past the raw threshold
  Message reply;
  uint64_t bytes_out = 0;
  ASSERT_TRUE(FillPullReply(pull, Floats(std::vector<float>(n, 1.5f)), 0, 0, &*codec, 1, reply, &bytes_out).ok());
  EXPECT_GT(reply.header.pull_reply().value_parts(), 0u);
  EXPECT_EQ(reply.frames.size(), reply.header.pull_reply().value_parts());
  uint64_t frame_bytes = 0;
  for (const Buffer& b : reply.frames) frame_bytes += b.size();
  EXPECT_EQ(bytes_out, frame_bytes);
  EXPECT_LT(bytes_out, n * sizeof(float));  // fp16: about half

  Message small;  // below the threshold: raw fp32, as without a codec
  bytes_out = 0;
  ASSERT_TRUE(FillPullReply(pull, Floats({1, 2}), 0, 0, &*codec, 2, small, &bytes_out).ok());
  if (spec->raw_below > 2) {
    EXPECT_EQ(small.header.pull_reply().value_parts(), 0u);
    EXPECT_EQ(bytes_out, 2 * sizeof(float));
  }
}

TEST(AnswersTest, AClockAckIsForKnownWorkersAndSaysZeroOnceOneLeft) {
  ClockTable clocks;
  clocks.Reset({{100, 0}, {101, 1}});
  ASSERT_TRUE(clocks.Advance(100, 3).ok());
  Message reply;
  ASSERT_TRUE(FillClockAck(100, clocks, 0, 2000, reply).ok());
  EXPECT_EQ(reply.header.clock_ack().worker_clock(), 3u);
  EXPECT_EQ(reply.header.clock_ack().min_clock(), 0u);
  EXPECT_EQ(reply.header.clock_ack().held_us(), 2u);
  clocks.Remove(100);
  Message left;
  ASSERT_TRUE(FillClockAck(100, clocks, 0, 0, left).ok());
  EXPECT_EQ(left.header.clock_ack().worker_clock(), 0u);
  Message stranger;
  const absl::Status s = FillClockAck(5, clocks, 0, 0, stranger);
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(s.message(), "node 5 is not a worker of this job");
}

TEST(AnswersTest, HeldRequestsAreRefusedNamingWhatTheyWaitFor) {
  ClockTable clocks;
  clocks.Reset({{100, 0}});
  proto::Envelope h;
  h.mutable_pull()->set_table_id(4);
  h.mutable_pull()->set_clock(9);
  absl::Status s = HeldTooLongError(h, 1500 * kMillis, clocks, 8);
  EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_EQ(s.message().rfind("pull of table 4 at clock 9 waited 1500 ms for slower workers: ", 0), 0u) << s;
  EXPECT_NE(s.message().find("(needs every live worker at clock >= 8)"), std::string::npos) << s;
  proto::Envelope advance;
  advance.mutable_clock_advance()->set_clock(3);
  EXPECT_EQ(HeldTooLongError(advance, 0, clocks, 2).message().rfind("clock 3 waited 0 ms", 0), 0u);
  s = TooManyHeldError(4, "tcp://w", 4);
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(s.message(), "4 requests of tcp://w are held already, waiting for slower workers; this server holds "
                         "at most 4 per sender (tessera-server --max-held-per-peer)");
}

TEST(AnswersTest, AReplicateAckNamesItsPositionAndAnyRejection) {
  Message ok = ReplicateAckOf(10, 3, 2, 7, absl::OkStatus(), false, true);
  EXPECT_EQ(ok.header.sender_id(), 10u);
  EXPECT_EQ(ok.header.epoch(), 3u);
  const proto::ReplicateAck& a = ok.header.replicate_ack();
  EXPECT_EQ(a.stream(), 2u);
  EXPECT_EQ(a.position(), 7u);
  EXPECT_TRUE(a.gap());
  EXPECT_FALSE(a.rejected());
  EXPECT_TRUE(a.reason().empty());
  Message no = ReplicateAckOf(10, 3, 2, 8, absl::FailedPreconditionError("old"), true, false);
  EXPECT_TRUE(no.header.replicate_ack().rejected());
  EXPECT_TRUE(no.header.replicate_ack().stale_epoch());
  EXPECT_EQ(no.header.replicate_ack().reason(), "old");
}

}  // namespace
}  // namespace tessera

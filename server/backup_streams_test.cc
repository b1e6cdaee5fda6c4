#include "server/backup_streams.h"

#include <gtest/gtest.h>

namespace tessera {
namespace {

constexpr RetransmitOptions kResend = {.initial = 100 * kMillis, .floor = 1 * kMillis, .ceiling = 1 * kSeconds};

Message ForwardOf(uint32_t table) {
  Message m;
  m.header.mutable_replicate()->set_table_id(table);
  return m;
}

std::vector<uint64_t> Positions(const std::vector<Message>& messages) {
  std::vector<uint64_t> out;
  for (const Message& m : messages) out.push_back(m.header.replicate().position());
  return out;
}

TEST(BackupStreamsTest, NumbersForwardsPerStreamAndNewStreamsGetNewIds) {
  BackupStreams s(kResend);
  BackupStream& to1 = s.To(1, 101);
  EXPECT_EQ(to1.id, 1u);
  EXPECT_EQ(s.Append(to1, ForwardOf(7), 11, 0).position, 1u);
  const Forward& second = s.Append(to1, ForwardOf(7), 12, 0);
  EXPECT_EQ(second.position, 2u);
  EXPECT_EQ(second.message.header.replicate().stream(), 1u);
  EXPECT_EQ(second.message.header.replicate().position(), 2u);
  EXPECT_EQ(second.push_id, 12u);
  BackupStream& to2 = s.To(2, 102);
  EXPECT_EQ(to2.id, 2u);
  EXPECT_EQ(s.Append(to2, ForwardOf(7), 13, 0).position, 1u);  // each stream counts from 1
  EXPECT_EQ(s.To(1, 999).node_id, 101u);                   // an existing stream keeps its process
  s.End(1);
  EXPECT_EQ(s.Find(1), nullptr);
  EXPECT_EQ(s.To(1, 101).id, 3u);  // begun again: a new id
  EXPECT_EQ(s.Ranks(), (std::vector<uint32_t>{1, 2}));
  EXPECT_EQ(s.unacked(), 1u);
}

TEST(BackupStreamsTest, AnAckReleasesEverythingUpToItsPositionInOrder) {
  BackupStreams s(kResend);
  BackupStream& st = s.To(1, 101);
  for (uint64_t push = 1; push <= 3; ++push) s.Append(st, ForwardOf(7), push, 0);
  EXPECT_EQ(s.AckedThrough(1, st.id), 0u);
  EXPECT_TRUE(s.Acked(1, st.id + 1, 3, false, 10).done.empty());  // another stream: nothing
  EXPECT_TRUE(s.Acked(5, st.id, 3, false, 10).done.empty());      // no stream to that rank
  auto acked = s.Acked(1, st.id, 2, false, 10);
  ASSERT_EQ(acked.done.size(), 2u);
  EXPECT_EQ(acked.done[0].push_id, 1u);
  EXPECT_EQ(acked.done[1].push_id, 2u);
  EXPECT_EQ(s.AckedThrough(1, st.id), 2u);
  EXPECT_EQ(s.AckedThrough(1, st.id + 1), UINT64_MAX);  // a stream that ended waits for nothing
  EXPECT_EQ(s.SentThrough(1), std::make_pair(st.id, uint64_t{3}));
  EXPECT_FALSE(s.SentThrough(4).has_value());
  EXPECT_EQ(s.Acked(1, st.id, 3, false, 20).done.size(), 1u);
  EXPECT_EQ(s.AckedThrough(1, st.id), 3u);
}

TEST(BackupStreamsTest, AGapNoticeResendsTheMissingForwardOnce) {
  BackupStreams s(kResend);
  BackupStream& st = s.To(1, 101);
  for (uint64_t push = 1; push <= 3; ++push) s.Append(st, ForwardOf(7), push, 0);
  auto gap = s.Acked(1, st.id, 0, /*gap=*/true, 5);  // has 2 or 3, misses 1
  EXPECT_TRUE(gap.done.empty());
  ASSERT_TRUE(gap.gap_resend.has_value());
  EXPECT_EQ(gap.gap_resend->header.replicate().position(), 1u);
  EXPECT_EQ(st.unacked.front().resends, 1u);
  EXPECT_EQ(st.unacked.front().sent, 5);
  EXPECT_FALSE(s.Acked(1, st.id, 0, true, 6).gap_resend.has_value());  // once
}

TEST(BackupStreamsTest, ARefusedForwardLeavesTheStream) {
  BackupStreams s(kResend);
  BackupStream& st = s.To(1, 101);
  for (uint64_t push = 1; push <= 3; ++push) s.Append(st, ForwardOf(7), push, 0);
  EXPECT_FALSE(s.Refused(1, st.id, 9).has_value());
  auto refused = s.Refused(1, st.id, 2);
  ASSERT_TRUE(refused.has_value());
  EXPECT_EQ(refused->push_id, 2u);
  EXPECT_EQ(s.unacked(), 2u);
}

TEST(BackupStreamsTest, ResendsWhatIsDuePerTheTimerAndLearnsFromCleanRoundTrips) {
  BackupStreams s(kResend);
  BackupStream& st = s.To(1, 101);
  s.Append(st, ForwardOf(7), 1, 0);
  s.Append(st, ForwardOf(7), 2, 50 * kMillis);
  EXPECT_EQ(s.NextDue(), 100 * kMillis);  // the first forward's initial timer
  EXPECT_TRUE(s.TakeDue(1, 99 * kMillis, true).empty());
  EXPECT_EQ(Positions(s.TakeDue(1, 100 * kMillis, true)), std::vector<uint64_t>{1});
  EXPECT_EQ(st.unacked.front().resends, 1u);
  EXPECT_GT(s.NextDue(), 100 * kMillis);                              // doubled after a resend
  EXPECT_EQ(Positions(s.TakeDue(1, 0, false)), (std::vector<uint64_t>{1, 2}));  // all, timer or not
  // An ack of a forward sent again takes no sample; one sent once does.
  s.Acked(1, st.id, 1, false, 200 * kMillis);
  ASSERT_EQ(s.Timers().size(), 1u);
  EXPECT_EQ(s.Timers()[0].second.samples(), 0u);
  s.Append(st, ForwardOf(7), 3, 300 * kMillis);
  s.Acked(1, st.id, 2, false, 301 * kMillis);  // position 2 was resent: no sample
  s.Acked(1, st.id, 3, false, 302 * kMillis);  // sent once, acknowledged alone: 2 ms
  EXPECT_EQ(s.Timers()[0].second.samples(), 1u);
  EXPECT_LT(s.ShortestTimer(), 100 * kMillis);
  EXPECT_EQ(s.NextDue(), std::numeric_limits<Nanos>::max());  // nothing unacknowledged
}

}  // namespace
}  // namespace tessera

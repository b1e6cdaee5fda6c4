// Rendezvous (endpoint_rendezvous.h) on the simulated fabric
// (rdma/testing/simulated_fabric.h): zero copy and staged parts, ordering
// behind a rendezvous, receiver-named destinations, timeouts, peer death,
// protocol errors, registration limits.
#include "rdma/rdma_protocol.h"

#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "rdma/testing/simulated_fabric.h"

namespace tessera::rdma {
namespace {

using ::testing::HasSubstr;
using testing::AnyMentions;
using testing::Config;
using testing::Fabric;
using testing::HasPattern;
using testing::MakeMessage;
using testing::rdmaEndpointTest;

TEST_F(rdmaEndpointTest, LargeFrameGoesZeroCopyByRendezvous) {
  const std::vector<size_t> sizes = {100, 200 * 1024, 50};
  Message m = MakeMessage(9, sizes, 7);
  const std::byte* source = m.frames[1].data();
  ASSERT_TRUE(fabric_.Send(a_, b_, m).ok());
  fabric_.Run();
  ASSERT_EQ(fabric_.node(b_).delivered.size(), 1u);
  EXPECT_TRUE(HasPattern(fabric_.node(b_).delivered[0], sizes, 7));
  EXPECT_EQ(fabric_.core(a_).stats().rendezvous_zero_copy, 1u);
  EXPECT_EQ(fabric_.core(a_).stats().rendezvous_staged, 0u);
  EXPECT_EQ(fabric_.writes_executed, 1u);  // one WRITE_WITH_IMM straight from the user's buffer
  EXPECT_EQ(fabric_.core(b_).stats().rendezvous_received, 1u);
  EXPECT_NE(fabric_.node(b_).delivered[0].frames[1].data(), source);
  // Sending the same buffer again reuses its registration.
  const uint64_t registrations = fabric_.node(a_).registrar.registers();
  ASSERT_TRUE(fabric_.Send(a_, b_, m).ok());
  fabric_.Run();
  EXPECT_EQ(fabric_.node(a_).registrar.registers(), registrations);
  EXPECT_GE(fabric_.core(a_).cache().hits(), 1u);
  // And the receiver's destination block came back and was reused, registration included.
  fabric_.node(b_).delivered.clear();
  const uint64_t b_registrations = fabric_.node(b_).registrar.registers();
  ASSERT_TRUE(fabric_.Send(a_, b_, m).ok());
  fabric_.Run();
  EXPECT_EQ(fabric_.node(b_).registrar.registers(), b_registrations);
  EXPECT_GE(fabric_.core(b_).destinations().reuses(), 1u);
  ExpectIdleAndClean(a_);
  ExpectIdleAndClean(b_);
}

TEST_F(rdmaEndpointTest, MediumFrameIsStagedThroughThePool) {
  const std::vector<size_t> sizes = {10 * 1024 + 17};  // above a slot, below the threshold
  ASSERT_TRUE(fabric_.Send(a_, b_, MakeMessage(3, sizes, 8)).ok());
  fabric_.Run();
  ASSERT_EQ(fabric_.node(b_).delivered.size(), 1u);
  EXPECT_TRUE(HasPattern(fabric_.node(b_).delivered[0], sizes, 8));
  EXPECT_EQ(fabric_.core(a_).stats().rendezvous_staged, 1u);
  EXPECT_EQ(fabric_.writes_executed, 3u);  // 4096 + 4096 + 2065
  EXPECT_EQ(fabric_.node(a_).registrar.registers(), 0u) << "staging needs no registration";
  ExpectIdleAndClean(a_);
  ExpectIdleAndClean(b_);
}

TEST_F(rdmaEndpointTest, RefusedSourceRegistrationFallsBackToStaging) {
  Fabric fabric;
  ProtocolConfig small = Config("rdma://10.0.0.1:4000");
  small.max_pinned_bytes = 64 * 1024;  // the sender cannot pin a 256 KiB frame
  const int a = fabric.AddNode(small);
  const int b = fabric.AddNode(Config("rdma://10.0.0.2:4000"));
  const std::vector<size_t> sizes = {256 * 1024};
  ASSERT_TRUE(fabric.Send(a, b, MakeMessage(5, sizes, 9)).ok());
  fabric.Run();
  ASSERT_EQ(fabric.node(b).delivered.size(), 1u);
  EXPECT_TRUE(HasPattern(fabric.node(b).delivered[0], sizes, 9));
  EXPECT_EQ(fabric.core(a).stats().rendezvous_staged, 1u);
  EXPECT_EQ(fabric.core(a).cache().refusals(), 1u);
  EXPECT_EQ(fabric.writes_executed, 64u);
  EXPECT_LE(fabric.core(a).pool().high_water(), 10u + small.max_staged_chunks_in_flight + 1);
}

TEST_F(rdmaEndpointTest, OversizedEnvelopeTravelsByRendezvous) {
  Message m = MakeMessage(11, {10}, 1);
  m.header.mutable_error()->set_message(std::string(20000, 'x'));
  ASSERT_TRUE(fabric_.Send(a_, b_, m).ok());
  fabric_.Run();
  ASSERT_EQ(fabric_.node(b_).delivered.size(), 1u);
  EXPECT_EQ(fabric_.node(b_).delivered[0].header.error().message(), std::string(20000, 'x'));
  EXPECT_EQ(fabric_.core(a_).stats().rendezvous_started, 1u);
}

TEST_F(rdmaEndpointTest, RendezvousHoldsBackLaterMessagesOfTheSameSender) {
  ASSERT_TRUE(fabric_.Send(a_, b_, MakeMessage(1, {300 * 1024}, 1)).ok());
  ASSERT_TRUE(fabric_.Send(a_, b_, MakeMessage(2, {10}, 1)).ok());
  ASSERT_TRUE(fabric_.Send(a_, b_, MakeMessage(3, {20 * 1024}, 1)).ok());
  ASSERT_TRUE(fabric_.Send(a_, b_, MakeMessage(4, {}, 1)).ok());
  fabric_.Run();
  ASSERT_EQ(fabric_.node(b_).delivered.size(), 4u);
  for (int i = 0; i < 4; ++i) EXPECT_EQ(fabric_.node(b_).delivered[i].header.request_id(), i + 1u);
  EXPECT_TRUE(HasPattern(fabric_.node(b_).delivered[0], {300 * 1024}, 1));
  EXPECT_TRUE(HasPattern(fabric_.node(b_).delivered[2], {20 * 1024}, 1));
}

TEST_F(rdmaEndpointTest, ManyLargeMessagesWithTinyCreditsAndPool) {
  Fabric fabric;
  ProtocolConfig c1 = Config("rdma://10.0.0.1:4000");
  c1.credits = 2;
  c1.min_send_slots = 2;
  ProtocolConfig c2 = Config("rdma://10.0.0.2:4000");
  c2.credits = 4;
  c2.min_send_slots = 2;
  c2.max_pinned_bytes = 300 * 1024;  // the receiver can take one 200 KiB value (a 256 KiB block) at a time
  const int a = fabric.AddNode(c1, 8 * 4096);
  const int b = fabric.AddNode(c2, 10 * 4096);
  std::vector<std::vector<size_t>> shapes;
  for (int i = 0; i < 60; ++i) {
    shapes.push_back({static_cast<size_t>(i % 3 == 0 ? 200 * 1024 : (i % 3 == 1 ? 9000 : 10)), 33});
    ASSERT_TRUE(fabric.Send(a, b, MakeMessage(i, shapes.back(), static_cast<uint8_t>(i))).ok());
    ASSERT_TRUE(fabric.Send(b, a, MakeMessage(i, {static_cast<size_t>(i * 100)}, 3)).ok());
  }
  fabric.Run();
  EXPECT_EQ(fabric.receive_queue_ran_dry, 0u);
  ASSERT_EQ(fabric.node(b).delivered.size(), 60u);
  ASSERT_EQ(fabric.node(a).delivered.size(), 60u);
  for (int i = 0; i < 60; ++i) {
    EXPECT_TRUE(HasPattern(fabric.node(b).delivered[i], shapes[i], static_cast<uint8_t>(i))) << i;
  }
  EXPECT_GT(fabric.core(b).stats().registration_waits, 0u);
  EXPECT_LE(fabric.node(b).registrar.high_water(), 300u * 1024);
  EXPECT_EQ(fabric.node(b).registrar.violations(), 0u);
  for (int n : {a, b}) EXPECT_TRUE(fabric.node(n).problems.empty()) << fabric.node(n).problems[0];
}

TEST_F(rdmaEndpointTest, ReceiverNamedDestinationIsWrittenDirectly) {
  Buffer mine = Buffer::Allocate(100 * 1024);
  ASSERT_TRUE(fabric_.core(b_).PostDestination(77, 1, mine).ok());
  EXPECT_EQ(fabric_.core(b_).PostDestination(77, 1, mine).code(), absl::StatusCode::kAlreadyExists);
  const std::vector<size_t> sizes = {8, 100 * 1024};
  ASSERT_TRUE(fabric_.Send(a_, b_, MakeMessage(77, sizes, 12)).ok());
  fabric_.Run();
  ASSERT_EQ(fabric_.node(b_).delivered.size(), 1u);
  const Message& got = fabric_.node(b_).delivered[0];
  EXPECT_TRUE(HasPattern(got, sizes, 12));
  EXPECT_EQ(got.frames[1].data(), mine.data()) << "not written into the posted buffer";
  EXPECT_EQ(fabric_.core(b_).stats().preposted_hits, 1u);
  EXPECT_EQ(fabric_.core(b_).destinations().allocations(), 0u);
  EXPECT_FALSE(fabric_.core(b_).CancelDestination(77, 1)) << "a used destination is consumed";
}

TEST_F(rdmaEndpointTest, ReceiverNamedDestinationOfTheWrongLengthIsNotUsed) {
  Buffer mine = Buffer::Allocate(64 * 1024);
  ASSERT_TRUE(fabric_.core(b_).PostDestination(78, 0, mine).ok());
  const std::vector<size_t> sizes = {100 * 1024};
  ASSERT_TRUE(fabric_.Send(a_, b_, MakeMessage(78, sizes, 13)).ok());
  fabric_.Run();
  ASSERT_EQ(fabric_.node(b_).delivered.size(), 1u);
  EXPECT_TRUE(HasPattern(fabric_.node(b_).delivered[0], sizes, 13));
  EXPECT_NE(fabric_.node(b_).delivered[0].frames[0].data(), mine.data());
  EXPECT_EQ(fabric_.core(b_).stats().preposted_mismatches, 1u);
  EXPECT_TRUE(fabric_.node(b_).problems.empty()) << "a frame of another size is no problem";
  // The destination stays posted: the next frame of its size takes it.
  const std::vector<size_t> fits = {64 * 1024};
  ASSERT_TRUE(fabric_.Send(a_, b_, MakeMessage(78, fits, 14)).ok());
  fabric_.Run();
  ASSERT_EQ(fabric_.node(b_).delivered.size(), 2u);
  EXPECT_EQ(fabric_.node(b_).delivered[1].frames[0].data(), mine.data());
  EXPECT_TRUE(HasPattern(fabric_.node(b_).delivered[1], fits, 14));
  EXPECT_FALSE(fabric_.core(b_).CancelDestination(78, 0));
}

TEST_F(rdmaEndpointTest, ReceiverNamedDestinationStaysPostedUntilCancelled) {
  Buffer mine = Buffer::Allocate(100 * 1024);
  std::memset(mine.mutable_data(), 0x5A, mine.size());
  ASSERT_TRUE(fabric_.core(b_).PostDestination(79, 0, mine).ok());
  // Another request id, and an inline frame of the right request: neither takes it.
  ASSERT_TRUE(fabric_.Send(a_, b_, MakeMessage(80, {100 * 1024}, 1)).ok());
  ASSERT_TRUE(fabric_.Send(a_, b_, MakeMessage(79, {100}, 2)).ok());
  fabric_.Run();
  ASSERT_EQ(fabric_.node(b_).delivered.size(), 2u);
  EXPECT_NE(fabric_.node(b_).delivered[0].frames[0].data(), mine.data());
  EXPECT_NE(fabric_.node(b_).delivered[1].frames[0].data(), mine.data());
  Actions out;
  EXPECT_EQ(fabric_.core(b_).CancelDestination(79, 0, out), EndpointCore::CancelResult::kCancelled);
  EXPECT_TRUE(out.empty());
  EXPECT_EQ(fabric_.core(b_).CancelDestination(79, 0, out), EndpointCore::CancelResult::kNotPosted);
  // Cancelled: the next frame of its size goes to a pool block.
  ASSERT_TRUE(fabric_.Send(a_, b_, MakeMessage(79, {100 * 1024}, 3)).ok());
  fabric_.Run();
  ASSERT_EQ(fabric_.node(b_).delivered.size(), 3u);
  EXPECT_NE(fabric_.node(b_).delivered[2].frames[0].data(), mine.data());
  EXPECT_TRUE(HasPattern(fabric_.node(b_).delivered[2], {100 * 1024}, 3));
  for (size_t i = 0; i < mine.size(); ++i) ASSERT_EQ(mine.data()[i], std::byte{0x5A}) << "written at " << i;
  EXPECT_EQ(fabric_.core(b_).stats().preposted_hits, 0u);
  ExpectIdleAndClean(b_);
}

TEST_F(rdmaEndpointTest, ReceiverNamedDestinationsForTwoFramesOfOneRequest) {
  Buffer first = Buffer::Allocate(70 * 1024);
  Buffer second = Buffer::Allocate(90 * 1024);
  ASSERT_TRUE(fabric_.core(b_).PostDestination(81, 0, first).ok());
  ASSERT_TRUE(fabric_.core(b_).PostDestination(81, 2, second).ok());
  const std::vector<size_t> sizes = {70 * 1024, 8, 90 * 1024};
  ASSERT_TRUE(fabric_.Send(a_, b_, MakeMessage(81, sizes, 4)).ok());
  fabric_.Run();
  ASSERT_EQ(fabric_.node(b_).delivered.size(), 1u);
  const Message& got = fabric_.node(b_).delivered[0];
  EXPECT_TRUE(HasPattern(got, sizes, 4));
  EXPECT_EQ(got.frames[0].data(), first.data());
  EXPECT_EQ(got.frames[2].data(), second.data());
  EXPECT_EQ(fabric_.core(b_).stats().preposted_hits, 2u);
  Actions out;
  EXPECT_EQ(fabric_.core(b_).CancelDestination(81, 0, out), EndpointCore::CancelResult::kNotPosted)
      << "a destination whose data arrived is no longer held";
  EXPECT_EQ(fabric_.core(b_).CancelDestination(81, 2, out), EndpointCore::CancelResult::kNotPosted);
  EXPECT_TRUE(out.empty());
  ExpectIdleAndClean(b_);
}

TEST_F(rdmaEndpointTest, CancellingADestinationThePeerMayWriteDisconnects) {
  ASSERT_TRUE(fabric_.Send(a_, b_, MakeMessage(1, {10})).ok());
  fabric_.Run();
  Buffer mine = Buffer::Allocate(100 * 1024);
  ASSERT_TRUE(fabric_.core(b_).PostDestination(82, 0, mine).ok());
  ASSERT_TRUE(fabric_.Send(a_, b_, MakeMessage(82, {100 * 1024}, 5)).ok());
  fabric_.StepNode(a_);            // the RTS reaches B, which answers clear-to-send naming `mine`
  fabric_.node(a_).frozen = true;  // A's write is posted but does not run
  fabric_.Run();
  EXPECT_EQ(fabric_.core(b_).stats().preposted_hits, 1u);
  Actions out;
  EXPECT_EQ(fabric_.core(b_).CancelDestination(82, 0, out), EndpointCore::CancelResult::kTaken);
  ASSERT_EQ(out.size(), 1u);
  auto* disconnect = std::get_if<DisconnectAction>(&out[0]);
  ASSERT_NE(disconnect, nullptr);
  EXPECT_EQ(disconnect->connection, BfromA());
  EXPECT_EQ(disconnect->reason.code(), absl::StatusCode::kCancelled);
  // The shell destroys the queue pair (A's write can no longer land), then the cores clean up.
  fabric_.Kill(b_, BfromA(), absl::UnavailableError("disconnected"));
  fabric_.node(a_).frozen = false;
  fabric_.Run();
  EXPECT_EQ(fabric_.node(b_).delivered.size(), 1u) << "the message whose destination was given up is lost";
  EXPECT_EQ(fabric_.core(b_).cache().in_use_bytes(), 0u);
  EXPECT_EQ(fabric_.core(a_).cache().in_use_bytes(), 0u);
  EXPECT_EQ(fabric_.core(b_).CancelDestination(82, 0, out), EndpointCore::CancelResult::kNotPosted);
}

TEST_F(rdmaEndpointTest, CancellingADestinationWaitingForRegistrationUsesAPoolBlock) {
  Fabric fabric;
  ProtocolConfig c1 = Config("rdma://10.0.0.1:4000");
  ProtocolConfig c2 = Config("rdma://10.0.0.2:4000");
  c2.max_pinned_bytes = 150 * 1024;  // one 100 KiB destination at a time
  const int a = fabric.AddNode(c1);
  const int b = fabric.AddNode(c2);
  ASSERT_TRUE(fabric.Send(a, b, MakeMessage(1, {10})).ok());
  fabric.Run();
  Buffer mine = Buffer::Allocate(100 * 1024);
  std::memset(mine.mutable_data(), 0x5A, mine.size());
  ASSERT_TRUE(fabric.core(b).PostDestination(84, 0, mine).ok());
  // The first value holds the registration room (A's write stalls); the
  // second, for `mine`, waits for room.
  ASSERT_TRUE(fabric.Send(a, b, MakeMessage(83, {100 * 1024}, 6)).ok());
  ASSERT_TRUE(fabric.Send(a, b, MakeMessage(84, {100 * 1024}, 7)).ok());
  fabric.StepNode(a);  // both RTSs reach B
  fabric.StepNode(a);
  fabric.node(a).frozen = true;
  fabric.Run();
  EXPECT_GT(fabric.core(b).stats().registration_waits, 0u);
  Actions out;
  EXPECT_EQ(fabric.core(b).CancelDestination(84, 0, out), EndpointCore::CancelResult::kTaken);
  EXPECT_TRUE(out.empty()) << "nothing named the memory to the peer: no disconnect";
  fabric.node(a).frozen = false;
  fabric.Run();
  ASSERT_EQ(fabric.node(b).delivered.size(), 3u);
  EXPECT_TRUE(HasPattern(fabric.node(b).delivered[2], {100 * 1024}, 7));
  EXPECT_NE(fabric.node(b).delivered[2].frames[0].data(), mine.data());
  for (size_t i = 0; i < mine.size(); ++i) ASSERT_EQ(mine.data()[i], std::byte{0x5A}) << "written at " << i;
  EXPECT_TRUE(fabric.node(b).disconnects.empty());
}

TEST_F(rdmaEndpointTest, ClearToSendTimeoutCancelsAndBothSidesClean) {
  ASSERT_TRUE(fabric_.Send(a_, b_, MakeMessage(1, {10})).ok());
  fabric_.Run();
  fabric_.TickAll(1000);
  // B stalls after receiving the RTS: its clear-to-send never leaves.
  ASSERT_TRUE(fabric_.Send(a_, b_, MakeMessage(2, {100 * 1024, 200 * 1024}, 2)).ok());
  fabric_.node(b_).frozen = true;
  fabric_.Run();
  EXPECT_EQ(fabric_.core(a_).pending_rendezvous(AtoB()), 2u);
  fabric_.TickAll(1099);
  EXPECT_TRUE(fabric_.node(a_).problems.empty());
  fabric_.TickAll(1100);
  ASSERT_FALSE(fabric_.node(a_).problems.empty());
  EXPECT_EQ(fabric_.node(a_).problems[0].code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(std::string(fabric_.node(a_).problems[0].message()), HasSubstr("rdma://10.0.0.2:4000"));
  EXPECT_EQ(fabric_.core(a_).pending_rendezvous(AtoB()), 0u);
  // The cancels reach B, which drops the message and releases its destinations.
  fabric_.Run();
  EXPECT_EQ(fabric_.core(b_).pending_rendezvous(BfromA()), 0u);
  EXPECT_EQ(fabric_.core(b_).cache().in_use_bytes(), 0u);
  EXPECT_TRUE(AnyMentions(fabric_.node(b_).problems, "sender cancelled"));
  // B wakes up: its stale clear-to-sends reach A, which ignores them as unknown.
  fabric_.node(b_).frozen = false;
  fabric_.Run();
  EXPECT_EQ(fabric_.core(a_).stats().unknown_tags, 2u);
  EXPECT_EQ(fabric_.node(b_).delivered.size(), 1u);
  EXPECT_EQ(fabric_.writes_executed, 0u);
  // The connection still works.
  ASSERT_TRUE(fabric_.Send(a_, b_, MakeMessage(3, {100 * 1024}, 3)).ok());
  fabric_.Run();
  ASSERT_EQ(fabric_.node(b_).delivered.size(), 2u);
  EXPECT_TRUE(HasPattern(fabric_.node(b_).delivered[1], {100 * 1024}, 3));
}

TEST_F(rdmaEndpointTest, DataOverdueAfterClearToSendDisconnects) {
  ASSERT_TRUE(fabric_.Send(a_, b_, MakeMessage(1, {100 * 1024})).ok());
  // Deliver A's RTS and B's CTS, but A's write never executes (A stalls).
  fabric_.StepNode(a_);  // RTS to B
  fabric_.node(a_).frozen = true;
  fabric_.Run();   // B's CTS reaches A; A's write is posted but does not run
  EXPECT_EQ(fabric_.core(b_).cache().in_use_bytes(), 128u * 1024);
  fabric_.TickAll(199);
  EXPECT_TRUE(fabric_.node(b_).disconnects.empty());
  fabric_.TickAll(200);
  ASSERT_EQ(fabric_.node(b_).disconnects.size(), 1u);
  EXPECT_EQ(fabric_.node(b_).disconnects[0].second.code(), absl::StatusCode::kDeadlineExceeded);
  // The destination stays leased until the connection is really gone.
  EXPECT_GT(fabric_.core(b_).cache().in_use_bytes(), 0u);
  fabric_.Kill(b_, BfromA(), absl::UnavailableError("disconnected"));
  EXPECT_EQ(fabric_.core(b_).cache().in_use_bytes(), 0u);
  EXPECT_EQ(fabric_.core(a_).cache().in_use_bytes(), 0u);
}

TEST_F(rdmaEndpointTest, PeerDeathFailsEveryPendingRendezvousNamingThePeer) {
  ASSERT_TRUE(fabric_.Send(a_, b_, MakeMessage(1, {10})).ok());
  fabric_.Run();
  const ConnectionId ab = AtoB();
  const ConnectionId ba = BfromA();
  fabric_.node(b_).frozen = true;  // B takes the RTSs but answers nothing
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(fabric_.Send(a_, b_, MakeMessage(10 + i, {80 * 1024}, 1)).ok());
  ASSERT_TRUE(fabric_.Send(a_, b_, MakeMessage(20, {10})).ok());
  fabric_.Run();
  EXPECT_EQ(fabric_.core(a_).pending_rendezvous(ab), 3u);
  EXPECT_EQ(fabric_.core(b_).pending_rendezvous(ba), 3u);
  const size_t a_problems = fabric_.node(a_).problems.size();
  const size_t b_problems = fabric_.node(b_).problems.size();
  fabric_.Kill(a_, ab, absl::UnavailableError("peer disconnected"));
  // A: three failed rendezvous sends, each naming B.
  int named = 0;
  for (size_t i = a_problems; i < fabric_.node(a_).problems.size(); ++i) {
    const absl::Status& s = fabric_.node(a_).problems[i];
    if (absl::StrContains(s.message(), "rendezvous send")) {
      ++named;
      EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable);
      EXPECT_THAT(std::string(s.message()), HasSubstr("rdma://10.0.0.2:4000"));
      EXPECT_THAT(std::string(s.message()), HasSubstr("peer disconnected"));
    }
  }
  EXPECT_EQ(named, 3);
  // B: three failed rendezvous receives naming A, and the held-back messages dropped.
  int b_named = 0;
  for (size_t i = b_problems; i < fabric_.node(b_).problems.size(); ++i) {
    if (absl::StrContains(fabric_.node(b_).problems[i].message(), "rendezvous receive")) {
      ++b_named;
      EXPECT_THAT(std::string(fabric_.node(b_).problems[i].message()), HasSubstr("rdma://10.0.0.1:4000"));
    }
  }
  EXPECT_EQ(b_named, 3);
  EXPECT_TRUE(AnyMentions(fabric_.node(b_).problems, "4 message(s)"));
  for (int n : {a_, b_}) {
    EXPECT_TRUE(fabric_.core(n).connections().empty());
    EXPECT_EQ(fabric_.core(n).cache().in_use_bytes(), 0u);
    EXPECT_EQ(fabric_.core(n).pool().in_use(), 0u);
  }
  EXPECT_EQ(fabric_.core(a_).stats().connections_lost, 1u);
  // A later send reconnects.
  fabric_.node(b_).frozen = false;
  ASSERT_TRUE(fabric_.Send(a_, b_, MakeMessage(30, {10})).ok());
  fabric_.Run();
  EXPECT_EQ(fabric_.node(b_).delivered.back().header.request_id(), 30u);
}


TEST_F(rdmaEndpointTest, UnknownTagDuplicateAndMismatchedClearToSend) {
  ASSERT_TRUE(fabric_.Send(a_, b_, MakeMessage(1, {10})).ok());
  fabric_.Run();
  const ConnectionId ab = AtoB();
  std::vector<std::byte> buf(128);
  // Unknown tag.
  size_t n = EncodeClearToSend(buf, 0, ClearToSend{999, 0x1000, 4096, 1});
  fabric_.Inject(a_, ab, std::span<const std::byte>(buf.data(), n));
  EXPECT_EQ(fabric_.core(a_).stats().unknown_tags, 1u);
  EXPECT_TRUE(AnyMentions(fabric_.node(a_).problems, "unknown rendezvous tag 999"));

  // A pending rendezvous whose clear-to-send arrives; A's write is held (A frozen), then a duplicate.
  ASSERT_TRUE(fabric_.Send(a_, b_, MakeMessage(2, {100 * 1024}, 2)).ok());
  fabric_.StepNode(a_);                  // RTS to B
  fabric_.node(a_).frozen = true;  // A posts its write but it does not run yet
  fabric_.Run();                   // B's CTS to A
  ASSERT_EQ(fabric_.core(a_).pending_rendezvous(ab), 1u);
  const Fabric::QueuePair& qa = fabric_.qp(a_, ab);
  ASSERT_EQ(qa.outgoing.size(), 1u);
  const PostWriteAction w = qa.outgoing.front().write;
  n = EncodeClearToSend(buf, 0, ClearToSend{w.immediate, w.remote_address, 100 * 1024, w.rkey});
  fabric_.Inject(a_, ab, std::span<const std::byte>(buf.data(), n));
  EXPECT_EQ(fabric_.core(a_).stats().duplicate_clear_to_send, 1u);
  EXPECT_EQ(fabric_.qp(a_, ab).outgoing.size(), 1u) << "a duplicate must not write twice";
  fabric_.node(a_).frozen = false;
  fabric_.Run();
  ASSERT_EQ(fabric_.node(b_).delivered.size(), 2u);
  EXPECT_TRUE(HasPattern(fabric_.node(b_).delivered[1], {100 * 1024}, 2));

  // A clear-to-send that offers the wrong length: A cancels, B drops the message.
  ASSERT_TRUE(fabric_.Send(a_, b_, MakeMessage(3, {100 * 1024}, 3)).ok());
  fabric_.node(b_).frozen = true;  // keep B's real CTS from leaving
  fabric_.Run();
  std::optional<uint32_t> tag;
  for (const auto& op : fabric_.qp(b_, BfromA()).outgoing) {
    absl::StatusOr<WireFrame> f =
        ParseWire(std::span<const std::byte>(reinterpret_cast<const std::byte*>(op.send.address), op.send.length));
    if (f.ok() && f->type == WireType::kClearToSend) tag = f->tag;
  }
  ASSERT_TRUE(tag.has_value());
  n = EncodeClearToSend(buf, 0, ClearToSend{*tag, 0x1000, 4096, 1});
  fabric_.Inject(a_, ab, std::span<const std::byte>(buf.data(), n));
  EXPECT_EQ(fabric_.core(a_).stats().length_mismatches, 1u);
  EXPECT_TRUE(AnyMentions(fabric_.node(a_).problems, "offers 4096 bytes, the part has 102400"));
  fabric_.node(b_).frozen = false;
  fabric_.Run();
  EXPECT_EQ(fabric_.node(b_).delivered.size(), 2u) << "the message must be dropped";
  EXPECT_TRUE(AnyMentions(fabric_.node(b_).problems, "length mismatch"));
  EXPECT_EQ(fabric_.core(a_).stats().unknown_tags, 2u);  // B's real CTS came late
  ExpectIdleAndClean(a_);
  ExpectIdleAndClean(b_);
}

TEST_F(rdmaEndpointTest, UnknownImmediateAndWrongWriteLength) {
  ASSERT_TRUE(fabric_.Send(a_, b_, MakeMessage(1, {10})).ok());
  fabric_.Run();
  const ConnectionId ba = BfromA();
  fabric_.InjectImmediate(b_, ba, 12345, 100);
  EXPECT_EQ(fabric_.core(b_).stats().unknown_tags, 1u);
  EXPECT_TRUE(AnyMentions(fabric_.node(b_).problems, "unknown rendezvous tag 12345"));

  ASSERT_TRUE(fabric_.Send(a_, b_, MakeMessage(2, {100 * 1024}, 2)).ok());
  fabric_.StepNode(a_);                  // RTS to B
  fabric_.node(a_).frozen = true;  // A's real write will not run
  fabric_.Run();                   // CTS to A
  const PostWriteAction w = fabric_.qp(a_, AtoB()).outgoing.front().write;
  fabric_.InjectImmediate(b_, ba, w.immediate, 1000);  // neither the whole part nor a last chunk
  EXPECT_EQ(fabric_.core(b_).stats().length_mismatches, 1u);
  EXPECT_TRUE(AnyMentions(fabric_.node(b_).problems, "wrote 1000 bytes; expected 102400"));
  EXPECT_EQ(fabric_.node(b_).delivered.size(), 1u);
  EXPECT_EQ(fabric_.core(b_).cache().in_use_bytes(), 0u);
}


TEST_F(rdmaEndpointTest, ValueTooLargeForTheReceiverIsRefused) {
  Fabric fabric;
  const int a = fabric.AddNode(Config("rdma://10.0.0.1:4000"));
  ProtocolConfig small = Config("rdma://10.0.0.2:4000");
  small.max_pinned_bytes = 64 * 1024;
  const int b = fabric.AddNode(small);
  ASSERT_TRUE(fabric.Send(a, b, MakeMessage(1, {10, 256 * 1024, 300 * 1024}, 1)).ok());
  ASSERT_TRUE(fabric.Send(a, b, MakeMessage(2, {10}, 1)).ok());
  fabric.Run();
  ASSERT_EQ(fabric.node(b).delivered.size(), 1u);
  EXPECT_EQ(fabric.node(b).delivered[0].header.request_id(), 2u);
  EXPECT_TRUE(AnyMentions(fabric.node(b).problems, "exceeds max_pinned_bytes"));
  EXPECT_TRUE(AnyMentions(fabric.node(a).problems, "too large to register"));
  EXPECT_EQ(fabric.writes_executed, 0u);
  EXPECT_EQ(fabric.core(a).pending_rendezvous(*fabric.core(a).ConnectionTo("rdma://10.0.0.2:4000")), 0u);
  EXPECT_EQ(fabric.core(b).cache().in_use_bytes(), 0u);
}

TEST_F(rdmaEndpointTest, ReceiverWaitsForRegistrationRoomThenTimesOut) {
  Fabric fabric;
  ProtocolConfig patient = Config("rdma://10.0.0.1:4000");
  patient.rendezvous_timeout_ticks = 1000;  // the sender outwaits the receiver here
  const int a = fabric.AddNode(patient);
  ProtocolConfig small = Config("rdma://10.0.0.2:4000");
  small.max_pinned_bytes = 256 * 1024;
  const int b = fabric.AddNode(small);
  ASSERT_TRUE(fabric.Send(a, b, MakeMessage(1, {10})).ok());
  fabric.Run();
  fabric.node(a).frozen = true;  // A's writes never run: B's first destination stays leased
  ASSERT_TRUE(fabric.Send(a, b, MakeMessage(2, {200 * 1024}, 1)).ok());
  ASSERT_TRUE(fabric.Send(a, b, MakeMessage(3, {200 * 1024}, 1)).ok());
  // Let A's two RTSs out, but not its writes.
  ASSERT_TRUE(fabric.StepNode(a));
  ASSERT_TRUE(fabric.StepNode(a));
  fabric.Run();
  EXPECT_EQ(fabric.core(b).stats().registration_waits, 1u);
  fabric.TickAll(99);
  EXPECT_FALSE(AnyMentions(fabric.node(b).problems, "no room to register"));
  fabric.TickAll(100);
  EXPECT_TRUE(AnyMentions(fabric.node(b).problems, "no room to register"));
  fabric.node(a).frozen = false;
  fabric.Run();
  ASSERT_EQ(fabric.node(b).delivered.size(), 2u);  // 1 and 2; 3 refused after the wait
  EXPECT_EQ(fabric.node(b).delivered[1].header.request_id(), 2u);
  EXPECT_TRUE(AnyMentions(fabric.node(a).problems, "refused rendezvous"));
}


TEST(rdmaLastChunkTest, Arithmetic) {
  EXPECT_EQ(LastChunkBytes(10000, 4096), 10000u - 8192);
  EXPECT_EQ(LastChunkBytes(8192, 4096), 4096u);
  EXPECT_EQ(LastChunkBytes(100, 4096), 100u);
}

}  // namespace
}  // namespace tessera::rdma

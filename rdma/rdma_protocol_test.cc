// EndpointCore on the simulated fabric (rdma/testing/simulated_fabric.h):
// eager messages, credits and the receive queues, pool slots and the send
// queue (endpoint_sending.h), connections (endpoint_connection.h), malformed
// input (endpoint_receiving.h), configuration (protocol_config.h).
// Rendezvous is tested in endpoint_rendezvous_test.cc, authentication in
// endpoint_auth_test.cc.
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

TEST_F(rdmaEndpointTest, SmallMessageTravelsEagerAndIntact) {
  Message m = MakeMessage(42, {0, 13, 1000}, 3);
  ASSERT_TRUE(fabric_.Send(a_, b_, m).ok());
  fabric_.Run();
  ASSERT_EQ(fabric_.node(b_).delivered.size(), 1u);
  const Message& got = fabric_.node(b_).delivered[0];
  EXPECT_EQ(got.header.request_id(), 42u);
  EXPECT_EQ(got.header.sender_address(), "rdma://10.0.0.1:4000");
  EXPECT_TRUE(HasPattern(got, {0, 13, 1000}, 3));
  EXPECT_EQ(fabric_.core(a_).stats().eager_sends, 1u);
  EXPECT_EQ(fabric_.core(a_).stats().rendezvous_started, 0u);
  EXPECT_EQ(fabric_.core(b_).stats().messages_received, 1u);
  EXPECT_EQ(fabric_.writes_executed, 0u);
  EXPECT_TRUE(fabric_.node(a_).problems.empty());
  ExpectIdleAndClean(a_);
  ExpectIdleAndClean(b_);
}

TEST_F(rdmaEndpointTest, RepliesReuseTheAcceptedConnection) {
  ASSERT_TRUE(fabric_.Send(a_, b_, MakeMessage(1, {10})).ok());
  fabric_.Run();
  fabric_.auto_connect = false;
  ASSERT_TRUE(fabric_.Send(b_, a_, MakeMessage(2, {10})).ok());
  EXPECT_TRUE(fabric_.pending_connects.empty()) << "the reply opened a second connection";
  fabric_.Run();
  ASSERT_EQ(fabric_.node(a_).delivered.size(), 1u);
  EXPECT_EQ(fabric_.node(a_).delivered[0].header.sender_address(), "rdma://10.0.0.2:4000");
  EXPECT_EQ(fabric_.core(b_).connections().size(), 1u);
}

TEST_F(rdmaEndpointTest, SendsBeforeTheConnectionIsUpAreQueuedInOrder) {
  fabric_.auto_connect = false;
  for (int i = 0; i < 20; ++i) ASSERT_TRUE(fabric_.Send(a_, b_, MakeMessage(i, {100}, 1)).ok());
  ASSERT_EQ(fabric_.pending_connects.size(), 1u) << "one connection for all sends";
  EXPECT_EQ(fabric_.core(a_).queued_messages(AtoB()), 20u);
  auto [n, c] = fabric_.pending_connects[0];
  fabric_.Connect(n, c.connection, c.address);
  fabric_.Run();
  ASSERT_EQ(fabric_.node(b_).delivered.size(), 20u);
  for (int i = 0; i < 20; ++i) EXPECT_EQ(fabric_.node(b_).delivered[i].header.request_id(), static_cast<uint64_t>(i));
}

TEST_F(rdmaEndpointTest, FloodOneDirectionNeverRunsTheReceiveQueueDry) {
  constexpr int kMessages = 5000;
  for (int i = 0; i < kMessages; ++i) {
    ASSERT_TRUE(fabric_.Send(a_, b_, MakeMessage(i, {static_cast<size_t>(i % 300)}, 2)).ok());
  }
  // Nothing ran yet: all but one window's worth is queued, none dropped, nothing blocked.
  EXPECT_EQ(fabric_.core(a_).queued_messages(AtoB()), kMessages - 8u);
  EXPECT_EQ(*fabric_.core(a_).credits_available(AtoB()), 0u);
  fabric_.Run();
  EXPECT_EQ(fabric_.receive_queue_ran_dry, 0u);
  ASSERT_EQ(fabric_.node(b_).delivered.size(), static_cast<size_t>(kMessages));
  for (int i = 0; i < kMessages; ++i) {
    ASSERT_EQ(fabric_.node(b_).delivered[i].header.request_id(), static_cast<uint64_t>(i)) << "out of order";
  }
  // B never had anything to say, so every credit went back in explicit updates.
  EXPECT_GT(fabric_.core(b_).stats().credit_updates_sent, 0u);
  EXPECT_LE(fabric_.core(b_).stats().credit_updates_sent, static_cast<uint64_t>(kMessages) / 4 + 1);
  EXPECT_EQ(fabric_.core(b_).stats().protocol_violations, 0u);
  EXPECT_EQ(fabric_.core(a_).stats().protocol_violations, 0u);
  // At the end every credit is back or returnable (less than half a window outstanding).
  EXPECT_GT(*fabric_.core(a_).credits_available(AtoB()), 8u / 2 - 1);
  for (const Fabric::QueuePair& q : fabric_.qps_) EXPECT_GE(q.min_receives_seen, 1u);
  ExpectIdleAndClean(a_);
  ExpectIdleAndClean(b_);
}

TEST_F(rdmaEndpointTest, FloodBothWaysPiggybacksCredits) {
  constexpr int kMessages = 2000;
  for (int i = 0; i < kMessages; ++i) {
    ASSERT_TRUE(fabric_.Send(a_, b_, MakeMessage(i, {64}, 4)).ok());
    if (i == 0) fabric_.Run();  // let the connection exist so that B replies on it
    ASSERT_TRUE(fabric_.Send(b_, a_, MakeMessage(i, {64}, 5)).ok());
  }
  fabric_.Run();
  EXPECT_EQ(fabric_.receive_queue_ran_dry, 0u);
  ASSERT_EQ(fabric_.node(b_).delivered.size(), static_cast<size_t>(kMessages));
  ASSERT_EQ(fabric_.node(a_).delivered.size(), static_cast<size_t>(kMessages));
  for (int i = 0; i < kMessages; ++i) {
    ASSERT_EQ(fabric_.node(a_).delivered[i].header.request_id(), static_cast<uint64_t>(i));
    ASSERT_TRUE(HasPattern(fabric_.node(a_).delivered[i], {64}, 5));
  }
  // With traffic both ways, credits ride on messages: few explicit updates.
  const uint64_t updates = fabric_.core(a_).stats().credit_updates_sent + fabric_.core(b_).stats().credit_updates_sent;
  EXPECT_LT(updates, static_cast<uint64_t>(kMessages) / 8);
}

// Completions pile up and are processed in random order relative to the
// traffic (a busy receiver): the reserved slots are what keep the receive
// queues from running dry, in one direction and in both.
TEST_F(rdmaEndpointTest, RandomInterleavingsNeverRunDryAndKeepOrder) {
  for (uint64_t seed = 1; seed <= 12; ++seed) {
    SCOPED_TRACE(::testing::Message() << "seed " << seed);
    Fabric fabric;
    fabric.interleave.emplace(seed);
    ProtocolConfig c1 = Config("rdma://10.0.0.1:4000");
    ProtocolConfig c2 = Config("rdma://10.0.0.2:4000");
    c1.credits = 3 + seed % 3;
    c2.credits = 2 + seed % 4;
    const int a = fabric.AddNode(c1);
    const int b = fabric.AddNode(c2);
    const bool both_ways = seed % 2 == 0;
    constexpr int kMessages = 400;
    auto shape = [](int i) {
      return std::vector<size_t>{static_cast<size_t>(i % 17 == 0 ? 40 * 1024 : (i % 5 == 0 ? 6000 : i % 200))};
    };
    ASSERT_TRUE(fabric.Send(a, b, MakeMessage(0, shape(0), 0)).ok());
    for (int i = 1; i < kMessages; ++i) {
      ASSERT_TRUE(fabric.Send(a, b, MakeMessage(i, shape(i), static_cast<uint8_t>(i))).ok());
      if (both_ways && i > 1) {
        ASSERT_TRUE(fabric.Send(b, a, MakeMessage(i, shape(i + 1), 9)).ok());
      }
      for (int k = 0; k < 3; ++k) fabric.Step();
      if (i == 1) fabric.Run();  // the connection exists before B replies on it
    }
    fabric.Run();
    ASSERT_EQ(fabric.receive_queue_ran_dry, 0u);
    ASSERT_EQ(fabric.node(b).delivered.size(), static_cast<size_t>(kMessages));
    for (int i = 0; i < kMessages; ++i) {
      ASSERT_EQ(fabric.node(b).delivered[i].header.request_id(), static_cast<uint64_t>(i));
      ASSERT_TRUE(HasPattern(fabric.node(b).delivered[i], shape(i), static_cast<uint8_t>(i)));
    }
    if (both_ways) {
      ASSERT_EQ(fabric.node(a).delivered.size(), kMessages - 2u);
    }
    for (int n : {a, b}) {
      ASSERT_TRUE(fabric.node(n).problems.empty()) << fabric.node(n).problems[0];
      ASSERT_EQ(fabric.core(n).stats().protocol_violations, 0u);
      ASSERT_EQ(fabric.core(n).cache().in_use_bytes(), 0u);
    }
    uint64_t min_receives = SIZE_MAX;
    for (const Fabric::QueuePair& q : fabric.qps_) min_receives = std::min<uint64_t>(min_receives, q.min_receives_seen);
    // Non-vacuous: some receive queue got down to (about) its reserved slots.
    EXPECT_LE(min_receives, CreditWindow::kReservedSlots + 1) << "the interleaving never stressed the receive queues";
  }
}

TEST_F(rdmaEndpointTest, PoolExhaustionQueuesAndRecovers) {
  Fabric fabric;
  ProtocolConfig ca = Config("rdma://10.0.0.1:4000");
  // 20 slots: 10 receive slots for the one connection, 10 for sending.
  const int a = fabric.AddNode(ca, 20 * 4096);
  const int b = fabric.AddNode(Config("rdma://10.0.0.2:4000"));
  fabric.node(a).hold_send_completions = true;  // the adapter does not report completions yet
  for (int i = 0; i < 30; ++i) ASSERT_TRUE(fabric.Send(a, b, MakeMessage(i, {500}, 6)).ok());
  fabric.Run();
  // 8 credits, so 8 went; later ones wait for credits or for slots held by unfinished sends.
  EXPECT_EQ(fabric.core(a).pool().in_use(), 20u);
  EXPECT_GT(fabric.core(a).pool().waits(), 0u);
  EXPECT_EQ(fabric.core(a).pool().high_water(), 20u);
  EXPECT_LT(fabric.node(b).delivered.size(), 30u);
  EXPECT_GT(fabric.core(a).queued_messages(*fabric.core(a).ConnectionTo("rdma://10.0.0.2:4000")), 0u);
  for (int round = 0; round < 100 && fabric.node(b).delivered.size() < 30; ++round) {
    fabric.ReleaseHeldCompletions(a);
    fabric.Run();
  }
  ASSERT_EQ(fabric.node(b).delivered.size(), 30u);
  for (int i = 0; i < 30; ++i) EXPECT_EQ(fabric.node(b).delivered[i].header.request_id(), static_cast<uint64_t>(i));
  fabric.ReleaseHeldCompletions(a);
  EXPECT_EQ(fabric.core(a).pool().in_use(), 10u);  // only the posted receives
  EXPECT_EQ(fabric.receive_queue_ran_dry, 0u);
}

TEST_F(rdmaEndpointTest, SendQueueDepthIsNeverExceeded) {
  Fabric fabric;
  ProtocolConfig c = Config("rdma://10.0.0.1:4000");
  c.send_queue_depth = 3;
  const int a = fabric.AddNode(c);
  const int b = fabric.AddNode(Config("rdma://10.0.0.2:4000"));
  fabric.node(a).hold_send_completions = true;
  for (int i = 0; i < 10; ++i) ASSERT_TRUE(fabric.Send(a, b, MakeMessage(i, {10, 20 * 1024}, 1)).ok());
  const ConnectionId ab = *fabric.core(a).ConnectionTo("rdma://10.0.0.2:4000");
  // Posted on the queue pair and not yet completed: never more than the depth.
  auto outstanding = [&] { return fabric.qp(a, ab).outgoing.size() + fabric.node(a).held_completions.size(); };
  EXPECT_EQ(outstanding(), 3u);
  for (int round = 0; round < 200 && fabric.node(b).delivered.size() < 10; ++round) {
    for (int k = 0; k < 50; ++k) {
      fabric.Step();
      ASSERT_LE(outstanding(), 3u);
    }
    EXPECT_EQ(fabric.core(a).sends_in_flight(ab), outstanding());
    fabric.ReleaseHeldCompletions(a);
  }
  ASSERT_EQ(fabric.node(b).delivered.size(), 10u);
  for (int i = 0; i < 10; ++i) EXPECT_TRUE(HasPattern(fabric.node(b).delivered[i], {10, 20 * 1024}, 1));
}

TEST_F(rdmaEndpointTest, PoolTooSmallForAnotherConnectionIsRefused) {
  Fabric fabric;
  // 23 slots: 10 receive slots for the connection to b, and 13 left, fewer
  // than another 10 plus the 4 kept for sending.
  const int a = fabric.AddNode(Config("rdma://10.0.0.1:4000"), 23 * 4096);
  const int b = fabric.AddNode(Config("rdma://10.0.0.2:4000"));
  const int c = fabric.AddNode(Config("rdma://10.0.0.3:4000"));
  ASSERT_TRUE(fabric.Send(a, b, MakeMessage(1, {1})).ok());
  fabric.Run();
  Actions out;
  absl::StatusOr<ConnectionId> id = fabric.core(a).OnConnectRequest(fabric.core(c).LocalHandshake(), out);
  ASSERT_TRUE(id.ok());
  absl::Status s = fabric.core(a).OnQueuePairReady(*id, out);
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(s.message()), HasSubstr("pool_bytes"));
  fabric.core(a).OnConnectionLost(*id, s, out);
  EXPECT_EQ(fabric.core(a).connections().size(), 1u);
}


TEST_F(rdmaEndpointTest, UnreachablePeerDropsQueuedMessagesWithAnError) {
  ASSERT_TRUE(fabric_.SendTo(a_, "rdma://10.9.9.9:1", MakeMessage(1, {10})).ok());
  ASSERT_FALSE(fabric_.node(a_).problems.empty());
  EXPECT_THAT(std::string(fabric_.node(a_).problems.back().message()), HasSubstr("rdma://10.9.9.9:1"));
  EXPECT_THAT(std::string(fabric_.node(a_).problems.back().message()), HasSubstr("no route to host"));
  EXPECT_EQ(fabric_.core(a_).stats().messages_dropped, 1u);
  EXPECT_FALSE(fabric_.core(a_).ConnectionTo("rdma://10.9.9.9:1").has_value());
}

TEST_F(rdmaEndpointTest, ConnectTimeoutDisconnects) {
  fabric_.auto_connect = false;
  ASSERT_TRUE(fabric_.Send(a_, b_, MakeMessage(1, {10})).ok());
  fabric_.TickAll(99);
  EXPECT_TRUE(fabric_.node(a_).disconnects.empty());
  fabric_.TickAll(100);
  ASSERT_EQ(fabric_.node(a_).disconnects.size(), 1u);
  EXPECT_THAT(std::string(fabric_.node(a_).disconnects[0].second.message()), HasSubstr("not connected within"));
}


TEST_F(rdmaEndpointTest, MalformedInputIsCountedNotDeliveredNotFatal) {
  ASSERT_TRUE(fabric_.Send(a_, b_, MakeMessage(1, {10})).ok());
  fabric_.Run();
  const ConnectionId ba = BfromA();
  std::vector<std::byte> garbage(200, std::byte{0x5a});
  fabric_.Inject(b_, ba, garbage);
  EXPECT_EQ(fabric_.core(b_).stats().malformed_received, 1u);
  EXPECT_EQ(fabric_.core(b_).posted_receives(ba), 10u) << "the slot must be reposted";

  // A well-formed wire message whose envelope does not parse.
  std::vector<std::byte> bad_envelope(7, std::byte{0xff});
  std::vector<PartDescriptor> parts = {{bad_envelope.size(), 0}};
  std::vector<std::span<const std::byte>> data = {bad_envelope};
  std::vector<std::byte> wire(MessageWireBytes(parts));
  EncodeMessage(wire, 0, 0, parts, data);
  fabric_.Inject(b_, ba, wire);
  EXPECT_EQ(fabric_.core(b_).stats().malformed_received, 2u);

  // An envelope without a sender address.
  proto::Envelope e;
  e.set_request_id(5);
  std::string s = e.SerializeAsString();
  std::vector<std::byte> env(s.size());
  std::memcpy(env.data(), s.data(), s.size());
  parts = {{env.size(), 0}};
  data = {env};
  wire.assign(MessageWireBytes(parts), std::byte{0});
  EncodeMessage(wire, 0, 0, parts, data);
  fabric_.Inject(b_, ba, wire);
  EXPECT_EQ(fabric_.core(b_).stats().malformed_received, 3u);
  EXPECT_TRUE(AnyMentions(fabric_.node(b_).problems, "no sender_address"));

  EXPECT_EQ(fabric_.node(b_).delivered.size(), 1u);
  // Real traffic still flows.
  ASSERT_TRUE(fabric_.Send(a_, b_, MakeMessage(2, {10})).ok());
  fabric_.Run();
  EXPECT_EQ(fabric_.node(b_).delivered.size(), 2u);
}


TEST_F(rdmaEndpointTest, LongAddressTravelsInHello) {
  Fabric fabric;
  const int a = fabric.AddNode(Config("rdma://a-very-long-host-name.rack-07.cluster.example.org:4000"));
  const int b = fabric.AddNode(Config("rdma://10.0.0.2:4000"));
  ASSERT_TRUE(fabric.Send(a, b, MakeMessage(1, {10})).ok());
  fabric.Run();
  ASSERT_EQ(fabric.node(b).delivered.size(), 1u);
  const ConnectionId ba = fabric.core(b).connections()[0];
  EXPECT_EQ(fabric.core(b).peer_address(ba), "rdma://a-very-long-host-name.rack-07.cluster.example.org:4000");
  fabric.auto_connect = false;
  ASSERT_TRUE(fabric.Send(b, a, MakeMessage(2, {10})).ok());
  EXPECT_TRUE(fabric.pending_connects.empty());
  fabric.Run();
  EXPECT_EQ(fabric.node(a).delivered.size(), 1u);
}

TEST_F(rdmaEndpointTest, SendValidatesItsInput) {
  Actions out;
  EXPECT_EQ(fabric_.core(a_).Send("tcp://10.0.0.2:4000", MakeMessage(1, {}), out).code(),
            absl::StatusCode::kInvalidArgument);
  std::vector<size_t> many(65, 1);
  EXPECT_EQ(fabric_.core(a_).Send("rdma://10.0.0.2:4000", MakeMessage(1, many), out).code(),
            absl::StatusCode::kInvalidArgument);
  Fabric fabric;
  ProtocolConfig c = Config("rdma://10.0.0.1:4000");
  c.max_message_bytes = 1000;
  const int a = fabric.AddNode(c);
  EXPECT_THAT(std::string(fabric.core(a).Send("rdma://10.0.0.2:4000", MakeMessage(1, {2000}), out).message()),
              HasSubstr("max_message_bytes"));
  EXPECT_TRUE(out.empty());
  EXPECT_EQ(fabric.core(a).connections().size(), 0u);
}

TEST_F(rdmaEndpointTest, ConfigValidation) {
  ProtocolConfig c = Config("rdma://h:1");
  EXPECT_TRUE(EndpointCore::Validate(c, 1 << 20).ok());
  EXPECT_THAT(std::string(EndpointCore::Validate(c, 10 * 4096).message()), HasSubstr("one connection needs"));
  c.credits = 0;
  EXPECT_FALSE(EndpointCore::Validate(c, 1 << 20).ok());
  c = Config("rdma://h:1");
  c.slot_bytes = 512;
  EXPECT_FALSE(EndpointCore::Validate(c, 1 << 20).ok());
  c = Config("");
  EXPECT_FALSE(EndpointCore::Validate(c, 1 << 20).ok());
}

}  // namespace
}  // namespace tessera::rdma

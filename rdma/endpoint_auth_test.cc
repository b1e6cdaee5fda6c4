// Authentication (endpoint_auth.h; the rule under "Authentication" in
// rdma_protocol.h) on the simulated fabric (rdma/testing/simulated_fabric.h),
// between cores and against a scripted peer.
#include "rdma/rdma_protocol.h"

#include <cstring>
#include <optional>
#include <random>
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

// The rule under test (rdma_protocol.h, "Authentication"): a connection is
// usable only between holders of the same job key; a keyed endpoint refuses
// an unkeyed one and the other way round; two unkeyed endpoints connect, and
// each says once that authentication is off.

constexpr char kJobSecret[] = "Ra]8Hb}#}Kz4!FS!*2I]/=Av#aiLKw7ETIsnJ-LG";
constexpr char kOtherJobSecret[] = "g*[3LarCm@*mW($XTv}LD)$GZUJp@]jL0Gnp5rDQ";

ProtocolConfig Keyed(const std::string& address, const std::string& secret = kJobSecret) {
  ProtocolConfig c = Config(address);
  c.auth_secret_key = secret;
  return c;
}

std::vector<WireType> TypesSent(const Fabric& fabric, int from, int to) {
  std::vector<WireType> types;
  for (const Fabric::WireRecord& r : fabric.wire_log) {
    if (r.from != from || r.to != to) continue;
    absl::StatusOr<WireFrame> f = ParseWire(r.bytes);
    EXPECT_TRUE(f.ok()) << f.status();
    if (f.ok()) types.push_back(f->type);
  }
  return types;
}

bool Carries(const std::vector<WireType>& types, WireType type) {
  return std::find(types.begin(), types.end(), type) != types.end();
}

bool AnyDisconnectMentions(const Fabric::Node& node, const std::string& text) {
  for (const auto& [id, reason] : node.disconnects) {
    if (absl::StrContains(reason.message(), text)) return true;
  }
  return false;
}

// The handshake a peer the test plays sends: it claims `address` and to hold a key.
std::vector<std::byte> ScriptedHandshake(const std::string& address, bool auth_required = true) {
  Handshake h{8, 4096, address};
  h.auth_required = auth_required;
  return EncodeHandshake(h, 56);
}

std::vector<std::byte> ChallengeBytes(const AuthNonce& nonce, const std::string& address) {
  std::vector<std::byte> out(AuthChallengeWireBytes(address));
  EncodeAuthChallenge(out, 0, nonce, address);
  return out;
}

std::vector<std::byte> ProofBytes(const AuthMac& mac) {
  std::vector<std::byte> out(kAuthProofWireBytes);
  EncodeAuthProof(out, 0, mac);
  return out;
}

// A well-formed message (envelope only) claiming to come from `sender`.
std::vector<std::byte> MessageBytes(uint64_t request_id, const std::string& sender, size_t remote_frame = 0) {
  proto::Envelope e;
  e.set_request_id(request_id);
  e.set_sender_address(sender);
  const std::string env = e.SerializeAsString();
  std::vector<PartDescriptor> parts = {{env.size(), 0}};
  std::vector<std::span<const std::byte>> data = {
      std::span<const std::byte>(reinterpret_cast<const std::byte*>(env.data()), env.size())};
  if (remote_frame > 0) {  // a frame sent by rendezvous: this message is its RTS
    parts.push_back({remote_frame, 77});
    data.push_back({});
  }
  std::vector<std::byte> out(MessageWireBytes(parts));
  EncodeMessage(out, 0, request_id, parts, data);
  return out;
}

AuthNonce FreshNonce() {
  AuthNonce n;
  FillRandomBytes(n);
  return n;
}

// A keyed node b and a peer the test plays, connected to it as initiator.
class rdmaScriptedPeerTest : public ::testing::Test {
 protected:
  static constexpr char kPeer[] = "rdma://10.0.0.66:4000";
  void SetUp() override {
    b_ = fabric_.AddNode(Keyed("rdma://10.0.0.2:4000"));
    absl::StatusOr<ConnectionId> id = fabric_.ConnectScripted(b_, ScriptedHandshake(kPeer));
    ASSERT_TRUE(id.ok()) << id.status();
    bp_ = *id;
  }
  // B's sends on the scripted connection, parsed.
  std::vector<WireFrame> FromB() {
    std::vector<WireFrame> frames;
    sent_by_b_ = fabric_.PostedSends(b_, bp_);
    for (const std::vector<std::byte>& bytes : sent_by_b_) {
      absl::StatusOr<WireFrame> f = ParseWire(bytes);
      EXPECT_TRUE(f.ok()) << f.status();
      if (f.ok()) frames.push_back(*f);
    }
    return frames;
  }
  AuthNonce NonceOfB() {
    std::vector<WireFrame> frames = FromB();
    EXPECT_FALSE(frames.empty());
    EXPECT_EQ(frames[0].type, WireType::kAuthChallenge);
    EXPECT_EQ(frames[0].auth_address, "rdma://10.0.0.2:4000");
    return frames.empty() ? AuthNonce{} : frames[0].auth_nonce;
  }
  // The proof the peer would send if it held `secret`.
  AuthMac ProofFor(const AuthNonce& peer_nonce, const std::string& secret = kJobSecret) {
    AuthTranscript t;
    t.prover = AuthRole::kInitiator;
    t.initiator_nonce = peer_nonce;
    t.acceptor_nonce = NonceOfB();
    t.initiator_address = kPeer;
    t.acceptor_address = "rdma://10.0.0.2:4000";
    return ComputeAuthProof(*DeriveConnectionAuthKey(secret), t);
  }
  void Inject(const std::vector<std::byte>& bytes) { fabric_.Inject(b_, bp_, bytes); }
  // B refused the peer: counted once, a PermissionDenied disconnect that says `why`, nothing delivered.
  void ExpectRefused(const std::string& why) {
    const Fabric::Node& b = fabric_.node(b_);
    EXPECT_EQ(fabric_.core(b_).stats().auth_rejected, 1u);
    ASSERT_EQ(b.disconnects.size(), 1u);
    EXPECT_EQ(b.disconnects[0].first, bp_);
    EXPECT_EQ(b.disconnects[0].second.code(), absl::StatusCode::kPermissionDenied);
    EXPECT_THAT(std::string(b.disconnects[0].second.message()), HasSubstr(why));
    EXPECT_EQ(b.logged_disconnects.size(), 1u) << "the first refusal is logged";
    EXPECT_TRUE(b.delivered.empty());
    EXPECT_FALSE(fabric_.core(b_).authenticated(bp_));
    EXPECT_FALSE(fabric_.core(b_).ConnectionTo(kPeer).has_value()) << "replies must never be routed to it";
    EXPECT_EQ(fabric_.core(b_).pending_rendezvous(bp_), 0u);
    for (const WireFrame& f : FromB()) {
      EXPECT_TRUE(f.type == WireType::kAuthChallenge || f.type == WireType::kAuthProof ||
                  f.type == WireType::kCreditUpdate)
          << "B sent type " << static_cast<int>(f.type) << " to an unauthenticated peer";
    }
  }

  Fabric fabric_;
  int b_ = 0;
  ConnectionId bp_ = 0;
  std::vector<std::vector<std::byte>> sent_by_b_;  // keeps FromB's spans valid
};

TEST(rdmaAuthTest, SameKeyConnectsAndExchangesMessagesBothWays) {
  Fabric fabric;
  fabric.record_wire = true;
  const int a = fabric.AddNode(Keyed("rdma://10.0.0.1:4000"));
  const int b = fabric.AddNode(Keyed("rdma://10.0.0.2:4000"));
  ASSERT_TRUE(fabric.Send(a, b, MakeMessage(1, {100, 200 * 1024}, 4)).ok());
  ASSERT_TRUE(fabric.Send(a, b, MakeMessage(2, {10}, 5)).ok());
  fabric.Run();
  ASSERT_EQ(fabric.node(b).delivered.size(), 2u);
  EXPECT_TRUE(HasPattern(fabric.node(b).delivered[0], {100, 200 * 1024}, 4));
  EXPECT_TRUE(HasPattern(fabric.node(b).delivered[1], {10}, 5));
  fabric.auto_connect = false;
  ASSERT_TRUE(fabric.Send(b, a, MakeMessage(3, {50 * 1024}, 6)).ok());
  EXPECT_TRUE(fabric.pending_connects.empty()) << "the reply must reuse the authenticated connection";
  fabric.Run();
  ASSERT_EQ(fabric.node(a).delivered.size(), 1u);
  EXPECT_TRUE(HasPattern(fabric.node(a).delivered[0], {50 * 1024}, 6));
  EXPECT_EQ(fabric.node(a).delivered[0].header.sender_address(), "rdma://10.0.0.2:4000");
  for (int n : {a, b}) {
    const EndpointCore& core = fabric.core(n);
    EXPECT_TRUE(core.authenticating());
    EXPECT_EQ(core.stats().connections_authenticated, 1u);
    EXPECT_EQ(core.stats().auth_rejected, 0u);
    ASSERT_EQ(core.connections().size(), 1u);
    EXPECT_TRUE(core.authenticated(core.connections()[0]));
    EXPECT_TRUE(fabric.node(n).problems.empty()) << fabric.node(n).problems[0];
    EXPECT_TRUE(fabric.node(n).warnings.empty()) << "no 'authentication off' with a key";
    EXPECT_EQ(core.cache().in_use_bytes(), 0u);
  }
  // On the wire: each side's challenge, then its proof, then the traffic.
  for (auto [from, to] : {std::pair{a, b}, std::pair{b, a}}) {
    const std::vector<WireType> types = TypesSent(fabric, from, to);
    ASSERT_GE(types.size(), 3u);
    EXPECT_EQ(types[0], WireType::kAuthChallenge);
    EXPECT_EQ(types[1], WireType::kAuthProof);
  }
  EXPECT_TRUE(Carries(TypesSent(fabric, a, b), WireType::kMessage));
  EXPECT_TRUE(Carries(TypesSent(fabric, b, a), WireType::kClearToSend));
}

// A wrong key on either side, whichever side connects: both sides refuse the
// other's proof, count it, and nothing of either is delivered.
TEST(rdmaAuthTest, WrongKeyIsRefusedBothWaysAndCounted) {
  for (const bool b_connects : {false, true}) {
    SCOPED_TRACE(b_connects ? "B connects to A" : "A connects to B");
    Fabric fabric;
    fabric.record_wire = true;
    const int a = fabric.AddNode(Keyed("rdma://10.0.0.1:4000", kJobSecret));
    const int b = fabric.AddNode(Keyed("rdma://10.0.0.2:4000", kOtherJobSecret));
    const int from = b_connects ? b : a;
    const int to = b_connects ? a : b;
    for (int i = 0; i < 3; ++i) ASSERT_TRUE(fabric.Send(from, to, MakeMessage(i, {100, 100 * 1024}, 1)).ok());
    fabric.Run();
    for (int n : {a, b}) {
      const Fabric::Node& node = fabric.node(n);
      EXPECT_TRUE(node.delivered.empty());
      EXPECT_EQ(fabric.core(n).stats().auth_rejected, 1u) << "node " << n;
      EXPECT_EQ(fabric.core(n).stats().connections_authenticated, 0u);
      ASSERT_EQ(node.disconnects.size(), 1u);
      EXPECT_EQ(node.disconnects[0].second.code(), absl::StatusCode::kPermissionDenied);
      EXPECT_TRUE(AnyDisconnectMentions(node, "does not hold the job's key"));
      EXPECT_FALSE(fabric.core(n).authenticated(node.disconnects[0].first));
    }
    // Not one message, rendezvous or write crossed; the messages wait on their sender.
    for (auto [x, y] : {std::pair{a, b}, std::pair{b, a}}) {
      const std::vector<WireType> types = TypesSent(fabric, x, y);
      EXPECT_EQ(types, (std::vector<WireType>{WireType::kAuthChallenge, WireType::kAuthProof}));
    }
    EXPECT_EQ(fabric.writes_executed, 0u);
    EXPECT_EQ(fabric.core(from).queued_messages(*fabric.core(from).ConnectionTo(fabric.node(to).address)), 3u);
  }
}

// The same with the disconnects carried out: the connection goes on both
// sides, and the sender's queued messages are dropped with an error naming
// the peer.
TEST(rdmaAuthTest, WrongKeyTearsTheConnectionDownAndDropsTheQueuedMessages) {
  Fabric fabric;
  fabric.tear_down_on_disconnect = true;
  const int a = fabric.AddNode(Keyed("rdma://10.0.0.1:4000", kJobSecret));
  const int b = fabric.AddNode(Keyed("rdma://10.0.0.2:4000", kOtherJobSecret));
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(fabric.Send(a, b, MakeMessage(i, {100}, 1)).ok());
  fabric.Run();
  EXPECT_TRUE(fabric.node(a).delivered.empty());
  EXPECT_TRUE(fabric.node(b).delivered.empty());
  EXPECT_GE(fabric.core(a).stats().auth_rejected + fabric.core(b).stats().auth_rejected, 1u);
  EXPECT_TRUE(fabric.core(a).connections().empty());
  EXPECT_TRUE(fabric.core(b).connections().empty());
  EXPECT_EQ(fabric.core(a).stats().messages_dropped, 3u);
  EXPECT_TRUE(AnyMentions(fabric.node(a).problems, "RDMA peer rdma://10.0.0.2:4000: 3 message(s) queued"));
  // The refusing side does not report the loss of the connection it refused a second time.
  for (int n : {a, b}) {
    if (fabric.core(n).stats().auth_rejected == 0) continue;
    EXPECT_FALSE(AnyMentions(fabric.node(n).problems, "connection lost")) << "node " << n;
  }
}

// Rule: a keyed endpoint and an unkeyed one never connect, whichever side
// connects; the accepting side rejects the request at set-up (the handshake
// flag), counts it and says why; the connecting side sees the rejection.
TEST(rdmaAuthTest, KeyedAndUnkeyedEndpointsRefuseEachOtherAtSetUp) {
  for (const bool keyed_connects : {false, true}) {
    SCOPED_TRACE(keyed_connects ? "the keyed endpoint connects" : "the unkeyed endpoint connects");
    Fabric fabric;
    fabric.record_wire = true;
    const int k = fabric.AddNode(Keyed("rdma://10.0.0.1:4000"));
    const int u = fabric.AddNode(Config("rdma://10.0.0.2:4000"));
    const int from = keyed_connects ? k : u;
    const int to = keyed_connects ? u : k;
    // Each message tries afresh (the rejected connection is gone): two rejections.
    for (int i = 0; i < 2; ++i) ASSERT_TRUE(fabric.Send(from, to, MakeMessage(i, {10}, 1)).ok());
    fabric.Run();
    EXPECT_EQ(fabric.rejected_connects, 2u);
    EXPECT_EQ(fabric.core(to).stats().auth_rejected, 2u);
    EXPECT_EQ(fabric.core(from).stats().auth_rejected, 0u);
    EXPECT_TRUE(AnyMentions(fabric.node(to).problems, keyed_connects ? "this endpoint has none"
                                                                     : "this endpoint admits only holders"));
    EXPECT_TRUE(AnyMentions(fabric.node(to).problems, "refused a connection from rdma://10.0.0."));
    EXPECT_TRUE(fabric.core(to).connections().empty());
    EXPECT_TRUE(fabric.core(from).connections().empty());
    EXPECT_EQ(fabric.core(from).stats().messages_dropped, 2u);
    EXPECT_TRUE(AnyMentions(fabric.node(from).problems, "REJECTED"));
    EXPECT_TRUE(fabric.node(k).delivered.empty());
    EXPECT_TRUE(fabric.node(u).delivered.empty());
    EXPECT_TRUE(fabric.wire_log.empty());
  }
}

// The connecting side checks the accept reply's flag too (a peer that
// accepted although the flags differ is refused there).
TEST(rdmaAuthTest, ConnectingSideRefusesAnAcceptReplyWithTheOtherFlag) {
  for (const bool keyed : {true, false}) {
    SCOPED_TRACE(keyed ? "keyed connects, reply without the flag" : "unkeyed connects, reply with the flag");
    Fabric fabric;
    fabric.auto_connect = false;
    const int a = fabric.AddNode(keyed ? Keyed("rdma://10.0.0.1:4000") : Config("rdma://10.0.0.1:4000"));
    ASSERT_TRUE(fabric.SendTo(a, "rdma://10.0.0.2:4000", MakeMessage(1, {10})).ok());
    ASSERT_EQ(fabric.pending_connects.size(), 1u);
    const ConnectionId id = fabric.pending_connects[0].second.connection;
    Actions out;
    ASSERT_TRUE(fabric.core(a).OnQueuePairReady(id, out).ok());
    const absl::Status s =
        fabric.core(a).OnEstablished(id, ScriptedHandshake("rdma://10.0.0.2:4000", /*auth_required=*/!keyed), out);
    EXPECT_EQ(s.code(), absl::StatusCode::kPermissionDenied);
    bool disconnected = false;
    for (const Action& action : out) {
      if (const auto* d = std::get_if<DisconnectAction>(&action)) {
        disconnected = d->connection == id && d->reason.code() == absl::StatusCode::kPermissionDenied;
      }
      EXPECT_FALSE(std::holds_alternative<PostSendAction>(action)) << "nothing may go to it";
    }
    EXPECT_TRUE(disconnected);
    EXPECT_EQ(fabric.core(a).stats().auth_rejected, 1u);
  }
}

// Without a key: endpoints connect as before, nothing of authentication goes
// on the wire, and each endpoint warns once (not once per connection).
TEST(rdmaAuthTest, UnkeyedEndpointsWarnOnceAndConnect) {
  Fabric fabric;
  fabric.record_wire = true;
  const int a = fabric.AddNode(Config("rdma://10.0.0.1:4000"));
  const int b = fabric.AddNode(Config("rdma://10.0.0.2:4000"));
  const int c = fabric.AddNode(Config("rdma://10.0.0.3:4000"));
  ASSERT_TRUE(fabric.Send(a, b, MakeMessage(1, {10, 100 * 1024}, 2)).ok());
  ASSERT_TRUE(fabric.Send(a, c, MakeMessage(2, {10}, 2)).ok());
  ASSERT_TRUE(fabric.Send(c, b, MakeMessage(3, {10}, 2)).ok());
  fabric.Run();
  ASSERT_TRUE(fabric.Send(b, a, MakeMessage(4, {10}, 2)).ok());
  fabric.Run();
  EXPECT_EQ(fabric.node(b).delivered.size(), 2u);
  EXPECT_EQ(fabric.node(c).delivered.size(), 1u);
  EXPECT_EQ(fabric.node(a).delivered.size(), 1u);
  EXPECT_EQ(fabric.core(a).connections().size(), 2u);
  for (int n : {a, b, c}) {
    EXPECT_FALSE(fabric.core(n).authenticating());
    ASSERT_EQ(fabric.node(n).warnings.size(), 1u) << "node " << n;
    EXPECT_THAT(std::string(fabric.node(n).warnings[0].message()), HasSubstr("authentication off"));
    EXPECT_TRUE(fabric.node(n).problems.empty());
    EXPECT_EQ(fabric.core(n).stats().auth_rejected, 0u);
  }
  for (const Fabric::WireRecord& r : fabric.wire_log) {
    absl::StatusOr<WireFrame> f = ParseWire(r.bytes);
    ASSERT_TRUE(f.ok());
    EXPECT_NE(f->type, WireType::kAuthChallenge);
    EXPECT_NE(f->type, WireType::kAuthProof);
  }
}

// Authentication under stress: tiny windows (one credit), random
// interleavings of completions and traffic both ways, rendezvous included.
TEST(rdmaAuthTest, KeyedTrafficWithOneCreditUnderRandomInterleavings) {
  for (uint64_t seed = 1; seed <= 8; ++seed) {
    SCOPED_TRACE(::testing::Message() << "seed " << seed);
    Fabric fabric;
    fabric.interleave.emplace(seed);
    ProtocolConfig c1 = Keyed("rdma://10.0.0.1:4000");
    ProtocolConfig c2 = Keyed("rdma://10.0.0.2:4000");
    c1.credits = 1 + seed % 2;
    c2.credits = 1;
    const int a = fabric.AddNode(c1);
    const int b = fabric.AddNode(c2);
    constexpr int kMessages = 150;
    auto shape = [](int i) { return std::vector<size_t>{static_cast<size_t>(i % 13 == 0 ? 40 * 1024 : i % 300)}; };
    for (int i = 0; i < kMessages; ++i) {
      ASSERT_TRUE(fabric.Send(a, b, MakeMessage(i, shape(i), static_cast<uint8_t>(i))).ok());
      if (i == 0) fabric.Run();
      if (i > 0) {
        ASSERT_TRUE(fabric.Send(b, a, MakeMessage(i, shape(i + 1), 9)).ok());
      }
      for (int k = 0; k < 3; ++k) fabric.Step();
    }
    fabric.Run();
    ASSERT_EQ(fabric.receive_queue_ran_dry, 0u);
    ASSERT_EQ(fabric.node(b).delivered.size(), static_cast<size_t>(kMessages));
    ASSERT_EQ(fabric.node(a).delivered.size(), kMessages - 1u);
    for (int i = 0; i < kMessages; ++i) {
      ASSERT_EQ(fabric.node(b).delivered[i].header.request_id(), static_cast<uint64_t>(i));
      ASSERT_TRUE(HasPattern(fabric.node(b).delivered[i], shape(i), static_cast<uint8_t>(i)));
    }
    for (int n : {a, b}) {
      ASSERT_TRUE(fabric.node(n).problems.empty()) << fabric.node(n).problems[0];
      ASSERT_EQ(fabric.core(n).stats().protocol_violations, 0u);
      ASSERT_EQ(fabric.core(n).stats().connections_authenticated, 1u);
      ASSERT_EQ(fabric.core(n).connections().size(), 1u);
    }
  }
}

// A peer the test plays (initiator) holding the right key gets in: what the
// refusals below refuse is the missing or bad proof, not the harness.
TEST_F(rdmaScriptedPeerTest, PeerWithTheKeyGetsIn) {
  const AuthNonce mine = FreshNonce();
  Inject(ChallengeBytes(mine, kPeer));
  Inject(ProofBytes(ProofFor(mine)));
  EXPECT_TRUE(fabric_.core(b_).authenticated(bp_));
  EXPECT_EQ(fabric_.core(b_).ConnectionTo(kPeer), bp_);
  Inject(MessageBytes(7, kPeer));
  ASSERT_EQ(fabric_.node(b_).delivered.size(), 1u);
  EXPECT_EQ(fabric_.node(b_).delivered[0].header.request_id(), 7u);
  EXPECT_EQ(fabric_.core(b_).stats().auth_rejected, 0u);
  // B's own proof (its second send) verifies as the acceptor's.
  std::vector<WireFrame> frames = FromB();
  ASSERT_GE(frames.size(), 2u);
  ASSERT_EQ(frames[1].type, WireType::kAuthProof);
  AuthTranscript t{AuthRole::kAcceptor, mine, frames[0].auth_nonce, kPeer, "rdma://10.0.0.2:4000"};
  EXPECT_TRUE(VerifyAuthProof(*DeriveConnectionAuthKey(kJobSecret), t, frames[1].auth_mac));
}

TEST_F(rdmaScriptedPeerTest, MessageWithoutAnyAuthenticationIsRefused) {
  Inject(MessageBytes(1, kPeer));
  ExpectRefused("it sent a message before proving it holds the job key");
  // Whatever it sends next is not even looked at.
  Inject(MessageBytes(2, kPeer));
  Inject(std::vector<std::byte>(100, std::byte{0x5a}));
  EXPECT_TRUE(fabric_.node(b_).delivered.empty());
  EXPECT_EQ(fabric_.core(b_).stats().auth_rejected, 1u);
  EXPECT_EQ(fabric_.core(b_).stats().malformed_received, 0u);
}

TEST_F(rdmaScriptedPeerTest, PeerThatSkipsTheProofIsRefused) {
  Inject(ChallengeBytes(FreshNonce(), kPeer));
  Inject(MessageBytes(1, kPeer, /*remote_frame=*/100 * 1024));  // with an RTS: no clear-to-send may follow
  ExpectRefused("it sent a message before proving");
  EXPECT_EQ(fabric_.core(b_).cache().in_use_bytes(), 0u) << "nothing was registered for it";
}

TEST_F(rdmaScriptedPeerTest, ControlMessagesAndWritesBeforeTheProofAreRefused) {
  // A clear-to-send (it would make B write its memory out), and separately a write with immediate.
  Inject(ChallengeBytes(FreshNonce(), kPeer));
  std::vector<std::byte> cts(kWireHeaderBytes + kClearToSendBodyBytes);
  EncodeClearToSend(cts, 0, ClearToSend{1, 0x1000, 4096, 5});
  Inject(cts);
  ExpectRefused("it sent a clear-to-send before proving");
  EXPECT_EQ(fabric_.core(b_).stats().writes_posted, 0u);

  Fabric fabric;
  const int b = fabric.AddNode(Keyed("rdma://10.0.0.2:4000"));
  const ConnectionId id = *fabric.ConnectScripted(b, ScriptedHandshake(kPeer));
  fabric.InjectImmediate(b, id, 1, 4096);
  EXPECT_EQ(fabric.core(b).stats().auth_rejected, 1u);
  EXPECT_TRUE(AnyDisconnectMentions(fabric.node(b), "wrote with immediate before proving"));
}

TEST_F(rdmaScriptedPeerTest, TruncatedProofIsRefused) {
  const AuthNonce mine = FreshNonce();
  Inject(ChallengeBytes(mine, kPeer));
  std::vector<std::byte> proof = ProofBytes(ProofFor(mine));  // the right proof, cut short
  proof.resize(kWireHeaderBytes + 16);
  Inject(proof);
  ExpectRefused("malformed message before proving");
  EXPECT_EQ(fabric_.core(b_).stats().malformed_received, 1u);
}

TEST_F(rdmaScriptedPeerTest, ProofMadeWithAnotherJobsKeyIsRefused) {
  const AuthNonce mine = FreshNonce();
  Inject(ChallengeBytes(mine, kPeer));
  Inject(ProofBytes(ProofFor(mine, kOtherJobSecret)));
  Inject(MessageBytes(1, kPeer));
  ExpectRefused("its proof does not verify");
}

TEST_F(rdmaScriptedPeerTest, ProofWithOneBitFlippedIsRefused) {
  const AuthNonce mine = FreshNonce();
  Inject(ChallengeBytes(mine, kPeer));
  AuthMac proof = ProofFor(mine);
  proof[9] ^= std::byte{0x10};
  Inject(ProofBytes(proof));
  Inject(MessageBytes(1, kPeer));
  ExpectRefused("its proof does not verify");
}

TEST_F(rdmaScriptedPeerTest, MissingProofIsRefusedAfterTheConnectTimeout) {
  Inject(ChallengeBytes(FreshNonce(), kPeer));
  fabric_.TickAll(99);
  EXPECT_EQ(fabric_.core(b_).stats().auth_rejected, 0u);
  EXPECT_TRUE(fabric_.node(b_).disconnects.empty());
  fabric_.TickAll(100);
  ExpectRefused("did not prove it holds the job key within 100 ticks");
  fabric_.TickAll(500);  // counted once, not once per tick
  EXPECT_EQ(fabric_.core(b_).stats().auth_rejected, 1u);
}

TEST_F(rdmaScriptedPeerTest, ProofBeforeChallengeAndSecondChallengeAreRefused) {
  Inject(ProofBytes(AuthMac{}));
  ExpectRefused("it sent a proof before its challenge");

  Fabric fabric;
  const int b = fabric.AddNode(Keyed("rdma://10.0.0.2:4000"));
  const ConnectionId id = *fabric.ConnectScripted(b, ScriptedHandshake(kPeer));
  fabric.Inject(b, id, ChallengeBytes(FreshNonce(), kPeer));
  fabric.Inject(b, id, ChallengeBytes(FreshNonce(), kPeer));
  EXPECT_TRUE(AnyDisconnectMentions(fabric.node(b), "second authentication challenge"));
  EXPECT_EQ(fabric.core(b).stats().auth_rejected, 1u);
}

// Reflection: the peer sends B's own proof (the acceptor's) back as its own
// (the initiator's), or B's own nonce as its challenge.
TEST_F(rdmaScriptedPeerTest, ReflectedProofOrNonceIsRefused) {
  const AuthNonce mine = FreshNonce();
  Inject(ChallengeBytes(mine, kPeer));
  std::vector<WireFrame> frames = FromB();
  ASSERT_EQ(frames.size(), 2u);
  ASSERT_EQ(frames[1].type, WireType::kAuthProof);
  Inject(ProofBytes(frames[1].auth_mac));
  ExpectRefused("its proof does not verify");

  Fabric fabric;
  const int b = fabric.AddNode(Keyed("rdma://10.0.0.2:4000"));
  const ConnectionId id = *fabric.ConnectScripted(b, ScriptedHandshake(kPeer));
  const std::vector<std::vector<std::byte>> sent = fabric.PostedSends(b, id);
  ASSERT_EQ(sent.size(), 1u);
  absl::StatusOr<WireFrame> challenge = ParseWire(sent[0]);
  ASSERT_TRUE(challenge.ok());
  fabric.Inject(b, id, ChallengeBytes(challenge->auth_nonce, kPeer));
  EXPECT_TRUE(AnyDisconnectMentions(fabric.node(b), "echoes this endpoint's nonce"));
}

TEST_F(rdmaScriptedPeerTest, ChallengeNamingAnotherAddressIsRefused) {
  const AuthNonce mine = FreshNonce();
  Inject(ChallengeBytes(mine, "rdma://10.0.0.1:4000"));  // the handshake said kPeer
  ExpectRefused("its challenge names it rdma://10.0.0.1:4000, not the address this connection was opened from");
}

// An initiator whose address does not fit the handshake sends it in a hello,
// before its challenge; the acceptor routes replies to it only once it is
// authenticated.
TEST(rdmaAuthTest, LongAddressTravelsInHelloBeforeTheChallenge) {
  const std::string long_name = "rdma://a-very-long-host-name.rack-07.cluster.example.org:4000";
  Fabric fabric;
  fabric.record_wire = true;
  const int a = fabric.AddNode(Keyed(long_name));
  const int b = fabric.AddNode(Keyed("rdma://10.0.0.2:4000"));
  ASSERT_TRUE(fabric.Send(a, b, MakeMessage(1, {10}, 1)).ok());
  fabric.Run();
  ASSERT_EQ(fabric.node(b).delivered.size(), 1u);
  const std::vector<WireType> types = TypesSent(fabric, a, b);
  ASSERT_GE(types.size(), 4u);
  EXPECT_EQ(std::vector<WireType>(types.begin(), types.begin() + 4),
            (std::vector<WireType>{WireType::kHello, WireType::kAuthChallenge, WireType::kAuthProof,
                                   WireType::kMessage}));
  EXPECT_TRUE(fabric.core(b).ConnectionTo(long_name).has_value());
  fabric.auto_connect = false;
  ASSERT_TRUE(fabric.Send(b, a, MakeMessage(2, {10}, 1)).ok());
  EXPECT_TRUE(fabric.pending_connects.empty());
  fabric.Run();
  EXPECT_EQ(fabric.node(a).delivered.size(), 1u);
}

TEST(rdmaAuthTest, AddressFromAHelloIsNotRoutedToBeforeTheProof) {
  const std::string long_name = "rdma://a-very-long-host-name.rack-07.cluster.example.org:4000";
  Fabric fabric;
  const int b = fabric.AddNode(Keyed("rdma://10.0.0.2:4000"));
  const std::vector<std::byte> handshake = ScriptedHandshake(long_name);
  ASSERT_TRUE(ParseHandshake(handshake)->address_in_hello);
  const ConnectionId id = *fabric.ConnectScripted(b, handshake);
  std::vector<std::byte> hello(HelloWireBytes(long_name));
  EncodeHello(hello, 0, long_name);
  fabric.Inject(b, id, hello);
  EXPECT_EQ(fabric.core(b).peer_address(id), long_name);
  EXPECT_FALSE(fabric.core(b).ConnectionTo(long_name).has_value()) << "replies routed to an unproven peer";
  fabric.Inject(b, id, MessageBytes(1, long_name));
  EXPECT_EQ(fabric.core(b).stats().auth_rejected, 1u);
  EXPECT_FALSE(fabric.core(b).ConnectionTo(long_name).has_value());
  EXPECT_TRUE(fabric.node(b).delivered.empty());
}

// The initiator checks that the acceptor names itself by the address it
// dialed: a connection redirected elsewhere is refused.
TEST(rdmaAuthTest, AcceptorNamingItselfOtherwiseIsRefusedByTheInitiator) {
  Fabric fabric;
  const int a = fabric.AddNode(Keyed("rdma://10.0.0.1:4000"));
  const int b = fabric.AddNode(Keyed("rdma://10.0.0.2:4000"));
  fabric.aliases["rdma://10.0.0.99:4000"] = b;
  ASSERT_TRUE(fabric.SendTo(a, "rdma://10.0.0.99:4000", MakeMessage(1, {10})).ok());
  fabric.Run();
  EXPECT_TRUE(fabric.node(b).delivered.empty());
  EXPECT_EQ(fabric.core(a).stats().auth_rejected, 1u);
  EXPECT_TRUE(AnyDisconnectMentions(fabric.node(a), "names it rdma://10.0.0.2:4000, not the address this connection dialed"));
}

// Replay: a peer without the key records a real initiator's challenge and
// proof from one connection and plays them back on a new one. B's fresh
// nonce makes the old proof worthless. The control run (B's nonce source
// made to repeat) shows the replay is otherwise a working one: the refusal
// is due to the nonce alone.
TEST(rdmaAuthTest, ReplayedProofFromAnEarlierConnectionIsRefused) {
  for (const bool repeating_nonces : {true, false}) {
    SCOPED_TRACE(repeating_nonces ? "control: B's nonces repeat" : "B's nonces are fresh");
    Fabric fabric;
    fabric.record_wire = true;
    const int a = fabric.AddNode(Keyed("rdma://10.0.0.1:4000"));
    ProtocolConfig cb = Keyed("rdma://10.0.0.2:4000");
    if (repeating_nonces) {
      cb.random_bytes = [](std::span<std::byte> out) { std::fill(out.begin(), out.end(), std::byte{0x42}); };
    }
    const int b = fabric.AddNode(cb);
    ASSERT_TRUE(fabric.Send(a, b, MakeMessage(1, {10}, 1)).ok());
    fabric.Run();
    ASSERT_EQ(fabric.node(b).delivered.size(), 1u);
    const ConnectionId legit = *fabric.core(b).ConnectionTo("rdma://10.0.0.1:4000");

    // What a tap saw A send: challenge, proof, message.
    std::vector<std::vector<std::byte>> recorded;
    for (const Fabric::WireRecord& r : fabric.wire_log) {
      if (r.from == a) recorded.push_back(r.bytes);
    }
    ASSERT_GE(recorded.size(), 3u);
    ASSERT_EQ(ParseWire(recorded[0])->type, WireType::kAuthChallenge);
    ASSERT_EQ(ParseWire(recorded[1])->type, WireType::kAuthProof);
    ASSERT_EQ(ParseWire(recorded[2])->type, WireType::kMessage);

    absl::StatusOr<ConnectionId> replay = fabric.ConnectScripted(b, fabric.core(a).LocalHandshake());
    ASSERT_TRUE(replay.ok());
    for (size_t i = 0; i < 3; ++i) fabric.Inject(b, *replay, recorded[i]);
    if (repeating_nonces) {
      EXPECT_TRUE(fabric.core(b).authenticated(*replay)) << "with a repeated nonce the replay gets in";
      EXPECT_EQ(fabric.node(b).delivered.size(), 2u);
      EXPECT_EQ(fabric.core(b).stats().auth_rejected, 0u);
      continue;
    }
    EXPECT_FALSE(fabric.core(b).authenticated(*replay));
    EXPECT_EQ(fabric.core(b).stats().auth_rejected, 1u);
    EXPECT_TRUE(AnyDisconnectMentions(fabric.node(b), "its proof does not verify"));
    EXPECT_EQ(fabric.node(b).delivered.size(), 1u) << "the replayed message must not be delivered";
    // The real peer's connection is untouched: replies still go to it.
    EXPECT_EQ(fabric.core(b).ConnectionTo("rdma://10.0.0.1:4000"), legit);
    ASSERT_TRUE(fabric.Send(b, a, MakeMessage(2, {10}, 1)).ok());
    fabric.Run();
    ASSERT_EQ(fabric.node(a).delivered.size(), 1u);
  }
}

// A flood of strangers: every refusal is counted, only the 1st, 2nd, 4th,
// 8th, ... is logged, and the torn-down connections are not reported again.
TEST(rdmaAuthTest, RefusalsAreAllCountedButTheLogIsRateLimited) {
  Fabric fabric;
  fabric.tear_down_on_disconnect = true;
  const int b = fabric.AddNode(Keyed("rdma://10.0.0.2:4000"));
  for (int i = 0; i < 20; ++i) {
    const std::string peer = "rdma://10.0.1." + std::to_string(i) + ":4000";
    absl::StatusOr<ConnectionId> id = fabric.ConnectScripted(b, ScriptedHandshake(peer));
    ASSERT_TRUE(id.ok());
    fabric.Inject(b, *id, MessageBytes(1, peer));
    fabric.Run();
  }
  // Half of another 20 do not even have the flag: rejected at set-up, same accounting.
  for (int i = 0; i < 20; ++i) {
    absl::StatusOr<ConnectionId> id = fabric.ConnectScripted(b, ScriptedHandshake("rdma://10.0.2.1:4000", false));
    EXPECT_EQ(id.status().code(), absl::StatusCode::kPermissionDenied);
  }
  EXPECT_EQ(fabric.core(b).stats().auth_rejected, 40u);
  EXPECT_EQ(fabric.node(b).disconnects.size(), 20u);
  ASSERT_EQ(fabric.node(b).logged_disconnects.size(), 5u);  // refusals 1, 2, 4, 8, 16
  EXPECT_THAT(std::string(fabric.node(b).logged_disconnects[4].message()), HasSubstr("(16 refused so far)"));
  // Of the set-up rejections (refusals 21..40) only the 32nd is logged.
  ASSERT_EQ(fabric.node(b).problems.size(), 1u);
  EXPECT_THAT(std::string(fabric.node(b).problems[0].message()), HasSubstr("(32 refused so far)"));
  EXPECT_TRUE(fabric.core(b).connections().empty());
  EXPECT_TRUE(fabric.node(b).delivered.empty());
}

TEST(rdmaAuthTest, ConfigValidationChecksTheKeyWithoutEchoingIt) {
  ProtocolConfig c = Keyed("rdma://h:1");
  EXPECT_TRUE(EndpointCore::Validate(c, 1 << 20).ok());
  c.auth_secret_key = "Ra]8Hb}#}Kz4!FS!*2I]/=Av#aiLKw7ETIsnJ-L";  // 39 characters
  absl::Status s = EndpointCore::Validate(c, 1 << 20);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr("auth_secret_key"));
  EXPECT_THAT(std::string(s.message()), ::testing::Not(HasSubstr("Ra]8Hb")));
  c.auth_secret_key = std::string(40, '"');
  EXPECT_FALSE(EndpointCore::Validate(c, 1 << 20).ok());
}

}  // namespace
}  // namespace tessera::rdma

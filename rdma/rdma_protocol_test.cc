// EndpointCore driven through a simulated reliable-connected fabric: two or
// more cores, their queue pairs wired together in memory. The fabric checks
// what an adapter would: a SEND or WRITE_WITH_IMM needs a posted receive
// (else the receive queue "ran dry" and the test fails), local buffers must
// lie in the pool or a live registration, remote writes must land inside a
// live registration of the receiver under the rkey given.
#include "rdma/rdma_protocol.h"

#include <algorithm>
#include <cstring>
#include <deque>
#include <functional>
#include <map>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/strings/match.h"
#include "rdma/testing/fake_registrar.h"

namespace tessera::rdma {
namespace {

using ::testing::HasSubstr;

constexpr uint32_t kPoolLkey = 7;

ProtocolConfig Config(const std::string& address) {
  ProtocolConfig c;
  c.local_address = address;
  c.slot_bytes = 4096;
  c.credits = 8;
  c.rendezvous_threshold = 16 * 1024;
  c.rendezvous_timeout_ticks = 100;
  c.connect_timeout_ticks = 100;
  c.min_send_slots = 4;
  c.max_pinned_bytes = 8 << 20;
  return c;
}

// A message whose frames hold a pattern that depends on (seed, frame, byte).
Message MakeMessage(uint64_t request_id, const std::vector<size_t>& frame_sizes, uint8_t seed = 1) {
  Message m;
  m.header.set_request_id(request_id);
  m.header.set_epoch(seed);
  for (size_t f = 0; f < frame_sizes.size(); ++f) {
    Buffer b = Buffer::Allocate(frame_sizes[f]);
    for (size_t i = 0; i < frame_sizes[f]; ++i) b.mutable_data()[i] = static_cast<std::byte>(seed * 31 + f * 7 + i % 251);
    m.frames.push_back(std::move(b));
  }
  return m;
}

::testing::AssertionResult HasPattern(const Message& m, const std::vector<size_t>& frame_sizes, uint8_t seed) {
  if (m.frames.size() != frame_sizes.size()) {
    return ::testing::AssertionFailure() << m.frames.size() << " frames, expected " << frame_sizes.size();
  }
  for (size_t f = 0; f < frame_sizes.size(); ++f) {
    if (m.frames[f].size() != frame_sizes[f]) {
      return ::testing::AssertionFailure() << "frame " << f << " has " << m.frames[f].size() << " bytes";
    }
    for (size_t i = 0; i < frame_sizes[f]; ++i) {
      if (m.frames[f].data()[i] != static_cast<std::byte>(seed * 31 + f * 7 + i % 251)) {
        return ::testing::AssertionFailure() << "frame " << f << " byte " << i << " differs";
      }
    }
  }
  return ::testing::AssertionSuccess();
}

bool AnyMentions(const std::vector<absl::Status>& statuses, const std::string& text) {
  for (const absl::Status& s : statuses) {
    if (absl::StrContains(s.message(), text)) return true;
  }
  return false;
}

class Fabric {
 public:
  struct Node {
    std::string address;
    std::vector<std::byte> region;
    testing::FakeRegistrar registrar;
    std::unique_ptr<EndpointCore> core;
    std::vector<Message> delivered;
    std::vector<absl::Status> problems;
    std::vector<absl::Status> warnings;
    std::vector<std::pair<ConnectionId, absl::Status>> disconnects;
    std::vector<absl::Status> logged_disconnects;  // the ones the core asked the shell to log
    bool hold_send_completions = false;
    std::vector<uint64_t> held_completions;
    bool frozen = false;  // its posted work does not execute
    // Completions the adapter reported and the node has not processed yet.
    struct Completion {
      bool receive = false;
      uint64_t wr_id = 0;
      uint32_t byte_len = 0;
      std::optional<uint32_t> immediate;
    };
    std::deque<Completion> completion_queue;
  };
  struct Op {
    bool is_write = false;
    PostSendAction send{};
    PostWriteAction write{};
  };
  struct QueuePair {
    int node = 0;
    ConnectionId connection = 0;
    int peer = -1;
    std::deque<PostReceiveAction> receives;
    std::deque<Op> outgoing;
    size_t min_receives_seen = SIZE_MAX;
  };

  int AddNode(ProtocolConfig config, size_t pool_bytes = 1 << 20) {
    auto n = std::make_unique<Node>();
    n->address = config.local_address;
    n->region.resize(pool_bytes);
    n->core = std::make_unique<EndpointCore>(config, n->region, kPoolLkey, n->registrar);
    nodes_.push_back(std::move(n));
    return static_cast<int>(nodes_.size() - 1);
  }
  Node& node(int i) { return *nodes_[i]; }
  EndpointCore& core(int i) { return *nodes_[i]->core; }

  absl::Status Send(int from, int to, Message m) { return SendTo(from, nodes_[to]->address, std::move(m)); }
  absl::Status SendTo(int from, const std::string& address, Message m) {
    Actions out;
    absl::Status s = core(from).Send(address, std::move(m), out);
    Apply(from, out);
    return s;
  }

  void Apply(int n, Actions& actions) {
    Actions local = std::move(actions);
    actions.clear();
    for (Action& a : local) {
      if (auto* c = std::get_if<ConnectAction>(&a)) {
        if (auto_connect) {
          Connect(n, c->connection, c->address);
        } else {
          pending_connects.emplace_back(n, *c);
        }
      } else if (auto* r = std::get_if<PostReceiveAction>(&a)) {
        qp(n, r->connection).receives.push_back(*r);
      } else if (auto* s = std::get_if<PostSendAction>(&a)) {
        qp(n, s->connection).outgoing.push_back(Op{false, *s, {}});
      } else if (auto* w = std::get_if<PostWriteAction>(&a)) {
        qp(n, w->connection).outgoing.push_back(Op{true, {}, *w});
      } else if (auto* d = std::get_if<DeliverAction>(&a)) {
        node(n).delivered.push_back(std::move(d->message));
      } else if (auto* x = std::get_if<DisconnectAction>(&a)) {
        node(n).disconnects.emplace_back(x->connection, x->reason);
        if (x->log) node(n).logged_disconnects.push_back(x->reason);
        if (tear_down_on_disconnect) pending_teardowns.push_back({n, x->connection, x->reason});
      } else if (auto* p = std::get_if<ProblemAction>(&a)) {
        // "authentication off" is a warning about the configuration, not a problem of the traffic.
        if (p->status.code() == absl::StatusCode::kUnauthenticated) {
          node(n).warnings.push_back(p->status);
        } else {
          node(n).problems.push_back(p->status);
        }
      }
    }
  }

  // The connection manager: the passive side accepts, both post receives, both are established.
  void Connect(int a, ConnectionId ca, const std::string& address) {
    int b = -1;
    for (size_t i = 0; i < nodes_.size(); ++i) {
      if (nodes_[i]->address == address) b = static_cast<int>(i);
    }
    if (auto it = aliases.find(address); it != aliases.end()) b = it->second;
    Actions out;
    if (b < 0) {
      core(a).OnConnectionLost(ca, absl::UnavailableError("no route to host"), out);
      Apply(a, out);
      return;
    }
    absl::StatusOr<ConnectionId> cb = core(b).OnConnectRequest(core(a).LocalHandshake(), out);
    Apply(b, out);
    if (!cb.ok()) {  // the passive side rejected the request
      ++rejected_connects;
      core(a).OnConnectionLost(ca, absl::UnavailableError("RDMA_CM_EVENT_REJECTED (status 28)"), out);
      Apply(a, out);
      return;
    }
    const int qa = static_cast<int>(qps_.size());
    qps_.push_back(QueuePair{a, ca, qa + 1});
    qps_.push_back(QueuePair{b, *cb, qa});
    index_[{a, ca}] = qa;
    index_[{b, *cb}] = qa + 1;
    ASSERT_TRUE(core(a).OnQueuePairReady(ca, out).ok());
    Apply(a, out);
    ASSERT_TRUE(core(b).OnQueuePairReady(*cb, out).ok());
    Apply(b, out);
    // The active side may refuse the accept reply (an authentication flag
    // mismatch): it says so with a DisconnectAction.
    (void)core(a).OnEstablished(ca, core(b).LocalHandshake(), out);
    Apply(a, out);
    ASSERT_TRUE(core(b).OnEstablished(*cb, {}, out).ok());
    Apply(b, out);
  }

  // A connection to node b from a peer the test plays by hand: b gets
  // `handshake` as the connect request and is established; what b posts
  // piles up in the queue pair's `outgoing` (nothing executes it), and the
  // test injects the peer's SENDs with Inject.
  absl::StatusOr<ConnectionId> ConnectScripted(int b, std::span<const std::byte> handshake) {
    Actions out;
    absl::StatusOr<ConnectionId> cb = core(b).OnConnectRequest(handshake, out);
    Apply(b, out);
    if (!cb.ok()) return cb.status();
    const int q = static_cast<int>(qps_.size());
    qps_.push_back(QueuePair{b, *cb, -1});
    index_[{b, *cb}] = q;
    EXPECT_TRUE(core(b).OnQueuePairReady(*cb, out).ok());
    Apply(b, out);
    EXPECT_TRUE(core(b).OnEstablished(*cb, {}, out).ok());
    Apply(b, out);
    return *cb;
  }
  // The bytes of the SENDs node n posted on connection c that have not executed.
  std::vector<std::vector<std::byte>> PostedSends(int n, ConnectionId c) {
    std::vector<std::vector<std::byte>> sends;
    for (const Op& op : qp(n, c).outgoing) {
      if (op.is_write) continue;
      const auto* p = reinterpret_cast<const std::byte*>(op.send.address);
      sends.emplace_back(p, p + op.send.length);
    }
    return sends;
  }

  // What the shell does after a DisconnectAction: destroy the queue pair
  // (the peer's end goes too, as with a real disconnect), then tell the cores.
  void TearDown(int n, ConnectionId c, const absl::Status& why) {
    auto it = index_.find({n, c});
    if (it != index_.end() && qps_[it->second].peer >= 0) {
      Kill(n, c, why);
      return;
    }
    if (it != index_.end()) {
      qps_[it->second].outgoing.clear();
      qps_[it->second].receives.clear();
    }
    Actions out;
    core(n).OnConnectionLost(c, why, out);  // ignored when already lost
    Apply(n, out);
  }
  void ProcessTeardowns() {
    while (!pending_teardowns.empty()) {
      Teardown t = pending_teardowns.front();
      pending_teardowns.pop_front();
      TearDown(t.node, t.connection, t.reason);
    }
  }

  QueuePair& qp(int n, ConnectionId c) {
    auto it = index_.find({n, c});
    if (it == index_.end()) {
      ADD_FAILURE() << "node " << n << " posted on unknown connection " << c;
      static QueuePair dummy;
      return dummy;
    }
    return qps_[it->second];
  }
  // The peer's end of node n's connection c.
  std::pair<int, ConnectionId> PeerOf(int n, ConnectionId c) {
    const QueuePair& q = qp(n, c);
    return {qps_[q.peer].node, qps_[q.peer].connection};
  }

  bool LocalOk(int n, uint64_t address, uint32_t length, uint32_t lkey) {
    const uint64_t lo = reinterpret_cast<uint64_t>(node(n).region.data());
    if (lkey == kPoolLkey) return address >= lo && address + length <= lo + node(n).region.size();
    return node(n).registrar.Covers(lkey, false, address, length);
  }

  // Takes a posted receive of the queue pair; fails the test when none is posted.
  std::optional<PostReceiveAction> TakeReceive(QueuePair& q) {
    q.min_receives_seen = std::min(q.min_receives_seen, q.receives.size());
    if (q.receives.empty()) {
      ++receive_queue_ran_dry;
      ADD_FAILURE() << "receive queue of node " << q.node << " connection " << q.connection << " ran dry";
      return std::nullopt;
    }
    PostReceiveAction r = q.receives.front();
    q.receives.pop_front();
    return r;
  }

  void Complete(int n, uint64_t wr_id) { node(n).completion_queue.push_back({false, wr_id, 0, std::nullopt}); }
  void ProcessCompletion(int n) {
    Node::Completion c = node(n).completion_queue.front();
    node(n).completion_queue.pop_front();
    Actions out;
    if (c.receive) {
      core(n).OnReceiveCompleted(c.wr_id, c.byte_len, c.immediate, out);
    } else if (node(n).hold_send_completions) {
      node(n).held_completions.push_back(c.wr_id);
      return;
    } else {
      core(n).OnSendCompleted(c.wr_id, out);
    }
    Apply(n, out);
  }
  void ReleaseHeldCompletions(int n) {
    std::vector<uint64_t> held = std::move(node(n).held_completions);
    node(n).held_completions.clear();
    for (uint64_t wr : held) {
      Actions out;
      core(n).OnSendCompleted(wr, out);
      Apply(n, out);
    }
  }

  // Executes the oldest posted operation of node n, frozen or not.
  bool StepNode(int n) {
    for (size_t i = 0; i < qps_.size(); ++i) {
      if (qps_[i].node != n || qps_[i].outgoing.empty() || qps_[i].peer < 0) continue;
      Op op = qps_[i].outgoing.front();
      qps_[i].outgoing.pop_front();
      Execute(static_cast<int>(i), op);
      return true;
    }
    return false;
  }

  // Processes one completion or executes one posted operation; false when
  // nothing is runnable. Without an interleaving seed, completions are
  // processed as soon as they exist; with one, the choice among everything
  // runnable is random (so completions pile up, as on a busy node).
  bool Step() {
    if (!pending_teardowns.empty()) {
      ProcessTeardowns();
      return true;
    }
    if (interleave) {
      std::vector<int> runnable;  // >= 0: queue pair index; < 0: -(node + 1)
      for (size_t i = 0; i < qps_.size(); ++i) {
        if (!qps_[i].outgoing.empty() && !node(qps_[i].node).frozen && qps_[i].peer >= 0) {
          runnable.push_back(static_cast<int>(i));
        }
      }
      for (size_t n = 0; n < nodes_.size(); ++n) {
        if (!nodes_[n]->completion_queue.empty()) runnable.push_back(-static_cast<int>(n) - 1);
      }
      if (runnable.empty()) return false;
      const int pick = runnable[(*interleave)() % runnable.size()];
      if (pick < 0) {
        ProcessCompletion(-pick - 1);
      } else {
        Op op = qps_[pick].outgoing.front();
        qps_[pick].outgoing.pop_front();
        Execute(pick, op);
      }
      return true;
    }
    for (size_t n = 0; n < nodes_.size(); ++n) {
      if (!nodes_[n]->completion_queue.empty()) {
        ProcessCompletion(static_cast<int>(n));
        return true;
      }
    }
    for (size_t k = 0; k < qps_.size(); ++k) {
      const size_t i = (next_ + k) % qps_.size();
      QueuePair& q = qps_[i];
      if (q.outgoing.empty() || node(q.node).frozen || q.peer < 0) continue;
      next_ = i + 1;
      Op op = q.outgoing.front();
      q.outgoing.pop_front();
      Execute(static_cast<int>(i), op);
      return true;
    }
    return false;
  }
  void Execute(int qi, const Op& op) {
    const int n = qps_[qi].node;
    const int peer_index = qps_[qi].peer;
    QueuePair& peer = qps_[peer_index];
    const int pn = peer.node;
    if (!op.is_write) {
      const PostSendAction& s = op.send;
      EXPECT_TRUE(LocalOk(n, s.address, s.length, s.lkey)) << "send from outside registered memory";
      std::optional<PostReceiveAction> r = TakeReceive(peer);
      if (!r) return;
      EXPECT_LE(s.length, r->length);
      EXPECT_TRUE(LocalOk(pn, r->address, r->length, r->lkey));
      std::memcpy(reinterpret_cast<void*>(r->address), reinterpret_cast<const void*>(s.address), s.length);
      ++sends_executed;
      if (record_wire) {
        const auto* p = reinterpret_cast<const std::byte*>(s.address);
        wire_log.push_back(WireRecord{n, pn, std::vector<std::byte>(p, p + s.length)});
      }
      node(pn).completion_queue.push_back({true, r->wr_id, s.length, std::nullopt});
      Complete(n, s.wr_id);
      return;
    }
    const PostWriteAction& w = op.write;
    EXPECT_TRUE(LocalOk(n, w.local_address, w.length, w.lkey)) << "write from outside registered memory";
    const bool remote_ok = node(pn).registrar.Covers(w.rkey, true, w.remote_address, w.length);
    EXPECT_TRUE(remote_ok) << "write to memory the receiver did not register (rkey " << w.rkey << ")";
    if (remote_ok) {
      std::memcpy(reinterpret_cast<void*>(w.remote_address), reinterpret_cast<const void*>(w.local_address), w.length);
    }
    ++writes_executed;
    if (w.with_immediate) {
      std::optional<PostReceiveAction> r = TakeReceive(peer);
      if (!r) return;
      node(pn).completion_queue.push_back({true, r->wr_id, w.length, w.immediate});
    }
    Complete(n, w.wr_id);
  }
  void Run(size_t max_steps = 10'000'000) {
    for (size_t i = 0; i < max_steps && Step(); ++i) {
    }
  }

  // Delivers raw bytes into node n's connection c as if the peer had sent them.
  void Inject(int n, ConnectionId c, std::span<const std::byte> bytes) {
    QueuePair& q = qp(n, c);
    std::optional<PostReceiveAction> r = TakeReceive(q);
    ASSERT_TRUE(r.has_value());
    ASSERT_LE(bytes.size(), r->length);
    std::memcpy(reinterpret_cast<void*>(r->address), bytes.data(), bytes.size());
    Actions out;
    core(n).OnReceiveCompleted(r->wr_id, static_cast<uint32_t>(bytes.size()), std::nullopt, out);
    Apply(n, out);
  }
  void InjectImmediate(int n, ConnectionId c, uint32_t tag, uint32_t byte_len) {
    QueuePair& q = qp(n, c);
    std::optional<PostReceiveAction> r = TakeReceive(q);
    ASSERT_TRUE(r.has_value());
    Actions out;
    core(n).OnReceiveCompleted(r->wr_id, byte_len, tag, out);
    Apply(n, out);
  }

  // Tears the connection down on both sides (queue pairs destroyed, then the cores told).
  void Kill(int n, ConnectionId c, const absl::Status& why) {
    auto [pn, pc] = PeerOf(n, c);
    for (auto [x, xc] : {std::pair<int, ConnectionId>{n, c}, std::pair<int, ConnectionId>{pn, pc}}) {
      QueuePair& q = qp(x, xc);
      q.outgoing.clear();
      q.receives.clear();
      q.peer = -1;
      node(x).held_completions.clear();
      Actions out;
      core(x).OnConnectionLost(xc, why, out);
      Apply(x, out);
    }
  }

  void TickAll(uint64_t now) {
    for (size_t i = 0; i < nodes_.size(); ++i) {
      Actions out;
      core(static_cast<int>(i)).Tick(now, out);
      Apply(static_cast<int>(i), out);
    }
  }

  bool auto_connect = true;
  // Set: a DisconnectAction tears the connection down (both ends) before the next step.
  bool tear_down_on_disconnect = false;
  struct Teardown {
    int node;
    ConnectionId connection;
    absl::Status reason;
  };
  std::deque<Teardown> pending_teardowns;
  uint64_t rejected_connects = 0;
  // Addresses that lead to a node although it names itself otherwise.
  std::map<std::string, int> aliases;
  // Set: every executed SEND is recorded (what a tap on the fabric would see).
  bool record_wire = false;
  struct WireRecord {
    int from;
    int to;
    std::vector<std::byte> bytes;
  };
  std::vector<WireRecord> wire_log;
  std::optional<std::mt19937_64> interleave;  // set: random interleaving (see Step)
  std::vector<std::pair<int, ConnectAction>> pending_connects;
  uint64_t receive_queue_ran_dry = 0;
  uint64_t sends_executed = 0;
  uint64_t writes_executed = 0;
  std::vector<QueuePair> qps_;

 private:
  std::vector<std::unique_ptr<Node>> nodes_;
  std::map<std::pair<int, ConnectionId>, int> index_;
  size_t next_ = 0;
};

class rdmaEndpointTest : public ::testing::Test {
 protected:
  void SetUp() override {
    a_ = fabric_.AddNode(Config("rdma://10.0.0.1:4000"));
    b_ = fabric_.AddNode(Config("rdma://10.0.0.2:4000"));
  }
  ConnectionId AtoB() { return *fabric_.core(a_).ConnectionTo(fabric_.node(b_).address); }
  // B's end of A's connection to B.
  ConnectionId BfromA() { return fabric_.PeerOf(a_, AtoB()).second; }
  void ExpectIdleAndClean(int n) {
    EndpointCore& c = fabric_.core(n);
    EXPECT_EQ(c.cache().in_use_bytes(), 0u) << "node " << n << " still leases registrations";
    for (ConnectionId id : c.connections()) {
      EXPECT_EQ(c.pending_rendezvous(id), 0u) << "node " << n;
      EXPECT_EQ(c.queued_messages(id), 0u) << "node " << n;
      EXPECT_EQ(c.posted_receives(id), c.config().credits + CreditWindow::kReservedSlots);
    }
  }

  Fabric fabric_;
  int a_ = 0;
  int b_ = 0;
};

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

// ---------------------------------------------------------------- authentication
//
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

TEST(rdmaLastChunkTest, Arithmetic) {
  EXPECT_EQ(LastChunkBytes(10000, 4096), 10000u - 8192);
  EXPECT_EQ(LastChunkBytes(8192, 4096), 4096u);
  EXPECT_EQ(LastChunkBytes(100, 4096), 100u);
}

}  // namespace
}  // namespace tessera::rdma

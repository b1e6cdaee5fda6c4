#pragma once
// EndpointCore driven through a simulated reliable-connected fabric: two or
// more cores, their queue pairs wired together in memory. The fabric checks
// what an adapter would: a SEND or WRITE_WITH_IMM needs a posted receive
// (else the receive queue "ran dry" and the test fails), local buffers must
// lie in the pool or a live registration, remote writes must land inside a
// live registration of the receiver under the rkey given.
//
// Test-only: the fabric, the message helpers and the two-node fixture
// (rdmaEndpointTest) shared by the EndpointCore tests (rdma_protocol_test.cc,
// endpoint_rendezvous_test.cc, endpoint_auth_test.cc). Not thread-safe.
#include <algorithm>
#include <cstring>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/strings/match.h"
#include "rdma/rdma_protocol.h"
#include "rdma/testing/fake_registrar.h"

namespace tessera::rdma::testing {

inline constexpr uint32_t kPoolLkey = 7;

inline ProtocolConfig Config(const std::string& address) {
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
inline Message MakeMessage(uint64_t request_id, const std::vector<size_t>& frame_sizes, uint8_t seed = 1) {
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

inline ::testing::AssertionResult HasPattern(const Message& m, const std::vector<size_t>& frame_sizes, uint8_t seed) {
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

inline bool AnyMentions(const std::vector<absl::Status>& statuses, const std::string& text) {
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

}  // namespace tessera::rdma::testing

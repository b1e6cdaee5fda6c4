// A push queued for a server that died must not reach the next process at
// that server's address (Transport::Forget, called by the Worker for every
// server a newer shard map drops: worker/worker.cc, ForgetServer).
//
// Pushes lend the caller's key and value memory (Buffer::Borrow) until their
// Future completes, and ZmqTransport keeps frames of 1 KiB and more by
// reference; a DEALER to a peer that is not connected keeps what it queued.
// So a push part sent to a server that had just died stayed queued; the
// worker resent the push to the new primary after the failover, the push
// completed, the caller reused its memory, and once a process bound the dead
// server's address libzmq connected and delivered the stale part, reading the
// caller's memory as it was then: an update of garbage keys and values.
//
// The job: a coordinator, two servers (replication 2) and a worker over
// ZeroMQ tcp on loopback in this process. Server 1 is stopped (its port is
// free) once the worker's DEALER to it exists; a push of keys on server 1's
// shards then queues for it, goes to server 0 after the failover, and
// completes; the test overwrites the pushed memory, binds a raw ROUTER at
// server 1's old address and expects nothing from the worker there. The data
// must hold the push exactly once. Every wait is bounded; no assertion is on
// durations.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <functional>
#include <future>
#include <iostream>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>
#include <zmq.hpp>

#include "absl/strings/str_cat.h"
#include "common/keys.h"
#include "common/logging.h"
#include "coordinator/coordinator_node.h"
#include "server/server_node.h"
#include "tests/cluster/raw_client.h"
#include "transport/transport_factory.h"
#include "transport/zmq_transport.h"
#include "worker/worker.h"

namespace tessera {
namespace {

constexpr uint32_t kRowWidth = 4;
constexpr size_t kKeys = 256;  // a 2 KiB keys frame: over send_copy_below_bytes, so borrowed in place
constexpr Key kGarbageKey = 0xDEADBEEFDEADBEEFULL;
constexpr float kGarbageValue = 1e30f;

// Polls `done` every 5 ms until it holds or `limit` passed; returns done().
bool WaitUntil(const std::function<bool()>& done, std::chrono::milliseconds limit) {
  const auto deadline = std::chrono::steady_clock::now() + limit;
  while (!done()) {
    if (std::chrono::steady_clock::now() >= deadline) return done();
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return true;
}

// Passes everything to a ZeroMQ transport, and watches: the JobReady it
// delivered, the link events, the pushes sent to each address, the Forget
// calls. Kill() stops the inner transport (its port is free again) as a
// process's death would; sends after it are dropped.
class WatchedTransport final : public Transport {
 public:
  explicit WatchedTransport(std::unique_ptr<Transport> inner) : inner_(std::move(inner)) {}
  ~WatchedTransport() override { Stop(); }

  absl::Status Start(Handler handler) override {
    handler_ = std::move(handler);
    return inner_->Start([this](Message m) {
      if (m.header.has_job_ready()) {
        std::lock_guard lock(mu_);
        if (!job_ready_) job_ready_ = m.header.job_ready();
      }
      handler_(std::move(m));
    });
  }
  const std::string& address() const override { return inner_->address(); }
  absl::Status Send(const std::string& to, Message message) override {
    {
      std::lock_guard lock(mu_);
      if (killed_) return absl::OkStatus();
      if (message.header.has_push()) ++pushes_to_[to];
    }
    return inner_->Send(to, std::move(message));
  }
  void Stop() override { inner_->Stop(); }
  TransportStats stats() const override { return inner_->stats(); }
  bool LendsTo(const std::string& to, size_t bytes) const override { return inner_->LendsTo(to, bytes); }
  bool SameHostPath(const std::string& peer) const override { return inner_->SameHostPath(peer); }
  PeerBacklog Backlog(const std::string& to) const override { return inner_->Backlog(to); }
  ForgetResult Forget(const std::string& peer, std::chrono::milliseconds max_wait) override {
    const ForgetResult r = inner_->Forget(peer, max_wait);
    std::lock_guard lock(mu_);
    forgets_.push_back(absl::StrCat(peer, " (frames pending ", r.frames_pending, ", still held ", r.frames_still_held,
                                    ", messages dropped ", r.messages_dropped, ")"));
    return r;
  }
  void Flush() override { inner_->Flush(); }
  bool DeliverUntil(const std::function<bool()>& done, std::chrono::milliseconds max_wait) override {
    return inner_->DeliverUntil(done, max_wait);
  }
  void WakeCallerDelivery() override { inner_->WakeCallerDelivery(); }
  void SetLinkHandler(LinkHandler handler) override {
    link_handler_ = std::move(handler);
    inner_->SetLinkHandler([this](const std::string& address, bool up) {
      {
        std::lock_guard lock(mu_);
        links_.emplace_back(address, up);
      }
      if (link_handler_) link_handler_(address, up);
    });
  }
  bool PlacesInto(const std::string& from) const override { return inner_->PlacesInto(from); }
  absl::Status PostDestination(const std::string& from, uint64_t request_id, uint32_t frame_index,
                               Buffer destination) override {
    return inner_->PostDestination(from, request_id, frame_index, std::move(destination));
  }
  bool CancelDestination(const std::string& from, uint64_t request_id, uint32_t frame_index) override {
    return inner_->CancelDestination(from, request_id, frame_index);
  }

  void Kill() {
    {
      std::lock_guard lock(mu_);
      killed_ = true;
    }
    inner_->Stop();
  }
  std::optional<proto::JobReady> job_ready() const {
    std::lock_guard lock(mu_);
    return job_ready_;
  }
  bool SawLinkDown(const std::string& address) const {
    std::lock_guard lock(mu_);
    return std::find(links_.begin(), links_.end(), std::pair{address, false}) != links_.end();
  }
  uint64_t pushes_to(const std::string& address) const {
    std::lock_guard lock(mu_);
    auto it = pushes_to_.find(address);
    return it == pushes_to_.end() ? 0 : it->second;
  }
  std::string DescribeForgets() const {
    std::lock_guard lock(mu_);
    std::string s;
    for (const std::string& f : forgets_) absl::StrAppend(&s, s.empty() ? "" : "; ", f);
    return s.empty() ? "none" : s;
  }

 private:
  std::unique_ptr<Transport> inner_;
  Handler handler_;
  LinkHandler link_handler_;
  mutable std::mutex mu_;
  bool killed_ = false;
  std::optional<proto::JobReady> job_ready_;
  std::vector<std::pair<std::string, bool>> links_;
  std::map<std::string, uint64_t> pushes_to_;
  std::vector<std::string> forgets_;
};

std::unique_ptr<Transport> NewZmqTransport() {
  // No link timeout: as OneServerJob (raw_client.h).
  auto t =
      MakeTransport(ZmqTransport::Options{.bind = "tcp://127.0.0.1:0", .count_backlog = true, .link_timeout_ms = 0});
  EXPECT_TRUE(t.ok()) << t.status();
  return t.ok() ? std::move(*t) : nullptr;
}

// A coordinator and two servers over ZeroMQ tcp on loopback, replication 2
// (each server holds a copy of every shard), a short server lease. Server 1's
// transport is watched, and can be killed.
class TwoServerJob {
 public:
  TwoServerJob() : coordinator_(Options(), NewZmqTransport()) {
    EXPECT_TRUE(coordinator_.Start().ok());
    coordinator_done_ = std::async(std::launch::async, [this] { return coordinator_.Run(); });
    for (int rank = 0; rank < 2; ++rank) {
      CoordinatorSession::Options so;
      so.coordinator = coordinator_.address();
      so.role = proto::SERVER;
      so.rank = rank;
      so.connect_timeout = 20 * kSeconds;
      so.heartbeat_interval = 50 * kMillis;
      std::unique_ptr<Transport> transport = NewZmqTransport();
      if (rank == 1) {
        // Killed: it then hears nothing, and ends after this silence.
        so.lease = 1 * kSeconds;
        so.give_up = 3 * kSeconds;
        auto watched = std::make_unique<WatchedTransport>(std::move(transport));
        server1_transport_ = watched.get();
        transport = std::move(watched);
      }
      servers_.push_back(std::make_unique<ServerNode>(so, std::move(transport)));
      ServerNode* s = servers_.back().get();
      server_done_.push_back(std::async(std::launch::async, [s] { return s->Run(); }));
    }
  }
  const std::string& coordinator_address() const { return coordinator_.address(); }
  WatchedTransport& server1_transport() { return *server1_transport_; }

  // After the worker finished: the coordinator and server 0 end in order;
  // server 1 (killed) ends once it gave up on the coordinator.
  void ExpectEnd() {
    const auto limit = std::chrono::seconds(30);
    ASSERT_EQ(coordinator_done_.wait_for(limit), std::future_status::ready) << "the coordinator did not end";
    const absl::Status c = coordinator_done_.get();
    EXPECT_TRUE(c.ok()) << "coordinator: " << c;
    ASSERT_EQ(server_done_[0].wait_for(limit), std::future_status::ready) << "server 0 did not end";
    const absl::Status s0 = server_done_[0].get();
    EXPECT_TRUE(s0.ok()) << "server 0: " << s0;
    ASSERT_EQ(server_done_[1].wait_for(limit), std::future_status::ready) << "server 1 (killed) did not end";
    (void)server_done_[1].get();  // whatever it says: it lost its transport
  }

 private:
  static CoordinatorOptions Options() {
    CoordinatorOptions co;
    co.servers = 2;
    co.workers = 1;
    co.vshards = 8;
    co.replication = 2;
    co.assemble_timeout = 20 * kSeconds;
    co.server_lease = 500 * kMillis;  // server 1 is lost half a second after it died
    co.heartbeat_interval = 0;        // not told: each node keeps its own
    return co;
  }

  CoordinatorNode coordinator_;
  std::future<absl::Status> coordinator_done_;
  WatchedTransport* server1_transport_ = nullptr;  // owned by servers_[1]
  std::vector<std::unique_ptr<ServerNode>> servers_;
  std::vector<std::future<absl::Status>> server_done_;  // destroyed (waited for) before servers_
};

// Rows of `keys`: key i's row is i + 1, i + 1.25, i + 1.5, i + 1.75 (exact in float).
std::vector<float> RowsOf(const std::vector<Key>& keys) {
  std::vector<float> v;
  for (size_t i = 0; i < keys.size(); ++i) {
    for (uint32_t j = 0; j < kRowWidth; ++j) v.push_back(static_cast<float>(i + 1) + 0.25f * static_cast<float>(j));
  }
  return v;
}

// The first `n` keys from `first` up whose shard's primary is server `rank`.
std::vector<Key> KeysOn(const ShardMapView& map, uint32_t rank, Key first, size_t n) {
  std::vector<Key> keys;
  for (Key k = first; keys.size() < n; ++k) {
    if (map.ServerRankOfKey(kTable, k) == rank) keys.push_back(k);
  }
  return keys;
}

// What a raw ROUTER bound at `address` received within `listen`: one line
// per message, and how many came from `worker_address`.
struct Heard {
  std::vector<std::string> from_worker;
  std::vector<std::string> from_others;
};

Heard ListenAt(const std::string& address, const std::string& worker_address, std::chrono::milliseconds listen) {
  Heard heard;
  zmq::context_t ctx;
  zmq::socket_t router(ctx, zmq::socket_type::router);
  router.set(zmq::sockopt::linger, 0);
  router.set(zmq::sockopt::rcvtimeo, 50);
  try {
    router.bind(address);
  } catch (const zmq::error_t& e) {
    ADD_FAILURE() << "could not bind a ROUTER at server 1's old address " << address << ": " << e.what()
                  << " (the port was taken meanwhile)";
    return heard;
  }
  const auto deadline = std::chrono::steady_clock::now() + listen;
  while (std::chrono::steady_clock::now() < deadline) {
    std::vector<zmq::message_t> parts;
    zmq::message_t part;
    if (!router.recv(part, zmq::recv_flags::none)) continue;  // nothing within rcvtimeo
    parts.push_back(std::move(part));
    while (parts.back().more()) {
      zmq::message_t next;
      if (!router.recv(next, zmq::recv_flags::none)) break;
      parts.push_back(std::move(next));
    }
    // [identity, header, data frames...]
    proto::Envelope header;
    if (parts.size() < 2 || !header.ParseFromArray(parts[1].data(), static_cast<int>(parts[1].size()))) {
      heard.from_others.push_back(absl::StrCat("a message of ", parts.size(), " parts without a header that parses"));
      continue;
    }
    std::string line = absl::StrCat("from ", header.sender_address(), ": ", header.ShortDebugString().substr(0, 200),
                                    "; ", parts.size() - 2, " data frames");
    if (header.has_push() && parts.size() >= 4) {
      const zmq::message_t& keys = parts[2];
      const zmq::message_t& values = parts[3];
      const size_t nkeys = keys.size() / sizeof(Key);
      const size_t nvalues = values.size() / sizeof(float);
      size_t garbage_keys = 0, garbage_values = 0;
      for (size_t i = 0; i < nkeys; ++i) {
        Key k;
        std::memcpy(&k, static_cast<const char*>(keys.data()) + i * sizeof(Key), sizeof(Key));
        garbage_keys += k == kGarbageKey;
      }
      for (size_t i = 0; i < nvalues; ++i) {
        float v;
        std::memcpy(&v, static_cast<const char*>(values.data()) + i * sizeof(float), sizeof(float));
        garbage_values += v == kGarbageValue;
      }
      line = absl::StrCat("from ", header.sender_address(), ": a push (request id ", header.request_id(), ", seq ",
                          header.push().seq(), ", map epoch ", header.epoch(), ", table ", header.push().table_id(),
                          ") of ", nkeys, " keys: ", garbage_keys, " of them are the garbage key 0x",
                          absl::Hex(kGarbageKey), " and ", garbage_values, " of its ", nvalues,
                          " values the garbage value 1e30 the test wrote over the pushed memory after the push "
                          "completed (a phantom update read from the caller's reused memory)");
    }
    (header.sender_address() == worker_address ? heard.from_worker : heard.from_others).push_back(std::move(line));
  }
  return heard;
}

TEST(LostServerQueueTest, APushQueuedForALostServerNeverReachesTheNextProcessAtItsAddress) {
  spdlog::default_logger()->set_level(spdlog::level::warn);
  TwoServerJob job;
  WatchedTransport& server1 = job.server1_transport();

  auto watched = std::make_unique<WatchedTransport>(NewZmqTransport());
  WatchedTransport& worker_transport = *watched;
  WorkerOptions wo;
  wo.coordinator = job.coordinator_address();
  wo.rank = 0;
  wo.connect_timeout = 20 * kSeconds;
  wo.request_timeout = 20 * kSeconds;
  wo.heartbeat_interval = 200 * kMillis;
  auto connected = Worker::Connect(wo, std::move(watched));
  ASSERT_TRUE(connected.ok()) << connected.status();
  std::unique_ptr<Worker> worker = std::move(*connected);
  TableOptions t;
  t.id = kTable;
  t.width = kRowWidth;
  t.kind = proto::SPARSE;
  t.optimizer = proto::ACCUMULATE;
  t.consistency = proto::ASP;
  ASSERT_TRUE(worker->CreateTable(t).ok());

  // The map the job started with (server 1 heard it once it had joined).
  ASSERT_TRUE(WaitUntil([&] { return server1.job_ready().has_value(); }, std::chrono::seconds(10)));
  absl::StatusOr<ShardMapView> map = ShardMapView::Create(server1.job_ready()->shard_map());
  ASSERT_TRUE(map.ok()) << map.status();
  ASSERT_EQ(map->num_servers(), 2u);
  const std::string server1_address = map->server(1).address();
  ASSERT_EQ(server1_address, server1.address());

  // Keys whose primary is server 1 only: each push goes whole to it, as the
  // caller's memory; and server 0 (primary of the others) forwards nothing
  // to server 1, so nothing of server 0 waits for server 1's address.
  const std::vector<Key> warm_keys = KeysOn(*map, 1, 1'000'000, 16);
  const std::vector<float> warm_values = RowsOf(warm_keys);
  std::vector<Key> keys = KeysOn(*map, 1, 1, kKeys);
  std::vector<float> values = RowsOf(keys);
  const std::vector<Key> original_keys = keys;
  const std::vector<float> original_values = values;

  // The worker's DEALER to server 1 exists and carried a push and a pull.
  ASSERT_TRUE(worker->Push(kTable, warm_keys, warm_values).Wait().ok());
  std::vector<float> warm_out(warm_values.size(), -1);
  ASSERT_TRUE(worker->Pull(kTable, warm_keys, warm_out).Wait().ok());
  ASSERT_EQ(warm_out, warm_values);

  // Server 1 dies: its port is free, and the worker's DEALER to it queues.
  server1.Kill();
  ASSERT_TRUE(WaitUntil([&] { return worker_transport.SawLinkDown(server1_address); }, std::chrono::seconds(10)))
      << "the worker's transport never saw its connection to server 1 go down";

  const uint64_t pushes_before = worker_transport.pushes_to(server1_address);
  Future push = worker->Push(kTable, keys, values);
  ASSERT_GT(worker_transport.pushes_to(server1_address), pushes_before)
      << "the push did not go to server 1 (the failover came first?): the test exercised nothing";
  // After the server lease the coordinator drops server 1 from the map; the
  // worker sends the push again to server 0, whose copy of the shards is now
  // the primary.
  const absl::Status pushed = push.Wait();
  ASSERT_TRUE(pushed.ok()) << pushed;
  EXPECT_GE(worker->stats().resends, 1u);

  // The push completed: the caller may reuse its memory.
  std::fill(keys.begin(), keys.end(), kGarbageKey);
  std::fill(values.begin(), values.end(), kGarbageValue);

  // A new process at server 1's address hears nothing from the worker (its
  // DEALER reconnects every 50 ms: it would have delivered a queued message
  // many times over within the listening time).
  const Heard heard = ListenAt(server1_address, worker_transport.address(), std::chrono::milliseconds(2500));
  std::string others;
  for (const std::string& line : heard.from_others) absl::StrAppend(&others, "\n  ", line);
  if (!others.empty()) std::cout << "messages from other nodes at server 1's old address (ignored):" << others << "\n";
  std::string stale;
  for (const std::string& line : heard.from_worker) absl::StrAppend(&stale, "\n  ", line);
  EXPECT_TRUE(heard.from_worker.empty())
      << heard.from_worker.size() << " stale message(s) the worker had queued for the lost server 1 reached the "
      << "process that bound its address " << server1_address << " after the push completed elsewhere:" << stale
      << "\nthe worker's Transport::Forget calls: " << worker_transport.DescribeForgets();

  // The push was applied exactly once (by server 0, now the primary).
  std::vector<float> out(original_values.size(), -1);
  const absl::Status pulled = worker->Pull(kTable, original_keys, out).Wait();
  ASSERT_TRUE(pulled.ok()) << pulled;
  EXPECT_EQ(out, original_values);

  EXPECT_TRUE(worker->Finish(MakeWorkerDone(worker->stats(), 1, 0, "{}")).ok());
  job.ExpectEnd();
}

}  // namespace
}  // namespace tessera

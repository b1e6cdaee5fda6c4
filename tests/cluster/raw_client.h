#pragma once
// Test-only pieces for jobs over real ZeroMQ sockets in one process
// (bad_requests_test, auth_test): a raw client that registers as the job's
// worker through a real CoordinatorSession and then sends hand-made
// requests to the server, and builders for those requests.
#include <gtest/gtest.h>

#include <condition_variable>
#include <deque>
#include <mutex>

#include <future>

#include "coordinator/coordinator_node.h"
#include "node/coordinator_session.h"
#include "server/server_node.h"
#include "transport/transport_factory.h"

namespace tessera {

inline constexpr uint32_t kTable = 1;
inline constexpr uint32_t kWidth = 4;

class RawClient {
 public:
  // `transport`: not started; null = MakeTransport with the default
  // TransportChoice (no job key).
  explicit RawClient(const std::string& coordinator, std::unique_ptr<Transport> transport = nullptr) {
    if (transport == nullptr) {
      auto t = MakeTransport("tcp://127.0.0.1:0");
      EXPECT_TRUE(t.ok()) << t.status();
      transport = std::move(*t);
    }
    transport_ = std::move(transport);
    CoordinatorSession::Options so;
    so.coordinator = coordinator;
    so.role = proto::WORKER;
    so.rank = 0;
    so.connect_timeout = 20 * kSeconds;
    session_ = std::make_unique<CoordinatorSession>(so, transport_.get());
    EXPECT_TRUE(transport_->Start([this](Message m) {
      if (session_->Handle(m)) return;
      std::lock_guard lock(mu_);
      inbox_.push_back(std::move(m));
      cv_.notify_all();
    }).ok());
  }
  ~RawClient() {
    session_.reset();
    transport_->Stop();
  }

  absl::StatusOr<proto::JobReady> Join() {
    auto ready = session_->Join();
    if (ready.ok()) server_ = ready->shard_map().servers(0).address();
    return ready;
  }

  // Sends `m` as a request and returns its reply (or a message with no body
  // after 5 s: the test then fails on the missing reply).
  Message Call(Message m, std::chrono::milliseconds wait = std::chrono::seconds(5)) {
    const uint64_t id = ++next_id_;
    m.header.set_request_id(id);
    m.header.set_sender_id(session_->self().node_id());
    EXPECT_TRUE(transport_->Send(server_, std::move(m)).ok());
    std::unique_lock lock(mu_);
    Message reply;
    cv_.wait_for(lock, wait, [&] {
      for (auto it = inbox_.begin(); it != inbox_.end(); ++it) {
        if (it->header.request_id() == id) {
          reply = std::move(*it);
          inbox_.erase(it);
          return true;
        }
      }
      return false;
    });
    return reply;
  }

  CoordinatorSession& session() { return *session_; }
  // The job's server, from the JobReady (after Join()).
  const std::string& server() const { return server_; }

 private:
  std::unique_ptr<Transport> transport_;
  std::unique_ptr<CoordinatorSession> session_;
  std::string server_;
  uint64_t next_id_ = 0;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Message> inbox_;
};

inline Message Push(uint32_t table, uint64_t num_keys, std::vector<Buffer> frames, uint32_t value_parts = 0) {
  Message m;
  m.header.mutable_push()->set_table_id(table);
  m.header.mutable_push()->set_num_keys(num_keys);
  m.header.mutable_push()->set_value_parts(value_parts);
  m.frames = std::move(frames);
  return m;
}

inline Message Pull(uint32_t table, uint64_t num_keys, std::vector<Buffer> frames) {
  Message m;
  m.header.mutable_pull()->set_table_id(table);
  m.header.mutable_pull()->set_num_keys(num_keys);
  m.frames = std::move(frames);
  return m;
}

// A sparse ACCUMULATE table `table_id` (7 unless given: the tests' table
// for bad table configs, apart from their data table kTable).
inline Message Create(uint32_t width, const std::string& compression = "", const std::string& pull_compression = "",
                      uint32_t table_id = 7) {
  Message m;
  auto* c = m.header.mutable_create_table()->mutable_config();
  c->set_table_id(table_id);
  c->set_width(width);
  c->set_kind(proto::SPARSE);
  c->set_optimizer(proto::ACCUMULATE);
  c->set_compression(compression);
  c->set_pull_compression(pull_compression);
  return m;
}

template <typename T>
Buffer Of(const std::vector<T>& v) {
  return Buffer::CopyOf(v.data(), v.size() * sizeof(T));
}

// A job of one coordinator, one server and one worker place, over ZeroMQ
// tcp on loopback (MakeTransport with `choice`: e.g. its job_keys), the
// coordinator and the server running on threads of their own.
class OneServerJob {
 public:
  explicit OneServerJob(ServerCoreOptions server_options = {}, const TransportChoice& choice = {})
      : coordinator_(Options(), NewTransport(choice)) {
    EXPECT_TRUE(coordinator_.Start().ok());
    coordinator_done_ = std::async(std::launch::async, [this] { return coordinator_.Run(); });
    CoordinatorSession::Options so;
    so.coordinator = coordinator_.address();
    so.role = proto::SERVER;
    so.rank = 0;
    server_ = std::make_unique<ServerNode>(so, NewTransport(choice), std::move(server_options));
    server_done_ = std::async(std::launch::async, [this] { return server_->Run(); });
  }
  const std::string& coordinator_address() const { return coordinator_.address(); }
  ServerNode& server() { return *server_; }
  // After the worker reported done: both end in order.
  void ExpectOrderlyEnd() {
    EXPECT_TRUE(coordinator_done_.get().ok());
    EXPECT_TRUE(server_done_.get().ok());
  }

 private:
  static CoordinatorOptions Options() {
    CoordinatorOptions co;
    co.servers = 1;
    co.workers = 1;
    co.vshards = 8;
    co.assemble_timeout = 20 * kSeconds;
    co.heartbeat_interval = 0;  // not told: the raw client's session keeps its own
    return co;
  }
  static std::unique_ptr<Transport> NewTransport(const TransportChoice& choice) {
    // No link timeout: a test's peer may read nothing for seconds on purpose
    // (Linux counts TCP_USER_TIMEOUT against a zero window too).
    auto t = MakeTransport(
        ZmqTransport::Options{.bind = "tcp://127.0.0.1:0", .count_backlog = true, .link_timeout_ms = 0}, choice);
    EXPECT_TRUE(t.ok()) << t.status();
    return t.ok() ? std::move(*t) : nullptr;
  }

  CoordinatorNode coordinator_;
  std::future<absl::Status> coordinator_done_;
  std::unique_ptr<ServerNode> server_;
  std::future<absl::Status> server_done_;
};

}  // namespace tessera

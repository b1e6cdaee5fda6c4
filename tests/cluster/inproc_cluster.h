#pragma once
// InProcCluster: a whole job in one process (test-only): the real
// coordinator, server and worker shells and cores, wired through the
// in-process transport. Each node runs on its own threads, like a process.
#include <gtest/gtest.h>

#include <atomic>
#include <future>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "coordinator/coordinator_node.h"
#include "server/server_node.h"
#include "transport/inproc_transport.h"
#include "worker/worker.h"

namespace tessera {

struct ClusterOptions {
  uint32_t servers = 2;
  uint32_t workers = 2;
  uint32_t started_servers = 2;  // fewer than `servers` simulates a missing one
  uint32_t vshards = 32;
  Nanos assemble_timeout = 10 * kSeconds;
  Nanos lease = 5 * kSeconds;
  WorkerLossPolicy on_worker_loss = WorkerLossPolicy::kStopJob;
  Nanos hold_timeout = 120 * kSeconds;  // workers' wait for slower workers
  Nanos rejoin_timeout = 60 * kSeconds;  // with WorkerLossPolicy::kWait
  ServerCoreOptions server;  // e.g. the test-only testing.answer_early switch
  uint32_t replication = 1;  // copies of each shard
  uint64_t part_bytes = 0;   // the workers' WorkerOptions::part_bytes
};

class InProcCluster {
 public:
  explicit InProcCluster(ClusterOptions o) : options_(o) {
    // Create the default logger on this thread before the nodes log from
    // theirs (binaries do this in main through InitLogging).
    spdlog::default_logger()->set_level(spdlog::level::warn);
    CoordinatorOptions co;
    co.servers = o.servers;
    co.workers = o.workers;
    co.vshards = o.vshards;
    co.replication = o.replication;
    co.assemble_timeout = o.assemble_timeout;
    co.lease = o.lease;
    co.server_lease = o.lease;   // servers heartbeat every lease / 5 here
    co.heartbeat_interval = 0;   // not told: each node keeps its own (tests count the heartbeats)
    co.on_worker_loss = o.on_worker_loss;
    co.rejoin_timeout = o.rejoin_timeout;
    coordinator_ = std::make_unique<CoordinatorNode>(co, net_.Create("coordinator"));
    EXPECT_TRUE(coordinator_->Start().ok());
    coordinator_result_ = std::async(std::launch::async, [this] { return coordinator_->Run(); });
    for (uint32_t i = 0; i < o.started_servers; ++i) {
      CoordinatorSession::Options so;
      so.coordinator = coordinator_->address();
      so.rank = static_cast<int>(i);
      so.connect_timeout = o.assemble_timeout + 5 * kSeconds;
      so.heartbeat_interval = o.lease / 5;
      servers_.push_back(std::make_unique<ServerNode>(so, net_.Create("server-" + std::to_string(i)), o.server));
      ServerNode* s = servers_.back().get();
      server_results_.push_back(std::async(std::launch::async, [s] { return s->Run(); }));
    }
  }

  // Connects all workers concurrently (Connect blocks until the job assembles).
  std::vector<absl::StatusOr<std::unique_ptr<Worker>>> ConnectWorkers() {
    std::vector<std::future<absl::StatusOr<std::unique_ptr<Worker>>>> pending;
    for (uint32_t i = 0; i < options_.workers; ++i) {
      pending.push_back(std::async(std::launch::async, [this, i] { return ConnectWorker(static_cast<int>(i)); }));
    }
    std::vector<absl::StatusOr<std::unique_ptr<Worker>>> out;
    for (auto& p : pending) out.push_back(p.get());
    return out;
  }

  // Connects one worker process (a replacement, once the job runs).
  absl::StatusOr<std::unique_ptr<Worker>> ConnectWorker(int rank) {
    WorkerOptions wo;
    wo.coordinator = coordinator_->address();
    wo.rank = rank;
    wo.connect_timeout = options_.assemble_timeout + 5 * kSeconds;
    wo.request_timeout = 20 * kSeconds;
    wo.heartbeat_interval = options_.lease / 5;
    wo.hold_timeout = options_.hold_timeout;
    wo.part_bytes = options_.part_bytes;
    return Worker::Connect(wo, net_.Create(absl::StrCat("worker-", rank, "-", next_process_++)));
  }

  absl::Status CoordinatorResult() { return coordinator_result_.get(); }
  std::vector<absl::Status> ServerResults() {
    std::vector<absl::Status> r;
    for (auto& f : server_results_) r.push_back(f.get());
    return r;
  }
  std::string Summary() const { return coordinator_->SummaryJson(); }

 private:
  ClusterOptions options_;
  InProcNetwork net_;
  std::atomic<int> next_process_{0};
  std::unique_ptr<CoordinatorNode> coordinator_;
  std::future<absl::Status> coordinator_result_;
  std::vector<std::unique_ptr<ServerNode>> servers_;
  std::vector<std::future<absl::Status>> server_results_;
};

// Runs fn(worker) on every worker concurrently and returns the statuses.
template <typename Fn>
std::vector<absl::Status> OnEachWorker(std::vector<std::unique_ptr<Worker>>& workers, Fn fn) {
  std::vector<std::future<absl::Status>> f;
  for (auto& w : workers) f.push_back(std::async(std::launch::async, [&fn, &w] { return fn(*w); }));
  std::vector<absl::Status> r;
  for (auto& x : f) r.push_back(x.get());
  return r;
}

// The workers that connected; a failure is reported to GoogleTest.
inline std::vector<std::unique_ptr<Worker>> Unwrap(std::vector<absl::StatusOr<std::unique_ptr<Worker>>> in) {
  std::vector<std::unique_ptr<Worker>> out;
  for (auto& w : in) {
    if (!w.ok()) ADD_FAILURE() << w.status();
    if (w.ok()) out.push_back(std::move(*w));
  }
  return out;
}

}  // namespace tessera

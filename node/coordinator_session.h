#pragma once
// CoordinatorSession: a server's or worker's side of the coordinator
// protocol (register, wait for the job to assemble, heartbeats, barriers,
// report done, wait for shutdown). A shell around the pure SessionCore
// (node/session_core.h), which holds the protocol: the session owns a
// heartbeat thread (it ticks the core and sends what it returns),
// resolves an etcd:// coordinator, waits with condition variables, logs, and
// sends through the node's transport; the node's receive handler passes
// every message to Handle() first.
//
// Promises:
// - Join() returns the JobReady (shard map and nodes) or an error that says
//   why: the coordinator's own reason (e.g. "job did not assemble within
//   30 s: missing server 1"), or "coordinator at ADDR did not answer within
//   N s" when nothing came back.
// - After Join(), the session heartbeats every heartbeat_interval (or the
//   job's interval from the RegisterReply, when that is shorter). If the
//   coordinator is silent for `lease`, the session logs a warning that names
//   it and the give-up time, again every `lease` while the silence lasts,
//   and goes on heartbeating; a coordinator that answers again is logged
//   too. Only after `give_up` of silence does the job end for this node,
//   with Unavailable("lost the coordinator at ADDR ...").
// - Rejoin() registers again for the node's rank after the coordinator
//   declared it lost (SessionCore::StartRejoin) and returns the new
//   JobReady, or why not.
// - Heartbeats carry the node's shard map epoch (set_map_epoch; at first
//   the JobReady's): a coordinator with a newer map answers with a
//   ShardMapUpdate, so a node that missed one (a lost message) catches up.
// - The coordinator is a fixed address, or "etcd://HOST:PORT[,...]/JOB": the
//   session then reads the leader's address from etcd (/tessera/JOB/leader)
//   before it registers, and again whenever the coordinator has been silent
//   for two heartbeats; when the address changed (a standby took over) it
//   goes on with the new leader, which gets a whole `lease` to answer.
// - ReportDone() sends its report again until the coordinator answers.
// - The end of the job (Shutdown from the coordinator, or a lost
//   coordinator) is reported exactly once, to WaitForEnd() and to the
//   on_end callback. Barrier() and ReportDone() return early with the
//   job's end status if the job ends while they wait.
// Thread safety: all methods are thread-safe.
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/clock.h"
#include "common/message.h"
#include "etcd/etcd_client.h"
#include "node/session_core.h"
#include "transport/transport.h"

namespace tessera {

class CoordinatorSession {
 public:
  struct Options {
    std::string coordinator;                  // the coordinator's address, or etcd://HOST:PORT/JOB
    proto::Role role = proto::WORKER;         // SERVER or WORKER
    int rank = -1;                            // requested rank, -1 = any
    Nanos connect_timeout = 30 * kSeconds;    // registration + assembly
    Nanos heartbeat_interval = kDefaultHeartbeatInterval;  // how often to heartbeat
    Nanos lease = kDefaultLease;  // coordinator silence that is logged as such
    Nanos give_up = 60 * kSeconds;            // coordinator silence that ends the job for this node
    Nanos register_retry = 500 * kMillis;     // resend registration this often
  };

  // `transport` must be started, outlive the session, and route messages to Handle().
  CoordinatorSession(Options options, Transport* transport);
  ~CoordinatorSession();
  CoordinatorSession(const CoordinatorSession&) = delete;
  CoordinatorSession& operator=(const CoordinatorSession&) = delete;

  // Consumes the message if it belongs to this session; returns whether it did.
  bool Handle(const Message& message);

  absl::StatusOr<proto::JobReady> Join();
  // Registers again for this node's rank (see above); self() is the new node
  // once it returns a JobReady.
  absl::StatusOr<proto::JobReady> Rejoin();
  // The end of the job for this node, once it has ended (nonblocking).
  std::optional<absl::Status> ended();
  const proto::NodeInfo& self() const { return self_; }
  // A worker that joined a job already running (cluster.max_workers): it
  // starts at the job's clock (WorkerCore::JoinClock).
  bool joined_running_job() const { return joined_running_job_; }

  absl::Status Barrier(const std::string& name, Nanos timeout);
  // Sends the coordinator a notice (no reply expected), e.g. ShardsInSync.
  void Notify(proto::Envelope notice) { Send(std::move(notice)); }
  // The epoch of the shard map the node acts on (heartbeats carry it).
  void set_map_epoch(uint64_t epoch);
  // Called (on the heartbeat thread, without the session's lock) to add the
  // node's figures to each heartbeat. Set before Join().
  void set_heartbeat_filler(std::function<void(proto::Heartbeat*)> fill) { fill_heartbeat_ = std::move(fill); }
  absl::Status ReportDone(const proto::WorkerDone& report, Nanos timeout);

  // Blocks until the job ends; OK for an orderly shutdown.
  absl::Status WaitForEnd();
  // Called once, from some thread, when the job ends. Set before Join().
  void set_on_end(std::function<void(const absl::Status&)> on_end) { on_end_ = std::move(on_end); }

  // Request ids with this bit belong to the session.
  static constexpr uint64_t kSessionRequestBit = SessionCore::kSessionRequestBit;

 private:
  static SessionCoreOptions CoreOptions(const Options& options);
  // Sends a notice, stamped with this node's id.
  void Send(proto::Envelope header);
  // Sends an envelope as the core made it.
  void Transmit(proto::Envelope header);
  std::string coordinator() const;
  // With an etcd:// coordinator: reads the leader's address (at most every
  // 250 ms unless `force`); switches to it if it changed. Call without mu_.
  // Returns why it could not, or OK.
  absl::Status Resolve(bool force);
  // Ticks the core when it has something due, and sends what it returns.
  void HeartbeatLoop();
  // Starts the heartbeat thread unless it runs (or ran).
  void StartThreadLocked();
  // Reports the end of the job once (to waiters and on_end_), after the core ended it.
  void ReportEndLocked(std::unique_lock<std::mutex>& lock);
  // Waits for the outcome of a join the core has started (Join, Rejoin).
  absl::StatusOr<proto::JobReady> AwaitJoinLocked(std::unique_lock<std::mutex>& lock, Nanos deadline);
  // Logs the coordinator's silence as it starts, goes on and ends (heartbeat thread, mu_ held).
  void NoteSilenceLocked(Nanos now);

  const Options options_;
  Transport* const transport_;
  std::unique_ptr<EtcdClient> etcd_;  // set for an etcd:// coordinator
  std::string etcd_job_, leader_key_;
  mutable std::mutex address_mu_;
  std::string coordinator_;           // guarded by address_mu_
  Nanos last_resolve_ = 0;            // guarded by address_mu_
  std::function<void(const absl::Status&)> on_end_;
  std::function<void(proto::Heartbeat*)> fill_heartbeat_;
  proto::NodeInfo self_;
  bool joined_running_job_ = false;

  std::mutex mu_;
  std::condition_variable cv_;
  SessionCore core_;          // guarded by mu_
  bool end_reported_ = false;  // guarded by mu_
  std::optional<Nanos> silent_since_;  // guarded by mu_: the silence last logged
  Nanos next_silence_line_ = 0;        // guarded by mu_
  bool stopping_ = false;      // guarded by mu_
  std::thread heartbeat_thread_;
};

}  // namespace tessera

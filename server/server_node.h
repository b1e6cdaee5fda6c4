#pragma once
// ServerNode: the server's I/O shell. It joins the job through the
// coordinator, installs the shard map into a ServerCore, then feeds every
// request to the core on the transport's delivery thread and sends the
// replies. Used by the tessera-server binary and by in-process cluster tests.
#include <atomic>
#include <map>
#include <memory>
#include <string>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <optional>

#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "node/coordinator_session.h"
#include "server/checkpoint.h"
#include "server/server_core.h"
#include "server/server_node_core.h"
#include "transport/transport.h"

namespace tessera {

// Checkpoints of the shards a server is primary of (server/checkpoint.h).
struct CheckpointOptions {
  std::string dir;           // where checkpoints go (and come from for a lost shard); "" = none
  Nanos every = 0;           // write one this often (0 = only on RequestCheckpoint)
  uint32_t keep = 3;         // checkpoints kept per server rank
  std::string restore_from;  // at start: load every held shard's newest checkpoint from this directory
};

class ServerNode {
 public:
  // `transport` is not started yet; the node starts and stops it.
  ServerNode(CoordinatorSession::Options session, std::unique_ptr<Transport> transport,
             ServerCoreOptions core_options = {});
  ~ServerNode();
  ServerNode(const ServerNode&) = delete;
  ServerNode& operator=(const ServerNode&) = delete;

  // Joins the job and serves until the coordinator ends it. Returns OK for an
  // orderly end, else the reason (could not join, job failed, coordinator
  // silent for the session's give_up, could not rejoin).
  //
  // A server the coordinator declared lost while it was only cut off or
  // paused learns so from the next map (it is deposed: it serves nothing,
  // and the epoch fences what it still had) and rejoins: it drops its state,
  // registers again for its rank, and serves as a new, empty node that the
  // coordinator gives copies to (state transfer). Until then the deposed
  // core answers requests (Aborted: the shards are not its own). A rejoin the coordinator
  // refuses (the rank was taken over by another process) ends Run with
  // that reason; a drained server is told to stop and ends OK.
  absl::Status Run();

  // Core statistics; valid after Run() returned.
  ServerStats stats() const;
  // Checkpoints: set before Run().
  void set_checkpoints(CheckpointOptions options) { checkpoints_ = std::move(options); }
  // Asks for a checkpoint now (any thread, e.g. a signal handler's flag).
  void RequestCheckpoint() { checkpoint_requested_.store(true); }

  // Audit mode: the core's AuditDump() (any thread; empty before serving).
  std::string AuditDump() const;
  // This process's node id and rank once it joined (0 and the requested rank before).
  uint32_t node_id() const { return session_.self().node_id(); }
  uint32_t rank() const { return session_.self().rank(); }
  // The server's metrics in the Prometheus text format (any thread, any time).
  std::string MetricsText() const;

 private:
  // One line on forwards to backups (sent, sent again, gap notices) and each
  // backup's learned timer; empty when this server forwarded nothing.
  std::string DescribeForwards(const ServerStats& st) const;
  void OnMessage(Message m);
  // Sends a step's messages and tells the coordinator its notices.
  void Send(ServerNodeCore::Output& out);
  // The core (null before serving); mu_ held.
  ServerCore* core() const { return node_.core(); }
  // A link event from the transport: a backup's connection made again
  // resends its unacknowledged forwards (ServerCore::OnLinkRestored).
  void OnLink(const std::string& address, bool up);
  void OnMapUpdate(const proto::ShardMapUpdate& update);
  // Makes a core from a JobReady and serves with it: requests and the map
  // that came while there was none are applied first. `first`: the job's
  // start (checkpoints to restore from).
  absl::Status Serve(const proto::JobReady& ready, bool first);
  // After deposition: registers again and serves anew (see Run).
  absl::Status Rejoin();
  // Writes a checkpoint of the shards this server is primary of.
  void WriteCheckpointNow();
  // Logs, once per table, a table whose disk tier's store takes its whole
  // memory budget (server/load_summary.h, StoreTakesBudget). Tick thread.
  void WarnOfStoresThatTakeTheBudget();
  // Restores `vshards` into `core` from the newest checkpoints in `dir`
  // that hold them (mu_ held by the caller). Returns a line for the log.
  static std::string RestoreFromCheckpoints(ServerCore& core, const std::string& dir,
                                            const std::vector<uint32_t>& vshards, bool with_windows,
                                            const std::map<uint32_t, uint64_t>& last_applied);
  void TickLoop();

  std::unique_ptr<Transport> transport_;
  CoordinatorSession session_;
  const ServerCoreOptions core_options_;
  BufferPool pool_;
  mutable std::mutex mu_;  // guards core_ and every call into it (delivery and tick threads)
  std::condition_variable tick_cv_;
  Nanos tick_at_ = 0;  // guarded by mu_: when the tick thread wakes next
  bool stopping_ = false;  // guarded by mu_
  bool rejoin_wanted_ = false;  // guarded by mu_: deposed by a map while the job runs
  bool session_ended_ = false;  // guarded by mu_
  std::condition_variable state_cv_;  // rejoin_wanted_ or session_ended_ changed
  mutable ServerNodeCore node_;  // guarded by mu_: the start sequence, map updates, the ServerCore
  CheckpointOptions checkpoints_;
  std::atomic<bool> checkpoint_requested_{false};
  Nanos next_checkpoint_ = 0;  // tick thread only
  Nanos next_budget_check_ = 0;                // tick thread only
  absl::flat_hash_set<uint32_t> budget_warned_;  // tick thread only: tables warned of
};

}  // namespace tessera

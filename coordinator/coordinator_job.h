#pragma once
// CoordinatorJob: the job record every part of the coordinator core shares,
// and the few operations on it that every part uses. Pure: no sockets,
// threads or clocks; `now` comes in from the caller.
//
// Owns: the options, the phase and failure reason, the registered nodes
// (by node id and by address) and the next node id, the shard map, the
// backup copies still syncing, the restores not yet known delivered, the
// applied counts the primaries reported, the smoothed load, the event
// lines and the counters.
// Offers (to the parts above it): replies and broadcasts in node-id order,
// publishing a new map (PublishMap), failing the job (Fail), noting
// recruited backups as syncing (NoteRecruits), the JobReady message, new
// node records, and the names used in event lines.
// Called by: nobody directly. The parts derive from it, each adding one
// concern: CoordinatorProgress (coordinator_progress.h: barriers, workers
// done or gone, job end) -> CoordinatorMoves (coordinator_moves.h: moves,
// rebalancing, drains) -> CoordinatorMembership (coordinator_membership.h:
// registration, takeovers, joins, server loss) -> CoordinatorCore
// (coordinator_core.h: the router, Step and Tick, saved state). The read-only
// accessors below are what the shells, tests and the simulator read
// through CoordinatorCore.
#include <algorithm>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "common/clock.h"
#include "common/keys.h"
#include "common/message.h"
#include "coordinator/coordinator_options.h"
#include "coordinator/load_tracker.h"

namespace tessera {

class CoordinatorJob {
 public:
  enum class Phase { kAssembling, kRunning, kDone, kFailed };

  CoordinatorJob(const CoordinatorJob&) = delete;
  CoordinatorJob& operator=(const CoordinatorJob&) = delete;

  Phase phase() const { return phase_; }
  bool finished() const { return phase_ == Phase::kDone || phase_ == Phase::kFailed; }
  const std::string& failure_reason() const { return failure_reason_; }

  struct Node {
    proto::NodeInfo info;
    Nanos last_seen = 0;
    bool done = false;
    bool lost = false;         // lease expired (kContinue policy; servers that failed over)
    Nanos lost_at = 0;         // when it was declared lost
    std::string lost_reason;
    bool away = false;         // lease expired, place kept for a replacement (kWait policy)
    Nanos away_since = 0;
    std::string away_reason;
    // Barriers this rank passed, with the incarnation that passed them.
    absl::flat_hash_map<std::string, uint32_t> passed_barriers;
    // The request id of the last request of each barrier released to it:
    // the same request again (its release was lost) gets the release again.
    absl::flat_hash_map<std::string, std::pair<uint32_t, uint64_t>> released_requests;  // (incarnation, id)
    // A worker that joined the running job: barriers the job had passed
    // then, each released to it at once the first time it asks.
    absl::flat_hash_set<std::string> catch_up_barriers;
    bool joined_running_job = false;  // registered while the job ran (max_workers)
    proto::WorkerDone report;  // workers, once done
  };
  // Registered nodes by node id.
  const absl::flat_hash_map<uint32_t, Node>& nodes() const { return nodes_; }
  const proto::ShardMap& shard_map() const { return shard_map_; }

  // Shards moving now (0 or 1).
  size_t moves_in_progress() const { return static_cast<size_t>(shard_map_.moving_vshards_size()); }

  // Membership lines since the last call ("worker 1 (...) was lost: ..."), for logs.
  std::vector<std::string> TakeEvents() { return std::exchange(events_, {}); }

  // Counts since this core started (not saved with the state), for metrics.
  struct Stats {
    uint64_t messages = 0;           // messages stepped, of every kind
    uint64_t heartbeats = 0;
    uint64_t servers_lost = 0;       // declared lost (failed over, or the job failed)
    uint64_t workers_lost = 0;       // declared lost, under any on_worker_loss
    uint64_t rejoins = 0;            // processes that took a lost node's place
    uint64_t maps_published = 0;     // shard map updates broadcast (each a new epoch)
    uint64_t barriers_released = 0;
    uint64_t moves_started = 0;      // StartMove (and the rebalancer) began a move
    uint64_t moves_finished = 0;     // the destination became primary
    uint64_t moves_cancelled = 0;    // timed out, or ended by a lost server
    uint64_t servers_added = 0;      // servers that joined the running job (max_servers)
    uint64_t servers_drained = 0;    // drained and removed
    uint64_t workers_added = 0;      // workers that joined the running job (max_workers)
  };
  const Stats& stats() const { return stats_; }
  // The servers' and shards' load, smoothed, from server heartbeats.
  const LoadTracker& load() const { return load_; }
  size_t syncing_copies() const { return syncing_.size(); }

  // Human name of a node: "server 1", "worker 0".
  static std::string NodeName(proto::Role role, uint32_t rank);

 protected:
  explicit CoordinatorJob(CoordinatorOptions options);
  ~CoordinatorJob() = default;

  // "server", "worker", ... for event lines and errors.
  static const char* RoleName(proto::Role role);
  // A duration for event lines: "1.5 s".
  static std::string Seconds(Nanos n);
  static void SetError(Message& reply, absl::StatusCode code, const std::string& message);

  void Fail(const std::string& reason, std::vector<Outgoing>& out);
  void PublishMap(const std::string& reason, std::vector<Outgoing>& out,
                  const std::vector<proto::ShardRestore>& restores = {});
  void Broadcast(const proto::Envelope& header, std::vector<Outgoing>& out) const;
  Message Reply(const Message& request) const;
  // JobReady with the shard map and every node (sorted by node id).
  proto::Envelope JobReadyEnvelope() const;
  std::vector<std::string> MissingNodes() const;
  // A node of `role` and `rank` at `address`, heard from `now`, with the next node id.
  Node NewNode(proto::Role role, uint32_t rank, const std::string& address, Nanos now);
  uint32_t MaxServers() const { return std::max(options_.servers, options_.max_servers); }
  uint32_t MaxWorkers() const { return std::max(options_.workers, options_.max_workers); }
  // Marks the backups `next` has that `previous` did not as syncing.
  void NoteRecruits(const proto::ShardMap& previous, const proto::ShardMap& next);

  const CoordinatorOptions options_;
  Phase phase_ = Phase::kAssembling;
  std::string failure_reason_;
  uint32_t next_node_id_ = 1;  // 0 is "unregistered"; the coordinator is not in nodes_
  // Invariants: ranks are unique per role and < the role's count; nodes_ holds
  // at most servers + workers entries.
  absl::flat_hash_map<uint32_t, Node> nodes_;
  absl::flat_hash_map<std::string, uint32_t> node_by_address_;
  proto::ShardMap shard_map_;
  std::vector<std::string> events_;
  Stats stats_;
  LoadTracker load_;
  // vshard -> pushes applied to it, as its primary last reported (heartbeats).
  absl::flat_hash_map<uint32_t, uint64_t> last_applied_;
  // (vshard, backup rank) recruited but not yet in sync (its primary has not
  // reported the state transfer acknowledged): never promoted.
  absl::flat_hash_set<std::pair<uint32_t, uint32_t>> syncing_;
  // Restores not yet known to have reached their new primary (by its
  // heartbeats' map epoch): vshard -> (the restore, the map epoch that asked
  // for it). A heartbeat catch-up map to that primary carries them again.
  absl::flat_hash_map<uint32_t, std::pair<proto::ShardRestore, uint64_t>> pending_restores_;
};

}  // namespace tessera

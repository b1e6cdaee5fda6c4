#pragma once
// CoordinatorCore: membership, the shard map, heartbeats, barriers and job
// end, as a pure state machine. Step(message, now) and Tick(now) return the
// messages to send; the tessera-coordinator binary is a thin shell.
//
// Lifecycle: kAssembling (nodes register) -> kRunning (everyone registered;
// JobReady with the shard map, weighed by server_weights, sent to every node) -> kDone (every worker sent
// WorkerDone; Shutdown{ok} sent to all) or kFailed (Shutdown{ok=false,
// reason} sent to every registered node). kDone and kFailed are final.
//
// Promises:
// - A job that has not assembled by assemble_timeout fails with a reason that
//   names every missing node ("missing server 1, worker 0").
// - A registered node that sends nothing for `lease` (servers, when the
//   map replicates: server_lease) is lost. A lost server fails the job with a reason that
//   names it and its address, unless replication > 1 and every shard it held
//   has a copy left: then the coordinator publishes the next map (epoch + 1,
//   each of its shards taken over by the first backup; WithoutServer in
//   common/keys.h) to every node in a ShardMapUpdate, and the job goes on.
//   A shard left with no copy fails the job, naming the shards, or, with
//   restore_lost_shards, goes to the least-loaded live server, which the map
//   update tells (ShardMapUpdate.restores, with the applied count its last
//   primary reported in heartbeats) to restore it from the last checkpoint.
//   A recruited backup is promoted only once its primary reported its state
//   transfer acknowledged (ShardsInSync); until then a shard whose other
//   copies are lost counts as lost. The same map
//   re-makes lost copies on the least-loaded live servers, per unit of
//   server weight (WithBackupsFilled;
//   their primaries send them the state). A process that registers for a
//   dead server rank while the job runs takes the rank over as a new node
//   (incarnation + 1), empty, and is recruited where copies are missing; so
//   does a lost server that registers again from its old address (it was
//   only cut off or paused, and learned from the map that it was lost). A
//   drained server that registers again is told to stop. A lost worker
//   does too under WorkerLossPolicy::kStopJob; under kContinue it is
//   announced to the servers (WorkersLeft) so nobody waits for its clock, and
//   the job ends when every other worker is done. (Workers that reported
//   done are no longer watched; they are announced as left too.) Under kWait
//   the job keeps the lost worker's place: nobody is told it left, so
//   synchronous peers wait for its clock (their own hold timeouts name it)
//   and barriers wait for it. A process that registers for the same rank
//   (or for any rank, with rank -1) within rejoin_timeout takes the place
//   over: same node id, the next incarnation, the new address; messages from
//   the old address are refused from then on. A barrier that the rank's
//   earlier incarnation already passed is released to the replacement at
//   once. No replacement in time fails the job, naming the worker.
// - Moves (live migration of a virtual shard between live servers; the
//   rebalancer's, or StartMove's): the map of the next epoch lists the
//   shard as moving to its destination, added as its last backup if it
//   holds no copy (WithMoveStarted in common/keys.h); the primary sends
//   that copy the shard's state and forwards every push from then on, and
//   holds its pull replies of the shard until the destination has what
//   they read. Once the primary reports the destination has everything it
//   had sent it when the move began (Heartbeat.moves_in_sync, under the
//   current map) the next map makes the destination primary
//   (WithMoveFinished): the old primary stays a backup if the shard would
//   otherwise lack copies, else lets it go. Every push acknowledged before
//   the switch was acknowledged by the destination too; pushes still
//   waiting at the old primary are answered Aborted there and sent again
//   by their workers to the new primary, which applies each once. A move
//   not finished within move_timeout is cancelled (WithMoveCancelled); a
//   lost source or destination ends it (WithoutServer). One move at a time.
// - Rebalancing (options.rebalance.threshold > 0; coordinator/rebalancer.h):
//   every rebalance.interval, once every live server has reported its
//   load and no move is under way, PlanMove on the smoothed shard loads
//   picks at most one shard to move, and StartMove moves it.
// - Draining (Drain, or a DrainRequest from anyone, e.g. tessera-admin
//   drain): the server is listed as draining in the next map
//   (WithServerDraining: refused if the servers left could not hold every
//   shard's copies); it gets no new copy, rebalancing pauses, and its
//   copies move away one at a time (PlanDrain in coordinator/rebalancer.h:
//   primaries by moves as above, backups by moves from the backup, which
//   leave the primary where it is). Once it holds nothing it is removed:
//   the next map lists it dead (no failover: it held nothing), its node
//   counts as done, and it is told to stop (Shutdown ok). A DrainRequest
//   is answered with a DrainReply (copies left, removed or not, and what is
//   going on); asking again only reports. A drain survives a coordinator
//   restart (the map lists it).
// - Joining workers (options.max_workers above workers): a worker that
//   registers for the next rank (or any) while the job runs joins as a new
//   node (RegisterReply.joined_running_job) and gets the job; from then on
//   the job waits for it (barriers, the end). It asks the servers to track
//   it (ClockQuery join: each starts it at its fastest live worker's clock)
//   and starts at the highest clock they answer. A barrier the job passed
//   before it joined is released to it at once, the first time it asks.
//   Workers leave by finishing or being lost (WorkersLeft).
// - The coordinator's own silence: when no registered node at all has been
//   heard for half the shortest lease while the job runs (the coordinator was
//   cut off from every host, or paused), it takes that for its own
//   isolation, not every node's death: it declares nobody lost while the
//   silence lasts, so that every node has a whole lease from when it is
//   heard again (events say when the silence is noticed and when it ends).
//   A silence that outlasts isolation_give_up is every node's loss after
//   all: losses are declared as usual a lease later.
// - Membership changes are also reported as lines by TakeEvents(), for logs.
// - Load: every server heartbeat while the job runs feeds load() (see
//   coordinator/load_tracker.h), the smoothed view placement decisions read.
// - Barriers release when every worker reached them; a barrier cannot hang
//   without a message: a lost worker fails the job, which releases everyone
//   with the reason.
// - Every request with a request_id gets a reply (possibly an Error).
// - Lost messages: a heartbeat stamped with an older map epoch than the
//   coordinator's is answered with the current map too; a server's heartbeat
//   that knows of fewer workers that left (Heartbeat.workers_left) than the
//   coordinator is answered with WorkersLeft naming all of them; once the
//   job has ended, any message from a node is answered with the Shutdown
//   again.
// - A worker lost under kContinue that is heard from again (it was only
//   paused or cut off) is answered with Shutdown{ok=false} saying it was
//   declared lost; its reports (done, barriers) no longer count.
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/clock.h"
#include "common/keys.h"
#include "common/message.h"
#include "coordinator/load_tracker.h"
#include "coordinator/rebalancer.h"

namespace tessera {

// What the job does when a worker is lost (its lease expired).
enum class WorkerLossPolicy {
  kStopJob,   // fail the job, naming the worker
  kContinue,  // drop it from the clock tables and go on with the others
  kWait,      // keep its place for a replacement process, up to rejoin_timeout
};

struct CoordinatorOptions {
  uint32_t servers = 1;                      // servers the job needs
  uint32_t workers = 1;                      // workers the job needs
  uint32_t vshards = 64;                     // virtual shards of the key space
  Nanos assemble_timeout = 30 * kSeconds;    // registration deadline, from start
  Nanos lease = 5 * kSeconds;                // silence after which a node is lost
  std::string address;                       // the coordinator's own address
  WorkerLossPolicy on_worker_loss = WorkerLossPolicy::kStopJob;
  Nanos rejoin_timeout = 60 * kSeconds;      // kWait: how long a lost worker's place is kept
  uint32_t replication = 1;                  // copies of each shard (primary + backups), capped at servers
  Nanos server_lease = 0;                    // with replication > 1: silence after which a server is lost (0 = lease)
  Nanos isolation_give_up = 60 * kSeconds;   // silence of every node taken for the coordinator's own, at most
  // When a shard loses every copy: false = fail the job naming it; true =
  // give it to a live server to restore from the last checkpoint, and say
  // how many applied pushes that checkpoint may miss.
  bool restore_lost_shards = false;
  Nanos heartbeat_interval = 0;              // told to registering nodes (RegisterReply); 0 = not told
  // Capacity of each server rank (empty: all equal): the first map gives
  // each server primaries and copies in proportion (WeightedShardMap in
  // common/keys.h), and re-made copies follow them. Weights that
  // ValidateServerWeights refuses fail the job once it has assembled, naming
  // the bad weight; tessera-coordinator refuses them at start.
  std::vector<float> server_weights;
  // Servers the job may grow to while it runs (0: `servers`, no growth): a
  // server that registers for the next rank (or any rank, -1) once the job
  // runs is added to the map (WithServerAdded), empty; the rebalancer then
  // moves shards to it.
  uint32_t max_servers = 0;
  // Workers the job may grow to while it runs (0: `workers`, no growth): a
  // worker that registers for the next rank joins (see Joining workers).
  uint32_t max_workers = 0;
  RebalanceOptions rebalance;               // threshold 0: no automatic moves
  Nanos load_tau = 10 * kSeconds;           // time constant of the smoothed loads (LoadTracker)
  Nanos move_timeout = 60 * kSeconds;       // a move not finished by then is cancelled
  bool test_switch_before_sync = false;     // TEST ONLY (negative control): a move switches at once, without the copy
};

class CoordinatorCore {
 public:
  enum class Phase { kAssembling, kRunning, kDone, kFailed };

  CoordinatorCore(CoordinatorOptions options, Nanos start);
  CoordinatorCore(const CoordinatorCore&) = delete;
  CoordinatorCore& operator=(const CoordinatorCore&) = delete;

  std::vector<Outgoing> Step(const Message& message, Nanos now);
  std::vector<Outgoing> Tick(Nanos now);

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

  // The state a restarted coordinator needs (its --state-file): everything
  // but timings. Deterministic for equal states (sorted). `with_counts`
  // adds the pushes applied per shard, which change with every server
  // heartbeat: a shell saves them now and then, not on every change.
  proto::CoordinatorState SaveState(bool with_counts = true) const;
  // Takes a saved state over at time `now`: every live node counts as just
  // heard from (a node that died meanwhile is lost one lease later). Only on
  // a fresh core; a bad state is an error and changes nothing.
  // `source` names where the state came from, for the event line.
  absl::Status RestoreState(const proto::CoordinatorState& state, Nanos now,
                            std::string_view source = "the state file");

  // Starts moving `vshard` to server rank `to` (see Moves above), or says
  // why not: the job is not running, a move is under way, the shard or the
  // server is not valid, the server already is the primary, or it is a
  // backup not yet in sync. `why` goes into the event line and the map
  // update's reason.
  // `from`: the copy the move takes away, a backup of the shard (draining),
  // or kNotMoving for its primary.
  absl::StatusOr<std::vector<Outgoing>> StartMove(uint32_t vshard, uint32_t to, Nanos now,
                                                  const std::string& why = "",
                                                  uint32_t from = ShardMapView::kNotMoving);
  // Starts draining server `rank` (see Draining above), or says why not.
  // A server already draining: nothing to send, OK.
  absl::StatusOr<std::vector<Outgoing>> Drain(uint32_t rank, Nanos now);
  // Whether server `rank` was drained and removed (dead in the map, its
  // node done).
  bool Removed(uint32_t rank) const;
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
  // Each shard's cost per second as the rebalancer weighs it (bytes in and
  // out plus rebalance.request_cost_bytes per request), by vshard.
  std::vector<double> ShardCosts() const;
  size_t syncing_copies() const { return syncing_.size(); }

  // Human name of a node: "server 1", "worker 0".
  static std::string NodeName(proto::Role role, uint32_t rank);

 private:
  void HandleRegister(const Message& m, Nanos now, std::vector<Outgoing>& out);
  // A process asks for the place of a worker that is away (kWait). Returns
  // false (nothing done) if no such place is free.
  bool TakeOverAwayWorker(const Message& m, Nanos now, std::vector<Outgoing>& out);
  void HandleBarrier(const Message& m, std::vector<Outgoing>& out);
  void HandleWorkerDone(const Message& m, std::vector<Outgoing>& out);
  void Fail(const std::string& reason, std::vector<Outgoing>& out);
  // A server's lease expired: fail over (see the promises) or fail the job.
  void LoseServer(Node& server, const std::string& what, Nanos now, std::vector<Outgoing>& out);
  // A process registers for a dead server rank (or any, with rank -1): it
  // becomes that rank as a new node, is recruited where copies are missing,
  // and everyone gets the new map. Returns false if no rank is dead.
  bool TakeOverDeadServer(const Message& m, Nanos now, std::vector<Outgoing>& out);
  // A process registers for the next server rank while the job runs and
  // the job may grow: it joins as that rank. Returns false (nothing done)
  // if the job is at max_servers or the rank asked for is not the next.
  bool AddServer(const Message& m, Nanos now, std::vector<Outgoing>& out);
  uint32_t MaxServers() const { return std::max(options_.servers, options_.max_servers); }
  // A process registers for the next worker rank (or any) while the job
  // runs and may grow: it joins as that rank. False (nothing done) if the
  // job is at max_workers or the rank asked for is not the next.
  bool AddWorker(const Message& m, Nanos now, std::vector<Outgoing>& out);
  // A node of `role` and `rank` at `address`, heard from `now`, with the next node id.
  Node NewNode(proto::Role role, uint32_t rank, const std::string& address, Nanos now);
  uint32_t MaxWorkers() const { return std::max(options_.workers, options_.max_workers); }
  // A server that took a place while the job runs (`how`: "joined",
  // "rejoined"): its registration reply, the new map to everyone, and the
  // job to it.
  void WelcomeServer(const Message& m, const proto::NodeInfo& info, const char* how,
                     std::vector<Outgoing>& out);
  void PublishMap(const std::string& reason, std::vector<Outgoing>& out,
                  const std::vector<proto::ShardRestore>& restores = {});
  void AnnounceWorkerLeft(const Node& worker, const std::string& reason, std::vector<Outgoing>& out) const;
  // A server's heartbeat says it knows of fewer workers that left than
  // there are: WorkersLeft again, naming all of them (idempotent there).
  void ResendWorkersLeft(const Node& server, const proto::Heartbeat& hb, std::vector<Outgoing>& out) const;
  void MaybeFinish(std::vector<Outgoing>& out);
  // Releases every barrier that all live (not done, not lost) workers reached.
  void ReleaseBarriers(std::vector<Outgoing>& out);
  void Broadcast(const proto::Envelope& header, std::vector<Outgoing>& out) const;
  Message Reply(const Message& request) const;
  // JobReady with the shard map and every node (sorted by node id).
  proto::Envelope JobReadyEnvelope() const;
  std::vector<std::string> MissingNodes() const;

  const CoordinatorOptions options_;
  const Nanos start_;
  // The last message from any registered node, and whether the silence
  // since then was taken for the coordinator's own (see Tick).
  Nanos last_heard_any_ = 0;
  bool silence_noted_ = false;
  Phase phase_ = Phase::kAssembling;
  std::string failure_reason_;
  uint32_t next_node_id_ = 1;  // 0 is "unregistered"; the coordinator is not in nodes_
  // Invariants: ranks are unique per role and < the role's count; nodes_ holds
  // at most servers + workers entries.
  absl::flat_hash_map<uint32_t, Node> nodes_;
  absl::flat_hash_map<std::string, uint32_t> node_by_address_;
  proto::ShardMap shard_map_;
  // Barrier name -> node ids of the workers that reached it.
  absl::flat_hash_map<std::string, absl::flat_hash_set<uint32_t>> barriers_;
  // barrier name -> node id -> the request id it arrived with
  absl::flat_hash_map<std::string, absl::flat_hash_map<uint32_t, uint64_t>> barrier_requests_;
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
  // The destination of moving shard v is in sync: the next map makes it
  // primary. A no-op for a shard that is not moving (any more).
  void FinishMove(uint32_t vshard, std::vector<Outgoing>& out);
  // Moves past their deadline are cancelled; moves a failover ended are forgotten.
  void CheckMoves(Nanos now, std::vector<Outgoing>& out);
  void MaybeRebalance(Nanos now, std::vector<Outgoing>& out);
  // Draining: removes drained servers, and starts the next move off a
  // draining server when no move is under way (PlanDrain).
  void MaybeDrain(Nanos now, std::vector<Outgoing>& out);
  // A DrainRequest: starts the drain if need be and answers with progress.
  void HandleDrainRequest(const Message& m, Nanos now, std::vector<Outgoing>& out);
  // Tells a removed server to stop.
  void SendRemoved(const Node& server, std::vector<Outgoing>& out) const;
  std::string last_drain_note_;  // the last PlanDrain line logged (logged once)
  // vshard -> when its move is given up (shards moving in the map).
  absl::flat_hash_map<uint32_t, Nanos> move_deadline_;
  Nanos last_rebalance_at_ = -1;  // -1: not yet running
  // Marks the backups `next` has that `previous` did not as syncing.
  void NoteRecruits(const proto::ShardMap& previous, const proto::ShardMap& next);
};

// When a coordinator's shell writes its state (its --state-file, or etcd):
// write-ahead, after each step and before it sends what the step produced,
// whenever the state changed, and every `counts_every` for the applied
// counts alone (they change with every heartbeat). The tessera-coordinator
// shell and the cluster simulator use the same rule.
class CoordinatorStateSaver {
 public:
  explicit CoordinatorStateSaver(Nanos counts_every) : counts_every_(counts_every) {}
  // The bytes to write now (the state with the counts, serialized
  // deterministically), or nothing when no write is due.
  std::optional<std::string> Due(const CoordinatorCore& core, Nanos now);
  // The bytes Due gave were written (at `now`); until then Due gives them again.
  void Written(Nanos now);

 private:
  const Nanos counts_every_;
  std::string saved_;    // the last state written, without the counts
  std::string pending_;  // the state Due gave, without the counts
  Nanos counts_written_at_ = 0;
  bool written_once_ = false;
};

}  // namespace tessera

#pragma once
// CoordinatorCore: membership, the shard map, heartbeats, barriers and job
// end, as a pure state machine. Step(message, now) and Tick(now) return the
// messages to send; the tessera-coordinator binary is a thin shell.
//
// CoordinatorCore is the router that the shells, tests and the simulator
// call; the rules live in its parts, each a layer the next builds on:
// CoordinatorJob (coordinator_job.h: the shared job record),
// CoordinatorProgress (coordinator_progress.h: barriers, workers done or
// gone, the job's end), CoordinatorMoves (coordinator_moves.h: moves,
// rebalancing, drains), CoordinatorMembership (coordinator_membership.h:
// registration, takeovers, joins, server failover). This class routes each
// message and timer to them, watches the leases and the coordinator's own
// silence, and saves and restores the state. The options and their
// defaults are in coordinator_options.h.
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
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/clock.h"
#include "common/message.h"
#include "coordinator/coordinator_membership.h"
#include "coordinator/coordinator_options.h"

namespace tessera {

class CoordinatorCore : public CoordinatorMembership {
 public:
  CoordinatorCore(CoordinatorOptions options, Nanos start);

  std::vector<Outgoing> Step(const Message& message, Nanos now);
  std::vector<Outgoing> Tick(Nanos now);

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

 private:
  // A heartbeat from a registered node that is not lost: the applied
  // counts, load and moves in sync a server reports, and the map (with its
  // restores) again to a node behind on it.
  void HandleHeartbeat(const Message& m, Node& node, Nanos now, std::vector<Outgoing>& out);
  // A primary reports backups in sync: they may be promoted from now on.
  void HandleShardsInSync(const Message& m, const Node& node);

  const Nanos start_;
  // The last message from any registered node, and whether the silence
  // since then was taken for the coordinator's own (see Tick).
  Nanos last_heard_any_ = 0;
  bool silence_noted_ = false;
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

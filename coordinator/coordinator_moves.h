#pragma once
// CoordinatorMoves: live moves of virtual shards between servers, the
// rebalancer's decisions, and draining servers out of the job. Pure, like
// the rest of the core.
//
// Owns: each move's deadline, when the rebalancer last decided, and the
// last drain note logged. (The moves themselves are in the shard map.)
// Rules (the promises in coordinator_core.h, Moves, Rebalancing and
// Draining): one move at a time; the destination becomes primary only
// once the primary reports it in sync under the current map; a move past
// move_timeout is cancelled, one a lost server ended is forgotten; the
// rebalancer moves at most one shard per interval, once every live server
// reported its load, and waits while a drain is under way; a draining
// server gets no new copy, its copies move away one at a time (PlanDrain),
// and once it holds nothing it is removed and told to stop.
// Called by: CoordinatorCore (StartMove and Drain, public through it for the
// shells, tests and simulator; Step for a DrainRequest and a heartbeat's
// moves in sync; Tick for deadlines, drains and rebalancing) and
// CoordinatorMembership (a removed server registering again). Built on
// CoordinatorProgress (coordinator_progress.h).
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "coordinator/coordinator_progress.h"
#include "coordinator/rebalancer.h"

namespace tessera {

class CoordinatorMoves : public CoordinatorProgress {
 public:
  // Starts moving `vshard` to server rank `to` (see Moves in
  // coordinator_core.h), or says why not: the job is not running, a move is under way, the shard or the
  // server is not valid, the server already is the primary, or it is a
  // backup not yet in sync. `why` goes into the event line and the map
  // update's reason.
  // `from`: the copy the move takes away, a backup of the shard (draining),
  // or kNotMoving for its primary.
  absl::StatusOr<std::vector<Outgoing>> StartMove(uint32_t vshard, uint32_t to, Nanos now,
                                                  const std::string& why = "",
                                                  uint32_t from = ShardMapView::kNotMoving);
  // Starts draining server `rank` (see Draining in coordinator_core.h), or
  // says why not.
  // A server already draining: nothing to send, OK.
  absl::StatusOr<std::vector<Outgoing>> Drain(uint32_t rank, Nanos now);
  // Whether server `rank` was drained and removed (dead in the map, its
  // node done).
  bool Removed(uint32_t rank) const;
  // Each shard's cost per second as the rebalancer weighs it (bytes in and
  // out plus rebalance.request_cost_bytes per request), by vshard.
  std::vector<double> ShardCosts() const;

 protected:
  using CoordinatorProgress::CoordinatorProgress;

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
};

}  // namespace tessera

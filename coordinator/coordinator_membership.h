#pragma once
// CoordinatorMembership: who is in the job. Registration while the job
// assembles (ranks, the first shard map, JobReady), and while it runs:
// replacements for away workers (kWait), processes taking over dead server
// ranks, servers and workers joining a job that may grow, and the failover
// when a server's lease runs out. Pure, like the rest of the core.
//
// Owns: no state of its own; it changes the job record (nodes, shard map,
// syncing copies, restores) by the rules in coordinator_core.h (the
// promises on lost servers, rejoins and joining workers).
// Called by: CoordinatorCore::Step (RegisterRequest) and
// CoordinatorCore::Tick (a server's lease ran out: LoseServer). Built on
// CoordinatorMoves (coordinator_moves.h): a drained server registering
// again is told to stop.
#include <string>
#include <vector>

#include "coordinator/coordinator_moves.h"

namespace tessera {

class CoordinatorMembership : public CoordinatorMoves {
 protected:
  using CoordinatorMoves::CoordinatorMoves;

  void HandleRegister(const Message& m, Nanos now, std::vector<Outgoing>& out);
  // A registration while the job assembles: a rank of the job's count (the
  // one asked for, or the first free), and the first map and JobReady to
  // everyone once every node registered.
  void RegisterWhileAssembling(const Message& m, Nanos now, std::vector<Outgoing>& out);
  // A process asks for the place of a worker that is away (kWait). Returns
  // false (nothing done) if no such place is free.
  bool TakeOverAwayWorker(const Message& m, Nanos now, std::vector<Outgoing>& out);
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
  // A process registers for the next worker rank (or any) while the job
  // runs and may grow: it joins as that rank. False (nothing done) if the
  // job is at max_workers or the rank asked for is not the next.
  bool AddWorker(const Message& m, Nanos now, std::vector<Outgoing>& out);
  // A server that took a place while the job runs (`how`: "joined",
  // "rejoined"): its registration reply, the new map to everyone, and the
  // job to it.
  void WelcomeServer(const Message& m, const proto::NodeInfo& info, const char* how,
                     std::vector<Outgoing>& out);
};

}  // namespace tessera

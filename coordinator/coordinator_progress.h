#pragma once
// CoordinatorProgress: the job's progress through its workers: barriers,
// workers that finish or leave, and the end of the job. Pure, like the rest
// of the core.
//
// Owns: the barriers being waited at (who arrived, with which request id).
// Rules: a barrier releases when every live worker (not done, not lost)
// reached it; a barrier cannot hang without a message, since a lost worker
// fails the job (which releases everyone with the reason) or leaves it. A
// worker's repeated request, a replacement whose predecessor passed the
// barrier, and a worker that joined after the job passed it are released at
// once. The servers are told of every worker that finished or was lost
// (WorkersLeft), again when a heartbeat shows a server missed it. The job is
// done when every worker is done or lost (at least one done).
// Called by: CoordinatorCore::Step (BarrierRequest, WorkerDone, a server's
// heartbeat), CoordinatorCore::Tick (releases and the end after losses), and
// CoordinatorMembership (announcing a lost worker). Built on CoordinatorJob
// (coordinator_job.h).
#include <string>
#include <vector>

#include "coordinator/coordinator_job.h"

namespace tessera {

class CoordinatorProgress : public CoordinatorJob {
 protected:
  using CoordinatorJob::CoordinatorJob;

  void HandleBarrier(const Message& m, std::vector<Outgoing>& out);
  void HandleWorkerDone(const Message& m, std::vector<Outgoing>& out);
  void AnnounceWorkerLeft(const Node& worker, const std::string& reason, std::vector<Outgoing>& out) const;
  // A server's heartbeat says it knows of fewer workers that left than
  // there are: WorkersLeft again, naming all of them (idempotent there).
  void ResendWorkersLeft(const Node& server, const proto::Heartbeat& hb, std::vector<Outgoing>& out) const;
  void MaybeFinish(std::vector<Outgoing>& out);
  // Releases every barrier that all live (not done, not lost) workers reached.
  void ReleaseBarriers(std::vector<Outgoing>& out);

  // Barrier name -> node ids of the workers that reached it.
  absl::flat_hash_map<std::string, absl::flat_hash_set<uint32_t>> barriers_;
  // barrier name -> node id -> the request id it arrived with
  absl::flat_hash_map<std::string, absl::flat_hash_map<uint32_t, uint64_t>> barrier_requests_;
};

}  // namespace tessera

#pragma once
// WorkerNodeCore: what one worker process does around its WorkerCore, with
// no threads, sockets, clocks read, files or log: the core made from the
// job's first map, how the process starts (with the job, joining the
// running job, or replacing a lost worker), the clock resume of the last
// two, and the shard map updates from the coordinator. Written once and
// used by the Worker shell (worker/worker.cc: threads, transport, session,
// futures, log lines) and by the simulator's worker (tests/sim/sim.cc), so
// that both run the same sequence.
//
// Contract:
// - Start(ready, self, joined_running_job, address) makes the WorkerCore
//   from `options` (node id and incarnation from `self`, `address` where
//   servers answer) and ready's map, counts the job's workers and sets the
//   start kind: kJoin when the session joined the running job, else
//   kReplacement when self's incarnation is above 0, else kFresh. A map
//   the core refuses is an error and leaves no core. Start again replaces
//   the core: the old one's state is dropped.
// - The clock resume (kJoin and kReplacement; the caller runs it before
//   anything else): QueryClock issues, as one operation, the query of the
//   clock the servers know for this worker: JoinClock (at self's rank: each
//   server starts tracking it at its fastest live worker's clock) for
//   kJoin, ClockQuery for kReplacement; for kFresh (or before Start) the
//   operation completes at once with FailedPrecondition and nothing is
//   sent. Once that operation completed OK, resume_clock() is the clock to
//   resume at (the highest any server answered), and AnnounceClock
//   announces it again (ClockAdvance) to every live server, as one
//   operation: a predecessor that died inside Clock() may have reached
//   only some servers, and the others would wait for it forever (found by
//   the cluster simulator). When resume_clock() is 0 there is nothing to
//   announce: the operation completes at once with OK and nothing is sent.
//   A failed operation ends the resume (the caller says why).
// - UpdateMap: before Start, nothing. A map newer than the core's goes to
//   the core (what went to lost servers, and what waited for this map,
//   goes again): `newer`, with the effects and the new epoch, which the
//   caller gives its session (heartbeats carry it), and `gone_servers`: the
//   addresses of the processes the old map had live that the new one does
//   not (a rank now dead, or at another address or incarnation), for the
//   caller's Transport::Forget before it sends the effects (a message still
//   queued for a process that went away must not reach a later process at
//   its address: it may view memory the caller gets back once the resent
//   operation completes). An older or equal map
//   changes nothing; an invalid one changes nothing and says why in
//   `error` (for the log).
// - Clock: ClockWaits() says whether Clock() waits for the servers
//   (ClockAdvance, an operation) or only tells them (ClockNotice, no
//   answer): it waits once a BSP or SSP table was created by this process
//   (TableCreated, called when a CreateTable completed OK), and only tells
//   while every table it created is ASP (or none was).
// - Not thread-safe: the shell calls it under its lock.
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "common/clock.h"
#include "proto/tessera.pb.h"
#include "worker/worker_core.h"

namespace tessera {

class WorkerNodeCore {
 public:
  enum class StartKind {
    kFresh,        // started with the job: clock 0
    kJoin,         // joined the running job: resumes at the servers' clock
    kReplacement,  // replaced a lost worker of its rank: resumes at its predecessor's clock
  };
  // What a map update changed.
  struct MapChange {
    WorkerCore::Effects effects;
    bool newer = false;  // the map was newer than the core's (else nothing changed)
    absl::Status error;  // an invalid map (nothing changed)
    uint64_t epoch = 0;  // the core's epoch after the update (when newer: for the session)
    std::vector<std::string> gone_servers;  // when newer: addresses to forget (see the contract)
  };

  // `options`: the core's options but node_id, incarnation and address
  // (Start sets them).
  explicit WorkerNodeCore(WorkerCoreOptions options) : options_(std::move(options)) {}

  // The job is ready: see the contract.
  absl::Status Start(const proto::JobReady& ready, const proto::NodeInfo& self, bool joined_running_job,
                     std::string address);
  // Null before Start.
  WorkerCore* core() { return core_.get(); }
  const WorkerCore* core() const { return core_.get(); }
  StartKind start_kind() const { return kind_; }
  // The job's workers when it was ready.
  uint32_t num_workers() const { return num_workers_; }

  // --- The clock resume (see the contract) ---
  WorkerCore::Effects QueryClock(WorkerCore::Handle handle, Nanos now);
  uint64_t resume_clock() const { return core_ ? core_->known_clock() : 0; }
  WorkerCore::Effects AnnounceClock(WorkerCore::Handle handle, Nanos now);

  MapChange UpdateMap(const proto::ShardMapUpdate& update, Nanos now);

  // --- Clock (see the contract) ---
  void TableCreated(proto::ConsistencyKind consistency) {
    if (consistency != proto::ASP) ++synchronous_tables_;
  }
  bool ClockWaits() const { return synchronous_tables_ > 0; }

 private:
  const WorkerCoreOptions options_;
  std::unique_ptr<WorkerCore> core_;
  StartKind kind_ = StartKind::kFresh;
  uint32_t rank_ = 0;
  uint32_t num_workers_ = 0;
  uint32_t synchronous_tables_ = 0;  // BSP or SSP tables created (TableCreated)
};

}  // namespace tessera

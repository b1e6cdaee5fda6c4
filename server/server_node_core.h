#pragma once
// ServerNodeCore: what one server process does around its ServerCore, with
// no threads, sockets, files or log: the start sequence, the requests and
// map that come before it, shard map updates (deposition, shards restored
// from checkpoints, their state sent to backups) and the notices for the
// coordinator. Written once and used by the tessera-server shell
// (server/server_node.cc: threads, transport, checkpoint files, log lines)
// and by the simulator (tests/sim/sim.cc), so that both run the same
// sequence.
//
// Contract:
// - Before Start, Receive keeps requests in arrival order, at most
//   `max_early` of them; past that a request that wants a reply is answered
//   Unavailable and others are dropped. UpdateMap keeps the newest update
//   (its map and the shards it gives this server to restore).
// - Start(ready, ...) makes a ServerCore from `options.core` (node id set),
//   installs ready's map for `rank`, learns the job's workers, restores the
//   shards this server holds through `restore_held` when set (a new job
//   from a checkpoint; no de-duplication windows: workers number pushes
//   afresh),
//   then steps the kept requests in order and applies the kept update when
//   its map is newer than ready's, as UpdateMap does (restores included:
//   Output::restore_line reports them). Start again (a rejoin) replaces the core: the
//   old one's state is dropped.
// - Receive, Tick and UpdateMap return what to send and the coordinator
//   notices (ShardsInSync) the step made; pending updates (apply_after_ack)
//   stay for ApplyPending, which the caller calls once the sends are out,
//   so that acknowledgements leave before the update work.
// - UpdateMap: a map not newer than the core's changes nothing. A newer one
//   says whether it deposed this server (declared lost while it ran); for
//   every shard it names as having lost every copy and that this server now
//   leads, the shard is restored through `restore_lost` (with its windows,
//   and the pushes each shard applied last, for the report) and its state
//   goes to its backups. Without `restore_lost` such shards start from
//   their initial values, and the report line says so.
// - Not thread-safe: the shell calls it under its lock.
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/clock.h"
#include "common/message.h"
#include "server/server_core.h"

namespace tessera {

class ServerNodeCore {
 public:
  // Restores `vshards` into `core` from checkpoints (the shell: files; the
  // simulator: its own). Returns one line for the log.
  using RestoreFn = std::function<std::string(ServerCore& core, const std::vector<uint32_t>& vshards,
                                              bool with_windows, const std::map<uint32_t, uint64_t>& last_applied)>;
  struct Options {
    ServerCoreOptions core;
    size_t max_early = 100000;  // requests kept before Start
    RestoreFn restore_held;     // Start restores every shard it holds (null: none)
    RestoreFn restore_lost;     // shards that lost every copy (null: no checkpoints)
  };
  struct Output {
    std::vector<Outgoing> sends;
    std::vector<proto::ShardsInSync> in_sync;  // for the coordinator
    absl::Status refused_map;  // Start: the map kept before it, refused by the core (ignored; for the log)
    std::string restore_line;  // Start: shards that lost every copy, restored by the update kept before it
  };
  // What a map update changed (for the shell's log).
  struct MapChange {
    Output out;
    bool newer = false;          // the map was newer than the core's (else nothing changed)
    bool kept = false;           // no core yet: kept for Start
    absl::Status error;          // a map the core refused (nothing changed)
    uint64_t epoch = 0;          // the core's epoch after the update
    bool newly_deposed = false;  // this map removed this live server from the job
    bool deposed = false;
    std::string restore_line;    // shards restored (or not) from checkpoints; empty when none were lost
    uint64_t transfers_sent = 0;     // state transfers to new backups this update started
    uint64_t rows_transferred = 0;
  };

  explicit ServerNodeCore(Options options) : options_(std::move(options)) {}
  // Where checkpoints come from (the shell knows once its flags are read).
  void SetRestore(RestoreFn held, RestoreFn lost) {
    options_.restore_held = std::move(held);
    options_.restore_lost = std::move(lost);
  }

  // Null before Start.
  ServerCore* core() { return core_.get(); }
  const ServerCore* core() const { return core_.get(); }

  // A request or reply from a peer (not a session message, not a map update).
  Output Receive(Message m, Nanos now);
  // The job is ready (or ready again after a rejoin): see the contract.
  // `restore_line` (if not null) gets the start restore's report.
  absl::StatusOr<Output> Start(const proto::JobReady& ready, uint32_t node_id, uint32_t rank, Nanos now,
                               std::string* restore_line = nullptr);
  MapChange UpdateMap(const proto::ShardMapUpdate& update, uint32_t rank, Nanos now);
  Output Tick(Nanos now);
  void ApplyPending() {
    if (core_) core_->ApplyPending();
  }
  size_t early_requests() const { return early_.size(); }

 private:
  // Moves the core's coordinator notices into `out`.
  void TakeNotices(Output& out);

  Options options_;
  std::unique_ptr<ServerCore> core_;
  std::deque<Message> early_;                 // requests before Start
  std::optional<proto::ShardMapUpdate> early_update_;  // the newest map update before Start
};

}  // namespace tessera

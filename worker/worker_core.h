#pragma once
// WorkerCore: the worker's side of the data protocol as a pure state machine.
// It turns the caller's operations into one request per server by the shard
// map, numbers pushes, tracks replies (RequestTracker), and sends parts again
// after a failover (a newer map) or a loss (a silent server). No sockets,
// threads, locks or clocks: time comes in as `now`. The Worker shell
// (worker/worker.cc) locks around it and hands what it returns to the
// transport; the cluster simulator (tests/sim) drives the very same code over
// a simulated network.
//
// Every call returns Effects: the messages to send (in order) and the
// operations it completed. Each operation completes exactly once (the
// tracker's promise), with OK or an error naming the server.
//
// Promises (the Worker contract in worker/worker.h rests on them):
// - Requests carry a fresh request id, this node's id, address and map epoch.
// - Push: every part carries the same sequence number (1, 2, ... per core),
//   the lowest number still in flight (acked_below), the clock and the
//   incarnation; all keys on one server go as the caller's own memory
//   (Buffer::Borrow, no copy), else each server gets a copy of its rows.
//   With a compressor, each part's rows are encoded (an encoding error
//   registers nothing and gives the number back: it is no longer in flight,
//   and not used again).
// - Pull: split the same way; the rows land in the caller's `out` by the
//   tracker's scatter. Servers may hold a pull up to hold_timeout, on top of
//   request_timeout.
// - ClockAdvance, ClockQuery and CreateTable go to every live server of the
//   map; ClockNotice (request id 0) too, and nothing waits for it.
// - OnReply: a compressed pull reply is decoded first (a bad one fails its
//   operation with DataLoss); a ClockAck raises known_clock().
// - OnMapUpdate(newer map): parts addressed to servers the map names dead,
//   and parts parked for this epoch, go again by the new map: a push whole,
//   marked resend, to every server now primary of some of its keys (same
//   sequence number); a pull split by the new primaries; other kinds again
//   to the same server. An older or equal epoch, or an invalid map, changes
//   nothing.
// - Tick(now): operations past their deadline fail; parts unanswered for
//   resend_after (doubling per resend, see RequestTracker) go again.
// - Push numbers are forgotten when their operation completes, by any path:
//   PushesCompleteThrough(n) is then true once every push numbered <= n is.
// Thread safety: none; the shell serializes calls.
#include <cstdint>
#include <memory>
#include <set>
#include <span>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/clock.h"
#include "common/keys.h"
#include "common/message.h"
#include "worker/request_tracker.h"

namespace tessera {

namespace compress {
class RowCompressor;
}

struct WorkerCoreOptions {
  uint32_t node_id = 0;                   // stamped on requests (sender_id)
  uint32_t incarnation = 0;               // stamped on pushes
  std::string address;                    // stamped on requests (sender_address)
  Nanos request_timeout = 60 * kSeconds;  // for every operation (on top of any hold)
  Nanos hold_timeout = 120 * kSeconds;    // how long servers may hold a pull or a clock advance
  Nanos resend_after = 2 * kSeconds;      // a part unanswered this long goes again (0: never)
};

class WorkerCore {
 public:
  using Handle = RequestTracker::Handle;
  using Completion = RequestTracker::Completion;

  // What one call produced.
  struct Effects {
    std::vector<Outgoing> sends;   // hand to the transport in this order
    std::vector<Completion> done;  // operations that completed
    uint64_t resent_parts = 0;     // parts sent again (failover or loss)
  };

  // `map` must be valid (ShardMapView::Create); errors say why.
  static absl::StatusOr<std::unique_ptr<WorkerCore>> Create(WorkerCoreOptions options, const proto::ShardMap& map);
  WorkerCore(const WorkerCore&) = delete;
  WorkerCore& operator=(const WorkerCore&) = delete;

  // The map this core acts on (replaced by OnMapUpdate; a snapshot stays valid).
  std::shared_ptr<const ShardMapView> map() const { return map_; }
  const WorkerCoreOptions& options() const { return options_; }

  // --- Operations (each registers one operation under `handle`) ---
  Effects CreateTable(Handle handle, const proto::TableConfig& config, Nanos now);
  // The highest clock any live server knows for this worker (a replacement
  // resumes there): known_clock() once the operation completed OK. The
  // replacement then announces that clock again (ClockAdvance): its
  // predecessor may have died with the announcement at only some servers.
  Effects ClockQuery(Handle handle, Nanos now);
  // The same for a worker that joined the running job (ClockQuery join):
  // each server starts tracking it, at its fastest live worker's clock, and
  // known_clock() is then the highest clock they answered.
  Effects JoinClock(Handle handle, uint32_t rank, Nanos now);
  // `values` holds keys.size() * width floats; keys non-empty. The caller
  // keeps keys and values unchanged until the operation completes.
  // `compressor` may be null. On error nothing is registered.
  absl::StatusOr<Effects> Push(Handle handle, uint32_t table, std::span<const Key> keys,
                               std::span<const float> values, uint32_t width, uint64_t clock,
                               compress::RowCompressor* compressor, Nanos now, std::string what = {});
  // `out` has room for keys.size() * width floats; keys non-empty. The
  // caller keeps keys unchanged and out untouched until completion.
  Effects Pull(Handle handle, uint32_t table, std::span<const Key> keys, std::span<float> out, uint32_t width,
               uint64_t clock, Nanos now, std::string what = {});
  // Announces `clock` and waits (servers hold the acks) per the tables' staleness.
  Effects ClockAdvance(Handle handle, uint64_t clock, Nanos now);
  // Announces `clock` to every live server without waiting (all tables ASP).
  std::vector<Outgoing> ClockNotice(uint64_t clock);

  // --- Inputs ---
  // A reply from a server (anything the shell did not consume itself).
  Effects OnReply(Message reply);
  // A map from the coordinator; `*changed` says whether it was newer.
  Effects OnMapUpdate(const proto::ShardMap& map, Nanos now, bool* changed = nullptr);
  Effects Tick(Nanos now);
  // Fails everything in flight (job ended, worker closing).
  Effects FailAll(const absl::Status& status);

  // --- Push numbering ---
  uint64_t last_push_seq() const { return last_push_seq_; }
  // Whether every push numbered <= seq has completed.
  bool PushesCompleteThrough(uint64_t seq) const {
    return pushes_in_flight_.empty() || *pushes_in_flight_.begin() > seq;
  }
  size_t pushes_in_flight() const { return pushes_in_flight_.size(); }

  uint64_t known_clock() const { return known_clock_; }
  const RequestTracker& tracker() const { return tracker_; }

 private:
  WorkerCore(WorkerCoreOptions options, std::shared_ptr<const ShardMapView> map, std::vector<std::string> names);
  Message NewRequest();
  // One request of the same header to every live server, under one operation.
  Effects ToEveryServer(Handle handle, std::string what, const proto::Envelope& body, Nanos now, Nanos hold);
  // Forgets the push numbers of completed operations.
  void Forget(const std::vector<Completion>& done);
  // Resends what the tracker hands back under the current map.
  void SendAgain(Nanos now, Nanos resend_after, Effects& effects);
  std::vector<RequestTracker::PartSpec> Redirect(const RequestTracker::Resend& r, std::vector<Outgoing>& sends);

  const WorkerCoreOptions options_;
  std::shared_ptr<const ShardMapView> map_;
  RequestTracker tracker_;
  uint64_t next_request_ = 0;
  uint64_t last_push_seq_ = 0;
  std::set<uint64_t> pushes_in_flight_;
  absl::flat_hash_map<const void*, uint64_t> push_seq_of_;  // operation handle -> its push number
  uint64_t known_clock_ = 0;
};

}  // namespace tessera

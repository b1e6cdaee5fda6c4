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
//   With part_bytes (below), every part carries its own number instead:
//   consecutive numbers, in part order, so that parts of one push that
//   reach the same shard are each applied (servers drop a repeated
//   (shard, worker, incarnation, number)). acked_below is the lowest
//   number of any push still in flight when the push is issued.
//   With a compressor, each part's rows are encoded (an encoding error
//   registers nothing and gives the number back: it is no longer in flight,
//   and not used again).
// - Pull: split the same way; the rows land in the caller's `out` by the
//   tracker's scatter. Servers may hold a pull of a BSP or SSP table up to
//   hold_timeout, on top of request_timeout; a pull of an ASP table (as
//   CreateTable told this core) is never held, so it fails after
//   request_timeout alone, and says so to the server (hold_timeout_ms 0).
// - Pull ranges (which memory a pull request's reply fills; the shell posts
//   it with the transport so that the reply is written there, worker/
//   posted_pulls.h): a pull request whose keys are a run of the caller's
//   keys, keys[b, b + n) (keys all on one server: the whole of them, or
//   with parts one part, borrowed as the caller's memory), has its rows at
//   the same run of `out`, out[b * width, (b + n) * width), and
//   PullRange(its request id) names that run. So does a resend of it that
//   goes whole to one server, under its new id (the same keys, the same
//   run). A request with keys of its own (keys on several servers, or a
//   part split by a newer map) has its rows scattered and names none; so
//   does a pull into a PulledRows view. A request id names its run until
//   it is answered, sent again under a new id, or its operation completes.
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
//   their server's resend timer go again (RequestTracker, "Lost messages":
//   resend_after before the first round trip to that server was timed, then
//   from the round trips, within [resend_floor, resend_ceiling], doubling
//   per resend up to the ceiling). NextResendDue says when Tick next has a
//   part to send again. A resend names the first send's request id
//   (Envelope.first_request_id).
// - OnLinkRestored(address): the transport made the connection to that
//   server again; its parts awaiting an answer go again now. OnLinkDown:
//   the connection is down; its parts wait for it instead of being resent
//   into it. An address that is no live server of the map changes nothing.
// - Push numbers are forgotten when their operation completes, by any path:
//   PushesCompleteThrough(n) is then true once every push numbered <= n is.
//
// Transfer scheduling (part_bytes and max_bytes_in_flight_per_server are off
// by default: one request per server, sent at once; only pushed rows wider
// than row_piece_bytes, 2 MiB by default, go in pieces, as below):
// - part_bytes > 0: each server's share of a push or a pull is split into
//   parts of at most part_bytes value bytes (rows * width * 4, uncompressed;
//   at least one row per part), in the caller's key order. Parts of keys all
//   on one server still borrow the caller's memory (a slice of it).
//   Rows wider than part_bytes, in an uncompressed push with row_pieces:
//   each row goes in pieces of part_bytes / 4 columns (the last one
//   shorter), one part per piece (Push.first_column, Push.columns), each a
//   slice of the caller's row, so that a server updates a wide row piece by
//   piece as the pieces arrive instead of after the whole row did. Pieces
//   of one push go to one server, in column order, each with its own
//   sequence number; a pull still gets whole rows.
// - row_piece_bytes > 0 (2 MiB by default), with part_bytes 0: rows wider
//   than row_piece_bytes go in pieces of that many bytes as above; a push
//   of narrower rows goes whole, one request per server. Rows to a server
//   whole_rows_to names go whole (where they fit one message):
//   over the same-host path pieces measured slower (docs/benchmarks.md,
//   "Pieces of wide rows by default").
// - max_bytes_in_flight_per_server > 0: push and pull parts wait in a queue
//   per server, ordered by (priority, issue order): lower priority numbers
//   go first (a layer's index, say), equal ones in issue order. A part
//   leaves when the value bytes of the parts sent to that server and not
//   yet answered, plus its own, fit the bound; one part is always allowed
//   in flight, however big. Strict priority: a part that does not fit holds
//   back the parts behind it. One exception keeps read-my-writes: a pull
//   part never overtakes a push part to the same server issued before it
//   (that push part goes first, in the pull's turn). A queued part's resend
//   timer starts when it is sent; its operation's deadline counts from the
//   call that issued it. A queued part addressed to a server a newer map
//   names dead is routed again by that map (a push whole, marked resend, to
//   each new primary of its keys) and queued there with its priority and
//   place; one whose keys moved to another live server stays queued (that
//   server answers Aborted at the newer epoch, and the part goes again by
//   the map, as parts in flight do). Resends of parts
//   (failover, silence) are queued the same way. Clocks, tables and queries
//   are never queued: a clock announced while pushes wait in a queue would
//   reach a server before them, so the caller announces a clock only when
//   no push part is queued (the Worker shell waits for its pushes first).
// - The answer frees a part's bytes (an answer of Aborted too: the part is
//   then parked, and queued again when it goes again).
// - Every request fits the servers' largest message (max_message_bytes,
//   on by default): a part holds at most MessageBudget() bytes of keys and
//   rows (the rest of the limit is room for the header), whatever
//   part_bytes says. With part_bytes 0 only a share that would not fit is
//   split; a push split this way numbers each part on its own, as under
//   part_bytes. A pushed row that does not fit alone goes in pieces of
//   columns where pieces are allowed (uncompressed, not ADAM); elsewhere
//   the push fails with InvalidArgument naming the row's size and the limit
//   (--transfer_max_message_mb), and nothing is sent. A pull part holds at
//   least one row; the server sends its reply in pieces.
// Thread safety: none; the shell serializes calls.
#include <compare>
#include <functional>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <tuple>
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
  Nanos resend_after = 200 * kMillis;     // resend timer before any round trip was timed (0: never resend)
  Nanos resend_floor = 2 * kMillis;       // the resend timer's least ...
  Nanos resend_ceiling = 1 * kSeconds;    // ... and greatest value, backoff included
  double resend_bytes_per_second = 100e6;  // a part's bytes (and those ahead of it) add their time at this rate
  uint64_t part_bytes = 0;                // parts of at most this many value bytes per server (0: no split)
  uint64_t row_piece_bytes = kDefaultRowPieceBytes;  // with part_bytes 0: pushed rows wider than this go in
                                                      // pieces of this many bytes (0: whole rows)
  // Servers (by address) that rows go to whole despite row_piece_bytes
  // (not despite part_bytes), where they fit one message: those reached
  // over the same-host path, where pieces only add messages (the shell
  // asks Transport::SameHostPath). Empty: none.
  std::function<bool(const std::string& address)> whole_rows_to;
  uint64_t max_bytes_in_flight_per_server = 0;  // value bytes sent to one server and unanswered (0: unbounded)
  size_t max_message_bytes = kDefaultMaxMessageBytes;  // the servers' largest message (0: no limit)
};

// Transfer priority of a push or a pull: lower numbers go first (for
// example a layer's index, so that the first layers' weights arrive first).
inline constexpr int32_t kDefaultTransferPriority = 0;

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
  // `row_pieces`: the table updates pieces of rows (its optimizer is not
  // ADAM), so that rows wider than part_bytes (or, with part_bytes 0, than
  // row_piece_bytes) may go in pieces (see Transfer scheduling).
  absl::StatusOr<Effects> Push(Handle handle, uint32_t table, std::span<const Key> keys,
                               std::span<const float> values, uint32_t width, uint64_t clock,
                               compress::RowCompressor* compressor, Nanos now, std::string what = {},
                               int32_t priority = kDefaultTransferPriority, bool row_pieces = false);
  // `dest`: the caller's `out`, with room for keys.size() * width floats,
  // or a PulledRows view (Worker::PullView); keys non-empty. The caller
  // keeps keys unchanged and the destination untouched until completion.
  Effects Pull(Handle handle, uint32_t table, std::span<const Key> keys, RequestTracker::Destination dest,
               uint32_t width, uint64_t clock, Nanos now, std::string what = {},
               int32_t priority = kDefaultTransferPriority);
  // Announces `clock` and waits (servers hold the acks) per the tables' staleness.
  Effects ClockAdvance(Handle handle, uint64_t clock, Nanos now);
  // Announces `clock` to every live server without waiting (all tables ASP).
  std::vector<Outgoing> ClockNotice(uint64_t clock);

  // --- Inputs ---
  // A reply from a server (anything the shell did not consume itself). It
  // may free room for queued parts, which leave at `now` (default: the
  // latest time any call was given).
  Effects OnReply(Message reply, std::optional<Nanos> now = std::nullopt);
  // A map from the coordinator; `*changed` says whether it was newer.
  Effects OnMapUpdate(const proto::ShardMap& map, Nanos now, bool* changed = nullptr);
  Effects Tick(Nanos now);
  // When Tick next has a part to send again for silence (INT64_MAX: none).
  Nanos NextResendDue() const;
  // The shortest resend timer of any server (a part sent now is due no sooner).
  Nanos ShortestResendTimer() const { return tracker_.ShortestTimer(); }
  // The transport's word on the connection to `address` (see the contract).
  Effects OnLinkRestored(const std::string& address, Nanos now);
  void OnLinkDown(const std::string& address);
  // Fails everything in flight (job ended, worker closing).
  Effects FailAll(const absl::Status& status);

  // --- Push numbering ---
  uint64_t last_push_seq() const { return last_push_seq_; }
  // Whether every push numbered <= seq has completed.
  bool PushesCompleteThrough(uint64_t seq) const {
    return pushes_in_flight_.empty() || *pushes_in_flight_.begin() > seq;
  }
  // Push numbers still in flight (with part_bytes, one per part).
  size_t pushes_in_flight() const { return pushes_in_flight_.size(); }

  // --- Transfer scheduling ---
  // Parts waiting in the queues (not sent yet).
  size_t queued_parts() const { return tracker_.queued(); }
  // Value bytes sent to server `rank` and not answered yet (counted only
  // with max_bytes_in_flight_per_server).
  uint64_t bytes_in_flight(uint32_t rank) const;

  // --- Pull ranges (see the contract) ---
  // The run of the caller's `out` that the reply to pull request
  // `request_id` fills, if it fills one run and is awaited.
  std::optional<RequestTracker::OutRange> PullRange(uint64_t request_id) const {
    return tracker_.PullRange(request_id);
  }

  uint64_t known_clock() const { return known_clock_; }
  const RequestTracker& tracker() const { return tracker_; }

 private:
  WorkerCore(WorkerCoreOptions options, std::shared_ptr<const ShardMapView> map, std::vector<std::string> names);
  Message NewRequest();
  // A clock notice (request id 0: recorded, never answered) to one server.
  Outgoing ClockNoticeTo(std::string address, uint64_t clock);
  // One request of the same header to every live server, under one operation.
  Effects ToEveryServer(Handle handle, std::string what, const proto::Envelope& body, Nanos now, Nanos hold);
  // Forgets the push numbers of completed operations.
  void Forget(const std::vector<Completion>& done);
  // Resends what the tracker hands back under the current map.
  void SendAgain(Nanos now, bool silence, Effects& effects);
  // The rank of the live server at `address`, if any.
  std::optional<uint32_t> RankAt(const std::string& address) const;
  std::vector<RequestTracker::PartSpec> Redirect(const RequestTracker::Resend& r, Effects& effects);
  // Push and pull parts of a map change whose queued requests the new map
  // routes elsewhere go again by it.
  void RouteQueued(Nanos now, Effects& effects);
  bool scheduled() const { return options_.max_bytes_in_flight_per_server > 0; }
  // Bytes of keys and rows one part may hold: max_message_bytes less room
  // for the header (a 64th of it, at least 4 KiB or half of it; unbounded
  // without a limit).
  size_t MessageBudget() const;
  // Rows per part for rows of `row_bytes` (part_bytes and the message
  // budget; at least one).
  size_t RowsPerPart(size_t row_bytes) const;
  // Columns per piece for a push of rows of row_bytes: 0 (whole rows) unless
  // pieces are allowed and the rows are wider than part_bytes or than the
  // message budget.
  size_t PieceColumns(size_t row_bytes, bool allowed) const;
  // Sends a new push or pull part now (no bound), or queues it (marks it queued).
  void Dispatch(RequestTracker::PartSpec& part, Effects& effects);
  // Frees the bytes of answered parts and sends what the bounds allow.
  void Pump(Nanos now, Effects& effects);

  // A part waiting in a server's queue. Entries of parts that are gone
  // (their operation ended, or they were routed again) are dropped when
  // they come up.
  struct QueueKey {
    int32_t priority;
    uint64_t order;
    uint64_t request_id;
    auto operator<=>(const QueueKey&) const = default;
  };
  struct Queued {
    uint64_t bytes;
    bool push;
    Outgoing send;
  };
  struct ServerQueue {
    std::map<QueueKey, Queued> queue;
    // The push entries of `queue` by issue order (read-my-writes).
    std::set<std::tuple<uint64_t, int32_t, uint64_t>> pushes;
    absl::flat_hash_map<uint64_t, uint64_t> in_flight;  // request id -> value bytes
    uint64_t in_flight_bytes = 0;
  };

  const WorkerCoreOptions options_;
  std::shared_ptr<const ShardMapView> map_;
  RequestTracker tracker_;
  uint64_t next_request_ = 0;
  uint64_t last_push_seq_ = 0;
  std::set<uint64_t> pushes_in_flight_;
  // operation handle -> its push numbers [first, last]
  absl::flat_hash_map<const void*, std::pair<uint64_t, uint64_t>> push_seq_of_;
  // Invariants: a part is queued in the tracker iff an entry for it is in
  // its server's queue (stale entries, of parts no longer queued, may stay
  // until they come up); in_flight holds only parts MarkSent and not yet
  // seen answered, and in_flight_bytes is the sum of its values.
  std::map<uint32_t, ServerQueue> queues_;  // server rank -> its queue (scheduled() only; ordered: deterministic)
  uint64_t known_clock_ = 0;
  absl::flat_hash_map<uint32_t, bool> asp_tables_;  // table id -> ASP, from CreateTable
  uint64_t announced_clock_ = 0;  // the highest clock this worker has announced (ClockAdvance, ClockNotice)
  Nanos last_now_ = 0;  // the latest `now` seen (OnReply and FailAll have none): when queued parts leave
};

}  // namespace tessera

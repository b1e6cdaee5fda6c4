#pragma once
// RequestTracker: the worker's book of requests in flight, as a pure core
// (no sockets, threads or clocks; the Worker shell locks around it).
//
// An operation (a Push, a Pull or a CreateTable) is split into parts, one
// request per server. The tracker remembers each part by request id, merges
// replies back (a pull's values are scattered straight into the caller's
// output rows), and completes the operation when every part has answered,
// with the first error if any part failed.
//
// Promises:
// - Every operation completes exactly once: all parts answered, a part timed
//   out (Tick), or FailAll.
// - A reply for an unknown request id (late, after a timeout, or duplicated)
//   is ignored and counted.
// - A malformed reply (wrong values size) fails its operation with an error
//   that names the server; it never writes outside the caller's buffer.
// - A pull reply may come in pieces (server/server_core.h, "Pull replies in
//   pieces"): each piece is placed in the caller's output as it arrives, and
//   the part is answered once its last byte is in. Pieces must arrive in
//   offset order without gaps or overlap; anything else fails the operation.
// - A pull with a PulledRows destination (Worker::PullView) leaves its rows
//   in the reply frames when a reply came whole, local, not transient and
//   aligned for floats (the view holds the frames); otherwise the part's
//   values are assembled into one buffer of the view (pieces, lent or
//   transient frames): never more than one copy. The view is reset at Begin.
// - Failover: a part that keeps its request (pushes and pulls) is never
//   failed by an Aborted reply (a server that is not, or no longer, the
//   primary of its keys) sent at a newer map epoch than the part's, or by a
//   server behind the part's epoch: the part is parked until the worker has
//   a map of that epoch (TakeResends). Aborted at the part's own epoch is an
//   error like any other (the map and the server disagree: a bug).
//   TakeResends hands back the parts to send again: parked ones whose epoch
//   has come, and push and pull parts addressed to a server the new map
//   names dead. Parts of other kinds (clocks, tables) addressed to a dead
//   server are answered as done: a lost server needs nothing more from us.
//   Reissue puts the new requests in the old part's place, in the same op.
// - Lost messages: with `silence`, TakeResends also hands back every part
//   that kept its request and has gone unanswered for its server's resend
//   timer (common/retransmit_timer.h: After(k, bytes), where k is how often
//   the part was sent again already and bytes the value and key bytes sent
//   to that server and unanswered when it left, its own included), whatever
//   its kind, for sending again under a new request id (a late answer to the
//   old id is then ignored). Every server request is safe to repeat: pushes
//   are de-duplicated by their sequence number, clocks and tables are
//   idempotent, pulls read, and a server that holds the first send for
//   slower workers keeps holding that one (Envelope.first_request_id).
// - Round trips: every answer (the first message of it, for pieces) that
//   OnReply is given a time for is a sample of its server's timer for its
//   lane (TimerLane: pushes apart from everything else): from
//   when that request id was sent to now, less the time the server says it
//   held the request (PullReply.held_us, ClockAck.held_us). A request id is
//   sent once, so no sample is ambiguous. The part's bytes ahead at its
//   server (its own included) over that round trip are a sample of the
//   server's pace, which sets how long queued bytes are allowed (a server
//   slow to answer large parts is not flooded with resends of them).
// - Links (LinkRestored): when the transport says the connection to a
//   server was made again, every part sent to it and awaiting an answer is
//   due at once (what was on the old connection may be lost), including one
//   whose reply had come in part (it starts over; late pieces of the old id
//   are ignored). While LinkDown says a server's connection is down, its
//   parts are not resent for silence (they would only queue behind it).
//   NextDue says when the next part will be due for silence.
// - Pull ranges: a pull part into the caller's `out` whose scatter is
//   contiguous (Scatter.rows empty) has its rows at out rows [first_row,
//   first_row + num_keys): the values of its reply, in order (pieces at
//   their offset), are exactly the bytes of that run, and the tracker
//   writes nowhere else for it. PullRange names that run while the part is
//   registered (queued, sent, parked, or with part of its reply in); it
//   names none for a part with scattered rows, a pull into a PulledRows
//   view, a part of any other kind, or a request id that is not registered
//   (answered, taken out and sent again under a new id, which names its own
//   run, or its operation ended).
// - Queued parts (transfer scheduling, worker/worker_core.h): a part begun
//   or reissued with `queued` set is registered but not sent yet; it is
//   never resent for silence until MarkSent says it left (its resend timer
//   starts there), while its operation's deadline counts from Begin. It is
//   handed back by TakeResends when its server is dead, and by TakeQueued.
#include <array>
#include <concepts>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "common/clock.h"
#include "common/message.h"
#include "common/retransmit_timer.h"
#include "worker/pulled_rows.h"

namespace tessera {

// The two kinds of answer a server's timers learn apart. A push is answered
// once its backups have it (replication > 1: about two round trips, and a
// wider spread); every other request (pull, clock, table) is answered by
// the server alone. One estimator over both would learn their mixture: a
// mean between the two and a variation as wide as the gap, which times
// every request out late.
enum class TimerLane : uint8_t { kRequests = 0, kPushes = 1 };
inline constexpr size_t kLanes = 2;
inline const char* LaneName(TimerLane lane) { return lane == TimerLane::kPushes ? "pushes" : "requests"; }

// Where a pull's rows go: the caller's `out`, or a view that keeps them in
// the reply frames (see RequestTracker's contract).
struct PullDestination {
  PullDestination() = default;
  template <typename T>
    requires std::convertible_to<T&&, std::span<float>>
  PullDestination(T&& o) : out(std::span<float>(o)) {}  // NOLINT(google-explicit-constructor): as a span converts
  PullDestination(PulledRows* v) : view(v) {}      // NOLINT(google-explicit-constructor)
  std::span<float> out;
  PulledRows* view = nullptr;
};

class RequestTracker {
 public:
  // Opaque completion handle, owned by the caller (the Worker's future state).
  using Handle = std::shared_ptr<void>;

  struct Completion {
    Handle handle;
    absl::Status status;
  };

  // Where a pull part's rows go in the caller's output: either `contiguous`
  // (part row i -> output row first_row + i) or row i -> output row rows[i].
  struct Scatter {
    uint64_t first_row = 0;
    std::vector<uint32_t> rows;  // empty = contiguous
    uint64_t num_keys = 0;
  };

  // How a part is scheduled (worker/worker_core.h, "Transfer scheduling"):
  // kept with the part and handed back with it for a resend.
  struct Transfer {
    int32_t priority = 0;  // lower goes sooner
    uint64_t order = 0;    // issue order (the request id of the part's first request)
    uint64_t bytes = 0;    // value bytes (rows * width * 4, uncompressed)
  };

  struct PartSpec {
    uint64_t request_id;
    uint32_t server_rank;
    Scatter scatter;  // pulls only
    Message request;  // what to send again after a failover or a loss (header unset: never sent again)
    Transfer transfer = {};
    bool queued = false;  // registered, not sent yet (MarkSent)
  };

  // A part taken out for sending again (TakeResends).
  struct Resend {
    uint64_t request_id;
    uint32_t server_rank;
    Scatter scatter;
    Message request;
    uint32_t resends = 0;  // times this part was sent again before (for the next one's backoff)
    Transfer transfer = {};
  };

  // `server_names` name servers by rank in error messages; `retransmit`
  // sets up each server's resend timer.
  explicit RequestTracker(std::vector<std::string> server_names, RetransmitOptions retransmit = {})
      : server_names_(std::move(server_names)), retransmit_(retransmit) {}

  using Destination = PullDestination;

  // Starts an operation. For pulls, `dest` is where the rows go and `width`
  // the row width. `what` describes it in errors ("pull of table 3").
  void Begin(Handle handle, std::string what, std::vector<PartSpec> parts, Nanos deadline, Destination dest = {},
             uint32_t width = 0, Nanos now = 0);

  // Feeds a reply; returns the operation if this reply completed it.
  // `now` (when it arrived; negative: unknown) times its server's round trip.
  std::vector<Completion> OnReply(const Message& reply, Nanos now = -1);
  // Fails operations with a part past its deadline.
  std::vector<Completion> Tick(Nanos now);
  // Fails every operation in flight (job ended, worker closing).
  std::vector<Completion> FailAll(const absl::Status& status);

  // Parts to send again with the map of `epoch` (see the contract); `dead`
  // says whether a server rank is dead in it. Operations that the dropped
  // parts of other kinds complete go to *done.
  // With `silence`, parts silent past their timer at `now` go again too.
  std::vector<Resend> TakeResends(uint64_t epoch, const std::function<bool(uint32_t)>& dead,
                                  std::vector<Completion>* done, Nanos now = 0, bool silence = false);
  // The earliest time a part sent and awaiting its answer comes due for a
  // resend for silence (INT64_MAX: none).
  Nanos NextDue() const;
  // The shortest timer (rto) of any server; the initial one when none was timed.
  Nanos ShortestTimer() const;
  // The connection to server `rank` was made again: its awaiting parts are
  // due now (see the contract). Returns how many.
  size_t LinkRestored(uint32_t rank);
  // The connection to server `rank` is down (true) or up again (false).
  void LinkDown(uint32_t rank, bool down);
  // Puts `parts` in the place of the part `old` was taken from (sent at
  // `now`). With no parts, the old part counts as answered (its op may
  // complete: returned).
  std::vector<Completion> Reissue(const Resend& old, std::vector<PartSpec> parts, Nanos now = 0);
  // Parked parts waiting for a newer map.
  size_t parked() const;

  // Queued parts (see the contract). MarkSent: part `request_id` left now
  // (its resend timer starts); unknown or not queued: nothing.
  void MarkSent(uint64_t request_id, Nanos now);
  // Whether the part is registered and still queued.
  bool Queued(uint64_t request_id) const;
  // Whether the part was sent and awaits its answer (not queued, not parked).
  bool Awaiting(uint64_t request_id) const;
  // Takes out, for Reissue, the queued parts for which `take(server_rank,
  // request)` is true (in issue order).
  std::vector<Resend> TakeQueued(const std::function<bool(uint32_t, const Message&)>& take);
  size_t queued() const;

  size_t in_flight() const { return ops_.size(); }

  // What a server owes us: its oldest unanswered part (by when its
  // operation began) and how many parts it owes in all.
  struct Owed {
    uint32_t server_rank = 0;
    std::string server;     // "server 1 (ADDRESS)"
    std::string what;       // the oldest part's operation, as begun ("pull from table 0 at clock 5")
    uint64_t request_id = 0;
    Nanos waited = 0;       // since that operation began
    Nanos left = 0;         // until its deadline
    uint32_t resends = 0;   // times that part was sent again for silence
    bool parked = false;    // waiting for a newer map, not for the server
    bool queued = false;    // not sent yet (transfer scheduling)
    size_t parts = 0;       // parts this server owes, this one included
  };
  // One entry per server that owes a part whose operation began at least
  // `older_than` before `now`, the longest wait first: what a waiting
  // worker reports (worker/worker.h, "Waiting").
  std::vector<Owed> OwedBy(Nanos now, Nanos older_than) const;
  // The number of values the pull part `request_id` expects (its keys times
  // the row width); 0 for an unknown request or one that is not a pull.
  uint64_t ExpectedValues(uint64_t request_id) const;
  // The run of the caller's `out` that the reply to pull part `request_id`
  // fills, where it fills one run (see the contract, "Pull ranges").
  struct OutRange {
    const void* op = nullptr;  // its operation's handle (Handle::get()): one per Begin
    uint64_t first_row = 0;    // rows of `out`, each of the pull's width
    uint64_t rows = 0;
    std::span<float> values;   // out[first_row * width, (first_row + rows) * width)
  };
  std::optional<OutRange> PullRange(uint64_t request_id) const;
  uint64_t ignored_replies() const { return ignored_replies_; }
  // Each server's resend timer per lane and how many parts of that lane
  // went to it again, by rank then lane. A lane never answered nor resent
  // is left out; a server with neither shows on the requests lane; servers
  // never sent to are left out.
  struct ServerTimer {
    uint32_t rank = 0;
    TimerLane lane = TimerLane::kRequests;
    Nanos rto = 0, smoothed = 0, variation = 0;
    uint64_t samples = 0;
    uint64_t resends = 0;  // parts of the lane sent again for silence or after a restored link
    bool link_down = false;
  };
  std::vector<ServerTimer> Timers() const;
  // Replies whose lent values could not be read because their server was
  // gone (Buffer::CopyOut Unavailable); each was treated as never received.
  uint64_t lost_lent_replies() const { return lost_lent_replies_; }
  // Error replies of code Unavailable: the server could not serve the part
  // now (busy: its answers to this worker wait to be written out; or no
  // shard map yet). Each is treated as no answer: the part goes again when
  // its resend timer runs out (backing off), and an operation that times
  // out meanwhile says what its servers last answered.
  uint64_t unavailable_replies() const { return unavailable_replies_; }

 private:
  struct Op {
    Handle handle;
    std::string what;
    std::span<float> out;
    PulledRows* view = nullptr;  // set: rows stay in frames (out unused)
    uint32_t width = 0;
    Nanos deadline = 0;
    Nanos begun = 0;  // Begin's `now`
    uint64_t serial = 0;  // Begin's order: ops that end together end in it
    size_t remaining = 0;
    absl::Status status;
    std::vector<uint64_t> request_ids;
    std::string unavailable;  // the last Unavailable answer, with its server's name
  };
  struct Part {
    Op* op;
    uint32_t server_rank;
    Scatter scatter;
    Message request;         // kept for a resend (pushes and pulls)
    uint64_t received = 0;   // value bytes placed so far (pulls in pieces)
    Buffer assembled;        // view pulls: the values, when they cannot stay in their frame
    bool parked = false;     // answered Aborted: waits for the map of ready_epoch
    uint64_t ready_epoch = 0;
    Nanos sent_at = 0;
    uint32_t resends = 0;    // times sent again because nobody answered
    Transfer transfer;
    bool queued = false;     // not sent yet: no resend timer
    bool due = false;        // its link was restored: resend now
    uint64_t wire_bytes = 0;   // request frames plus the values expected back
    uint64_t ahead_bytes = 0;  // wire bytes awaiting at its server when it left, its own included
    bool counted = false;      // wire_bytes are in awaiting_[server_rank]
  };
  // Per server: its timer, the wire bytes of its parts awaiting an answer,
  // resends for silence, and whether its link is down.
  struct Peer {
    std::array<RetransmitTimer, kLanes> timers;  // by TimerLane
    uint64_t awaiting = 0;
    std::array<uint64_t, kLanes> resends{};       // by TimerLane
    bool link_down = false;
  };
  Peer& PeerOf(uint32_t rank);
  // The timer lane of a part: pushes, or every other kind.
  static TimerLane LaneOf(const Part& part);
  static void SortBySerial(std::vector<Op*>& ops);
  // Part `part` left at `now`: its timer starts and its bytes count.
  void Sent(Part& part, Nanos now);
  // Its bytes no longer count (answered, taken out, or its op ended).
  void Uncount(Part& part);
  bool SilentPast(const Part& part, Nanos now) const;
  Nanos DueAt(const Part& part) const;
  // Applies a reply (or one piece of it) to its part; sets *part_done when
  // the part needs nothing more (it answered, or failed).
  absl::Status ApplyReply(Part& part, const Message& reply, bool* part_done);
  // Places bytes [offset, offset + len) of `part`'s values, which `frame`
  // holds from its start, in the op's destination; `done`: they complete it.
  absl::Status Place(Part& part, const Buffer& frame, uint64_t offset, uint64_t len, bool done);
  Completion Finish(Op* op);
  std::string ServerName(uint32_t rank) const;

  std::vector<std::string> server_names_;
  RetransmitOptions retransmit_;
  absl::flat_hash_map<uint32_t, Peer> peers_;
  // Invariant: every Part's op is in ops_; an op's request_ids are exactly
  // the parts in parts_ that point to it plus those already answered.
  absl::flat_hash_map<Op*, std::unique_ptr<Op>> ops_;
  uint64_t next_op_serial_ = 0;
  absl::flat_hash_map<uint64_t, Part> parts_;
  absl::flat_hash_map<uint64_t, Op*> resend_ops_;  // parts taken by TakeResends, not yet reissued
  uint64_t ignored_replies_ = 0;
  uint64_t lost_lent_replies_ = 0;
  uint64_t unavailable_replies_ = 0;
  std::vector<std::byte> scratch_;  // lent values of small scattered rows are read whole into this first
};

}  // namespace tessera

#pragma once
// PostedPulls: the Worker shell's book of the pull destinations it posted
// with its transport (Transport::PostDestination), so that a large pull
// reply is written straight into the caller's `out` and Pull copies
// nothing (WorkerStats::pull_replies_in_place). Pure: no transport, no
// locks; it says what to post and what to cancel, the shell (worker/
// worker.cc) does it, under its mutex, around the WorkerCore's calls.
//
// Contract:
// - Which memory a request's reply fills is the core's word alone
//   (WorkerCore::PullRange, worker/worker_core.h "Pull ranges"): Placeable
//   says whether a message is a pull request whose reply fills one run of
//   an `out` of at least kMinPlacedBytes, and names that run; the shell
//   posts it as the destination of the reply's values frame (frame 0) and,
//   when the transport took it, records it with Posted. Smaller replies
//   are not worth it: the transports place only frames they do not send
//   inline, and the copy is cheap.
// - TakePlaced(reply): a pull reply whose one values frame is the posted
//   destination of its request (the transport wrote it there: the frame
//   views that very memory) has its posting used up: forgotten, and the
//   frame replaced by one that reads into its own place without copying
//   (the tracker then copies nothing). Returns whether it was so.
// - Cancels: every posting still recorded is cancelled before its
//   operation completes (Withdraw with the completions), and once its
//   request was sent again under a new id (Withdraw after a call that sent
//   parts again: every posting whose request the core no longer names a
//   run for, which includes a request answered without using it), so that
//   the transport writes nothing into `out` once the caller has it back,
//   nor an old request's reply over rows asked for again. Withdraw forgets
//   what it hands back; the shell cancels those (Transport::
//   CancelDestination) before it completes the operations, and without
//   its mutex (a cancel may wait for a write in progress).
// Invariant: every recorded posting is of an operation that has not
// completed (postings are kept by operation, so that ending one is a lookup).
// Thread safety: none; the shell serializes calls.
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "common/message.h"
#include "worker/request_tracker.h"
#include "worker/worker_core.h"

namespace tessera {

class PostedPulls {
 public:
  // A destination posted with the transport: the request it awaits, and
  // the server the reply comes from.
  struct Posting {
    std::string to;
    uint64_t request_id = 0;
  };

  static constexpr size_t kMinPlacedBytes = 64 * 1024;

  PostedPulls() = default;
  PostedPulls(const PostedPulls&) = delete;
  PostedPulls& operator=(const PostedPulls&) = delete;

  // The run of `out` to post for `request` (a message the core sends), or
  // nothing: not a pull, its rows scattered or in a view, or under
  // kMinPlacedBytes.
  static std::optional<RequestTracker::OutRange> Placeable(const Message& request, const WorkerCore& core);
  // The transport took a destination for `request_id` (to `to`), the run `range`.
  void Posted(const RequestTracker::OutRange& range, std::string to, uint64_t request_id);
  // See the contract. `core` still has the reply's request (before OnReply).
  bool TakePlaced(Message& reply, const WorkerCore& core);
  // The postings to cancel after a core call that completed `done` and
  // sent `resent_parts` parts again (see the contract).
  std::vector<Posting> Withdraw(const std::vector<RequestTracker::Completion>& done, uint64_t resent_parts,
                                const WorkerCore& core);

  size_t size() const;

 private:
  // Operation (handle) -> its postings: request id -> the server.
  absl::flat_hash_map<const void*, absl::flat_hash_map<uint64_t, std::string>> by_op_;
};

}  // namespace tessera

#pragma once
// BackupStreams: a primary's side of replication. One ordered stream of
// forwards (pushes' rows, state transfers) per backup, each forward kept
// until the backup acknowledges it, and one resend timer per backup. A part
// of ServerCore (docs/design.md, "Server parts"): the core decides what to
// forward and to whom, stamps each message with its map epoch and address,
// and answers the pushes whose forwards are done.
//
// Contract:
// - To(rank, node) is the stream to backup `rank`; one that does not exist
//   is begun with a new id (ids count from 1 for the life of the part, so a
//   stream that ended and begins again is told apart: Replicate.stream) at
//   position 1, bound to process `node`.
// - Append(stream, message, push_id, now, carried, more) gives `message` the
//   stream's id and its next position and keeps it, in position order,
//   until acknowledged; it returns the kept forward (to send now).
// - Acked(rank, stream, position, gap, now): a backup's ack of every
//   position <= `position` of that stream. Those forwards are removed and
//   returned (done), in order. The backup's timer takes a round-trip sample
//   only from an ack that names the front forward alone, that was sent once,
//   and is not a gap notice. A gap notice (gap = true: the backup has a
//   later forward and misses position + 1) also returns the forward at
//   position + 1, for sending at once, the first time only. An ack of
//   another stream (one that ended) or of a rank without a stream does
//   nothing.
// - Refused(rank, stream, position) removes and returns the forward at
//   that position (the backup refused it), if any.
// - TakeDue(rank, now, due_only) returns copies of the stream's forwards to
//   send now, in position order: all of them, or (due_only) those whose
//   timer passed: sent + timer.After(resends, bytes of the stream's
//   forwards up to and including it). Each returned forward counts as sent
//   again at `now` (resends + 1). Resend(forward, now) does the same for one.
// - AckedThrough(rank, stream) is the last position of that stream the
//   backup acknowledged (all before it too), or UINT64_MAX if that stream
//   ended. SentThrough(rank) is (stream id, last position given), or
//   nullopt without a stream.
// - NextDue() is the earliest time TakeDue(due_only) has something
//   (INT64_MAX: never); ShortestTimer() the shortest timer of any backup
//   (a fresh timer's if none has one).
// Pure: no I/O, threads or clocks (time is passed in). Thread safety: none;
// the caller serializes.
#include <cstdint>
#include <deque>
#include <optional>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "common/clock.h"
#include "common/message.h"
#include "common/retransmit_timer.h"

namespace tessera {

struct Forward {
  uint64_t position;
  uint64_t push_id;  // the push that waits on it (0: none)
  Message message;   // header without epoch; stamped at each send
  Nanos sent;        // last sent
  std::vector<uint64_t> carried = {};  // pushes that also wait on this one (a transfer that replaced a stream)
  uint32_t resends = 0;                // times sent again (its round trip is then ambiguous)
  bool gap_resent = false;             // sent again for a backup's gap notice (once)
  bool more = false;                   // a transfer whose rows go on in the next position: not in sync before it
};

struct BackupStream {
  uint64_t id = 0;       // Replicate.stream: this server's streams, numbered from 1
  uint32_t node_id = 0;  // the process the stream goes to (a restarted rank starts a new stream)
  uint64_t next_position = 1;
  std::deque<Forward> unacked;  // position order
};

class BackupStreams {
 public:
  explicit BackupStreams(RetransmitOptions resend) : resend_(resend) {}

  BackupStream& To(uint32_t rank, uint32_t node_id);
  BackupStream* Find(uint32_t rank);
  void End(uint32_t rank) { streams_.erase(rank); }
  void Clear() { streams_.clear(); }
  // Every rank with a stream, ascending.
  std::vector<uint32_t> Ranks() const;

  const Forward& Append(BackupStream& stream, Message message, uint64_t push_id, Nanos now,
                        std::vector<uint64_t> carried = {}, bool more = false);

  struct AckResult {
    std::vector<Forward> done;           // acknowledged, in position order
    std::optional<Message> gap_resend;  // a gap notice's missing forward, to send now
  };
  AckResult Acked(uint32_t rank, uint64_t stream, uint64_t position, bool gap, Nanos now);
  std::optional<Forward> Refused(uint32_t rank, uint64_t stream, uint64_t position);

  std::vector<Message> TakeDue(uint32_t rank, Nanos now, bool due_only);
  static Message Resend(Forward& f, Nanos now);

  uint64_t AckedThrough(uint32_t rank, uint64_t stream) const;
  std::optional<std::pair<uint64_t, uint64_t>> SentThrough(uint32_t rank) const;

  size_t unacked() const;
  Nanos NextDue() const;
  Nanos ShortestTimer() const;
  // Each backup's timer, rank order (backups that were sent anything).
  std::vector<std::pair<uint32_t, RetransmitTimer>> Timers() const;

 private:
  RetransmitTimer& TimerOf(uint32_t rank);
  const RetransmitOptions resend_;
  uint64_t next_stream_id_ = 1;
  absl::flat_hash_map<uint32_t, BackupStream> streams_;   // backup rank -> forwards
  absl::flat_hash_map<uint32_t, RetransmitTimer> timers_;  // backup rank -> its forwards' resend timer
};

}  // namespace tessera

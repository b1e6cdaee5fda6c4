#pragma once
// Answers: the bodies of the replies ServerCore builds for pulls, clock
// advances and queries, forwards, and requests held too long or too many,
// as pure functions. A part of ServerCore (docs/design.md, "Server parts"):
// the core decides what to answer and when; these fill in the reply.
//
// Contract:
// - FillPullReply(pull, values, min_clock, held_for, codec, tensor_id,
//   reply, bytes_out): makes `reply` the PullReply of `pull` with `values`
//   (its rows, in key order): keys, row width, the min clock, the time held
//   (µs), the staleness (how far the pull's clock is past the min clock; 0
//   when it is not, or with no workers) and whole (Pull.whole). With a
//   `codec` (the table's pull compression) the values go as encoded parts
//   (value_parts set) unless the codec left them raw; else as one frame.
//   Adds the values' bytes as sent to *bytes_out. An encoding error is
//   returned (the reply is then to be an Error).
// - FillClockAck(sender, clocks, min_clock, held_for, reply): the ClockAck
//   of a known worker: the min clock, the time held (µs) and the worker's
//   own clock (0 once it left); NotFound for a node that is not a worker.
// - HeldTooLongError(h, waited, clocks, required): the DeadlineExceeded of
//   a pull or clock advance held past its hold timeout, naming the request,
//   how long it waited and the workers behind `required`.
// - TooManyHeldError(held, from, max): the ResourceExhausted of a request
//   past max_held_per_peer.
// - ReplicateAckOf(sender_id, epoch, stream, position, rejection, stale,
//   gap): a backup's ReplicateAck of a forward's position; a rejection
//   (non-OK) sets rejected, stale_epoch and its reason.
// Pure: no I/O, threads or clocks. Thread safety: none needed (no state).
#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "common/buffer.h"
#include "common/clock.h"
#include "common/message.h"
#include "compress/codec.h"
#include "proto/tessera.pb.h"
#include "server/clock_table.h"

namespace tessera {

absl::Status FillPullReply(const proto::Pull& pull, Buffer values, uint64_t min_clock, Nanos held_for,
                           const compress::Codec* codec, uint64_t tensor_id, Message& reply, uint64_t* bytes_out);
absl::Status FillClockAck(uint32_t sender, const ClockTable& clocks, uint64_t min_clock, Nanos held_for,
                          Message& reply);
absl::Status HeldTooLongError(const proto::Envelope& h, Nanos waited, const ClockTable& clocks, uint64_t required);
absl::Status TooManyHeldError(size_t held, const std::string& from, size_t max);
Message ReplicateAckOf(uint32_t sender_id, uint64_t epoch, uint64_t stream, uint64_t position,
                       const absl::Status& rejection, bool stale, bool gap);

}  // namespace tessera

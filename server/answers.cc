#include "server/answers.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "compress/row_compressor.h"

namespace tessera {

absl::Status FillPullReply(const proto::Pull& pull, Buffer values, uint64_t min_clock, Nanos held_for,
                           const compress::Codec* codec, uint64_t tensor_id, Message& reply, uint64_t* bytes_out) {
  reply.unsplit = pull.whole();
  auto* pr = reply.header.mutable_pull_reply();
  pr->set_num_keys(pull.num_keys());
  pr->set_width(values.size() / sizeof(float) / std::max<uint64_t>(1, pull.num_keys()));
  pr->set_min_clock(min_clock);
  pr->set_held_us(held_for / 1000);
  const bool fresh = min_clock == ClockTable::kNoWorkers || min_clock >= pull.clock();
  pr->set_staleness(fresh ? 0 : pull.clock() - min_clock);
  if (codec != nullptr) {
    auto encoded = compress::EncodeValues(*codec, values.As<float>(), tensor_id);
    if (!encoded.ok()) return encoded.status();
    if (!encoded->raw) {
      pr->set_value_parts(static_cast<uint32_t>(encoded->parts.size()));
      *bytes_out += encoded->wire_bytes;
      for (Buffer& b : encoded->parts) reply.frames.push_back(std::move(b));
      return absl::OkStatus();
    }
  }
  *bytes_out += values.size();
  reply.frames.push_back(std::move(values));
  return absl::OkStatus();
}

absl::Status FillClockAck(uint32_t sender, const ClockTable& clocks, uint64_t min_clock, Nanos held_for,
                          Message& reply) {
  if (!clocks.IsKnown(sender)) {
    return absl::NotFoundError(absl::StrCat("node ", sender, " is not a worker of this job"));
  }
  auto* ack = reply.header.mutable_clock_ack();
  ack->set_min_clock(min_clock);
  ack->set_held_us(held_for / 1000);
  const uint64_t mine = clocks.ClockOf(sender);
  ack->set_worker_clock(mine == ClockTable::kNoWorkers ? 0 : mine);  // 0 once it left
  return absl::OkStatus();
}

absl::Status HeldTooLongError(const proto::Envelope& h, Nanos waited, const ClockTable& clocks, uint64_t required) {
  std::string what = h.has_pull() ? absl::StrCat("pull of table ", h.pull().table_id(), " at clock ", h.pull().clock())
                                  : absl::StrCat("clock ", h.clock_advance().clock());
  return absl::DeadlineExceededError(absl::StrCat(what, " waited ", waited / kMillis, " ms for slower workers: ",
                                                  clocks.DescribeBehind(required),
                                                  " (needs every live worker at clock >= ", required, ")"));
}

absl::Status TooManyHeldError(size_t held, const std::string& from, size_t max) {
  return absl::ResourceExhaustedError(absl::StrCat(held, " requests of ", from,
                                                   " are held already, waiting for slower workers; ",
                                                   "this server holds at most ", max,
                                                   " per sender (tessera-server --max-held-per-peer)"));
}

Message ReplicateAckOf(uint32_t sender_id, uint64_t epoch, uint64_t stream, uint64_t position,
                       const absl::Status& rejection, bool stale, bool gap) {
  Message reply;
  reply.header.set_sender_id(sender_id);
  reply.header.set_epoch(epoch);
  auto* a = reply.header.mutable_replicate_ack();
  a->set_position(position);
  a->set_stream(stream);
  a->set_gap(gap);
  if (!rejection.ok()) {
    a->set_rejected(true);
    a->set_stale_epoch(stale);
    a->set_reason(std::string(rejection.message()));
  }
  return reply;
}

}  // namespace tessera

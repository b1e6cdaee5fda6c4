#include "rdma/endpoint_rendezvous.h"

#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "rdma/endpoint_connection.h"
#include "rdma/invariant.h"

namespace tessera::rdma {

uint64_t LastChunkBytes(uint64_t length, uint64_t chunk) {
  if (length == 0 || chunk == 0) return 0;
  const uint64_t rem = length % chunk;
  return rem == 0 ? chunk : rem;
}

void EndpointCore::ArrangeDestination(Connection& c, InboundRendezvous& rz, uint64_t request_id, Actions& out) {
  if (rz.part >= 1) {
    const std::pair<uint64_t, uint32_t> key{request_id, static_cast<uint32_t>(rz.part - 1)};
    auto it = posted_destinations_.find(key);
    if (it != posted_destinations_.end()) {
      if (it->second.size() == rz.length) {
        ++stats_.preposted_hits;
        Buffer dest = std::move(it->second);
        posted_destinations_.erase(it);
        rz.register_address = dest.data();
        rz.register_bytes = dest.size();
        rz.register_owner = dest.owner();
        rz.destination = std::move(dest);
        rz.posted_key = key;
      } else {
        // Not this frame's (a reply of another shape, say a compressed
        // one): it goes to a pool block, the destination stays posted.
        ++stats_.preposted_mismatches;
      }
    }
  }
  if (rz.destination.empty()) {
    DestinationPool::Destination d = destinations_.Get(rz.length);
    rz.destination = std::move(d.buffer);
    rz.register_address = d.block_address;
    rz.register_bytes = d.block_bytes;
    rz.register_owner = std::move(d.owner);
  }
  if (!TryRegisterDestination(c, rz, out)) {
    ++stats_.registration_waits;
    registration_waiters_.emplace_back(c.id, rz.tag);
  }
}

bool EndpointCore::TryRegisterDestination(Connection& c, InboundRendezvous& rz, Actions& out) {
  absl::StatusOr<RegistrationCache::Lease> lease =
      cache_.Acquire(rz.register_address, rz.register_bytes, rz.register_owner);
  if (lease.ok()) {
    rz.lease = *lease;
    rz.state = InboundRendezvous::State::kWaitData;
    rz.deadline = now_ + 2 * config_.rendezvous_timeout_ticks;
    ClearToSend cts{rz.tag, reinterpret_cast<uint64_t>(rz.destination.data()), rz.length, lease->rkey};
    c.control.push_back(ControlMessage{.type = WireType::kClearToSend, .cts = cts});
    return true;
  }
  if (lease.status().code() == absl::StatusCode::kResourceExhausted) return false;  // wait for room
  const AbortReason reason = lease.status().code() == absl::StatusCode::kOutOfRange ? AbortReason::kTooLarge
                                                                                     : AbortReason::kRegistrationFailed;
  const uint32_t tag = rz.tag;
  const uint64_t seq = rz.message_seq;
  c.control.push_back(ControlMessage{.type = WireType::kRefuse, .tag = tag, .reason = reason});
  c.inbound.erase(tag);  // rz is gone from here on
  ++stats_.rendezvous_failed;
  FailInbound(c, seq,
              PeerError(c, absl::StatusCode::kResourceExhausted,
                        absl::StrCat("cannot receive rendezvous tag ", tag, ": ", lease.status().message())),
              out);
  return true;
}

void EndpointCore::HandleClearToSend(Connection& c, const ClearToSend& cts, Actions& out) {
  auto it = c.outbound.find(cts.tag);
  if (it == c.outbound.end()) {
    ++stats_.unknown_tags;
    Problem(c, PeerError(c, absl::StatusCode::kNotFound,
                         absl::StrCat("clear-to-send for unknown rendezvous tag ", cts.tag, " (ignored)")),
            out);
    return;
  }
  OutboundRendezvous& rz = it->second;
  if (rz.state != OutboundRendezvous::State::kWaitClearToSend) {
    ++stats_.duplicate_clear_to_send;
    Problem(c, PeerError(c, absl::StatusCode::kAlreadyExists,
                         absl::StrCat("duplicate clear-to-send for rendezvous tag ", cts.tag, " (ignored)")),
            out);
    return;
  }
  if (cts.length != rz.data.size()) {
    ++stats_.length_mismatches;
    ++stats_.rendezvous_failed;
    const uint64_t seq = rz.message_seq;
    Problem(c, PeerError(c, absl::StatusCode::kInvalidArgument,
                         absl::StrCat("clear-to-send for rendezvous tag ", cts.tag, " offers ", cts.length,
                                      " bytes, the part has ", rz.data.size(), "; message dropped")),
            out);
    c.control.push_back(ControlMessage{.type = WireType::kCancel, .tag = cts.tag, .reason = AbortReason::kLengthMismatch});
    c.outbound.erase(it);
    ++stats_.messages_dropped;
    FailOutbound(c, seq, out);
    return;
  }
  rz.state = OutboundRendezvous::State::kWriting;
  rz.cts = cts;
  if (rz.data.size() >= config_.rendezvous_threshold) {
    absl::StatusOr<RegistrationCache::Lease> lease = cache_.Acquire(rz.data.data(), rz.data.size(), rz.data.owner());
    if (lease.ok()) rz.lease = *lease;  // otherwise: staged through the pool
  }
  if (rz.lease) {
    ++stats_.rendezvous_zero_copy;
  } else {
    ++stats_.rendezvous_staged;
  }
  c.writes.push_back(cts.tag);
}

void EndpointCore::HandleCancel(Connection& c, uint32_t tag, uint32_t reason, Actions& out) {
  auto it = c.inbound.find(tag);
  if (it == c.inbound.end()) {
    ++stats_.unknown_tags;
    Problem(c, PeerError(c, absl::StatusCode::kNotFound, absl::StrCat("cancel for unknown rendezvous tag ", tag)),
            out);
    return;
  }
  const uint64_t seq = it->second.message_seq;
  if (it->second.lease) cache_.Release(it->second.lease->entry);  // the sender promised not to write it
  c.inbound.erase(it);
  ++stats_.rendezvous_failed;
  FailInbound(c, seq,
              PeerError(c, absl::StatusCode::kAborted,
                        absl::StrCat("sender cancelled rendezvous tag ", tag, ": ", AbortReasonName(reason))),
              out);
}

void EndpointCore::HandleRefuse(Connection& c, uint32_t tag, uint32_t reason, Actions& out) {
  auto it = c.outbound.find(tag);
  if (it == c.outbound.end()) {
    ++stats_.unknown_tags;
    Problem(c, PeerError(c, absl::StatusCode::kNotFound, absl::StrCat("refusal of unknown rendezvous tag ", tag)),
            out);
    return;
  }
  if (it->second.state != OutboundRendezvous::State::kWaitClearToSend) {
    ++stats_.protocol_violations;
    Problem(c, PeerError(c, absl::StatusCode::kFailedPrecondition,
                         absl::StrCat("refusal of rendezvous tag ", tag, " after clear-to-send (ignored)")),
            out);
    return;
  }
  const uint64_t seq = it->second.message_seq;
  const uint64_t bytes = it->second.data.size();
  c.outbound.erase(it);
  ++stats_.rendezvous_failed;
  ++stats_.messages_dropped;
  Problem(c, PeerError(c, absl::StatusCode::kAborted,
                       absl::StrCat("refused rendezvous tag ", tag, " (", bytes, " bytes): ", AbortReasonName(reason),
                                    "; message dropped")),
          out);
  FailOutbound(c, seq, out);
}

void EndpointCore::HandleImmediate(Connection& c, uint32_t tag, uint32_t byte_len, Actions& out) {
  auto it = c.inbound.find(tag);
  if (it == c.inbound.end() || it->second.state != InboundRendezvous::State::kWaitData) {
    ++stats_.unknown_tags;
    Problem(c, PeerError(c, absl::StatusCode::kNotFound,
                         absl::StrCat("write with immediate for ",
                                      it == c.inbound.end() ? "unknown" : "not yet cleared", " rendezvous tag ", tag,
                                      " (ignored)")),
            out);
    return;
  }
  InboundRendezvous rz = std::move(it->second);
  c.inbound.erase(it);
  if (rz.lease) cache_.Release(rz.lease->entry);
  const bool length_ok = byte_len == rz.length || byte_len == LastChunkBytes(rz.length, c.peer_slot_bytes);
  if (!length_ok) {
    ++stats_.length_mismatches;
    ++stats_.rendezvous_failed;
    FailInbound(c, rz.message_seq,
                PeerError(c, absl::StatusCode::kDataLoss,
                          absl::StrCat("rendezvous tag ", tag, " wrote ", byte_len, " bytes; expected ", rz.length)),
                out);
    return;
  }
  ++stats_.rendezvous_received;
  InboundMessage* m = c.FindInbound(rz.message_seq);
  if (m == nullptr || m->failed) return;
  m->parts[rz.part] = std::move(rz.destination);
  --m->pending;
}

void EndpointCore::FailInbound(Connection& c, uint64_t seq, const absl::Status& status, Actions& out) {
  InboundMessage* m = c.FindInbound(seq);
  if (m == nullptr || m->failed) return;
  m->failed = true;
  m->parts.clear();
  ++stats_.messages_dropped;
  Problem(c, absl::Status(status.code(), absl::StrCat(status.message(), "; message dropped")), out);
  // Parts still waiting for room are refused; parts cleared to send stay
  // until their data or the sender's cancel arrives (the peer may be writing).
  std::vector<uint32_t> refuse;
  for (auto& [tag, rz] : c.inbound) {
    if (rz.message_seq == seq && rz.state == InboundRendezvous::State::kWaitRegistration) refuse.push_back(tag);
  }
  for (uint32_t tag : refuse) {
    c.inbound.erase(tag);
    ++stats_.rendezvous_failed;
    c.control.push_back(ControlMessage{.type = WireType::kRefuse, .tag = tag, .reason = AbortReason::kMessageFailed});
  }
}

void EndpointCore::FailOutbound(Connection& c, uint64_t seq, Actions& out) {
  (void)out;
  std::vector<uint32_t> cancel;
  for (auto& [tag, rz] : c.outbound) {
    if (rz.message_seq == seq && rz.state == OutboundRendezvous::State::kWaitClearToSend) cancel.push_back(tag);
  }
  for (uint32_t tag : cancel) {
    c.outbound.erase(tag);
    ++stats_.rendezvous_failed;
    c.control.push_back(ControlMessage{.type = WireType::kCancel, .tag = tag, .reason = AbortReason::kMessageFailed});
  }
}

// ---------------------------------------------------------------- destinations posted in advance

absl::Status EndpointCore::PostDestination(uint64_t request_id, uint32_t frame_index, Buffer destination) {
  if (destination.empty()) return absl::InvalidArgumentError("empty destination buffer");
  auto [it, inserted] = posted_destinations_.try_emplace({request_id, frame_index}, std::move(destination));
  if (!inserted) {
    return absl::AlreadyExistsError(
        absl::StrCat("a destination is already posted for request ", request_id, " frame ", frame_index));
  }
  return absl::OkStatus();
}

bool EndpointCore::CancelDestination(uint64_t request_id, uint32_t frame_index) {
  return posted_destinations_.erase({request_id, frame_index}) > 0;
}

EndpointCore::CancelResult EndpointCore::CancelDestination(uint64_t request_id, uint32_t frame_index,
                                                           Actions& out) {
  if (CancelDestination(request_id, frame_index)) return CancelResult::kCancelled;
  const std::pair<uint64_t, uint32_t> key{request_id, frame_index};
  for (auto& [id, c] : connections_) {
    for (auto& [tag, rz] : c->inbound) {
      if (rz.posted_key != key) continue;
      rz.posted_key.reset();
      if (rz.state == InboundRendezvous::State::kWaitRegistration) {
        // Nothing named the memory to the peer yet: take a pool block instead.
        DestinationPool::Destination d = destinations_.Get(rz.length);
        rz.destination = std::move(d.buffer);
        rz.register_address = d.block_address;
        rz.register_bytes = d.block_bytes;
        rz.register_owner = std::move(d.owner);
      } else {
        Disconnect(*c,
                   PeerError(*c, absl::StatusCode::kCancelled,
                             absl::StrCat("the destination posted for request ", request_id, " frame ", frame_index,
                                          " was cancelled while the peer may still write into it")),
                   out);
      }
      return CancelResult::kTaken;
    }
  }
  return CancelResult::kNotPosted;
}

}  // namespace tessera::rdma

#include "rdma/endpoint_receiving.h"

#include <algorithm>
#include <climits>
#include <iterator>
#include <optional>
#include <span>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "rdma/endpoint_auth.h"
#include "rdma/endpoint_connection.h"
#include "rdma/invariant.h"

namespace tessera::rdma {

namespace {

const char* WireTypeName(WireType type) {
  switch (type) {
    case WireType::kMessage: return "a message";
    case WireType::kCreditUpdate: return "a credit update";
    case WireType::kClearToSend: return "a clear-to-send";
    case WireType::kCancel: return "a cancel";
    case WireType::kRefuse: return "a refusal";
    case WireType::kHello: return "a hello";
    case WireType::kAuthChallenge: return "an authentication challenge";
    case WireType::kAuthProof: return "an authentication proof";
  }
  return "an unknown message";
}

}  // namespace

void EndpointCore::OnReceiveCompleted(uint64_t wr_id, uint32_t byte_len, std::optional<uint32_t> immediate,
                                      Actions& out) {
  auto it = work_.find(wr_id);
  if (it == work_.end() || it->second.kind != WorkKind::kReceive) return;
  const Work work = it->second;
  work_.erase(it);
  Connection* c = Find(work.connection);
  RDMA_CHECK(c != nullptr && work.slot.has_value());
  const uint32_t slot = *work.slot;
  --c->posted_receives;
  auto repost = [&] {
    const uint64_t wr = NewWork(Work{c->id, WorkKind::kReceive, slot});
    out.push_back(PostReceiveAction{c->id, wr, pool_.Address(slot), static_cast<uint32_t>(pool_.slot_bytes()),
                                    pool_.lkey()});
    ++c->posted_receives;
  };
  if (c->disconnecting && !c->authenticated) {
    repost();  // a connection being refused: whatever else it sends is not even looked at
    return;
  }
  if (!c->credits) {
    // Nothing may arrive before the handshake is known (the passive side knows it from the request).
    repost();
    ++stats_.protocol_violations;
    Problem(*c, PeerError(*c, absl::StatusCode::kFailedPrecondition, "data before the connection was established"),
            out);
    return;
  }
  if (immediate && !c->authenticated) {
    repost();
    RefuseAuthentication(*c, "it wrote with immediate before proving it holds the job key", out);
    return;
  }
  if (immediate) {
    repost();
    if (absl::Status s = c->credits->OnRegularReceived(); !s.ok()) {
      ++stats_.protocol_violations;
      Problem(*c, PeerError(*c, absl::StatusCode::kFailedPrecondition, std::string(s.message())), out);
    }
    HandleImmediate(*c, *immediate, byte_len, out);
  } else {
    const size_t n = std::min<size_t>(byte_len, pool_.slot_bytes());
    // HandleSend copies what it keeps out of the slot before the repost.
    HandleSend(*c, std::span<const std::byte>(pool_.Memory(slot).data(), n), out);
    repost();
  }
  Deliver(*c, out);
  Pump(*c, out);
  ServeWaiters(out);
}

void EndpointCore::HandleSend(Connection& c, std::span<const std::byte> bytes, Actions& out) {
  absl::StatusOr<WireFrame> frame = ParseWire(bytes, config_.max_data_frames + 1);
  if (!frame.ok() && !c.authenticated) {
    ++stats_.malformed_received;
    RefuseAuthentication(c, absl::StrCat("it sent a malformed message before proving it holds the job key: ",
                                         frame.status().message()),
                         out);
    return;
  }
  if (!c.authenticated && frame->type != WireType::kAuthChallenge && frame->type != WireType::kAuthProof &&
      frame->type != WireType::kHello && frame->type != WireType::kCreditUpdate) {
    RefuseAuthentication(c, absl::StrCat("it sent ", WireTypeName(frame->type), " before proving it holds the job key"),
                         out);
    return;
  }
  if (!frame.ok()) {
    ++stats_.malformed_received;
    (void)c.credits->OnRegularReceived();  // most likely a regular send; the peer is broken anyway
    Problem(c, PeerError(c, absl::StatusCode::kInvalidArgument, std::string(frame.status().message())), out);
    return;
  }
  if (frame->type != WireType::kCreditUpdate) {
    if (absl::Status s = c.credits->OnRegularReceived(); !s.ok()) {
      ++stats_.protocol_violations;
      if (!c.authenticated) return RefuseAuthentication(c, std::string(s.message()), out);
      Problem(c, PeerError(c, absl::StatusCode::kFailedPrecondition, std::string(s.message())), out);
    }
  }
  if (frame->credits > 0) {
    if (absl::Status s = c.credits->OnReturned(frame->credits); !s.ok()) {
      ++stats_.protocol_violations;
      if (!c.authenticated) return RefuseAuthentication(c, std::string(s.message()), out);
      Problem(c, PeerError(c, absl::StatusCode::kFailedPrecondition, std::string(s.message())), out);
    }
  }
  switch (frame->type) {
    case WireType::kMessage: HandleMessage(c, *frame, out); break;
    case WireType::kCreditUpdate: break;
    case WireType::kClearToSend: HandleClearToSend(c, frame->clear_to_send, out); break;
    case WireType::kCancel: HandleCancel(c, frame->tag, frame->reason, out); break;
    case WireType::kRefuse: HandleRefuse(c, frame->tag, frame->reason, out); break;
    case WireType::kHello:
      if (c.active || !c.peer_address.empty() || c.peer_nonce) {
        ++stats_.protocol_violations;
        if (!c.authenticated) return RefuseAuthentication(c, "it sent an unexpected hello", out);
        Problem(c, PeerError(c, absl::StatusCode::kFailedPrecondition, "unexpected hello"), out);
        break;
      }
      if (absl::StatusOr<HostPort> hp = ParseRdmaAddress(frame->hello_address, false, false); !hp.ok()) {
        ++stats_.malformed_received;
        if (!c.authenticated) return RefuseAuthentication(c, "it sent a hello with a bad address", out);
        Problem(c, PeerError(c, absl::StatusCode::kInvalidArgument, "hello with a bad address"), out);
        break;
      }
      c.peer_address = frame->hello_address;
      // Replies are routed to it only once it is authenticated (MarkAuthenticated).
      if (c.authenticated && !by_address_.contains(c.peer_address)) by_address_[c.peer_address] = c.id;
      break;
    case WireType::kAuthChallenge: HandleAuthChallenge(c, *frame, out); break;
    case WireType::kAuthProof: HandleAuthProof(c, *frame, out); break;
  }
}

void EndpointCore::HandleMessage(Connection& c, const WireFrame& frame, Actions& out) {
  InboundMessage m;
  m.seq = c.next_inbound_seq++;
  m.parts.resize(frame.parts.size());
  uint64_t total = 0;
  for (const PartDescriptor& d : frame.parts) total += d.length;
  m.bytes = total;
  if (total > config_.max_message_bytes) {
    m.failed = true;
    ++stats_.malformed_received;
    Problem(c, PeerError(c, absl::StatusCode::kInvalidArgument,
                         absl::StrCat("message of ", total, " bytes exceeds max_message_bytes ",
                                      config_.max_message_bytes)),
            out);
  }
  for (size_t i = 0; i < frame.parts.size(); ++i) {
    if (frame.parts[i].tag == 0 && !m.failed) m.parts[i] = Buffer::CopyOf(frame.inline_parts[i].data(), frame.inline_parts[i].size());
  }
  c.delivery.push_back(std::move(m));
  const uint64_t seq = c.delivery.back().seq;
  for (size_t i = 0; i < frame.parts.size(); ++i) {
    const PartDescriptor& d = frame.parts[i];
    if (d.tag == 0) continue;
    if (c.FindInbound(seq)->failed) {
      // Tell the sender not to write it.
      c.control.push_back(ControlMessage{.type = WireType::kRefuse, .tag = d.tag,
                                         .reason = total > config_.max_message_bytes ? AbortReason::kTooLarge
                                                                                     : AbortReason::kMessageFailed});
      continue;
    }
    if (c.inbound.contains(d.tag)) {
      ++stats_.protocol_violations;
      FailInbound(c, seq,
                  PeerError(c, absl::StatusCode::kFailedPrecondition,
                            absl::StrCat("rendezvous tag ", d.tag, " is already pending")),
                  out);
      continue;
    }
    InboundRendezvous rz;
    rz.tag = d.tag;
    rz.message_seq = seq;
    rz.part = i;
    rz.length = d.length;
    rz.deadline = now_ + config_.rendezvous_timeout_ticks;
    ++c.FindInbound(seq)->pending;
    auto [pos, inserted] = c.inbound.emplace(d.tag, std::move(rz));
    ArrangeDestination(c, pos->second, frame.request_id, out);
  }
}

void EndpointCore::Deliver(Connection& c, Actions& out) {
  while (!c.delivery.empty()) {
    InboundMessage& m = c.delivery.front();
    if (!m.failed && m.pending > 0) return;
    if (!m.failed) {
      Message message;
      const Buffer& envelope = m.parts[0];
      if (envelope.size() > static_cast<size_t>(INT_MAX) ||
          !message.header.ParseFromArray(envelope.data(), static_cast<int>(envelope.size()))) {
        ++stats_.malformed_received;
        Problem(c, PeerError(c, absl::StatusCode::kInvalidArgument,
                             absl::StrCat("header of ", envelope.size(), " bytes does not parse")),
                out);
      } else if (message.header.sender_address().empty()) {
        ++stats_.malformed_received;
        Problem(c, PeerError(c, absl::StatusCode::kInvalidArgument, "header names no sender_address"), out);
      } else {
        message.frames.assign(std::make_move_iterator(m.parts.begin() + 1), std::make_move_iterator(m.parts.end()));
        ++stats_.messages_received;
        stats_.bytes_received += m.bytes;
        message.received_bytes = m.bytes;
        out.push_back(DeliverAction{c.id, std::move(message)});
      }
    }
    c.delivery.pop_front();
  }
}

}  // namespace tessera::rdma

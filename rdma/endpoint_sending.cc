#include "rdma/endpoint_sending.h"

#include <algorithm>
#include <cstring>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "rdma/endpoint_connection.h"
#include "rdma/invariant.h"

namespace tessera::rdma {

absl::Status EndpointCore::Send(const std::string& to, Message message, Actions& out) {
  absl::StatusOr<HostPort> parsed = ParseRdmaAddress(to, /*allow_tcp=*/false, /*allow_port_zero=*/false);
  if (!parsed.ok()) return parsed.status();
  if (message.frames.size() > config_.max_data_frames) {
    return absl::InvalidArgumentError(absl::StrCat("message has ", message.frames.size(),
                                                   " data frames; the limit is ", config_.max_data_frames));
  }
  message.header.set_sender_address(config_.local_address);
  const size_t envelope_bytes = message.header.ByteSizeLong();
  const uint64_t total = envelope_bytes + message.FrameBytes();
  if (total > config_.max_message_bytes) {
    return absl::InvalidArgumentError(absl::StrCat("message of ", total, " bytes exceeds max_message_bytes ",
                                                   config_.max_message_bytes));
  }
  OutgoingMessage m;
  m.request_id = message.header.request_id();
  Buffer envelope = Buffer::Allocate(envelope_bytes);
  if (envelope_bytes > 0) {
    message.header.SerializeWithCachedSizesToArray(reinterpret_cast<uint8_t*>(envelope.mutable_data()));
  }
  m.parts.reserve(1 + message.frames.size());
  m.parts.push_back(std::move(envelope));
  for (Buffer& f : message.frames) m.parts.push_back(std::move(f));
  // Inline what fits, in order; the rest goes by rendezvous.
  size_t room = config_.slot_bytes - kWireHeaderBytes - m.parts.size() * kPartDescriptorBytes;
  for (const Buffer& part : m.parts) {
    PartDescriptor d{part.size(), 0};
    if (part.size() >= config_.rendezvous_threshold || part.size() > room) {
      d.tag = 1;  // placeholder: rendezvous
    } else {
      room -= part.size();
    }
    m.descriptors.push_back(d);
  }

  Connection* c = nullptr;
  if (auto it = by_address_.find(to); it != by_address_.end()) c = Find(it->second);
  if (c == nullptr) {
    c = &NewConnection(/*active=*/true, to);
    by_address_[to] = c->id;
    out.push_back(ConnectAction{c->id, to});
  }
  c->messages.push_back(std::move(m));
  ++stats_.messages_sent;
  stats_.bytes_sent += total;
  if (message.sent_bytes) message.sent_bytes->fetch_add(total, std::memory_order_relaxed);
  Pump(*c, out);
  return absl::OkStatus();
}

void EndpointCore::WaitForSlot(Connection& c) {
  if (c.waiting_for_slot) return;
  c.waiting_for_slot = true;
  slot_waiters_.push_back(c.id);
}

void EndpointCore::Pump(Connection& c, Actions& out) {
  if (c.state != Connection::State::kEstablished || c.disconnecting) return;
  // Priority: control (clear-to-send unblocks the peer), writes (complete
  // earlier messages), then new messages. Each returns whether it made progress.
  // Before the peer has proved it holds the key only control goes (hello,
  // challenge, proof: nothing else is queued there yet).
  for (;;) {
    const bool progress = SendControl(c, out) || (c.authenticated && (SendWrites(c, out) || SendMessage(c, out)));
    if (!progress) break;
  }
  if (c.credits && c.credits->ShouldSendUpdate()) SendCreditUpdate(c, out);
}

bool EndpointCore::SendControl(Connection& c, Actions& out) {
  if (c.control.empty()) return false;
  if (c.credits->available() == 0 || c.sends_in_flight >= config_.send_queue_depth) return false;
  std::optional<uint32_t> slot = pool_.Acquire();
  if (!slot) {
    WaitForSlot(c);
    return false;
  }
  RDMA_CHECK(c.credits->TryConsume());
  const ControlMessage& m = c.control.front();
  std::span<std::byte> mem = pool_.Memory(*slot);
  size_t n = 0;
  if (m.type == WireType::kClearToSend) {
    n = EncodeClearToSend(mem, TakeCredits(c), m.cts);
  } else if (m.type == WireType::kHello) {
    n = EncodeHello(mem, TakeCredits(c), config_.local_address);
  } else if (m.type == WireType::kAuthChallenge) {
    n = EncodeAuthChallenge(mem, TakeCredits(c), c.local_nonce, config_.local_address);
  } else if (m.type == WireType::kAuthProof) {
    n = EncodeAuthProof(mem, TakeCredits(c), m.mac);
  } else {
    n = EncodeAbort(mem, m.type, TakeCredits(c), m.tag, m.reason);
  }
  const uint64_t wr = NewWork(Work{c.id, WorkKind::kSend, *slot});
  out.push_back(PostSendAction{c.id, wr, pool_.Address(*slot), static_cast<uint32_t>(n), pool_.lkey()});
  ++c.sends_in_flight;
  c.control.pop_front();
  ++stats_.control_sends;
  return true;
}

bool EndpointCore::SendWrites(Connection& c, Actions& out) {
  bool progress = false;
  for (auto it = c.writes.begin(); it != c.writes.end();) {
    auto rzit = c.outbound.find(*it);
    if (rzit == c.outbound.end() || rzit->second.final_posted) {
      it = c.writes.erase(it);
      continue;
    }
    OutboundRendezvous& rz = rzit->second;
    const uint64_t length = rz.data.size();
    bool blocked = false;
    if (c.sends_in_flight >= config_.send_queue_depth) return progress;
    if (rz.lease) {  // zero copy: one write of the whole part
      if (!c.credits->TryConsume()) return progress;
      const uint64_t wr = NewWork(Work{c.id, WorkKind::kWrite, std::nullopt, rz.tag, true});
      out.push_back(PostWriteAction{c.id, wr, reinterpret_cast<uint64_t>(rz.data.data()),
                                    static_cast<uint32_t>(length), rz.lease->lkey, rz.cts.remote_address,
                                    rz.cts.rkey, true, rz.tag});
      rz.final_posted = true;
      ++rz.writes_in_flight;
      ++c.sends_in_flight;
      ++stats_.writes_posted;
      progress = true;
    } else {  // staged through pool slots
      while (rz.next_offset < length && rz.writes_in_flight < config_.max_staged_chunks_in_flight &&
             c.sends_in_flight < config_.send_queue_depth) {
        const uint64_t chunk = std::min<uint64_t>(config_.slot_bytes, length - rz.next_offset);
        const bool last = rz.next_offset + chunk == length;
        if (last && c.credits->available() == 0) {
          blocked = true;
          break;
        }
        std::optional<uint32_t> slot = pool_.Acquire();
        if (!slot) {
          WaitForSlot(c);
          return progress;
        }
        if (last) RDMA_CHECK(c.credits->TryConsume());
        std::memcpy(pool_.Memory(*slot).data(), rz.data.data() + rz.next_offset, chunk);
        const uint64_t wr = NewWork(Work{c.id, WorkKind::kWrite, *slot, rz.tag, last});
        out.push_back(PostWriteAction{c.id, wr, pool_.Address(*slot), static_cast<uint32_t>(chunk), pool_.lkey(),
                                      rz.cts.remote_address + rz.next_offset, rz.cts.rkey, last, rz.tag});
        rz.next_offset += chunk;
        ++rz.writes_in_flight;
        ++c.sends_in_flight;
        ++stats_.writes_posted;
        progress = true;
        if (last) rz.final_posted = true;
      }
    }
    if (rz.final_posted) {
      it = c.writes.erase(it);
    } else {
      ++it;
    }
    if (blocked) return progress;  // no credit: nothing else that needs one can go either
  }
  return progress;
}

bool EndpointCore::SendMessage(Connection& c, Actions& out) {
  if (c.messages.empty()) return false;
  if (c.credits->available() == 0 || c.sends_in_flight >= config_.send_queue_depth) return false;
  std::optional<uint32_t> slot = pool_.Acquire();
  if (!slot) {
    WaitForSlot(c);
    return false;
  }
  RDMA_CHECK(c.credits->TryConsume());
  OutgoingMessage m = std::move(c.messages.front());
  c.messages.pop_front();
  const uint64_t seq = c.next_outbound_seq++;
  std::vector<std::span<const std::byte>> inline_data(m.parts.size());
  for (size_t i = 0; i < m.parts.size(); ++i) {
    if (m.descriptors[i].tag == 0) {
      inline_data[i] = std::span<const std::byte>(m.parts[i].data(), m.parts[i].size());
      continue;
    }
    // A fresh tag: non-zero and not pending on this connection.
    uint32_t tag = c.next_tag;
    while (tag == 0 || c.outbound.contains(tag)) ++tag;
    c.next_tag = tag + 1;
    m.descriptors[i].tag = tag;
    OutboundRendezvous rz;
    rz.tag = tag;
    rz.message_seq = seq;
    rz.data = std::move(m.parts[i]);
    rz.deadline = now_ + config_.rendezvous_timeout_ticks;
    c.outbound.emplace(tag, std::move(rz));
    ++stats_.rendezvous_started;
  }
  const size_t n = EncodeMessage(pool_.Memory(*slot), TakeCredits(c), m.request_id, m.descriptors, inline_data);
  const uint64_t wr = NewWork(Work{c.id, WorkKind::kSend, *slot});
  out.push_back(PostSendAction{c.id, wr, pool_.Address(*slot), static_cast<uint32_t>(n), pool_.lkey()});
  ++c.sends_in_flight;
  ++stats_.eager_sends;
  return true;
}

bool EndpointCore::SendCreditUpdate(Connection& c, Actions& out) {
  if (c.sends_in_flight >= config_.send_queue_depth) return false;  // a completion will pump again
  std::optional<uint32_t> slot = pool_.Acquire();
  if (!slot) {
    WaitForSlot(c);
    return false;
  }
  const size_t n = EncodeCreditUpdate(pool_.Memory(*slot), TakeCredits(c));
  const uint64_t wr = NewWork(Work{c.id, WorkKind::kSend, *slot});
  out.push_back(PostSendAction{c.id, wr, pool_.Address(*slot), static_cast<uint32_t>(n), pool_.lkey()});
  ++c.sends_in_flight;
  ++stats_.credit_updates_sent;
  return true;
}

void EndpointCore::ServeWaiters(Actions& out) {
  // Receivers waiting for room to register, in arrival order.
  while (!registration_waiters_.empty()) {
    auto [cid, tag] = registration_waiters_.front();
    Connection* c = Find(cid);
    auto it = c ? c->inbound.find(tag) : decltype(c->inbound.end()){};
    if (c == nullptr || it == c->inbound.end() || it->second.state != InboundRendezvous::State::kWaitRegistration) {
      registration_waiters_.pop_front();
      continue;
    }
    if (!TryRegisterDestination(*c, it->second, out)) break;
    registration_waiters_.pop_front();
    Pump(*c, out);
  }
  // Connections waiting for a pool slot, in order.
  size_t rounds = slot_waiters_.size();
  while (!slot_waiters_.empty() && pool_.free_slots() > 0 && rounds-- > 0) {
    const ConnectionId id = slot_waiters_.front();
    slot_waiters_.pop_front();
    Connection* c = Find(id);
    if (c == nullptr) continue;
    c->waiting_for_slot = false;
    Pump(*c, out);
  }
}

void EndpointCore::OnSendCompleted(uint64_t wr_id, Actions& out) {
  auto it = work_.find(wr_id);
  if (it == work_.end()) return;
  const Work work = it->second;
  work_.erase(it);
  ReleaseWork(work);
  Connection* c = Find(work.connection);
  if (c != nullptr && c->sends_in_flight > 0) --c->sends_in_flight;
  if (c != nullptr && work.kind == WorkKind::kWrite) {
    auto rzit = c->outbound.find(work.tag);
    if (rzit != c->outbound.end()) {
      OutboundRendezvous& rz = rzit->second;
      if (rz.writes_in_flight > 0) --rz.writes_in_flight;
      if (work.final) {
        if (rz.lease) cache_.Release(rz.lease->entry);
        c->outbound.erase(rzit);
      }
    }
  }
  if (c != nullptr) Pump(*c, out);
  ServeWaiters(out);
}

}  // namespace tessera::rdma

#include "rdma/endpoint_connection.h"

#include <memory>
#include <utility>

#include "rdma/endpoint_auth.h"

namespace tessera::rdma {

std::string Printable(std::string_view text) {
  std::string out(text.substr(0, 200));
  for (char& ch : out) {
    if (static_cast<unsigned char>(ch) < 0x20 || static_cast<unsigned char>(ch) >= 0x7f) ch = '?';
  }
  if (text.size() > 200) out += "...";
  return out;
}

std::vector<std::byte> EndpointCore::LocalHandshake() const {
  Handshake h{config_.credits, static_cast<uint32_t>(config_.slot_bytes), config_.local_address};
  h.auth_required = auth_key_.has_value();
  return EncodeHandshake(h, config_.handshake_capacity);
}

absl::Status EndpointCore::OnQueuePairReady(ConnectionId id, Actions& out) {
  Connection* c = Find(id);
  if (c == nullptr) return absl::NotFoundError(absl::StrCat("no RDMA connection ", id));
  if (c->receives_posted) return absl::OkStatus();
  const uint32_t needed = config_.credits + CreditWindow::kReservedSlots;
  if (pool_.free_slots() < needed + config_.min_send_slots) {
    return absl::ResourceExhaustedError(
        absl::StrCat("RDMA buffer pool cannot post ", needed, " receives for ", c->Name(), ": ", pool_.free_slots(),
                     " of ", pool_.slot_count(), " slots free (raise pool_bytes or lower credits)"));
  }
  for (uint32_t i = 0; i < needed; ++i) {
    const uint32_t slot = *pool_.Acquire();
    const uint64_t wr = NewWork(Work{c->id, WorkKind::kReceive, slot});
    out.push_back(PostReceiveAction{c->id, wr, pool_.Address(slot), static_cast<uint32_t>(pool_.slot_bytes()),
                                    pool_.lkey()});
  }
  c->posted_receives = needed;
  c->receives_posted = true;
  if (c->state == Connection::State::kConnecting) c->state = Connection::State::kHandshaking;
  return absl::OkStatus();
}

absl::StatusOr<ConnectionId> EndpointCore::OnConnectRequest(std::span<const std::byte> private_data,
                                                            Actions& out) {
  absl::StatusOr<Handshake> h = ParseHandshake(private_data);
  if (!h.ok()) {
    out.push_back(ProblemAction{0, absl::Status(h.status().code(),
                                                absl::StrCat("refused a connection: ", h.status().message()))});
    return h.status();
  }
  if (absl::Status mismatch = CheckPeerAuthFlag(h->auth_required); !mismatch.ok()) {
    const uint64_t n = ++stats_.auth_rejected;
    absl::Status refusal = absl::PermissionDeniedError(absl::StrCat(
        "refused a connection from ", h->address.empty() ? std::string("a peer that did not name itself")
                                                         : Printable(h->address),
        ": ", mismatch.message(), " (", n, " refused so far)"));
    if (LogRefusal(n)) out.push_back(ProblemAction{0, refusal});
    return refusal;
  }
  Connection& c = NewConnection(/*active=*/false, h->address);
  c.peer_window = h->credits;
  c.peer_slot_bytes = h->slot_bytes;
  c.credits.emplace(config_.credits, h->credits);
  return c.id;
}

absl::Status EndpointCore::OnEstablished(ConnectionId id, std::span<const std::byte> private_data, Actions& out) {
  Connection* c = Find(id);
  if (c == nullptr) return absl::NotFoundError(absl::StrCat("no RDMA connection ", id));
  if (!c->receives_posted) return absl::FailedPreconditionError("RDMA connection established before its receives");
  if (c->active) {
    absl::StatusOr<Handshake> h = ParseHandshake(private_data);
    if (!h.ok()) {
      absl::Status s = PeerError(*c, absl::StatusCode::kInvalidArgument, std::string(h.status().message()));
      Disconnect(*c, s, out);
      return s;
    }
    c->peer_window = h->credits;
    c->peer_slot_bytes = h->slot_bytes;
    c->credits.emplace(config_.credits, h->credits);
    if (absl::Status mismatch = CheckPeerAuthFlag(h->auth_required); !mismatch.ok()) {
      RefuseAuthentication(*c, std::string(mismatch.message()), out);
      return PeerError(*c, absl::StatusCode::kPermissionDenied, std::string(mismatch.message()));
    }
    if (config_.local_address.size() > config_.handshake_capacity - kHandshakeFixedBytes) {
      c->control.push_front(ControlMessage{.type = WireType::kHello});  // before the challenge
    }
  } else if (c->authenticated && !c->peer_address.empty() && !by_address_.contains(c->peer_address)) {
    by_address_[c->peer_address] = c->id;  // replies to the peer reuse its connection
  }
  c->state = Connection::State::kEstablished;
  WarnUnauthenticatedOnce(*c, out);
  Pump(*c, out);
  ServeWaiters(out);
  return absl::OkStatus();
}

void EndpointCore::OnConnectionLost(ConnectionId id, const absl::Status& reason, Actions& out) {
  auto cit = connections_.find(id);
  if (cit == connections_.end()) return;
  std::unique_ptr<Connection> owned = std::move(cit->second);
  connections_.erase(cit);
  Connection& c = *owned;
  ++stats_.connections_lost;
  const std::string why = std::string(reason.message());
  for (auto& [tag, rz] : c.outbound) {
    if (rz.lease) cache_.Release(rz.lease->entry);
    ++stats_.rendezvous_failed;
    Problem(c, PeerError(c, absl::StatusCode::kUnavailable,
                         absl::StrCat("rendezvous send of tag ", tag, " (", rz.data.size(),
                                      " bytes) failed: connection lost: ", why)),
            out);
  }
  for (auto& [tag, rz] : c.inbound) {
    if (rz.lease) cache_.Release(rz.lease->entry);
    ++stats_.rendezvous_failed;
    Problem(c, PeerError(c, absl::StatusCode::kUnavailable,
                         absl::StrCat("rendezvous receive of tag ", tag, " (", rz.length,
                                      " bytes) failed: connection lost: ", why)),
            out);
  }
  size_t dropped = c.messages.size();
  for (const InboundMessage& m : c.delivery) {
    if (!m.failed) ++dropped;  // partly received messages never delivered
  }
  if (dropped > 0) {
    stats_.messages_dropped += dropped;
    Problem(c, PeerError(c, absl::StatusCode::kUnavailable,
                         absl::StrCat(dropped, " message(s) queued or half received dropped: ", why)),
            out);
  } else if (!reason.ok() && !c.auth_refused) {  // a refusal was reported when it was made
    Problem(c, PeerError(c, reason.code(), absl::StrCat("connection lost: ", why)), out);
  }
  for (auto it = work_.begin(); it != work_.end();) {
    if (it->second.connection == id) {
      ReleaseWork(it->second);
      work_.erase(it++);
    } else {
      ++it;
    }
  }
  if (auto it = by_address_.find(c.peer_address); it != by_address_.end() && it->second == id) by_address_.erase(it);
  ServeWaiters(out);
}

void EndpointCore::OnWorkFailed(uint64_t wr_id, const absl::Status& status, Actions& out) {
  auto it = work_.find(wr_id);
  if (it == work_.end()) return;
  const Work work = it->second;
  work_.erase(it);
  ReleaseWork(work);
  Connection* c = Find(work.connection);
  if (c == nullptr) return;
  if (work.kind == WorkKind::kReceive && c->posted_receives > 0) --c->posted_receives;
  if (work.kind != WorkKind::kReceive && c->sends_in_flight > 0) --c->sends_in_flight;
  if (work.kind == WorkKind::kWrite) {
    auto rzit = c->outbound.find(work.tag);
    if (rzit != c->outbound.end() && rzit->second.writes_in_flight > 0) --rzit->second.writes_in_flight;
  }
  Disconnect(*c, PeerError(*c, absl::StatusCode::kUnavailable, absl::StrCat("work request failed: ", status.message())),
             out);
  ServeWaiters(out);
}

}  // namespace tessera::rdma

#include "rdma/rdma_protocol.h"

#include <memory>
#include <utility>

#include "absl/strings/str_cat.h"
#include "rdma/endpoint_auth.h"
#include "rdma/endpoint_connection.h"
#include "rdma/invariant.h"
#include "rdma/protocol_config.h"

namespace tessera::rdma {

EndpointCore::EndpointCore(ProtocolConfig config, std::span<std::byte> pool_region, uint32_t pool_lkey,
                           Registrar& registrar)
    : config_(std::move(config)),
      auth_key_(AuthKeyFrom(config_.auth_secret_key)),
      pool_(pool_region, config_.slot_bytes, pool_lkey),
      cache_(RegistrationCache::Options{.max_pinned_bytes = config_.max_pinned_bytes,
                                        .page_bytes = config_.page_bytes},
             registrar),
      destinations_(DestinationPool::Options{.max_idle_bytes = config_.max_idle_destination_bytes}) {
  RDMA_CHECK(Validate(config_, pool_region.size()).ok());
}

EndpointCore::~EndpointCore() {
  // Leases go back before the cache deregisters everything.
  for (auto& [id, c] : connections_) {
    for (auto& [tag, rz] : c->outbound) {
      if (rz.lease) cache_.Release(rz.lease->entry);
    }
    for (auto& [tag, rz] : c->inbound) {
      if (rz.lease) cache_.Release(rz.lease->entry);
    }
  }
}

absl::Status EndpointCore::Validate(const ProtocolConfig& config, size_t pool_bytes) {
  return ValidateProtocolConfig(config, pool_bytes);
}

// ---------------------------------------------------------------- helpers

EndpointCore::Connection* EndpointCore::Find(ConnectionId id) {
  auto it = connections_.find(id);
  return it == connections_.end() ? nullptr : it->second.get();
}

const EndpointCore::Connection* EndpointCore::Find(ConnectionId id) const {
  auto it = connections_.find(id);
  return it == connections_.end() ? nullptr : it->second.get();
}

EndpointCore::Connection& EndpointCore::NewConnection(bool active, std::string peer_address) {
  auto c = std::make_unique<Connection>();
  c->id = next_connection_++;
  c->active = active;
  c->peer_address = std::move(peer_address);
  c->started = now_;
  c->authenticated = !auth_key_.has_value();
  if (auth_key_) {
    if (config_.random_bytes) {
      config_.random_bytes(c->local_nonce);
    } else {
      FillRandomBytes(c->local_nonce);
    }
    c->control.push_back(ControlMessage{.type = WireType::kAuthChallenge});
  }
  Connection& ref = *c;
  connections_.emplace(ref.id, std::move(c));
  return ref;
}

uint64_t EndpointCore::NewWork(Work work) {
  const uint64_t id = next_wr_id_++;
  work_.emplace(id, work);
  return id;
}

void EndpointCore::ReleaseWork(const Work& work) {
  if (work.slot) pool_.Release(*work.slot);
}

uint16_t EndpointCore::TakeCredits(Connection& c) { return c.credits ? c.credits->TakeReturnable() : 0; }

absl::Status EndpointCore::PeerError(const Connection& c, absl::StatusCode code, const std::string& what) const {
  return absl::Status(code, absl::StrCat("RDMA peer ", c.Name(), ": ", what));
}

void EndpointCore::Problem(const Connection& c, absl::Status status, Actions& out) {
  out.emplace_back(std::in_place_type<ProblemAction>, ProblemAction{c.id, std::move(status)});
}

void EndpointCore::Disconnect(Connection& c, absl::Status reason, Actions& out) {
  if (c.disconnecting) return;
  c.disconnecting = true;
  out.push_back(DisconnectAction{c.id, std::move(reason)});
}

// ---------------------------------------------------------------- timers

void EndpointCore::Tick(uint64_t now, Actions& out) {
  if (now > now_) now_ = now;
  std::vector<ConnectionId> ids;
  for (auto& [id, c] : connections_) ids.push_back(id);
  for (ConnectionId id : ids) {
    Connection* c = Find(id);
    if (c == nullptr) continue;
    if (c->state != Connection::State::kEstablished && now_ >= c->started + config_.connect_timeout_ticks) {
      Disconnect(*c, PeerError(*c, absl::StatusCode::kDeadlineExceeded,
                               absl::StrCat("not connected within ", config_.connect_timeout_ticks, " ticks")),
                 out);
      continue;
    }
    if (!c->authenticated && now_ >= c->started + config_.connect_timeout_ticks) {
      RefuseAuthentication(*c,
                           absl::StrCat("it did not prove it holds the job key within ", config_.connect_timeout_ticks,
                                        " ticks"),
                           out);
      continue;
    }
    std::vector<uint32_t> expired;
    for (auto& [tag, rz] : c->outbound) {
      if (rz.state == OutboundRendezvous::State::kWaitClearToSend && now_ >= rz.deadline) expired.push_back(tag);
    }
    for (uint32_t tag : expired) {
      auto it = c->outbound.find(tag);
      if (it == c->outbound.end()) continue;  // cancelled with an earlier sibling
      const uint64_t seq = it->second.message_seq;
      Problem(*c, PeerError(*c, absl::StatusCode::kDeadlineExceeded,
                            absl::StrCat("no clear-to-send for rendezvous tag ", tag, " (", it->second.data.size(),
                                         " bytes) within ", config_.rendezvous_timeout_ticks,
                                         " ticks; message dropped")),
              out);
      c->control.push_back(ControlMessage{.type = WireType::kCancel, .tag = tag, .reason = AbortReason::kTimeout});
      c->outbound.erase(it);
      ++stats_.rendezvous_failed;
      ++stats_.messages_dropped;
      FailOutbound(*c, seq, out);
    }
    expired.clear();
    bool data_overdue = false;
    for (auto& [tag, rz] : c->inbound) {
      if (now_ < rz.deadline) continue;
      if (rz.state == InboundRendezvous::State::kWaitRegistration) {
        expired.push_back(tag);
      } else {
        data_overdue = true;
      }
    }
    for (uint32_t tag : expired) {
      auto it = c->inbound.find(tag);
      if (it == c->inbound.end()) continue;
      const uint64_t seq = it->second.message_seq;
      c->inbound.erase(it);
      ++stats_.rendezvous_failed;
      c->control.push_back(ControlMessage{.type = WireType::kRefuse, .tag = tag, .reason = AbortReason::kTimeout});
      FailInbound(*c, seq,
                  PeerError(*c, absl::StatusCode::kDeadlineExceeded,
                            absl::StrCat("no room to register rendezvous tag ", tag, " within ",
                                         config_.rendezvous_timeout_ticks, " ticks")),
                  out);
    }
    if (data_overdue) {
      Disconnect(*c, PeerError(*c, absl::StatusCode::kDeadlineExceeded,
                               absl::StrCat("rendezvous data not written within ",
                                            2 * config_.rendezvous_timeout_ticks, " ticks of clear-to-send")),
                 out);
      continue;
    }
    Deliver(*c, out);
    Pump(*c, out);
  }
  ServeWaiters(out);
}

// ---------------------------------------------------------------- introspection

std::optional<ConnectionId> EndpointCore::ConnectionTo(const std::string& address) const {
  auto it = by_address_.find(address);
  if (it == by_address_.end()) return std::nullopt;
  return it->second;
}

std::vector<ConnectionId> EndpointCore::connections() const {
  std::vector<ConnectionId> ids;
  for (const auto& [id, c] : connections_) ids.push_back(id);
  return ids;
}

std::optional<uint32_t> EndpointCore::credits_available(ConnectionId id) const {
  const Connection* c = Find(id);
  if (c == nullptr || !c->credits) return std::nullopt;
  return c->credits->available();
}

uint32_t EndpointCore::posted_receives(ConnectionId id) const {
  const Connection* c = Find(id);
  return c == nullptr ? 0 : c->posted_receives;
}

size_t EndpointCore::queued_messages(ConnectionId id) const {
  const Connection* c = Find(id);
  return c == nullptr ? 0 : c->messages.size();
}

uint32_t EndpointCore::sends_in_flight(ConnectionId id) const {
  const Connection* c = Find(id);
  return c == nullptr ? 0 : c->sends_in_flight;
}

size_t EndpointCore::pending_rendezvous(ConnectionId id) const {
  const Connection* c = Find(id);
  return c == nullptr ? 0 : c->outbound.size() + c->inbound.size();
}

std::string EndpointCore::peer_address(ConnectionId id) const {
  const Connection* c = Find(id);
  return c == nullptr ? std::string() : c->peer_address;
}

bool EndpointCore::authenticated(ConnectionId id) const {
  const Connection* c = Find(id);
  return c != nullptr && c->authenticated;
}

}  // namespace tessera::rdma

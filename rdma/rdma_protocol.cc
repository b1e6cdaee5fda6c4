#include "rdma/rdma_protocol.h"

#include <algorithm>
#include <bit>
#include <climits>
#include <cstring>
#include <utility>

#include <sodium.h>

#include "absl/strings/str_cat.h"
#include "rdma/invariant.h"

namespace tessera::rdma {

namespace {

// `text` safe to put in a log line: printable ASCII only, at most 200
// characters. Addresses a peer names itself by are not trusted.
std::string Printable(std::string_view text) {
  std::string out(text.substr(0, 200));
  for (char& ch : out) {
    if (static_cast<unsigned char>(ch) < 0x20 || static_cast<unsigned char>(ch) >= 0x7f) ch = '?';
  }
  if (text.size() > 200) out += "...";
  return out;
}

// Authentication refusals logged: the 1st, 2nd, 4th, 8th, ...
bool LogRefusal(uint64_t n) { return std::bit_width(n) != std::bit_width(n - 1); }

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

std::optional<ConnectionAuthKey> AuthKeyFrom(const std::string& secret) {
  if (secret.empty()) return std::nullopt;
  absl::StatusOr<ConnectionAuthKey> key = DeriveConnectionAuthKey(secret);
  RDMA_CHECK(key.ok());  // Validate accepted the config
  return *key;
}

}  // namespace

uint64_t LastChunkBytes(uint64_t length, uint64_t chunk) {
  if (length == 0 || chunk == 0) return 0;
  const uint64_t rem = length % chunk;
  return rem == 0 ? chunk : rem;
}

struct EndpointCore::OutgoingMessage {
  uint64_t request_id = 0;
  std::vector<Buffer> parts;  // [envelope, frames...]
  std::vector<PartDescriptor> descriptors;  // tag != 0 marks a rendezvous part (real tags set at transmit)
};

struct EndpointCore::ControlMessage {
  WireType type = WireType::kClearToSend;
  ClearToSend cts;        // kClearToSend
  uint32_t tag = 0;       // kCancel / kRefuse
  AbortReason reason = AbortReason::kTimeout;
  AuthMac mac{};          // kAuthProof (kAuthChallenge carries the connection's nonce)
};

struct EndpointCore::OutboundRendezvous {
  enum class State { kWaitClearToSend, kWriting };
  uint32_t tag = 0;
  uint64_t message_seq = 0;
  Buffer data;
  State state = State::kWaitClearToSend;
  uint64_t deadline = 0;
  ClearToSend cts;
  std::optional<RegistrationCache::Lease> lease;  // zero copy
  uint64_t next_offset = 0;                       // staged: next byte to post
  uint32_t writes_in_flight = 0;
  bool final_posted = false;
};

struct EndpointCore::InboundRendezvous {
  enum class State { kWaitRegistration, kWaitData };
  uint32_t tag = 0;
  uint64_t message_seq = 0;
  size_t part = 0;
  uint64_t length = 0;
  State state = State::kWaitRegistration;
  uint64_t deadline = 0;
  Buffer destination;  // exactly `length` bytes
  // Set while `destination` is one posted for (request id, frame index).
  std::optional<std::pair<uint64_t, uint32_t>> posted_key;
  const void* register_address = nullptr;
  size_t register_bytes = 0;
  std::shared_ptr<void> register_owner;
  std::optional<RegistrationCache::Lease> lease;
};

struct EndpointCore::InboundMessage {
  uint64_t seq = 0;
  std::vector<Buffer> parts;
  size_t pending = 0;  // rendezvous parts not yet arrived
  bool failed = false;
  uint64_t bytes = 0;
};

struct EndpointCore::Connection {
  enum class State { kConnecting, kHandshaking, kEstablished };
  ConnectionId id = 0;
  bool active = false;
  std::string peer_address;  // may be empty on the passive side until known
  State state = State::kConnecting;
  uint64_t started = 0;
  bool receives_posted = false;
  bool disconnecting = false;
  bool waiting_for_slot = false;
  bool hello_needed = false;  // active: our address did not fit the handshake
  uint32_t peer_window = 0;
  uint32_t peer_slot_bytes = 0;
  uint32_t posted_receives = 0;
  uint32_t sends_in_flight = 0;  // send work requests posted, not completed
  std::optional<CreditWindow> credits;
  std::deque<ControlMessage> control;
  std::deque<OutgoingMessage> messages;
  std::deque<uint32_t> writes;  // outbound tags with writes left to post
  std::map<uint32_t, OutboundRendezvous> outbound;
  std::map<uint32_t, InboundRendezvous> inbound;
  std::deque<InboundMessage> delivery;
  uint64_t next_outbound_seq = 1;
  uint64_t next_inbound_seq = 1;
  uint32_t next_tag = 1;
  // Authentication. Invariants: `authenticated` is true from the start for an
  // endpoint without a key; with a key it becomes true only when the peer's
  // proof verified, and until then the connection sends and accepts nothing
  // but hello, challenge, proof and credit updates. Our challenge is queued
  // at creation, so it precedes our proof on the wire.
  bool authenticated = false;
  bool auth_refused = false;  // refused for authentication (already counted and reported)
  AuthNonce local_nonce{};
  std::optional<AuthNonce> peer_nonce;  // from the peer's challenge

  std::string Name() const {
    return peer_address.empty() ? absl::StrCat("connection ", id) : Printable(peer_address);
  }
  InboundMessage* FindInbound(uint64_t seq) {
    if (delivery.empty() || seq < delivery.front().seq) return nullptr;
    const uint64_t index = seq - delivery.front().seq;
    return index < delivery.size() ? &delivery[index] : nullptr;
  }
};

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
  auto bad = [](absl::string_view what) { return absl::InvalidArgumentError(absl::StrCat("RDMA options: ", what)); };
  if (config.slot_bytes < 1024 || config.slot_bytes > (1u << 24)) return bad("slot_bytes must be in [1 KiB, 16 MiB]");
  if (config.slot_bytes < kWireHeaderBytes + kMaxParts * kPartDescriptorBytes + 64) {
    return bad("slot_bytes too small for a full part table");
  }
  if (config.credits < 1 || config.credits > CreditWindow::kMaxWindow) {
    return bad(absl::StrCat("credits must be in [1, ", CreditWindow::kMaxWindow, "]"));
  }
  if (config.rendezvous_threshold < 1) return bad("rendezvous_threshold must be positive");
  if (config.max_data_frames + 1 > kMaxParts) return bad(absl::StrCat("max_data_frames above ", kMaxParts - 1));
  if (config.max_message_bytes < 1 || config.max_message_bytes > (size_t{1} << 31)) {
    return bad("max_message_bytes must be in [1, 2 GiB]");
  }
  if (config.max_staged_chunks_in_flight < 1) return bad("max_staged_chunks_in_flight must be positive");
  if (config.send_queue_depth < 1) return bad("send_queue_depth must be positive");
  if (config.handshake_capacity < kHandshakeFixedBytes) return bad("handshake_capacity too small");
  if (config.rendezvous_timeout_ticks < 1 || config.connect_timeout_ticks < 1) return bad("timeouts must be positive");
  if (config.page_bytes == 0 || (config.page_bytes & (config.page_bytes - 1)) != 0) {
    return bad("page_bytes must be a power of two");
  }
  const size_t slots = pool_bytes / config.slot_bytes;
  const size_t one_connection = size_t{config.credits} + CreditWindow::kReservedSlots;
  if (slots < one_connection + config.min_send_slots) {
    return bad(absl::StrCat("pool of ", pool_bytes, " bytes holds ", slots, " slots of ", config.slot_bytes,
                            " bytes; one connection needs ", one_connection, " receive slots plus ",
                            config.min_send_slots, " for sending"));
  }
  if (config.local_address.empty()) return bad("local_address is empty");
  if (AuthChallengeWireBytes(config.local_address) > config.slot_bytes) {
    return bad("local_address too long for one slot");
  }
  if (!config.auth_secret_key.empty()) {
    if (absl::StatusOr<std::array<unsigned char, 32>> key = DecodeZ85Key(config.auth_secret_key); !key.ok()) {
      return bad(absl::StrCat("auth_secret_key (the job's secret key): ", key.status().message()));
    }
  }
  return absl::OkStatus();
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
  out.push_back(ProblemAction{c.id, std::move(status)});
}

void EndpointCore::Disconnect(Connection& c, absl::Status reason, Actions& out) {
  if (c.disconnecting) return;
  c.disconnecting = true;
  out.push_back(DisconnectAction{c.id, std::move(reason)});
}

// ---------------------------------------------------------------- sending

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

// ---------------------------------------------------------------- connections

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

// ---------------------------------------------------------------- completions

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

// ---------------------------------------------------------------- authentication

absl::Status EndpointCore::CheckPeerAuthFlag(bool peer_requires_auth) const {
  if (auth_key_ && !peer_requires_auth) {
    return absl::PermissionDeniedError(
        "it has no job key (authentication is off there) and this endpoint admits only holders of the job key");
  }
  if (!auth_key_ && peer_requires_auth) {
    return absl::PermissionDeniedError(
        "it admits only holders of the job key and this endpoint has none (authentication is off here)");
  }
  return absl::OkStatus();
}

void EndpointCore::WarnUnauthenticatedOnce(const Connection& c, Actions& out) {
  if (auth_key_ || warned_unauthenticated_) return;
  warned_unauthenticated_ = true;
  out.push_back(ProblemAction{
      c.id, absl::UnauthenticatedError(absl::StrCat(
                "authentication off: the RDMA connection with ", c.Name(),
                " and every later one are not authenticated; any process that can reach this endpoint can connect "
                "and read or write what it serves (no job key; docs/security.md)"))});
}

AuthTranscript EndpointCore::Transcript(const Connection& c, AuthRole prover) const {
  RDMA_CHECK(c.peer_nonce.has_value());
  AuthTranscript t;
  t.prover = prover;
  if (c.active) {
    t.initiator_nonce = c.local_nonce;
    t.acceptor_nonce = *c.peer_nonce;
    t.initiator_address = config_.local_address;
    t.acceptor_address = c.peer_address;
  } else {
    t.initiator_nonce = *c.peer_nonce;
    t.acceptor_nonce = c.local_nonce;
    t.initiator_address = c.peer_address;
    t.acceptor_address = config_.local_address;
  }
  return t;
}

void EndpointCore::HandleAuthChallenge(Connection& c, const WireFrame& frame, Actions& out) {
  if (!auth_key_ || c.authenticated) {
    ++stats_.protocol_violations;
    Problem(c, PeerError(c, absl::StatusCode::kFailedPrecondition, "unexpected authentication challenge (ignored)"),
            out);
    return;
  }
  if (c.peer_nonce) return RefuseAuthentication(c, "it sent a second authentication challenge", out);
  if (c.peer_address.empty()) {
    return RefuseAuthentication(c, "it sent its challenge before naming its address", out);
  }
  if (frame.auth_address != c.peer_address) {
    return RefuseAuthentication(
        c,
        absl::StrCat("its challenge names it ", Printable(frame.auth_address), ", not the address this connection ",
                     c.active ? "dialed" : "was opened from"),
        out);
  }
  if (sodium_memcmp(frame.auth_nonce.data(), c.local_nonce.data(), kAuthNonceBytes) == 0) {
    return RefuseAuthentication(c, "its challenge echoes this endpoint's nonce", out);
  }
  c.peer_nonce = frame.auth_nonce;
  ControlMessage proof{.type = WireType::kAuthProof};
  proof.mac = ComputeAuthProof(*auth_key_, Transcript(c, c.active ? AuthRole::kInitiator : AuthRole::kAcceptor));
  c.control.push_back(proof);  // after our challenge, queued when the connection was made
}

void EndpointCore::HandleAuthProof(Connection& c, const WireFrame& frame, Actions& out) {
  if (!auth_key_ || c.authenticated) {
    ++stats_.protocol_violations;
    Problem(c, PeerError(c, absl::StatusCode::kFailedPrecondition, "unexpected authentication proof (ignored)"), out);
    return;
  }
  if (!c.peer_nonce) return RefuseAuthentication(c, "it sent a proof before its challenge", out);
  const AuthRole peer_role = c.active ? AuthRole::kAcceptor : AuthRole::kInitiator;
  if (!VerifyAuthProof(*auth_key_, Transcript(c, peer_role), frame.auth_mac)) {
    return RefuseAuthentication(
        c, "its proof does not verify: it does not hold the job's key (or replayed a proof of another connection)",
        out);
  }
  MarkAuthenticated(c);
}

void EndpointCore::MarkAuthenticated(Connection& c) {
  c.authenticated = true;
  ++stats_.connections_authenticated;
  if (!c.active && c.state == Connection::State::kEstablished && !c.peer_address.empty() &&
      !by_address_.contains(c.peer_address)) {
    by_address_[c.peer_address] = c.id;  // replies to the peer reuse its connection
  }
  // The caller (OnReceiveCompleted) pumps: queued messages go now.
}

void EndpointCore::RefuseAuthentication(Connection& c, const std::string& what, Actions& out) {
  if (c.disconnecting) return;
  const uint64_t n = ++stats_.auth_rejected;
  c.auth_refused = true;
  c.disconnecting = true;
  out.push_back(DisconnectAction{
      c.id, PeerError(c, absl::StatusCode::kPermissionDenied, absl::StrCat("refused: ", what, " (", n, " refused so far)")),
      LogRefusal(n)});
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

// ---------------------------------------------------------------- destinations, introspection

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

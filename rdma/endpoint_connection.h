#pragma once
// One connection of EndpointCore (rdma_protocol.h), and its life from queue
// pair to loss. EndpointCore members defined in endpoint_connection.cc:
// LocalHandshake, OnQueuePairReady, OnConnectRequest, OnEstablished,
// OnConnectionLost, OnWorkFailed; and Printable.
//
// Owns: the Connection record (below): its state (connecting, handshaking,
// established), the peer's window and slot size, its credits, the queues and
// rendezvous of the other parts, its authentication fields; and the rules of
// the core's address map (by_address_; also written by Send, a hello and
// MarkAuthenticated).
// Promises:
// - Receives: credits + 2 are posted when the queue pair is ready, and only if
//   min_send_slots of the pool stay free (else ResourceExhausted).
// - Address map: a connection Send dials is entered under the address dialed
//   when it is made; an accepted one under the peer's address only once it is
//   established and authenticated, and only while no connection holds that
//   address (replies to the peer then reuse it).
// - Handshake flags that do not match are refused at set-up, on both sides.
// - Loss: OnConnectionLost fails every pending rendezvous of the connection
//   (one ProblemAction each, naming the peer), drops and counts its queued and
//   half-received messages, releases its leases, pool slots and work requests,
//   and reports the loss once (a refusal was reported when it was made).
// - A failed work request disconnects its connection.
// Thread safety: none for the members (the caller of EndpointCore serializes
// every call); Printable is pure.
#include <cstdint>
#include <deque>
#include <map>
#include <optional>
#include <string>
#include <string_view>

#include "absl/strings/str_cat.h"
#include "rdma/connection_auth.h"
#include "rdma/credit_window.h"
#include "rdma/endpoint_receiving.h"
#include "rdma/endpoint_rendezvous.h"
#include "rdma/endpoint_sending.h"
#include "rdma/rdma_protocol.h"

namespace tessera::rdma {

// `text` safe to put in a log line: printable ASCII only, at most 200
// characters. Addresses a peer names itself by are not trusted.
std::string Printable(std::string_view text);

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

}  // namespace tessera::rdma

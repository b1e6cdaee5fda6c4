#pragma once
// EndpointCore: the whole RDMA protocol of one process (all of its
// connections) as a deterministic state machine. It makes every decision of
// the RDMA transport; the verbs shell (rdma_transport.cc) only executes the
// Actions it returns and feeds it completions and connection events.
//
// The parts (one behaviour, one file; each header states its contract):
// - protocol_config.{h,cc}: ProtocolConfig and the rules it must satisfy.
// - endpoint_actions.h: the Actions the shell executes, EndpointStats.
// - rdma_protocol.{h,cc} (this file): EndpointCore's state, its bookkeeping
//   (connections, work requests, errors), timers (Tick), introspection.
// - endpoint_connection.{h,cc}: one connection's state; its life (queue pair,
//   handshake, establishment, loss, failed work).
// - endpoint_sending.{h,cc}: the send path (queued messages and control,
//   credits, pool slots, writes, waiters).
// - endpoint_receiving.{h,cc}: the receive path (completions, parsing,
//   admission before authentication, in-order delivery).
// - endpoint_rendezvous.{h,cc}: rendezvous of large parts both ways, and the
//   destinations a receiver posts in advance.
// - endpoint_auth.{h,cc}: the challenge-response between holders of the job key.
// Users include this header only; the endpoint_*.h headers are internal to
// EndpointCore (they define its private records).
//
// What travels (bytes in rdma_wire.h):
// - A Tessera message = parts [serialized Envelope, frame 1, ..., frame n].
//   Parts smaller than rendezvous_threshold that fit go inline in one SEND
//   from a pool slot into one receive slot of the peer (eager). Every other
//   part goes by rendezvous: the SEND that carries the message names it
//   {tag, length} (the RTS); the receiver picks a registered destination
//   and answers clear-to-send {tag, address, rkey, length}; the sender writes
//   the bytes with RDMA WRITE, the last write WITH_IMM(imm = tag), and the
//   receiver completes the part on the immediate. The destination is, in this
//   order: one pre-posted with PostDestination for (request id, frame index)
//   of exactly that length (how pulls land in a worker's buffer), or a block
//   of the DestinationPool. The sender's source is the user's buffer itself
//   (registered through the RegistrationCache, zero copy) for parts of at
//   least rendezvous_threshold bytes, or else (smaller parts, or a
//   registration the cache refused) the bytes staged through pool slots in
//   chunks of slot_bytes, at most max_staged_chunks_in_flight at a time.
// - Credits (credit_window.h): a SEND or WRITE_WITH_IMM is posted only with a
//   credit; returned credits ride in every header; an explicit credit update
//   goes out when half the window is returnable and nothing else is sent.
//   Anything without a credit or a free pool slot waits in order; nothing is
//   dropped and nothing blocks.
//
// Promises:
// - Per connection, messages are delivered (DeliverAction) in the order the
//   peer sent them; a message waiting for a rendezvous part holds back later
//   ones from the same connection. Messages from one sender to one address
//   always use one connection (the first made or accepted for that address),
//   so per-sender order holds end to end.
// - No receive queue runs dry: each connection keeps credits + 2 receives
//   posted (see credit_window.h for why that suffices).
// - Memory: a source buffer is referenced (and its registration leased)
//   until its last write completed; a destination's lease is held from
//   clear-to-send until the data arrived, the sender cancelled, or the
//   connection was lost (never released while the peer may still write).
// - Errors never crash and are reported as ProblemActions (log them) whose
//   status names the peer: malformed input (counted, not delivered), unknown
//   tags, duplicate clear-to-send, length mismatches, refusals, timeouts by
//   ticks (a sender waits rendezvous_timeout_ticks for clear-to-send, then
//   cancels; a receiver waits that long for room to register, then refuses;
//   after clear-to-send it waits twice that for the data, then disconnects,
//   because only a torn-down queue pair guarantees the peer no longer
//   writes), and peer death: OnConnectionLost fails every pending rendezvous
//   of the connection, each with an error naming the peer, and drops the
//   messages still queued for it.
//
// Authentication (when config.auth_secret_key holds the job's secret key):
// - Rule: a connection is usable only between holders of the same job key.
//   A keyed endpoint refuses a peer without a key and a peer with another
//   key; an endpoint without a key refuses a keyed peer (a mismatch is
//   refused both ways, at set-up where the handshake flag shows it); two
//   endpoints without a key connect unauthenticated, and the first such
//   connection of each core says so in a ProblemAction ("authentication off").
// - Every connection starts with the mutual challenge-response of
//   rdma/connection_auth.h: each side's first SEND is its challenge (fresh
//   nonce from config.random_bytes + its own address; the initiator's hello,
//   when needed, goes before it), its second its proof. A challenge must name
//   the address the connection is known by: for the acceptor, the one in the
//   initiator's handshake or hello; for the initiator, the one it dialed.
// - Until the peer's proof has verified, the connection sends nothing but
//   hello, challenge, proof and credit updates, and accepts nothing else
//   (credit updates aside): a message, clear-to-send, cancel, refuse or RDMA
//   write with immediate from it refuses the connection, and it is not
//   entered in the address map (replies cannot be routed to it; a Send to
//   its address meanwhile opens a connection of our own). Nothing of an
//   unauthenticated peer is ever delivered.
// - Refused: a handshake flag that does not match ours (the connect request
//   is rejected, or the established connection dropped), a malformed or
//   unexpected authentication message, a second challenge, a proof before
//   the challenge, a proof that does not verify (wrong key, replayed from
//   another connection, reflected), a challenge naming another address or
//   echoing our nonce, anything else before the proof, and no proof within
//   connect_timeout_ticks of the connection's start. Each refusal counts in
//   stats().auth_rejected and disconnects; its DisconnectAction has `log` set
//   only for the 1st, 2nd, 4th, 8th, ... refusal of this core (so a flood of
//   strangers cannot flood the log), and the loss of a refused connection is
//   not reported again.
//
// Shell obligations:
// - Execute the actions of each call in order (PostReceive actions of a
//   connection before its connect/accept; posts on the connection's queue
//   pair in the order given).
// - Call OnConnectionLost only after the connection's queue pair is
//   destroyed (no DMA can touch its slots or leases any more). Completions of
//   work requests the core no longer knows (after a loss) are ignored.
// - Tick with a monotonic count (the shell uses milliseconds).
//
// Thread safety: none. The shell serializes every call (one mutex); the only
// thing that may happen on other threads is user code dropping delivered
// Buffers (see destination_pool.h).
#include <cstddef>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/buffer.h"
#include "common/message.h"
#include "rdma/connection_auth.h"
#include "rdma/credit_window.h"
#include "rdma/destination_pool.h"
#include "rdma/endpoint_actions.h"
#include "rdma/protocol_config.h"
#include "rdma/rdma_wire.h"
#include "rdma/registration_cache.h"
#include "rdma/slot_pool.h"

namespace tessera::rdma {

class EndpointCore {
 public:
  // `pool_region` (registered by the caller under `pool_lkey`) is borrowed
  // for the core's lifetime; `registrar` too.
  EndpointCore(ProtocolConfig config, std::span<std::byte> pool_region, uint32_t pool_lkey, Registrar& registrar);
  ~EndpointCore();
  EndpointCore(const EndpointCore&) = delete;
  EndpointCore& operator=(const EndpointCore&) = delete;

  // Validates the config (InvalidArgument naming the field).
  static absl::Status Validate(const ProtocolConfig& config, size_t pool_bytes);

  // Queues `message` for `to` ("rdma://HOST:PORT"), connecting first when no
  // connection to it exists (ConnectAction). Stamps sender_address. Errors
  // (nothing queued): InvalidArgument for a bad address, too many frames, or
  // a message over max_message_bytes.
  absl::Status Send(const std::string& to, Message message, Actions& out);

  // Both sides: the connection's queue pair exists; posts its receives.
  // ResourceExhausted when the pool cannot spare the slots (tear down).
  absl::Status OnQueuePairReady(ConnectionId id, Actions& out);
  // The private data to send with a connect request or an accept reply.
  std::vector<std::byte> LocalHandshake() const;
  // Passive side: a connect request arrived with this private data. Returns
  // the new connection (then create its queue pair, OnQueuePairReady, accept),
  // or an error (reject it): InvalidArgument for a bad handshake,
  // PermissionDenied when the peer's authentication flag does not match ours
  // (counted in auth_rejected). What should be logged about a refusal is in
  // `out` (ProblemActions, rate-limited for authentication refusals); the
  // shell need not log the returned error.
  absl::StatusOr<ConnectionId> OnConnectRequest(std::span<const std::byte> private_data, Actions& out);
  // The connection is established. Active side: `private_data` is the accept
  // reply's (the peer's handshake); a bad one, or one whose authentication
  // flag does not match ours, is an error and a DisconnectAction. Passive
  // side: ignored.
  absl::Status OnEstablished(ConnectionId id, std::span<const std::byte> private_data, Actions& out);
  // The connection is gone (rejected, unreachable, disconnected, errored) and
  // its queue pair destroyed. `reason` says why; unknown ids are ignored.
  void OnConnectionLost(ConnectionId id, const absl::Status& reason, Actions& out);

  // Work completions. `immediate` is set for a receive that completed a
  // WRITE_WITH_IMM. Unknown wr_ids are ignored.
  void OnReceiveCompleted(uint64_t wr_id, uint32_t byte_len, std::optional<uint32_t> immediate, Actions& out);
  void OnSendCompleted(uint64_t wr_id, Actions& out);
  // A work request completed with an error: the connection is broken.
  void OnWorkFailed(uint64_t wr_id, const absl::Status& status, Actions& out);

  // Advances time (monotonic, caller's units) and fires expired timers.
  void Tick(uint64_t now, Actions& out);

  // Receiver-named destination: the data frame `frame_index` (0-based) of the
  // next message carrying request id `request_id` that arrives by rendezvous
  // with exactly destination.size() bytes is written straight into
  // `destination` (and delivered as that Buffer). The destination is kept
  // until used or cancelled; a rendezvous of another length, or a frame that
  // came inline, leaves it posted (counted in preposted_mismatches for a
  // rendezvous). It is registered through the registration cache when a
  // rendezvous takes it (a registration waits for room like any other).
  // AlreadyExists if one is posted for that key; InvalidArgument for an
  // empty destination.
  absl::Status PostDestination(uint64_t request_id, uint32_t frame_index, Buffer destination);
  // True when the destination was posted and unused (it is dropped);
  // false when none is posted under that key, including one a rendezvous
  // has taken (see the overload below for that case).
  bool CancelDestination(uint64_t request_id, uint32_t frame_index);
  // What the overload below found.
  enum class CancelResult {
    kCancelled,  // posted and unused: dropped, never written
    kNotPosted,  // nothing under that key: never posted, cancelled, or its data arrived
    kTaken,      // a rendezvous had taken it and its data had not arrived: given up (below)
  };
  // CancelDestination for a caller that must not see its memory written
  // after the call (Transport::CancelDestination). A destination taken by
  // a rendezvous whose clear-to-send has not left yet (waiting for room to
  // register) is swapped for a block of the DestinationPool: the message
  // still arrives, into our memory. One whose clear-to-send has left may be
  // written by the peer at any moment: its connection is disconnected (a
  // DisconnectAction in `out`, unless it is already going) and the shell
  // must destroy the queue pair before it lets the caller reuse the memory;
  // that message is lost with the connection.
  CancelResult CancelDestination(uint64_t request_id, uint32_t frame_index, Actions& out);

  // --- Introspection (tests, metrics) ---
  const EndpointStats& stats() const { return stats_; }
  const SlotPool& pool() const { return pool_; }
  const RegistrationCache& cache() const { return cache_; }
  const DestinationPool& destinations() const { return destinations_; }
  const ProtocolConfig& config() const { return config_; }
  std::optional<ConnectionId> ConnectionTo(const std::string& address) const;
  std::vector<ConnectionId> connections() const;
  // Per connection (nullopt / 0 for an unknown id):
  std::optional<uint32_t> credits_available(ConnectionId id) const;
  uint32_t posted_receives(ConnectionId id) const;
  size_t queued_messages(ConnectionId id) const;
  size_t pending_rendezvous(ConnectionId id) const;  // both directions
  uint32_t sends_in_flight(ConnectionId id) const;
  std::string peer_address(ConnectionId id) const;
  // Whether the peer has proved it holds the job key (always true for an
  // established connection of an endpoint without a key).
  bool authenticated(ConnectionId id) const;
  bool authenticating() const { return auth_key_.has_value(); }

 private:
  // Records, defined in endpoint_connection.h (Connection),
  // endpoint_sending.h (OutgoingMessage, ControlMessage), endpoint_receiving.h
  // (InboundMessage) and endpoint_rendezvous.h (the rendezvous).
  struct Connection;
  struct OutgoingMessage;
  struct ControlMessage;
  struct OutboundRendezvous;
  struct InboundRendezvous;
  struct InboundMessage;
  enum class WorkKind { kReceive, kSend, kWrite };
  struct Work {
    ConnectionId connection = 0;
    WorkKind kind = WorkKind::kSend;
    std::optional<uint32_t> slot;
    uint32_t tag = 0;      // kWrite
    bool final = false;    // kWrite: the WITH_IMM one
  };

  // Bookkeeping (rdma_protocol.cc).
  Connection* Find(ConnectionId id);
  const Connection* Find(ConnectionId id) const;
  Connection& NewConnection(bool active, std::string peer_address);
  uint64_t NewWork(Work work);
  void ReleaseWork(const Work& work);
  uint16_t TakeCredits(Connection& c);
  void Problem(const Connection& c, absl::Status status, Actions& out);
  void Disconnect(Connection& c, absl::Status reason, Actions& out);
  absl::Status PeerError(const Connection& c, absl::StatusCode code, const std::string& what) const;

  // Send path (endpoint_sending.cc).
  void Pump(Connection& c, Actions& out);
  bool SendControl(Connection& c, Actions& out);
  bool SendWrites(Connection& c, Actions& out);
  bool SendMessage(Connection& c, Actions& out);
  bool SendCreditUpdate(Connection& c, Actions& out);
  void WaitForSlot(Connection& c);
  void ServeWaiters(Actions& out);

  // Receive path (endpoint_receiving.cc).
  void HandleSend(Connection& c, std::span<const std::byte> bytes, Actions& out);
  void HandleMessage(Connection& c, const WireFrame& frame, Actions& out);
  void Deliver(Connection& c, Actions& out);

  // Rendezvous (endpoint_rendezvous.cc).
  void HandleClearToSend(Connection& c, const ClearToSend& cts, Actions& out);
  void HandleCancel(Connection& c, uint32_t tag, uint32_t reason, Actions& out);
  void HandleRefuse(Connection& c, uint32_t tag, uint32_t reason, Actions& out);
  void HandleImmediate(Connection& c, uint32_t tag, uint32_t byte_len, Actions& out);
  void ArrangeDestination(Connection& c, InboundRendezvous& rz, uint64_t request_id, Actions& out);
  // Returns false when it must wait for room in the registration cache.
  bool TryRegisterDestination(Connection& c, InboundRendezvous& rz, Actions& out);
  void FailInbound(Connection& c, uint64_t seq, const absl::Status& status, Actions& out);
  void FailOutbound(Connection& c, uint64_t seq, Actions& out);

  // Authentication (see "Authentication" above; endpoint_auth.cc).
  void HandleAuthChallenge(Connection& c, const WireFrame& frame, Actions& out);
  void HandleAuthProof(Connection& c, const WireFrame& frame, Actions& out);
  AuthTranscript Transcript(const Connection& c, AuthRole prover) const;
  void MarkAuthenticated(Connection& c);
  // Counts, disconnects (logging rate-limited) and marks the connection refused.
  void RefuseAuthentication(Connection& c, const std::string& what, Actions& out);
  // The handshake flag check of both sides; OK or the reason to refuse.
  absl::Status CheckPeerAuthFlag(bool peer_requires_auth) const;
  void WarnUnauthenticatedOnce(const Connection& c, Actions& out);

  const ProtocolConfig config_;
  // Derived from config_.auth_secret_key; empty without a key.
  const std::optional<ConnectionAuthKey> auth_key_;
  bool warned_unauthenticated_ = false;
  SlotPool pool_;
  RegistrationCache cache_;
  DestinationPool destinations_;
  uint64_t now_ = 0;
  ConnectionId next_connection_ = 1;
  uint64_t next_wr_id_ = 1;
  // Invariants: every Work in work_ refers to a live connection and holds
  // the slot it names; by_address_ maps to live connections only;
  // slot_waiters_ holds each connection at most once (Connection::waiting_for_slot).
  std::map<ConnectionId, std::unique_ptr<Connection>> connections_;
  absl::flat_hash_map<std::string, ConnectionId> by_address_;
  absl::flat_hash_map<uint64_t, Work> work_;
  std::deque<ConnectionId> slot_waiters_;
  std::deque<std::pair<ConnectionId, uint32_t>> registration_waiters_;  // (connection, inbound tag)
  std::map<std::pair<uint64_t, uint32_t>, Buffer> posted_destinations_;
  EndpointStats stats_;
};

// Bytes of the last chunk of a staged write of `length` bytes in chunks of
// `chunk` bytes (what the receiver sees as byte_len of the WRITE_WITH_IMM).
// Defined in endpoint_rendezvous.cc.
uint64_t LastChunkBytes(uint64_t length, uint64_t chunk);

}  // namespace tessera::rdma

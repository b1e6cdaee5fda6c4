#pragma once
// Transport: moves Messages between nodes named by address strings.
// It holds no protocol logic: no retries, no ordering across peers, no
// interpretation of the header beyond stamping the sender's address.
//
// Contract (every implementation; checked by transport_conformance_test):
// - Start(handler) binds the local endpoint and starts delivery. After it
//   returns OK, address() is the endpoint other nodes send to.
// - Send(to, msg) is thread-safe and does not wait for the peer. It stamps
//   msg.header.sender_address with address(). Frames are sent without copying
//   their bytes where the medium allows; the Buffers are kept alive until the
//   bytes are gone. Messages from one sender to one receiver arrive in the
//   order they were sent; nothing is promised across different senders.
//   A send to an address nobody listens on is not an error (the message may
//   be queued or dropped); callers time out on replies, never on Send.
//   Send before Start() or after Stop() returns FailedPrecondition.
// - The handler runs on the transport's delivery thread (or on a thread
//   inside DeliverUntil, below), one message at a time, in arrival order.
//   It must not block for long; it may call Send.
// - Stop() stops delivery and returns once the handler is no longer running
//   and will not run again. Idempotent. The destructor calls Stop().
// - Malformed incoming data (a header that does not parse) is logged and
//   counted, never delivered, never fatal.
#include <chrono>
#include <functional>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "common/message.h"

namespace tessera {

// What a transport counted. Byte counts are Tessera message bytes: each
// message's serialized header plus its data frames, counted once, when the
// message is handed to the medium (Send accepted it) and when it is
// delivered to the handler. They leave out everything the medium adds:
// ZeroMQ's framing and connection handshakes, CURVE's encryption, TCP/IP
// headers and retransmissions, RDMA's envelopes. Malformed messages
// (dropped, counted in malformed_received) are not in bytes_received;
// messages queued for a peer that never connected are in bytes_sent.
//
// What the sockets carry, for ZmqTransport over TCP (ZMTP 3; checked
// against the kernel's per-socket counters on loopback by
// tests/launcher_e2e/test_wire_bytes.py): for each direction,
//   socket bytes = bytes - shm bytes (shm_bytes_*, shm_lent_bytes_*)
//                + per part (zmq_parts_*): 2 bytes (part up to 255 bytes)
//                  or 9 bytes (longer); with CURVE 33 more (command name,
//                  nonce, flags and MAC of its MESSAGE command)
//                + per connection and direction: the greeting (64 bytes)
//                  and the handshake (43 bytes without CURVE, so 107 in
//                  all; with CURVE 301 from the bound side, 559 from the
//                  connecting side; libzmq 4.3)
// Messages a transport makes itself (ShmTransport's releases) are in its
// counts but in no caller's (Message::sent_bytes, received_bytes).
struct TransportStats {
  uint64_t messages_sent = 0;
  uint64_t messages_received = 0;
  uint64_t bytes_sent = 0;      // header + frames (shared-memory frames included)
  uint64_t bytes_received = 0;  // header + frames (shared-memory frames included)
  // ZeroMQ message parts (a header or a data frame, the routing identity
  // not included) of the messages counted above; zero on transports that
  // do not use ZeroMQ (in-process, RDMA).
  uint64_t zmq_parts_sent = 0;
  uint64_t zmq_parts_received = 0;
  uint64_t malformed_received = 0;
  uint64_t auth_rejected = 0;   // connections refused: not the job's key (ZmqTransport with CURVE)
  // The same-host shared-memory path (ShmTransport); zero elsewhere.
  uint64_t shm_frames_sent = 0;      // data frames sent through a ring
  uint64_t shm_bytes_sent = 0;
  uint64_t shm_frames_received = 0;  // data frames received through a ring
  uint64_t shm_bytes_received = 0;
  uint64_t shm_fallback_frames = 0;  // frames for a same-host peer sent over the wire: ring full
  uint64_t shm_peers = 0;            // destinations with a ring now
  // Lent frames (cross-memory reads, transport/cross_memory.h): counted in
  // neither the shm_frames/shm_bytes figures nor the fallback.
  uint64_t shm_lent_frames_sent = 0;      // frames lent to a same-host peer
  uint64_t shm_lent_bytes_sent = 0;
  uint64_t shm_lent_frames_received = 0;  // frames a same-host peer lent us
  uint64_t shm_lent_bytes_received = 0;
  uint64_t shm_lent_bytes_now = 0;        // lent by us and not yet released
  uint64_t shm_lends_reclaimed = 0;       // lends dropped because their reader's process ended
  // Frames written straight into a destination the receiver posted
  // (Transport::PostDestination); counted by the transport that received them.
  uint64_t frames_placed = 0;
  uint64_t bytes_placed = 0;
  // Small messages sent and delivered together (transport/
  // coalescing_transport.h); zero elsewhere. A batch is one message in the
  // counts above.
  uint64_t coalesce_batches_sent = 0;
  uint64_t coalesce_messages_batched = 0;     // messages that went inside them
  uint64_t coalesce_batches_received = 0;
  uint64_t coalesce_messages_unbatched = 0;   // messages delivered out of them
  uint64_t coalesce_messages_held = 0;        // messages held to go with later ones (batched or not)
};

// What Transport::Forget did. A caller logs it, naming the peer; where
// frames_still_held is not zero it must keep the memory those frames view.
struct ForgetResult {
  // Messages to the peer held back by a wrapper (not yet handed to the
  // medium: CoalescingTransport's held messages, FaultTransport's delayed
  // ones) and dropped. Messages a ZeroMQ DEALER had queued are not counted
  // here: libzmq does not say which it had written (see frames_pending).
  uint64_t messages_dropped = 0;
  // Data frames of messages to the peer that the transport (and its
  // wrappers) still referenced when Forget began: ZeroMQ's zero-copy holds
  // (frames of at least send_copy_below_bytes, queued or being written) and
  // the frames of the messages counted above. Zero: nothing was pending.
  uint64_t frames_pending = 0;
  // Frames of messages to the peer still referenced when Forget returned
  // (max_wait ran out). Zero: no frame of a message whose Send returned
  // before Forget began is referenced any more, and borrowed memory
  // (common/buffer.h) may be reused or freed.
  uint64_t frames_still_held = 0;
};

class Transport {
 public:
  using Handler = std::function<void(Message)>;
  virtual ~Transport() = default;

  virtual absl::Status Start(Handler handler) = 0;
  virtual const std::string& address() const = 0;
  virtual absl::Status Send(const std::string& to, Message message) = 0;
  virtual void Stop() = 0;
  virtual TransportStats stats() const = 0;
  // Whether a frame of `bytes` in a Message::lendable message to `to` would
  // be lent now (read in place by the receiver; ShmTransport), so that
  // splitting it to pipeline copies gains nothing. A hint: the send may
  // still copy (a bound reached meanwhile). Thread-safe.
  virtual bool LendsTo(const std::string& /*to*/, size_t /*bytes*/) const { return false; }
  // Whether large frames to `peer` go through memory on this host (the
  // same-host path, ShmTransport, once it knows the peer is on this host)
  // rather than the network: a hint for how to cut data (wide rows go whole
  // there; in pieces over a network, Worker::Push). False when unknown.
  // Thread-safe. Wrappers pass it on.
  virtual bool SameHostPath(const std::string& /*peer*/) const { return false; }
  // The messages given to Send for `to` that this transport still holds:
  // not yet written to the network (nor dropped). It is memory this process
  // spends on that peer, and it grows when the peer reads slower than it is
  // sent to (a server answering a worker that does not read its replies).
  // Counts move when a whole message leaves: a message is counted from
  // Send until its last byte was handed to the kernel or it was dropped.
  // Transports that hand a message over during Send report zero (the
  // default); wrappers report the transport they wrap. Thread-safe, cheap.
  virtual PeerBacklog Backlog(const std::string& /*to*/) const { return {}; }

  // Forgets `peer` (an address this transport sent to), for a caller that
  // learned that the process there is gone (a server dropped from the shard
  // map) and is about to reuse memory it lent to sends (Buffer::Borrow
  // frames, whose contract ends when the operation completes):
  // - Every message to `peer` that this transport (or a wrapper) still holds
  //   and has not written to the network is dropped: it reaches neither
  //   `peer` nor a process that listens at that address later. (Without it
  //   a ZeroMQ DEALER keeps what it queued for a peer that went away and
  //   sends it to whichever process binds the address next, reading the
  //   frames' memory as it is then.) A message already written may still
  //   arrive, as on any connection loss.
  // - Returns once this transport holds no reference to a data frame of any
  //   message to `peer` whose Send returned before Forget began, or when
  //   `max_wait` ran out: ForgetResult::frames_still_held then counts the
  //   frames still referenced (their memory must not be reused yet).
  // - A later Send to `peer` works as a first one does (a new connection).
  //   A Send to `peer` that overlaps Forget (running on another thread
  //   meanwhile) is either dropped by it or goes on the new connection, as
  //   if it came before or after it; Forget need not wait for its frames.
  // - Not touched: frames lent to a same-host reader (Message::lendable,
  //   ShmTransport) stay lent until the reader releases them or its process
  //   ends (it may be reading them now); lendable messages lend memory their
  //   sender owns, never a caller's borrowed memory. Posted destinations
  //   (below) are the caller's to cancel.
  // - Default: returns at once with nothing pending, for transports that
  //   copy what they keep or hand messages over during Send (in-process).
  //   ZmqTransport implements it; wrappers drop what they hold for `peer`
  //   and pass it on. RdmaTransport keeps the default: it never carries a
  //   queued message over to a new connection (a lost connection drops its
  //   queue), but may reference a frame to a dead peer until it sees the
  //   connection lost (rdma/rdma_transport.h).
  // - Thread-safe. It waits only for the transport's own threads, so it may
  //   be called from the handler (which then waits up to max_wait). Before
  //   Start, after Stop, or for an address never sent to: returns at once,
  //   nothing pending.
  virtual ForgetResult Forget(const std::string& /*peer*/, std::chrono::milliseconds /*max_wait*/) { return {}; }

  // Sends now whatever this transport holds back to send together with
  // later messages (CoalescingTransport). A caller about to wait for answers
  // calls it; the default does nothing. Thread-safe. Wrappers pass it on.
  virtual void Flush() {}

  // Caller delivery (optional): a thread about to block until done() holds
  // may deliver incoming messages itself meanwhile, so that the reply it
  // waits for reaches it without a hand-off from the delivery thread (on a
  // virtual machine each hand-off costs tens of microseconds).
  // - Returns false at once, having delivered nothing, where the transport
  //   does not support it (the default), is not running, is called from
  //   inside its own handler, another thread is delivering this way, or
  //   the delivery thread is busy (messages are flowing, so it will deliver
  //   the reply soon anyway). The caller then waits as it otherwise would.
  // - Otherwise returns true once done() holds or the transport stops.
  //   Meanwhile the handler may run on this thread; the contract above
  //   still holds: one message at a time, in arrival order, never two
  //   handler calls at once, and Stop() from inside the handler works.
  // - done() is called on this thread, between messages and after each
  //   wake; it must be cheap and thread-safe. Whoever makes it true from
  //   another thread calls WakeCallerDelivery(); without that, the caller
  //   notices within `max_wait`.
  virtual bool DeliverUntil(const std::function<bool()>& /*done*/, std::chrono::milliseconds /*max_wait*/) {
    return false;
  }
  // Makes a thread inside DeliverUntil check its done() now. Thread-safe,
  // cheap when nobody delivers that way; a no-op where unsupported.
  virtual void WakeCallerDelivery() {}

  // Link events (optional). A transport that keeps connections to the
  // addresses it sends to calls handler(address, false) when the connection
  // to `address` went down, and handler(address, true) when it was made
  // again after that: messages sent on the old connection and not yet
  // delivered may be lost (the caller sends again what it still awaits).
  // The first connection to an address is no event. Set before Start; the
  // handler runs on a transport thread, must not block for long, and may
  // call Send. Transports without connections (in-process) never call it;
  // wrappers pass it to the transport they wrap.
  using LinkHandler = std::function<void(const std::string& address, bool up)>;
  virtual void SetLinkHandler(LinkHandler /*handler*/) {}

  // Destinations named by the receiver (optional): a caller that expects a
  // reply names the memory its frame should land in, so that the transport
  // writes the bytes there as they arrive instead of into a buffer of its
  // own that the caller would then copy from (how a pull reply lands in the
  // caller's output: worker/worker.cc).
  // - PlacesInto(from): whether this transport may place frames from `from`
  //   now (RDMA: always; same host: once `from` is known to share the host).
  //   A hint: posting for a peer it says false for is harmless, and a posted
  //   destination may still go unused. Default: false (not offered).
  // - PostDestination(from, request_id, frame_index, destination): the data
  //   frame `frame_index` (0-based) of the next message from `from` whose
  //   header carries `request_id` and whose frame holds exactly
  //   destination.size() bytes. Where the medium lets the transport write it
  //   there (RDMA: a frame that comes by rendezvous; same host: a frame
  //   lent or put in a ring), the bytes are written into `destination`
  //   before the handler runs, the handler's message holds, at frame_index,
  //   a Buffer viewing it (frame.data() == destination.data(), the same
  //   size: so the receiver can tell that nothing is left to copy), and the
  //   destination is used up. Otherwise the message is delivered exactly as
  //   without it and the destination stays posted: a frame of another size,
  //   or one the medium carries another way (small frames sent inline, or
  //   over the wire). Implementations may match on (request_id,
  //   frame_index) alone (request ids are the poster's own: only replies
  //   to it carry them); `from` says which peer is expected.
  //   `destination` must be local (not remote), non-empty and writable; the
  //   transport keeps the Buffer (and its owner) until the destination is
  //   used or cancelled. The caller keeps borrowed memory valid, and neither
  //   reads nor writes it, until the handler got a message holding it or
  //   CancelDestination returned. Errors: Unimplemented where not offered;
  //   AlreadyExists when one is posted for the same (from, request_id,
  //   frame_index); InvalidArgument for an empty or remote destination;
  //   FailedPrecondition before Start or after Stop.
  // - CancelDestination(from, request_id, frame_index): true when the
  //   destination was still posted (nothing was written into it); false when
  //   none is (never posted, cancelled, or used by a message). On return,
  //   either way, the transport writes into that memory no more: a write in
  //   progress is finished first (same host), or stopped by tearing down the
  //   connection it comes over (RDMA: once a clear-to-send named the memory,
  //   only a destroyed queue pair stops the peer's write; that message is
  //   lost, as on any connection loss). Stop() cancels every destination.
  // - Thread-safe; Post and Cancel may be called from the handler.
  // Wrappers pass all three to the transport they wrap.
  virtual bool PlacesInto(const std::string& /*from*/) const { return false; }
  virtual absl::Status PostDestination(const std::string& /*from*/, uint64_t /*request_id*/,
                                       uint32_t /*frame_index*/, Buffer /*destination*/) {
    return absl::UnimplementedError("this transport does not place frames into posted destinations");
  }
  virtual bool CancelDestination(const std::string& /*from*/, uint64_t /*request_id*/, uint32_t /*frame_index*/) {
    return false;
  }
};

}  // namespace tessera

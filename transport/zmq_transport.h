#pragma once
// ZmqTransport: the Transport over ZeroMQ (libzmq through cppzmq), for tcp://
// and ipc:// endpoints.
//
// Shape on the wire and in the process:
// - Every node binds one ROUTER socket at address() for everything it
//   receives, and connects one DEALER socket per destination address it sends
//   to (created on the first Send to that address). A reply therefore travels
//   over the replier's own DEALER to the requester's ROUTER: every node both
//   binds and connects, and nobody uses ROUTER identities for routing.
// - One message = one ZeroMQ multipart message: frame 0 is the serialized
//   proto::Envelope (with sender_address stamped), frames 1..n are the data
//   frames, byte for byte. The ROUTER sees [identity, header, frames...].
//
// Contract (in addition to the one in transport/transport.h):
// - Lifecycle: construct, Start() once, then Send() from any thread, then
//   Stop() (or destroy). Start() must happen-before any concurrent use of the
//   object; Start() after Stop() fails with FailedPrecondition. A failed
//   Start() leaves the transport unstarted, so Start() may be called again
//   (with the same options; useful when a fixed port was briefly busy).
// - address(): empty before Start() returns OK; afterwards the endpoint other
//   nodes must send to. For tcp it is the bound endpoint with the real port
//   (port 0 binds an ephemeral port); when options.advertise_host is set it
//   replaces the host, and a wildcard bind ("tcp://*:P", "tcp://0.0.0.0:P",
//   "tcp://[::]:P") without advertise_host advertises this machine's
//   hostname. For ipc it is the bound path ("ipc://*" binds a fresh path).
// - Send(): thread-safe; many threads may send at once, and sends to
//   different destinations proceed in parallel (one mutex per destination).
//   It never waits for the peer: each DEALER queues without bound
//   (ZMQ_SNDHWM = 0, ZMQ_IMMEDIATE off), so a message to a peer that is down or
//   not yet listening is queued and delivered if the peer comes up (or any
//   process that binds its address), and lost if it never does, if the
//   transport stops first (see linger_ms) or if Forget(to) drops it. Queued
//   memory toward a dead or slow peer is therefore not bounded by this
//   class; Backlog(to) tells how much it is, for the caller to bound.
//   Errors: FailedPrecondition before Start() or after Stop();
//   InvalidArgument for a destination ZeroMQ cannot parse, for more than
//   options.max_data_frames data frames, or for a message larger than
//   options.max_message_bytes (the receiver would drop it anyway).
//   Ownership: frames of at least options.send_copy_below_bytes are not
//   copied; the transport keeps a reference to each such Buffer until libzmq
//   has written its bytes (or dropped the message). Borrowed Buffers must stay
//   valid that long, which may be after Send() returns, and for a peer that
//   is down until Forget(to) returned; smaller frames are copied during
//   Send() (with options.count_backlog, a message's last frame is always
//   held, copied or not: its release marks the message written, see
//   Backlog).
// - Forget(to, max_wait) (Transport::Forget): takes `to`'s DEALER out of the
//   table (a later Send makes a new one, with a new connection), stops
//   watching its link (no link event for it from then on), closes it with
//   linger 0, so that libzmq drops every message it had queued for `to`
//   (also a message it was writing: the peer drops the torn frame), and
//   waits until libzmq has released every held frame sent to `to` (each
//   peer counts its holds: every frame of at least send_copy_below_bytes,
//   and with count_backlog every last frame). frames_pending: the holds
//   when it began; messages_dropped: always 0 (libzmq does not say which
//   queued messages it had written). A Send that overlaps it and finds the
//   DEALER closed drops its message and returns OK. Logs a warning when
//   max_wait runs out with frames still held.
// - Receiving: one thread (started by Start) reads the ROUTER and calls the
//   handler once per whole message, in arrival order; a thread inside
//   DeliverUntil takes its place while it waits (never both at once). A data frame of at
//   least options.receive_copy_below_bytes is handed over without a copy (the
//   Buffer owns the ZeroMQ message); smaller frames are copied. Received data
//   frames are at least 8-byte aligned (enough for uint64 keys and float or
//   double values; not the 64 bytes Buffer::Allocate gives).
// - Malformed input (header that does not parse or names no sender_address,
//   no header frame, more than max_data_frames data frames, more than
//   max_message_bytes in total) is logged (rate-limited), counted in
//   stats().malformed_received and never reaches the handler. A single frame
//   above max_message_bytes makes libzmq drop that connection (ZMQ_MAXMSGSIZE)
//   before this class sees it; that is not counted.
// - An exception thrown by the handler is caught, logged and otherwise
//   ignored; the delivery thread keeps going.
// - Stop(): idempotent, callable from any thread, including from inside the
//   handler. Called from outside the handler it returns once the delivery
//   thread has exited (the handler is not running and will not run again),
//   all sockets are closed and the ZeroMQ context is terminated; messages
//   still queued for sending are dropped after options.linger_ms. An ipc
//   socket file this transport bound is removed (unless another transport
//   has bound the same path since: libzmq lets a bind take over a path). Called
//   from inside the handler it stops delivery (the handler is not called
//   again) and the rest finishes when the handler returns. The destructor
//   calls Stop(); destroying the transport from inside its own handler is
//   allowed too.
// - Authentication (options.curve_public_key / curve_secret_key, the job's
//   CURVE key pair, Z85): every connection is encrypted, and the ROUTER lets
//   a peer in only if it presents the job's public key as its own (a ZAP
//   handler in this transport's context checks it, so holding the server key
//   alone is not enough). Every node holds the same pair: it is the job's
//   shared secret. A refused peer's handshake fails; nothing it sends reaches
//   the handler; stats().auth_rejected counts the refusals. Without keys the
//   transport is open to anyone who can reach the port.
// - Links (Transport::SetLinkHandler): each DEALER's connection is watched
//   (a ZeroMQ socket monitor, read by one thread of this transport); the
//   handler hears (address, false) when a connection went down and
//   (address, true) when ZeroMQ made it again. A tcp connection whose sent
//   bytes go unacknowledged for options.link_timeout_ms (TCP_USER_TIMEOUT)
//   is closed and made again, a connection attempt gives up after
//   options.connect_timeout_ms and is tried again options.reconnect_ms
//   later, so that a link cut by the network (packets dropped, no reset)
//   is found broken within seconds, and once the network heals a fresh
//   connection is up within about connect_timeout_ms + reconnect_ms instead
//   of waiting out the kernel's doubling retransmission timer (which after a
//   cut of a minute waits about a minute more).
// - Thread safety: every public method may be called from any thread once
//   Start() has returned; stats() is a snapshot of counters.
// - Exceptions: none escape; cppzmq's zmq::error_t becomes absl::Status.
#include <cstddef>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "transport/transport.h"

namespace tessera {

class ZmqTransport final : public Transport {
 public:
  struct Options {
    // Endpoint the ROUTER binds: "tcp://HOST:PORT" (PORT 0 = ephemeral, HOST may
    // be "*" or "0.0.0.0" for all interfaces) or "ipc:///path".
    std::string bind = "tcp://127.0.0.1:0";
    // Host name or IP put into address() instead of the bound host (tcp only);
    // empty = the bound host, or this machine's hostname for a wildcard bind.
    std::string advertise_host = "";
    // How long Stop() lets queued outgoing messages drain (ZMQ_LINGER), in ms;
    // 0 drops them at once, -1 waits until they are sent (Stop may then block).
    int linger_ms = 0;
    // Largest accepted message (header + data frames), both ways; also the
    // ZMQ_MAXMSGSIZE of the ROUTER, which caps any single frame.
    size_t max_message_bytes = kDefaultMaxMessageBytes;
    // Count what is queued toward each address (Backlog()). It costs an
    // allocation for each message whose last frame would have been copied
    // (a small one): servers turn it on, to bound what they queue for a
    // peer that reads slowly; off, Backlog() reports nothing.
    bool count_backlog = false;
    // Largest number of data frames in one message, both ways.
    size_t max_data_frames = 64;
    // ZeroMQ I/O threads of this transport's own context (at least 1).
    int io_threads = 1;
    // Outgoing frames smaller than this are copied into the ZeroMQ message
    // instead of being referenced (a copy is cheaper than the bookkeeping).
    size_t send_copy_below_bytes = 1024;
    // Incoming frames smaller than this are copied out of the ZeroMQ message,
    // so that a kept Buffer does not pin libzmq's shared 8 KiB receive batch.
    size_t receive_copy_below_bytes = 8 * 1024;
    // Links (see the contract; tcp only; 0: the system's default for each).
    int link_timeout_ms = 2000;     // sent bytes unacknowledged this long: the connection is broken
    int connect_timeout_ms = 200;   // a connection attempt gives up after this ...
    int reconnect_ms = 50;          // ... and the next one starts this much later
    // The job's CURVE key pair (Z85, 40 characters each; transport/job_keys.h);
    // both empty = no authentication or encryption.
    std::string curve_public_key;
    std::string curve_secret_key;
  };

  ZmqTransport() : ZmqTransport(Options{}) {}
  explicit ZmqTransport(Options options);
  ~ZmqTransport() override;
  ZmqTransport(const ZmqTransport&) = delete;
  ZmqTransport& operator=(const ZmqTransport&) = delete;

  // Binds options.bind and starts the delivery thread. Errors:
  // FailedPrecondition when already started or stopped; InvalidArgument for
  // bad options; Unavailable when the bind fails (the message names the
  // endpoint and the system's reason).
  absl::Status Start(Handler handler) override;
  const std::string& address() const override;
  absl::Status Send(const std::string& to, Message message) override;
  // With options.count_backlog: messages queued toward `to` (its DEALER's
  // unbounded queue, see Send) whose last frame libzmq has not released:
  // not yet written to the kernel, or waiting for a connection. Without it,
  // zero.
  PeerBacklog Backlog(const std::string& to) const override;
  ForgetResult Forget(const std::string& peer, std::chrono::milliseconds max_wait) override;
  void Stop() override;
  TransportStats stats() const override;
  // Caller delivery (transport/transport.h): while a thread waits in
  // DeliverUntil it reads the ROUTER and runs the handler itself; the
  // delivery thread parks meanwhile. Only when the delivery thread is idle
  // (waiting for a message) and no other thread delivers this way.
  bool DeliverUntil(const std::function<bool()>& done, std::chrono::milliseconds max_wait) override;
  void WakeCallerDelivery() override;
  void SetLinkHandler(LinkHandler handler) override;

  const Options& options() const;

 private:
  class Impl;
  // Shared with the delivery thread, which keeps the state alive until it
  // exits; that is what makes Stop() and destruction from the handler safe.
  std::shared_ptr<Impl> impl_;
};

}  // namespace tessera

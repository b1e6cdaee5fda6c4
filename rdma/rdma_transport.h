#pragma once
// The RDMA verbs Transport: the same messages as the ZeroMQ transport over
// reliable-connected queue pairs (libibverbs + librdmacm), with the protocol
// of rdma/rdma_protocol.h (EndpointCore) making every decision.
//
// Shape:
// - Addresses are "rdma://HOST:PORT". Start() listens with rdma_cm on the
//   bind host and port (port 0 = ephemeral); address() names the port bound,
//   and this machine's hostname for a wildcard bind.
// - A connection to a peer is made on the first Send to it (lazily) and
//   reused for every later Send to that address; a connection a peer made to
//   us is reused for replies to it (the peer's address travels in the
//   connection's private data, or in a hello message when too long).
// - One registered pool (options.pool_bytes) of fixed slots holds every
//   connection's receive buffers and the eager sends; frames of at least
//   options.rendezvous_threshold bytes are written zero-copy from the sender's
//   Buffer (registered through a cache bounded by options.max_pinned_bytes)
//   into a registered buffer of the receiver by RDMA WRITE_WITH_IMM.
// - One delivery thread waits on the completion channel and the rdma_cm
//   event channel (and ticks the core's timers every 50 ms).
//
// Contract (in addition to transport/transport.h):
// - Lifecycle as ZmqTransport: construct (MakeRdmaTransport), Start() once,
//   Send() from any thread, Stop() (idempotent, callable from the handler).
//   Start() after Stop() fails with FailedPrecondition.
// - Send() never waits for the peer: without credits or pool slots the
//   message is queued in order (memory toward a slow peer is not bounded by
//   this class). Frames of at least rendezvous_threshold bytes are not
//   copied: the Buffer is referenced until the peer has the bytes (after
//   Send() returns). Errors: FailedPrecondition before Start()/after Stop();
//   InvalidArgument for a bad address, too many frames or too many bytes.
//   A message to a peer that cannot be reached or that dies is dropped, with
//   a warning naming the peer.
// - The handler runs on the delivery thread, one message at a time, in
//   arrival order per sender. Received large frames are written into pooled
//   registered blocks that return to the pool when the last Buffer is gone.
// - Malformed input is logged, counted in stats().malformed_received and
//   never delivered.
// - Authentication (options.auth_secret_key, the job's secret key): a
//   connection carries nothing until both sides have proved they hold the
//   job's key (the challenge-response of rdma/connection_auth.h, run by
//   EndpointCore; rules in rdma/rdma_protocol.h). A peer that does not is
//   disconnected, logged (rate-limited) and counted in
//   stats().auth_rejected; nothing it sent reaches the handler. Without a key
//   the transport says at Start that authentication is off, connects only to
//   peers without a key, and warns at its first connection. Authentication
//   is at set-up only: the traffic itself is neither encrypted nor
//   integrity-protected (docs/security.md).
// - Thread safety: all methods may be called from any thread after Start().
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "transport/transport.h"

namespace tessera::rdma {

struct Options {
  std::string bind;                       // "rdma://HOST:PORT" or "tcp://HOST:PORT" (same host/port; port 0 = ephemeral)
  size_t pool_bytes = 64ull << 20;        // registered eager buffers per process
  size_t max_pinned_bytes = 1ull << 30;   // registration cache bound
  size_t rendezvous_threshold = 64 << 10; // frames at least this large go zero-copy by rendezvous
  uint32_t credits = 64;                  // receive slots per connection
  // The job's secret key (Z85, 40 characters: the `secret` line of the job
  // key file, transport/job_keys.h); empty = no authentication.
  std::string auth_secret_key;
};

// OK when this process can use RDMA now (a device with an ACTIVE port and an
// rdma_cm event channel); otherwise Unavailable with a one-line reason, e.g.
// "no RDMA device (ibv_get_device_list: Function not implemented)". Cheap,
// no lasting side effects.
absl::Status Usable();

// The transport (not started), or Unavailable(reason) exactly as Usable()
// would say, or InvalidArgument for a bad bind/options (checked first, so a
// bad configuration is reported even where RDMA is unavailable).
absl::StatusOr<std::unique_ptr<Transport>> MakeRdmaTransport(Options options);

// The checks MakeRdmaTransport makes on `options` before it looks for a
// device: InvalidArgument naming the field, or OK.
absl::Status ValidateOptions(const Options& options);

}  // namespace tessera::rdma

#pragma once
// ShmTransport: a Transport that sends large frames to peers on the same host
// through shared-memory rings (transport/shm_ring.h) and everything else
// through the transport it wraps (ZeroMQ tcp:// or ipc://).
//
// How it works:
// - Every message it sends carries, in its header, this process's host
//   identity (shm::HostIdentity: boot id, /dev/shm, user, network
//   namespace, the launcher's host name). Every message it
//   receives tells it the sender's identity, remembered per sender address.
//   So a peer is known to share the host once any message from it arrived;
//   until then everything goes through the inner transport.
// - To a peer that shares the host, a data frame of at least
//   options.min_frame_bytes is copied into a ring this transport made for
//   that peer (one ring per destination, made on first use), and the message
//   goes through the inner transport with an empty frame in its place and a
//   descriptor (ring name and position) in its header. The receiver hands its
//   handler a Buffer that views the ring: no copy on that side, 64-byte
//   aligned. The space returns to the sender when the last copy of that
//   Buffer is dropped.
// - A frame that does not fit the ring now (the receiver still holds earlier
//   frames) goes through the inner transport: Send never waits. A ring that
//   stays full with no space coming back for options.stuck_ms (its receiver
//   died or restarted, and messages were lost) is replaced by a new one.
// - The per-destination order of the inner transport is kept: the copy into
//   the ring and the inner Send happen under one lock per destination.
// - Selection is logged: one line per peer when its first ring is made, and
//   one if a ring cannot be made (that peer then gets everything through the
//   inner transport). stats() counts frames and bytes both ways and the
//   frames that fell back.
// - Lending (one copy instead of two; options.cross_memory): a frame of a
//   message marked Message::lendable is not copied into the ring when the
//   peer has proven it can read this process's memory. Its descriptor names
//   where the bytes lie here, the Buffer is kept (lent) and the receiver's
//   handler gets a Buffer::remote() frame that copies straight out of this
//   process (process_vm_readv) when read. When the receiver drops the last
//   reference, its transport sends a release and the lend ends. A lend ends
//   otherwise only when the reader's process has ended (checked through a
//   pidfd at most every 100 ms while sending lendable messages; a new
//   process at the reader's address does not end the old one's lends),
//   never on a timeout: a slow reader is never read from reused memory. At most options.ring_bytes are lent to
//   one peer at once; past that, frames take the ring. Only frames of at
//   least options.min_lend_bytes are lent.
//   Proof of readability, per peer process: every header carries the
//   sender's pid, pid namespace and the address and value of a random token
//   (transport/cross_memory.h); the receiver reads the token through a pidfd
//   and, when it matches, says so in its headers (shm_reads_pid). Where that
//   fails (no ptrace rights, another pid namespace, no pidfds) one line is
//   logged and the ring is used. A lender that ends while its frames are
//   being read makes the read fail (Unavailable): the worker then treats the
//   reply as lost and asks again (worker/request_tracker.cc).
//   If this transport stops while lent frames are held, their releases are
//   never sent: the lender keeps them until this process ends.
// - Posted destinations (Transport::PostDestination): a frame that arrives
//   lent or in a ring, from the peer, request id and frame index a
//   destination was posted for, with exactly its size, is copied into it
//   on the delivery thread before the handler runs (one cross-memory read
//   straight into the caller's memory, or one copy out of the ring) and the
//   handler gets the destination in its place; the lend or the ring space
//   goes back at once. Frames that came over the wire, and frames of
//   another size, are delivered as usual. PlacesInto(from) is true once
//   `from` is known to share the host (always with assume_local_peers).
// - Received descriptors are checked (ring name form, owner, bounds, order);
//   a message with a bad one is logged (rate-limited), counted in
//   malformed_received and dropped. The shm fields are removed from every
//   header before the handler sees it.
// - Forget(to) is the inner transport's: what this class keeps of a
//   message sent to `to` is either a copy (ring frames) or a lent frame
//   (Message::lendable, memory its sender owns), and a lend ends only at the
//   reader's release or when its process ended, never at Forget: the reader
//   may be reading it. (Lends whose message Forget dropped are therefore
//   kept until that process ends.)
// - Lifetime: Stop() stops the inner transport, then removes the ring files
//   this transport made (peers' mappings stay valid, so Buffers they hold
//   stay readable). Files left by a crashed process are removed by the next
//   ShmTransport that makes a ring on the host (shm::RemoveDeadRings).
// - Security: rings are files of mode 0600 owned by this user, and peers of
//   another user never share a host identity; the bytes are not encrypted
//   (they never leave the host).
// Thread safety: as the Transport contract. Destroying the transport from
// inside its handler is allowed when the inner transport allows it.
#include <cstdint>
#include <memory>
#include <string>

#include "transport/transport.h"

namespace tessera {

class ShmTransport final : public Transport {
 public:
  struct Options {
    size_t min_frame_bytes = 64 * 1024;  // smaller frames always go through the inner transport
    uint64_t ring_bytes = 64ull << 20;   // per destination; a power of two >= 1 MiB
    int64_t stuck_ms = 2000;             // a full ring with no progress this long is replaced
    uint64_t host_identity = 0;          // 0 = shm::HostIdentity(); tests set others
    // Treat every destination as sharing the host without waiting to hear
    // from it (for tests, and for jobs known to run on one host; a peer that
    // cannot map the rings then drops those messages).
    bool assume_local_peers = false;
    // Lend frames of Message::lendable messages to peers that can read this
    // process, and read frames peers lend (see "Lending" above).
    bool cross_memory = true;
    // Only frames at least this big are lent; smaller ones take the ring,
    // where two processes copying at once beat one cross-memory read (on a
    // 2-vCPU VM the crossover lay between 1 and 2 MiB; docs/benchmarks.md).
    size_t min_lend_bytes = 2 << 20;
  };

  // Takes ownership of `inner`, which must not be started.
  ShmTransport(std::unique_ptr<Transport> inner, Options options);
  ~ShmTransport() override;
  ShmTransport(const ShmTransport&) = delete;
  ShmTransport& operator=(const ShmTransport&) = delete;

  absl::Status Start(Handler handler) override;
  const std::string& address() const override;
  absl::Status Send(const std::string& to, Message message) override;
  void Stop() override;
  TransportStats stats() const override;
  void Flush() override;  // the wrapped transport's
  bool LendsTo(const std::string& to, size_t bytes) const override;
  bool SameHostPath(const std::string& peer) const override;  // PlacesInto's test: the peer's host is ours
  PeerBacklog Backlog(const std::string& to) const override;  // the wrapped transport's
  ForgetResult Forget(const std::string& peer, std::chrono::milliseconds max_wait) override;  // the wrapped transport's
  void SetLinkHandler(LinkHandler handler) override;  // the wrapped transport's events
  // Caller delivery through the inner transport (transport/transport.h).
  bool DeliverUntil(const std::function<bool()>& done, std::chrono::milliseconds max_wait) override;
  void WakeCallerDelivery() override;
  bool PlacesInto(const std::string& from) const override;
  absl::Status PostDestination(const std::string& from, uint64_t request_id, uint32_t frame_index,
                               Buffer destination) override;
  bool CancelDestination(const std::string& from, uint64_t request_id, uint32_t frame_index) override;

  // Checks options: InvalidArgument naming the bad one.
  static absl::Status Validate(const Options& options);

 private:
  class Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace tessera

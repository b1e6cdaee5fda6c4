#pragma once
// Send-side frame holding of ZmqTransport (internal to transport/): how an
// outgoing data frame becomes a zmq::message_t without a copy, and what is
// counted per peer: the frames held (ZmqTransport::Forget waits for them)
// and the messages queued (ZmqTransport::Backlog).
//
// Contract:
// - Owns SendHold, the allocation that keeps a sent frame's bytes alive (a
//   Buffer reference, or a small frame copied into the hold itself) until
//   libzmq releases the message: ReleaseSendHold, which libzmq calls from one
//   of its I/O threads once the bytes are written or the message is dropped,
//   frees it. Nothing else may free a hold that libzmq has taken.
// - PeerHolds is shared between a peer's DEALER (ZmqTransport's Peer, which
//   makes it and calls Drop once) and the holds of that peer's frames still
//   alive; the last of them frees it. Every hold counts itself in it (one
//   atomic add on the sending thread, one subtract on the releasing thread,
//   after the hold's Buffer is gone), so held_frames() == 0, read with
//   acquire, means no frame sent to the peer is referenced any more. Frames
//   copied into the ZeroMQ message (below send_copy_below_bytes) make no
//   hold and cost nothing. The backlog counters are counted up by
//   CountedToZmq on the sending thread and down by ReleaseSendHold.
// - Callers: ZmqTransport::Impl::Send, once per frame. FrameToZmq and
//   CountedToZmq are inline so that they compile into Send itself (this is
//   the per-frame send path); any thread may call them, for frames it owns,
//   with a PeerHolds it holds a reference to (its Peer). WaitForRelease:
//   ZmqTransport::Impl::Forget, after closing the DEALER.
// - A zmq::error_t from libzmq (zmq_msg_init_data) propagates to the caller;
//   the hold is released first.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <new>
#include <utility>

#include <zmq.hpp>

#include "common/buffer.h"

namespace tessera::zmq_internal {

// What one peer's messages hold: the frames libzmq has not released, and
// (when the transport counts backlogs) the messages and bytes queued.
class PeerHolds {
 public:
  static PeerHolds* New() { return new PeerHolds(); }
  PeerHolds(const PeerHolds&) = delete;
  PeerHolds& operator=(const PeerHolds&) = delete;

  // The Peer lets go (once); freed here when no hold is left.
  void Drop() { Unref(); }
  // A hold of a frame sent to this peer begins (the caller holds a
  // reference, so the count is above zero) / ends (ReleaseSendHold).
  void AddHold() { refs_.fetch_add(1, std::memory_order_relaxed); }
  void EndHold() { Unref(); }
  // Frames held now. Only while the caller holds the Peer's reference.
  uint64_t held_frames() const { return refs_.load(std::memory_order_acquire) - 1; }
  // Waits until held_frames() is 0 or `max_wait` passed (polling: libzmq's
  // threads release without telling anyone); returns held_frames() then.
  uint64_t WaitForRelease(std::chrono::milliseconds max_wait) const;

  // Messages and bytes sent to the peer that libzmq still holds (Backlog).
  std::atomic<uint64_t> backlog_messages{0};
  std::atomic<uint64_t> backlog_bytes{0};

 private:
  PeerHolds() = default;
  void Unref() {
    if (refs_.fetch_sub(1, std::memory_order_acq_rel) == 1) delete this;
  }
  std::atomic<uint64_t> refs_{1};  // the Peer's reference + one per hold alive
};

// Keeps a sent frame's bytes alive until libzmq releases the message. The
// atomic flag gives ThreadSanitizer the happens-before edge that libzmq's
// own (uninstrumented) queues provide between the sending thread and the I/O
// thread that frees the message.
struct SendHold {
  // A hold with `inline_size` bytes of its own after it (one allocation),
  // for a small frame copied into it.
  static SendHold* New(size_t inline_size = 0) {
    return new (::operator new(sizeof(SendHold) + inline_size)) SendHold();
  }
  static void Delete(SendHold* hold) {
    hold->~SendHold();
    ::operator delete(hold);
  }
  std::byte* inline_bytes() { return reinterpret_cast<std::byte*>(this + 1); }

  Buffer buffer;  // the frame, when not copied inline
  std::atomic<bool> published{false};
  // Set on the last frame of a message when the transport counts backlogs:
  // libzmq releases a message's frames in order once written (or dropped),
  // so the release of the last one means the whole message left.
  bool counted = false;
  uint64_t backlog_bytes = 0;
  PeerHolds* peer = nullptr;  // counts this hold
};
static_assert(sizeof(SendHold) % alignof(uint64_t) == 0);

// libzmq's free function for held messages (`hint` is the SendHold).
void ReleaseSendHold(void* data, void* hint);

// The message for `hold`'s bytes (data, size); the hold is released with it.
inline zmq::message_t HeldMessage(SendHold* hold, void* data, size_t size) {
  hold->published.store(true, std::memory_order_release);  // our last access before libzmq owns it
  try {
    return zmq::message_t(data, size, &ReleaseSendHold, hold);
  } catch (...) {
    ReleaseSendHold(data, hold);  // zmq_msg_init_data failed and did not take the hint
    throw;
  }
}

// A data frame as a ZeroMQ message: frames smaller than `copy_below_bytes`
// are copied, larger ones are referenced through a hold.
// The hold is counted in `peer`.
inline zmq::message_t FrameToZmq(Buffer frame, size_t copy_below_bytes, PeerHolds* peer) {
  if (frame.empty()) return zmq::message_t();
  if (frame.size() < copy_below_bytes) return zmq::message_t(frame.data(), frame.size());
  SendHold* hold = SendHold::New();
  hold->buffer = std::move(frame);
  peer->AddHold();
  hold->peer = peer;
  return HeldMessage(hold, const_cast<std::byte*>(hold->buffer.data()), hold->buffer.size());
}

// The last frame of a message when backlogs are counted: always held, its
// release takes the message (`message_bytes`) off `peer`'s backlog. A
// non-empty `frame` is kept by reference; otherwise `fill` writes the
// frame's `size` bytes into the hold (one allocation). Counted in `peer`.
inline zmq::message_t CountedToZmq(size_t size, const std::function<void(std::byte*)>& fill, Buffer frame,
                                   PeerHolds* peer, uint64_t message_bytes) {
  const bool copy = frame.empty();
  SendHold* hold = SendHold::New(copy ? std::max<size_t>(size, 1) : 0);
  void* data = hold->inline_bytes();
  if (copy) {
    fill(hold->inline_bytes());
  } else {
    hold->buffer = std::move(frame);
    data = const_cast<std::byte*>(hold->buffer.data());
  }
  // Counted before libzmq can release it (which may happen at once).
  peer->AddHold();
  peer->backlog_messages.fetch_add(1, std::memory_order_relaxed);
  peer->backlog_bytes.fetch_add(message_bytes, std::memory_order_relaxed);
  hold->peer = peer;
  hold->counted = true;
  hold->backlog_bytes = message_bytes;
  return HeldMessage(hold, data, size);
}

}  // namespace tessera::zmq_internal

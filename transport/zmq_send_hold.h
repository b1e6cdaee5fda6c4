#pragma once
// Send-side frame holding of ZmqTransport (internal to transport/): how an
// outgoing data frame becomes a zmq::message_t without a copy, and how the
// messages queued toward one peer are counted (ZmqTransport::Backlog).
//
// Contract:
// - Owns SendHold, the allocation that keeps a sent frame's bytes alive (a
//   Buffer reference, or a small frame copied into the hold itself) until
//   libzmq releases the message: ReleaseSendHold, which libzmq calls from one
//   of its I/O threads once the bytes are written or the message is dropped,
//   frees it. Nothing else may free a hold that libzmq has taken.
// - BacklogCount is shared between a peer's DEALER (ZmqTransport) and the
//   holds of that peer's messages still queued: counted up by CountedToZmq
//   on the sending thread, down by ReleaseSendHold on the I/O thread. The
//   counters are atomics; readers take a snapshot.
// - Callers: ZmqTransport::Impl::Send, once per frame. FrameToZmq and
//   CountedToZmq are inline so that they compile into Send itself (this is
//   the per-frame send path); any thread may call them, for frames it owns.
// - A zmq::error_t from libzmq (zmq_msg_init_data) propagates to the caller;
//   the hold is released first.
#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <new>
#include <utility>

#include <zmq.hpp>

#include "common/buffer.h"

namespace tessera::zmq_internal {

// Messages and bytes sent to one peer that libzmq still holds (Backlog).
struct BacklogCount {
  std::atomic<uint64_t> messages{0};
  std::atomic<uint64_t> bytes{0};
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
  std::shared_ptr<BacklogCount> backlog;
  uint64_t backlog_bytes = 0;
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
inline zmq::message_t FrameToZmq(Buffer frame, size_t copy_below_bytes) {
  if (frame.empty()) return zmq::message_t();
  if (frame.size() < copy_below_bytes) return zmq::message_t(frame.data(), frame.size());
  SendHold* hold = SendHold::New();
  hold->buffer = std::move(frame);
  return HeldMessage(hold, const_cast<std::byte*>(hold->buffer.data()), hold->buffer.size());
}

// The last frame of a message when backlogs are counted: always held, its
// release takes the message (`message_bytes`) off `backlog`. A non-empty
// `frame` is kept by reference; otherwise `fill` writes the frame's
// `size` bytes into the hold (one allocation).
inline zmq::message_t CountedToZmq(size_t size, const std::function<void(std::byte*)>& fill, Buffer frame,
                                   std::shared_ptr<BacklogCount> backlog, uint64_t message_bytes) {
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
  backlog->messages.fetch_add(1, std::memory_order_relaxed);
  backlog->bytes.fetch_add(message_bytes, std::memory_order_relaxed);
  hold->backlog = std::move(backlog);
  hold->backlog_bytes = message_bytes;
  return HeldMessage(hold, data, size);
}

}  // namespace tessera::zmq_internal

#pragma once
// Buffer: a reference-counted, immutable-by-convention span of bytes.
//
// Contract:
// - Copying a Buffer shares the bytes (no copy of data); the bytes live until
//   the last Buffer that refers to them is destroyed.
// - Buffer::Borrow wraps memory the caller owns; the caller promises it stays
//   valid and unchanged until every Buffer (and every message) that refers to
//   it is gone. This is how sends avoid copying user data.
// - mutable_data() is for the producer that just allocated the buffer; once a
//   Buffer is handed to a transport nobody writes to it.
// - Thread safety: a Buffer object is a value (like shared_ptr); distinct
//   objects sharing bytes may be used from different threads.
// - Remote buffers (Buffer::Remote) hold bytes that lie in another process
//   on this host, lent by its transport (transport/shm_transport.h): data()
//   is null, size() is the length, and the bytes are read only through
//   CopyOut, which may fail (the lending process is gone). A transport makes
//   them only for messages whose sender set Message::lendable, so code that
//   reads such messages' frames must read them with CopyOut; every other
//   Buffer reads the same through CopyOut as through data().
// - Transient buffers (MarkTransient) view memory a transport must get back
//   soon (a shared-memory ring that its sender reuses in order). Reading
//   them in the handler is fine; code that keeps a received frame after
//   its handler returns (worker/pulled_rows.h) copies a transient one
//   instead, so that holding it never stalls the sender. Slices keep the
//   mark.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <mutex>
#include <span>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"

namespace tessera {

// One piece of a CopyOut: `length` bytes from `offset` in the buffer to `dst`.
struct CopyRange {
  size_t offset = 0;
  void* dst = nullptr;
  size_t length = 0;
};

// Bytes in another process, readable on demand (implemented by a transport).
// The object keeps them lent: the owner process keeps them unchanged until
// this object is destroyed.
class RemoteBytes {
 public:
  virtual ~RemoteBytes() = default;
  // Copies each range (offsets relative to the start of the lent bytes, all
  // inside them) into its destination. Unavailable: the lending process is
  // gone (nothing read may be trusted); Internal: another failure.
  virtual absl::Status Read(std::span<const CopyRange> ranges) const = 0;
};

class Buffer {
 public:
  Buffer() = default;

  // Uninitialized storage of `size` bytes, owned by the buffer (64-byte aligned).
  static Buffer Allocate(size_t size);
  // A copy of [data, data+size).
  static Buffer CopyOf(const void* data, size_t size);
  // A non-owning view; see the class contract.
  static Buffer Borrow(const void* data, size_t size);
  // Takes shared ownership of `owner`, which keeps [data, data+size) alive.
  static Buffer Adopt(std::shared_ptr<void> owner, void* data, size_t size);
  // `size` bytes lent by another process; see the class contract.
  static Buffer Remote(std::shared_ptr<const RemoteBytes> bytes, size_t size);

  bool remote() const { return remote_ != nullptr; }
  bool transient() const { return transient_; }
  // Marks this buffer transient (see the class contract); returns it.
  Buffer&& MarkTransient() && {
    transient_ = true;
    return std::move(*this);
  }
  // Copies ranges of this buffer (each inside it) to their destinations:
  // memcpy for local bytes, RemoteBytes::Read for remote ones (one call for
  // all ranges). Errors only for remote buffers, as RemoteBytes::Read.
  absl::Status CopyOut(std::span<const CopyRange> ranges) const;

  // Null for remote buffers.
  const std::byte* data() const { return data_; }
  std::byte* mutable_data() { return data_; }
  size_t size() const { return size_; }
  bool empty() const { return size_ == 0; }

  // A view of [offset, offset+length) sharing ownership. Requires the range
  // to lie inside this buffer.
  Buffer Slice(size_t offset, size_t length) const;

  // Typed views. Requires size() to be a multiple of sizeof(T); the data of
  // Allocate()d and pooled buffers is suitably aligned for any scalar.
  template <typename T>
  std::span<const T> As() const {
    return {reinterpret_cast<const T*>(data_), size_ / sizeof(T)};
  }
  template <typename T>
  std::span<T> AsMutable() {
    return {reinterpret_cast<T*>(data_), size_ / sizeof(T)};
  }

  // The shared owner (may be null for borrowed or empty buffers). Transports
  // use it to tie the lifetime of a zero-copy send to the bytes.
  const std::shared_ptr<void>& owner() const { return owner_; }

 private:
  Buffer(std::shared_ptr<void> owner, std::byte* data, size_t size)
      : owner_(std::move(owner)), data_(data), size_(size) {}

  std::shared_ptr<void> owner_;
  std::shared_ptr<const RemoteBytes> remote_;  // set for remote buffers (data_ null)
  size_t remote_offset_ = 0;                   // of this view within remote_'s bytes
  std::byte* data_ = nullptr;
  size_t size_ = 0;
  bool transient_ = false;
};

// BufferPool: recycles large allocations so that receiving or building many
// large frames does not map and unmap fresh memory every time (page faults
// cost more than the copy they avoid).
//
// Contract:
// - Get(n) returns an owned Buffer of exactly n bytes (uninitialized). When
//   the last reference drops, the block returns to the pool if the pool still
//   exists and holds fewer than max_cached bytes; else it is freed.
// - Blocks are kept in power-of-two size classes from min_pooled_bytes up.
//   Smaller requests are plain allocations.
// - Thread-safe. The pool may be destroyed while buffers from it are alive.
class BufferPool {
 public:
  struct Options {
    size_t min_pooled_bytes = 64 * 1024;  // smaller sizes are not pooled
    size_t max_cached_bytes = 1ull << 30; // upper bound on idle memory kept
  };
  BufferPool() : BufferPool(Options{}) {}
  explicit BufferPool(Options options);
  ~BufferPool();
  BufferPool(const BufferPool&) = delete;
  BufferPool& operator=(const BufferPool&) = delete;

  Buffer Get(size_t size);

  // Statistics, for tests and metrics.
  uint64_t hits() const;
  uint64_t misses() const;
  size_t cached_bytes() const;

 private:
  struct State;
  std::shared_ptr<State> state_;
};

}  // namespace tessera

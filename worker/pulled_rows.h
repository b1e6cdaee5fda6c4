#pragma once
// PulledRows: the result of Worker::PullView, a pull whose rows stay in the
// buffers they arrived in (zero-copy on the worker).
//
// Worker::Pull writes every row into the caller's `out`: one copy of each
// pulled byte on the worker, on top of what the transport did to receive it.
// PullView skips that copy: row(i) points into the reply frame that carried
// key i (over ZeroMQ, the block libzmq received the message into). Use it
// when the rows are only read once (summed, fed to a device copy, checked),
// and Pull when they must end up in a buffer of the caller's own.
//
// Promises:
// - Valid only once the pull's Future completed OK; until then, and after a
//   failed pull, row() must not be called (size() is 0 before the pull began).
// - row(i) is key i's row of width() floats, as the server had it when it
//   answered. Rows never change afterwards: the frames are held by this
//   object, and a server's row that is later updated is copied first
//   (copy-on-write), never changed under a view.
// - Rows are read in place when a reply came whole, as plain floats in
//   this process's memory and aligned for floats (PullView asks servers for
//   whole replies: Pull.whole). A compressed reply (pull_compression) is
//   viewed in the buffer it was decoded into. A reply lent by a same-host
//   server, or one that views a shared-memory ring its sender wants back
//   (Buffer::transient()), or a reply too large for one message (sent in
//   pieces after all: ServerCoreOptions::max_whole_reply_bytes), is copied
//   once into a buffer of this object: one copy at most, never two.
// - The object holds the frames (their memory) until it is destroyed,
//   Clear()ed or used for another pull. Reusing it for a new PullView is
//   allowed once the previous pull completed.
// - Not thread-safe: one pull at a time, read after completion.
#include <cstdint>
#include <span>
#include <vector>

#include "common/buffer.h"
#include "common/check.h"

namespace tessera {

class RequestTracker;

class PulledRows {
 public:
  PulledRows() = default;
  PulledRows(const PulledRows&) = delete;
  PulledRows& operator=(const PulledRows&) = delete;
  PulledRows(PulledRows&&) = default;
  PulledRows& operator=(PulledRows&&) = default;

  size_t size() const { return rows_.size(); }
  uint32_t width() const { return width_; }
  // Requires i < size() (checked in debug builds only: called once per row).
  std::span<const float> row(size_t i) const {
    TESSERA_DCHECK(i < rows_.size());
    return {rows_[i], width_};
  }
  // Copies every row into `out` (size() * width() floats), row i at i * width().
  void CopyTo(std::span<float> out) const;
  // Drops the rows and the frames that hold them.
  void Clear();
  // Bytes of frames held (for accounting; at least size() * width() * 4).
  uint64_t held_bytes() const;

 private:
  friend class RequestTracker;
  void Reset(size_t rows, uint32_t width);

  std::vector<Buffer> held_;
  std::vector<const float*> rows_;
  uint32_t width_ = 0;
};

}  // namespace tessera

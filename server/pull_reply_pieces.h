#pragma once
// Pull replies in pieces: how ServerCore puts a reply on the wire. A part of
// ServerCore (docs/design.md, "Server parts").
//
// A reply whose values frame is larger than piece_bytes
// (ServerCoreOptions::pull_reply_piece_bytes) is sent as several messages
// to the same address, in order, each a zero-copy slice of the values:
//   piece 0:    the full PullReply header, frames [values[0, n0), descriptor]
//   piece k>0:  request_id, sender_id and epoch only (no body),
//               frames [values[o_k, o_k + n_k), descriptor]
// where descriptor is 16 bytes: the piece's byte offset and the total value
// bytes, as two little-endian uint64. Pieces are contiguous and in offset
// order. An unsplit reply has one frame and no descriptor. The receiver can
// place each piece while the next is still on the wire. A reply to an
// address for which reads_in_place says true is never split, nor one to a
// pull with Pull.whole set (Message::unsplit; Worker::PullView keeps the
// values in the message they arrive in: pieces would have to be joined by a
// copy) when it has at most max_whole_bytes. Only plain (uncompressed)
// pull replies are split; any other message goes as it is.
//
// Every plain pull reply, whole or in pieces, is marked Message::lendable
// (the worker reads plain values with Buffer::CopyOut, so a same-host
// transport may lend them).
// Pure: no I/O, threads or clocks. Thread safety: none (reads_in_place is
// called on the caller's thread).
#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "common/message.h"

namespace tessera {

inline constexpr size_t kPullPieceDescriptorBytes = 16;

struct ReplyPieceRules {
  size_t piece_bytes = 0;  // 0: never split
  size_t max_whole_bytes = size_t{1} << 30;
  // Whether the transport reads values of this many bytes to `to` in place
  // (not owned; null, or an empty function: split).
  const std::function<bool(const std::string& to, size_t bytes)>* reads_in_place = nullptr;
  uint32_t sender_id = 0;           // stamped on pieces after the first
  std::optional<uint64_t> epoch;    // likewise, when set
};

// Appends `reply` to `out`, whole or in pieces, per `rules`.
void AppendReply(std::vector<Outgoing>& out, std::string to, Message reply, const ReplyPieceRules& rules);

}  // namespace tessera

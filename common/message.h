#pragma once
// Message: one protocol message = a protobuf header (Envelope) plus raw data
// frames (keys, values) that never pass through protobuf.
#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/buffer.h"
#include "proto/tessera.pb.h"

namespace tessera {

// The largest message (header and data frames) a process accepts by
// default: every ZeroMQ transport's max_message_bytes, tessera-server's
// --max-message-mb and the launcher's limits.max_message_mb. Nothing a job
// sends by default meets it: a worker splits each server's share of a push
// or pull into parts that fit it (worker/worker_core.h,
// --transfer_max_message_mb), servers send pull replies in pieces and
// state transfers to backups in several messages (ShardTransfer.continued).
// It bounds what one message of a peer makes a process allocate.
inline constexpr size_t kDefaultMaxMessageBytes = size_t{256} << 20;

// Pushed rows wider than this go in pieces of this many bytes by default
// (WorkerOptions::row_piece_bytes, worker/worker_core.h), so that the server updates a wide
// row piece by piece as it arrives: a 16 MiB row pushes at 1.05-1.13x raw
// ZeroMQ in 2 MiB pieces against 0.60-0.70x whole, and rows of 2 MiB and
// less gain nothing from pieces (docs/benchmarks.md, "Pieces of wide rows
// by default").
inline constexpr size_t kDefaultRowPieceBytes = size_t{2} << 20;

// What a transport was given to send to one address and has not yet written
// out or dropped (Transport::Backlog): whole messages, and their bytes as
// the transport counts them (header + data frames).
struct PeerBacklog {
  uint64_t messages = 0;
  uint64_t bytes = 0;
};

struct Message {
  proto::Envelope header;
  std::vector<Buffer> frames;
  // The sender allows a same-host transport to lend these frames instead of
  // copying them: the receiver may get Buffer::remote() frames, views of the
  // sender's memory read with Buffer::CopyOut (transport/shm_transport.h).
  // Set only where the receiving code reads frames with CopyOut. Not sent.
  bool lendable = false;
  // A pull reply its receiver keeps as it arrives (Worker::PullView, the
  // request's Pull.whole): sent as one message, never in pieces. Not sent.
  bool unsplit = false;
  // Goes at once: a transport that holds small messages to send them
  // together (transport/coalescing_transport.h) does not hold this one; what
  // it held for the same peer goes first (order kept). For control messages
  // (a node's session with the coordinator), which nothing follows soon.
  // Not sent.
  bool at_once = false;
  // Byte accounting (transport/transport.h TransportStats), for callers that
  // count their own traffic by kind (the worker's wire bytes). Not sent.
  // - sent_bytes: where set, the transport adds what it counts in
  //   bytes_sent for this message (the header as sent, with whatever the
  //   transport stamps into it, plus every frame, shared-memory ones
  //   included), each time it hands the message over.
  // - received_bytes: set by the transport that delivers the message: what
  //   it counted in bytes_received for it (the header as it arrived, before
  //   the transport took its own fields out, plus every frame).
  std::shared_ptr<std::atomic<uint64_t>> sent_bytes;
  uint64_t received_bytes = 0;

  // Total bytes of the data frames (what the data path moves).
  size_t FrameBytes() const {
    size_t n = 0;
    for (const Buffer& f : frames) n += f.size();
    return n;
  }
};

// A message addressed to a node, as produced by the pure cores.
struct Outgoing {
  std::string to;  // transport address of the destination
  Message message;
};

}  // namespace tessera

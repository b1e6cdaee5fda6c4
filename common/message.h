#pragma once
// Message: one protocol message = a protobuf header (Envelope) plus raw data
// frames (keys, values) that never pass through protobuf.
#include <string>
#include <vector>

#include "common/buffer.h"
#include "proto/tessera.pb.h"

namespace tessera {

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

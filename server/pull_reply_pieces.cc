#include "server/pull_reply_pieces.h"

#include <algorithm>
#include <cstring>

namespace tessera {

void AppendReply(std::vector<Outgoing>& out, std::string to, Message reply, const ReplyPieceRules& rules) {
  // Plain values are read by the worker with Buffer::CopyOut
  // (worker/request_tracker.cc): a same-host transport may lend them.
  const bool plain_values = reply.header.has_pull_reply() && reply.header.pull_reply().value_parts() == 0;
  reply.lendable = plain_values;
  const size_t piece = rules.piece_bytes;
  if (piece == 0 || !plain_values || reply.frames.size() != 1 || reply.frames[0].size() <= piece ||
      (reply.unsplit && reply.frames[0].size() <= rules.max_whole_bytes) ||
      (rules.reads_in_place && *rules.reads_in_place && (*rules.reads_in_place)(to, reply.frames[0].size()))) {
    out.push_back(Outgoing{std::move(to), std::move(reply)});
    return;
  }
  const Buffer values = std::move(reply.frames[0]);
  const uint64_t total = values.size();
  const uint64_t request_id = reply.header.request_id();
  for (uint64_t offset = 0; offset < total; offset += piece) {
    Message m;
    if (offset == 0) {
      m.header = std::move(reply.header);
    } else {
      m.header.set_request_id(request_id);
      m.header.set_sender_id(rules.sender_id);
      if (rules.epoch) m.header.set_epoch(*rules.epoch);
    }
    const uint64_t n = std::min<uint64_t>(piece, total - offset);
    Buffer descriptor = Buffer::Allocate(kPullPieceDescriptorBytes);
    const uint64_t words[2] = {offset, total};  // little-endian hosts only (as every frame here)
    std::memcpy(descriptor.mutable_data(), words, sizeof(words));
    m.frames.push_back(values.Slice(offset, n));
    m.frames.push_back(std::move(descriptor));
    m.lendable = true;
    out.push_back(Outgoing{to, std::move(m)});
  }
}

}  // namespace tessera

#include "server/backup_streams.h"

#include <algorithm>
#include <limits>

namespace tessera {

BackupStream& BackupStreams::To(uint32_t rank, uint32_t node_id) {
  BackupStream& stream = streams_[rank];
  if (stream.id == 0) {
    stream.id = next_stream_id_++;
    stream.node_id = node_id;
  }
  return stream;
}

BackupStream* BackupStreams::Find(uint32_t rank) {
  auto it = streams_.find(rank);
  return it == streams_.end() ? nullptr : &it->second;
}

std::vector<uint32_t> BackupStreams::Ranks() const {
  std::vector<uint32_t> ranks;
  for (const auto& [rank, stream] : streams_) ranks.push_back(rank);
  std::sort(ranks.begin(), ranks.end());
  return ranks;
}

const Forward& BackupStreams::Append(BackupStream& stream, Message message, uint64_t push_id, Nanos now,
                                     std::vector<uint64_t> carried, bool more) {
  proto::Replicate* r = message.header.mutable_replicate();
  r->set_stream(stream.id);
  r->set_position(stream.next_position++);
  stream.unacked.push_back(Forward{r->position(), push_id, std::move(message), now, std::move(carried), 0, false, more});
  return stream.unacked.back();
}

BackupStreams::AckResult BackupStreams::Acked(uint32_t rank, uint64_t stream_id, uint64_t position, bool gap,
                                              Nanos now) {
  AckResult result;
  BackupStream* stream = Find(rank);
  if (stream == nullptr || stream->id != stream_id) return result;
  std::deque<Forward>& unacked = stream->unacked;
  // A round trip, when this ack is for the front forward alone and that was
  // sent once (an ack that covers several waited for a lost one; a gap
  // notice waited for a later forward). Its bytes teach the backup's pace
  // too (a lower bound: forwards sent before it may have been ahead).
  if (!gap && !unacked.empty() && unacked.front().position == position && unacked.front().resends == 0) {
    TimerOf(rank).Sample(now - unacked.front().sent, unacked.front().message.FrameBytes());
  }
  while (!unacked.empty() && unacked.front().position <= position) {
    result.done.push_back(std::move(unacked.front()));
    unacked.pop_front();
  }
  if (gap && !unacked.empty() && unacked.front().position == position + 1 && !unacked.front().gap_resent) {
    unacked.front().gap_resent = true;
    result.gap_resend = Resend(unacked.front(), now);
  }
  return result;
}

std::optional<Forward> BackupStreams::Refused(uint32_t rank, uint64_t stream_id, uint64_t position) {
  BackupStream* stream = Find(rank);
  if (stream == nullptr || stream->id != stream_id) return std::nullopt;
  for (auto f = stream->unacked.begin(); f != stream->unacked.end(); ++f) {
    if (f->position != position) continue;
    Forward refused = std::move(*f);
    stream->unacked.erase(f);
    return refused;
  }
  return std::nullopt;
}

std::vector<Message> BackupStreams::TakeDue(uint32_t rank, Nanos now, bool due_only) {
  std::vector<Message> out;
  BackupStream* stream = Find(rank);
  if (stream == nullptr) return out;
  const RetransmitTimer& timer = TimerOf(rank);
  uint64_t ahead = 0;  // bytes of the stream's unacknowledged forwards, this one included
  for (Forward& f : stream->unacked) {
    ahead += f.message.FrameBytes();
    if (due_only && now - f.sent < timer.After(f.resends, ahead)) continue;
    out.push_back(Resend(f, now));
  }
  return out;
}

Message BackupStreams::Resend(Forward& f, Nanos now) {
  f.sent = now;
  f.resends++;
  return f.message;  // shares the frames
}

uint64_t BackupStreams::AckedThrough(uint32_t rank, uint64_t stream_id) const {
  auto it = streams_.find(rank);
  if (it == streams_.end() || it->second.id != stream_id) return UINT64_MAX;  // that stream ended: nothing to wait for
  const BackupStream& s = it->second;
  return s.unacked.empty() ? s.next_position - 1 : s.unacked.front().position - 1;
}

std::optional<std::pair<uint64_t, uint64_t>> BackupStreams::SentThrough(uint32_t rank) const {
  auto it = streams_.find(rank);
  if (it == streams_.end()) return std::nullopt;
  return std::make_pair(it->second.id, it->second.next_position - 1);
}

size_t BackupStreams::unacked() const {
  size_t n = 0;
  for (const auto& [rank, stream] : streams_) n += stream.unacked.size();
  return n;
}

Nanos BackupStreams::NextDue() const {
  Nanos next = std::numeric_limits<Nanos>::max();
  for (const auto& [rank, stream] : streams_) {
    auto t = timers_.find(rank);
    const RetransmitTimer timer = t == timers_.end() ? RetransmitTimer(resend_) : t->second;
    uint64_t ahead = 0;
    for (const Forward& f : stream.unacked) {
      ahead += f.message.FrameBytes();
      next = std::min(next, f.sent + timer.After(f.resends, ahead));
    }
  }
  return next;
}

Nanos BackupStreams::ShortestTimer() const {
  Nanos shortest = RetransmitTimer(resend_).rto();
  for (const auto& [rank, timer] : timers_) shortest = std::min(shortest, timer.rto());
  return shortest;
}

std::vector<std::pair<uint32_t, RetransmitTimer>> BackupStreams::Timers() const {
  std::vector<std::pair<uint32_t, RetransmitTimer>> out(timers_.begin(), timers_.end());
  std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  return out;
}

RetransmitTimer& BackupStreams::TimerOf(uint32_t rank) {
  auto it = timers_.find(rank);
  if (it == timers_.end()) it = timers_.emplace(rank, RetransmitTimer(resend_)).first;
  return it->second;
}

}  // namespace tessera

// PostedPulls: the book of pull destinations posted with the transport
// (see worker/posted_pulls.h).
#include "worker/posted_pulls.h"

#include <cstring>
#include <memory>
#include <span>
#include <utility>

#include "common/buffer.h"

namespace tessera {

namespace {

// Bytes already where they are read to: a read into their own place is
// done; any other read copies.
class PlacedBytes final : public RemoteBytes {
 public:
  explicit PlacedBytes(Buffer bytes) : bytes_(std::move(bytes)) {}
  absl::Status Read(std::span<const CopyRange> ranges) const override {
    for (const CopyRange& r : ranges) {
      const std::byte* from = bytes_.data() + r.offset;
      if (r.dst != from) std::memcpy(r.dst, from, r.length);
    }
    return absl::OkStatus();
  }

 private:
  Buffer bytes_;
};

}  // namespace

std::optional<RequestTracker::OutRange> PostedPulls::Placeable(const Message& request, const WorkerCore& core) {
  if (!request.header.has_pull() || request.frames.empty()) return std::nullopt;
  std::optional<RequestTracker::OutRange> range = core.PullRange(request.header.request_id());
  if (!range || range->values.size_bytes() < kMinPlacedBytes) return std::nullopt;
  return range;
}

void PostedPulls::Posted(const RequestTracker::OutRange& range, std::string to, uint64_t request_id) {
  by_op_[range.op][request_id] = std::move(to);
}

bool PostedPulls::TakePlaced(Message& reply, const WorkerCore& core) {
  if (by_op_.empty() || reply.frames.size() != 1 || !reply.header.has_pull_reply() ||
      reply.header.pull_reply().value_parts() > 0) {
    return false;
  }
  const uint64_t id = reply.header.request_id();
  const std::optional<RequestTracker::OutRange> range = core.PullRange(id);
  if (!range) return false;
  auto op = by_op_.find(range->op);
  if (op == by_op_.end() || !op->second.contains(id)) return false;
  const Buffer& frame = reply.frames[0];
  if (frame.data() != reinterpret_cast<const std::byte*>(range->values.data()) ||
      frame.size() != range->values.size_bytes()) {
    return false;  // came another way: the destination stays posted
  }
  op->second.erase(id);  // used: nothing left to cancel
  if (op->second.empty()) by_op_.erase(op);
  const size_t size = frame.size();
  reply.frames[0] = Buffer::Remote(std::make_shared<PlacedBytes>(std::move(reply.frames[0])), size);
  return true;
}

std::vector<PostedPulls::Posting> PostedPulls::Withdraw(const std::vector<RequestTracker::Completion>& done,
                                                        uint64_t resent_parts, const WorkerCore& core) {
  std::vector<Posting> cancels;
  if (by_op_.empty()) return cancels;
  for (const RequestTracker::Completion& c : done) {
    auto op = by_op_.find(c.handle.get());
    if (op == by_op_.end()) continue;
    for (auto& [id, to] : op->second) cancels.push_back(Posting{std::move(to), id});
    by_op_.erase(op);
  }
  if (resent_parts == 0) return cancels;
  // Requests sent again under a new id: the core names no run for the old one.
  for (auto op = by_op_.begin(); op != by_op_.end();) {
    auto& postings = op->second;
    for (auto it = postings.begin(); it != postings.end();) {
      if (core.PullRange(it->first)) {
        ++it;
        continue;
      }
      cancels.push_back(Posting{std::move(it->second), it->first});
      postings.erase(it++);
    }
    if (postings.empty()) {
      by_op_.erase(op++);
    } else {
      ++op;
    }
  }
  return cancels;
}

size_t PostedPulls::size() const {
  size_t n = 0;
  for (const auto& [op, postings] : by_op_) n += postings.size();
  return n;
}

}  // namespace tessera

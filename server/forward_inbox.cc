#include "server/forward_inbox.h"

namespace tessera {

ForwardInbox::Decision ForwardInbox::Receive(uint32_t from, uint64_t stream, uint64_t position, const Message& m) {
  FromPrimary& p = from_[from];
  if (stream < p.stream) return Decision{Verdict::kIgnore};
  if (stream > p.stream) p = FromPrimary{.stream = stream};
  if (position < p.expected) return Decision{Verdict::kAckAgain, p.expected - 1};
  if (position > p.expected) {
    if (p.early.size() < kMaxEarlyForwards) p.early.emplace(position, m);
    Decision d{Verdict::kKept, p.expected - 1};
    if (p.gap_reported != p.expected) {
      p.gap_reported = p.expected;
      d.gap_notice = true;
    }
    return d;
  }
  p.expected++;
  return Decision{Verdict::kApply, position};
}

std::optional<Message> ForwardInbox::TakeNext(uint32_t from) {
  auto it = from_.find(from);
  if (it == from_.end()) return std::nullopt;
  FromPrimary& p = it->second;
  p.early.erase(p.early.begin(), p.early.lower_bound(p.expected));
  auto next = p.early.find(p.expected);
  if (next == p.early.end()) return std::nullopt;
  Message m = std::move(next->second);
  p.early.erase(next);
  return m;
}

size_t ForwardInbox::kept(uint32_t from) const {
  auto it = from_.find(from);
  return it == from_.end() ? 0 : it->second.early.size();
}

}  // namespace tessera

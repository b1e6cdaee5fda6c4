#include "server/hold_queue.h"

#include <algorithm>

namespace tessera {

void HoldQueue::Hold(Message request, uint64_t required_min_clock, Nanos now, Nanos deadline) {
  held_.push_back(HeldRequest{std::move(request), required_min_clock, now, deadline});
}

bool HoldQueue::Renew(std::string_view from, uint64_t first, uint64_t new_id, Nanos now) {
  if (first == 0) return false;
  for (HeldRequest& x : held_) {
    const proto::Envelope& xh = x.request.header;
    if (xh.sender_address() != from || (xh.request_id() != first && xh.first_request_id() != first)) continue;
    x.request.header.set_request_id(new_id);
    x.request.header.set_first_request_id(first);
    x.arrived = now;
    return true;
  }
  return false;
}

size_t HoldQueue::HeldFrom(std::string_view from) const {
  return static_cast<size_t>(std::count_if(held_.begin(), held_.end(), [&](const HeldRequest& x) {
    return x.request.header.sender_address() == from;
  }));
}

template <typename Due>
std::vector<HeldRequest> HoldQueue::Take(Due&& due) {
  std::vector<HeldRequest> out;
  for (auto it = held_.begin(); it != held_.end();) {
    if (!due(*it)) {
      ++it;
      continue;
    }
    out.push_back(std::move(*it));
    it = held_.erase(it);
  }
  return out;
}

std::vector<HeldRequest> HoldQueue::TakeReady(uint64_t min_clock) {
  return Take([&](const HeldRequest& x) { return x.required_min_clock <= min_clock; });
}

std::vector<HeldRequest> HoldQueue::TakeExpired(Nanos now) {
  return Take([&](const HeldRequest& x) { return now >= x.deadline; });
}

}  // namespace tessera

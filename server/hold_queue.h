#pragma once
// HoldQueue: requests (pulls, clock advances) that wait until the slowest
// live worker is far enough along (../shared/DESIGN.md section 5), in
// arrival order. A part of ServerCore (docs/design.md, "Server parts"): the
// core decides what a request needs and builds the answers; this part only
// keeps the requests and says which are due.
//
// Contract:
// - Hold(request, required, now, deadline) keeps `request` until a min clock
//   >= required (TakeReady) or until `deadline` (TakeExpired), whichever
//   comes first. Requests are kept and returned in arrival order.
// - Renew(from, first, new_id, now): a request sent again. If a request of
//   sender address `from` is held whose request_id or first_request_id is
//   `first` (first != 0), that one takes request id `new_id` (and first id
//   `first`) and counts its arrival from `now` (the sender times its round
//   trip from the newest send; its deadline stays), and Renew returns true:
//   the resend is not held a second time. Otherwise false, nothing changes.
// - HeldFrom(from): how many requests of that sender address are held (the
//   core limits it per sender).
// - TakeReady(min_clock) removes and returns every held request whose
//   required clock is <= min_clock; TakeExpired(now) every one whose
//   deadline is <= now. Both in arrival order; the rest stay in order.
// Pure: no I/O, threads or clocks (time is passed in). Thread safety: none;
// the caller serializes.
#include <cstdint>
#include <deque>
#include <string_view>
#include <vector>

#include "common/clock.h"
#include "common/message.h"

namespace tessera {

struct HeldRequest {
  Message request;
  uint64_t required_min_clock = 0;
  Nanos arrived = 0;   // of the newest send
  Nanos deadline = 0;  // answered DeadlineExceeded from then on
};

class HoldQueue {
 public:
  void Hold(Message request, uint64_t required_min_clock, Nanos now, Nanos deadline);
  bool Renew(std::string_view from, uint64_t first, uint64_t new_id, Nanos now);
  size_t HeldFrom(std::string_view from) const;
  std::vector<HeldRequest> TakeReady(uint64_t min_clock);
  std::vector<HeldRequest> TakeExpired(Nanos now);
  size_t size() const { return held_.size(); }

 private:
  template <typename Due>
  std::vector<HeldRequest> Take(Due&& due);
  std::deque<HeldRequest> held_;  // arrival order
};

}  // namespace tessera

#pragma once
// RetransmitTimer: how long to wait for an answer before sending a request
// again, learned from the round trips a peer's answers took (the way TCP
// sets its retransmission timeout, RFC 6298). One per peer and kind of
// answer: the worker keeps two per server (pushes, other requests:
// worker/request_tracker.h, TimerLane), a server one per backup it forwards
// to (server/server_core.h). Pure: no clocks, samples come in.
//
// Contract:
// - Sample(rtt): one measured round trip (send to answer, minus any time the
//   peer said it held the request on purpose). The first sample sets the
//   smoothed round trip to it and its variation to half of it; later ones
//   move them by 1/8 and 1/4 of the difference. Negative samples count as 0.
// - rto(): before any sample, options.initial; afterwards smoothed + 4 x
//   variation; always clamped to [options.floor, options.ceiling].
// - After(resends, bytes): how long a request sent `resends` times already
//   for silence may stay unanswered: rto() doubled per resend, capped at
//   options.ceiling (so a link that comes back is used again within a
//   ceiling), plus the time `bytes` take at options.bytes_per_second (a
//   large request, or one queued behind others to the same peer, is not
//   taken for lost while its bytes are still on the wire). Never below
//   options.floor, never overflows.
// - Nothing here is ever "lost": a request sent again too early is only a
//   duplicate, which every receiver de-duplicates (push numbers, forward
//   positions; pulls and clocks are idempotent).
// Thread safety: none (the owner's lock).
#include <algorithm>
#include <cstdint>
#include <string>

#include "absl/strings/str_format.h"
#include "common/clock.h"

namespace tessera {

struct RetransmitOptions {
  Nanos initial = 200 * kMillis;      // before the first sample
  Nanos floor = 2 * kMillis;          // never sooner (scheduling noise on a busy host)
  Nanos ceiling = 1 * kSeconds;       // never later, backoff included (before the bytes' allowance)
  double bytes_per_second = 100e6;    // the slowest transfer rate a request's bytes are allowed
};

class RetransmitTimer {
 public:
  RetransmitTimer() = default;
  explicit RetransmitTimer(RetransmitOptions options) : options_(options) {}

  void Sample(Nanos rtt);
  Nanos rto() const;
  Nanos After(uint32_t resends, uint64_t bytes) const;

  uint64_t samples() const { return samples_; }
  Nanos smoothed() const { return srtt_; }
  Nanos variation() const { return rttvar_; }
  const RetransmitOptions& options() const { return options_; }

 private:
  RetransmitOptions options_;
  Nanos srtt_ = 0;
  Nanos rttvar_ = 0;
  uint64_t samples_ = 0;
};

inline void RetransmitTimer::Sample(Nanos rtt) {
  rtt = std::max<Nanos>(rtt, 0);
  if (samples_++ == 0) {
    srtt_ = rtt;
    rttvar_ = rtt / 2;
    return;
  }
  const Nanos diff = srtt_ > rtt ? srtt_ - rtt : rtt - srtt_;
  rttvar_ = rttvar_ - rttvar_ / 4 + diff / 4;
  srtt_ = srtt_ - srtt_ / 8 + rtt / 8;
}

inline Nanos RetransmitTimer::rto() const {
  const Nanos raw = samples_ == 0 ? options_.initial : srtt_ + 4 * rttvar_;
  return std::clamp(raw, options_.floor, std::max(options_.floor, options_.ceiling));
}

inline Nanos RetransmitTimer::After(uint32_t resends, uint64_t bytes) const {
  const Nanos cap = std::max(options_.floor, options_.ceiling);
  Nanos wait = rto();
  for (uint32_t i = 0; i < resends && wait < cap; ++i) wait *= 2;
  wait = std::min(wait, cap);
  if (options_.bytes_per_second > 0 && bytes > 0) {
    const double allowance = static_cast<double>(bytes) / options_.bytes_per_second * static_cast<double>(kSeconds);
    wait += static_cast<Nanos>(std::min(allowance, 1e18));
  }
  return wait;
}

// A learned timer as the logs show it: "9.14 ms (round trip 2.88 +- 1.57 ms
// over 789 answers" (the caller closes the parenthesis, after what it adds).
inline std::string DescribeTimer(Nanos rto, Nanos smoothed, Nanos variation, uint64_t samples) {
  return absl::StrFormat("%.2f ms (round trip %.2f +- %.2f ms over %d answers", rto / 1e6, smoothed / 1e6,
                         variation / 1e6, samples);
}

}  // namespace tessera

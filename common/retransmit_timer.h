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
// - Sample(rtt, bytes): the same, for a request that had `bytes` sent to
//   the peer and unanswered when it left (its own included): with at
//   least kRateMinBytes, bytes / rtt is also a sample of the rate at which
//   the peer gets through what it is sent (a lower bound: it may have
//   served others too). rate() is their smoothed value (each sample moves
//   it by 1/8; the first sets it), 0 before any.
// - After(resends, bytes): how long a request sent `resends` times already
//   for silence may stay unanswered: rto() doubled per resend, capped at
//   options.ceiling (so a link that comes back is used again within a
//   ceiling), plus the time `bytes` take at allowance_rate(): the slower
//   of options.bytes_per_second and half the learned rate() (a large
//   request, or one queued behind others to the same peer, is not taken
//   for lost while its bytes are still on the wire or in the peer's queue,
//   however slowly the peer works through them: a server moving rows to
//   disk answers a megabyte in hundreds of milliseconds). Never below
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
  double bytes_per_second = 100e6;    // the fastest rate a request's bytes are allowed (a slower peer's learned rate lowers it; 0: no allowance)
};

class RetransmitTimer {
 public:
  RetransmitTimer() = default;
  explicit RetransmitTimer(RetransmitOptions options) : options_(options) {}

  // Requests with fewer bytes ahead teach no rate: their round trip is
  // mostly latency, not the peer's pace.
  static constexpr uint64_t kRateMinBytes = 64 * 1024;

  void Sample(Nanos rtt);
  void Sample(Nanos rtt, uint64_t bytes);
  Nanos rto() const;
  Nanos After(uint32_t resends, uint64_t bytes) const;
  // Bytes per second: the learned rate (0: none yet), and the one After
  // allows a request's bytes.
  double rate() const { return rate_; }
  double allowance_rate() const;

  uint64_t samples() const { return samples_; }
  Nanos smoothed() const { return srtt_; }
  Nanos variation() const { return rttvar_; }
  const RetransmitOptions& options() const { return options_; }

 private:
  RetransmitOptions options_;
  Nanos srtt_ = 0;
  Nanos rttvar_ = 0;
  uint64_t samples_ = 0;
  double rate_ = 0;
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

inline void RetransmitTimer::Sample(Nanos rtt, uint64_t bytes) {
  Sample(rtt);
  if (bytes < kRateMinBytes) return;
  const double seconds = static_cast<double>(std::max<Nanos>(rtt, 1)) / static_cast<double>(kSeconds);
  const double rate = static_cast<double>(bytes) / seconds;
  rate_ = rate_ == 0 ? rate : rate_ + (rate - rate_) / 8;
}

inline double RetransmitTimer::allowance_rate() const {
  const double configured = options_.bytes_per_second;
  if (rate_ <= 0 || configured <= 0) return configured;  // (0 or less: no allowance for bytes at all)
  return std::min(configured, rate_ / 2);
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
  if (const double rate = allowance_rate(); rate > 0 && bytes > 0) {
    const double allowance = static_cast<double>(bytes) / rate * static_cast<double>(kSeconds);
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

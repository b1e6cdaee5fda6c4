#include "coordinator/load_tracker.h"

#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace tessera {

double LoadTracker::Weight(Nanos dt) const {
  if (dt <= 0) return 0;
  if (tau_ <= 0) return 1;
  return 1.0 - std::exp(-static_cast<double>(dt) / static_cast<double>(tau_));
}

void LoadTracker::NoteShard(uint32_t rank, bool same_process, const proto::ShardLoad& l, Nanos now) {
  ShardLoad& s = shards_[l.vshard()];
  const bool continues = same_process && s.have_baseline && s.primary == rank && l.requests() >= s.requests &&
                         l.bytes_in() >= s.bytes_in && l.bytes_out() >= s.bytes_out;
  if (continues && now > s.last_at) {
    const double dt = static_cast<double>(now - s.last_at) / kSeconds;
    const double a = Weight(now - s.last_at);
    Move(s.requests_per_s, Double(l.requests() - s.requests) / dt, a);
    Move(s.bytes_in_per_s, Double(l.bytes_in() - s.bytes_in) / dt, a);
    Move(s.bytes_out_per_s, Double(l.bytes_out() - s.bytes_out) / dt, a);
  }
  s.primary = rank;
  s.requests = l.requests();
  s.bytes_in = l.bytes_in();
  s.bytes_out = l.bytes_out();
  s.last_at = now;
  s.have_baseline = true;
}

std::string LoadTracker::Describe() const {
  std::string out;
  for (size_t r = 0; r < servers_.size(); ++r) {
    const ServerLoad& s = servers_[r];
    if (s.last_at == 0 && !s.have_baseline) continue;
    absl::StrAppend(&out, out.empty() ? "" : "; ",
                    absl::StrFormat("server %u: %.2f cores, %.1f MB/s in, %.1f MB/s out, %.0f req/s, %u rows", r,
                                    s.cpu_cores, s.net_in_bytes_per_s / 1e6, s.net_out_bytes_per_s / 1e6,
                                    s.requests_per_s, s.rows));
  }
  return out;
}

}  // namespace tessera

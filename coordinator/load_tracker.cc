#include "coordinator/load_tracker.h"

#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace tessera {

namespace {
void Move(double& average, double sample, double weight) { average += weight * (sample - average); }
double Double(uint64_t x) { return static_cast<double>(x); }
}  // namespace

void LoadTracker::OnHeartbeat(uint32_t rank, uint32_t node_id, const proto::Heartbeat& hb, Nanos now,
                              const std::function<bool(uint32_t)>& is_primary) {
  if (servers_.size() <= rank) servers_.resize(rank + 1);
  ServerLoad& s = servers_[rank];
  const bool same_process = s.have_baseline && s.node_id == node_id;
  if (same_process && now > s.last_at) {
    const double dt = static_cast<double>(now - s.last_at) / kSeconds;
    const double a = Weight(now - s.last_at);
    if (hb.cpu_seconds() >= s.cpu_seconds) Move(s.cpu_cores, (hb.cpu_seconds() - s.cpu_seconds) / dt, a);
    if (hb.net_bytes_in() >= s.net_bytes_in) Move(s.net_in_bytes_per_s, Double(hb.net_bytes_in() - s.net_bytes_in) / dt, a);
    if (hb.net_bytes_out() >= s.net_bytes_out)
      Move(s.net_out_bytes_per_s, Double(hb.net_bytes_out() - s.net_bytes_out) / dt, a);
  }
  s.node_id = node_id;
  s.cpu_seconds = hb.cpu_seconds();
  s.net_bytes_in = hb.net_bytes_in();
  s.net_bytes_out = hb.net_bytes_out();
  s.rows = hb.rows();
  s.memory_bytes = hb.memory_bytes();
  s.last_at = now;
  s.have_baseline = true;
  // The server's data rates: the sum over the shards it reports and is
  // primary of (a shard with traffic is reported in every heartbeat).
  s.requests_per_s = s.bytes_in_per_s = s.bytes_out_per_s = 0;
  for (const proto::ShardLoad& l : hb.shard_loads()) {
    if (!is_primary(l.vshard())) continue;
    NoteShard(rank, same_process, l, now);
    const ShardLoad& shard = shards_.at(l.vshard());
    s.requests_per_s += shard.requests_per_s;
    s.bytes_in_per_s += shard.bytes_in_per_s;
    s.bytes_out_per_s += shard.bytes_out_per_s;
  }
}

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

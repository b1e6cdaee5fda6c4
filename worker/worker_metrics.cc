// What a worker reports about itself (see worker/worker_metrics.h).
#include "worker/worker_metrics.h"

#include "absl/strings/str_cat.h"
#include "transport/transport_metrics.h"

namespace tessera {

std::string WorkerMetricsText(const WorkerMetrics& m) {
  const WorkerStats& s = m.stats;
  std::vector<double> bounds;
  for (size_t i = 0; i + 1 < WorkerStats::kStalenessBuckets; ++i) bounds.push_back(static_cast<double>(i));
  std::vector<uint64_t> counts(s.staleness.begin(), s.staleness.end());
  double staleness_sum = 0;
  for (size_t i = 0; i < counts.size(); ++i) staleness_sum += static_cast<double>(i) * static_cast<double>(counts[i]);
  metrics::TextWriter w;
  w.Counter("tessera_worker_pushes_total", "Push calls", s.pushes)
      .Counter("tessera_worker_pulls_total", "Pull calls", s.pulls)
      .Counter("tessera_worker_clocks_total", "Clock() calls completed", s.clocks)
      .Counter("tessera_worker_pushed_bytes_total", "Key and value bytes of pushes, uncompressed", s.bytes_pushed)
      .Counter("tessera_worker_pulled_bytes_total", "Key and value bytes of pulls, uncompressed", s.bytes_pulled)
      .Counter("tessera_worker_wire_bytes_total", "Bytes to and from servers as on the wire", s.wire_bytes_pushed,
               {{"kind", "push"}})
      .Counter("tessera_worker_wire_bytes_total", "Bytes to and from servers as on the wire", s.wire_bytes_pulled,
               {{"kind", "pull"}})
      .Counter("tessera_worker_wire_bytes_total", "Bytes to and from servers as on the wire", s.wire_bytes_other,
               {{"kind", "other"}})
      .Counter("tessera_worker_clock_wait_seconds_total", "Time blocked in Clock()",
               static_cast<double>(s.clock_wait) / kSeconds)
      .Counter("tessera_worker_pull_held_seconds_total", "Time servers held this worker's pulls",
               static_cast<double>(s.pull_held) / kSeconds)
      .Histogram("tessera_worker_pull_staleness", "Observed staleness of pulls (clocks; the last bucket is 16+)",
                 bounds, counts, staleness_sum)
      .Histogram("tessera_worker_push_latency_seconds", "Push issue to completion", m.push_latency.bounds(),
                 m.push_latency.counts(), m.push_latency.sum())
      .Histogram("tessera_worker_pull_latency_seconds", "Pull issue to completion (holds included)",
                 m.pull_latency.bounds(), m.pull_latency.counts(), m.pull_latency.sum())
      .Counter("tessera_worker_resends_total", "Parts sent again: after a failover, unanswered past their timer, or a connection made again", s.resends)
      .Gauge("tessera_worker_clock", "This worker's clock", static_cast<double>(m.clock))
      .Gauge("tessera_worker_incarnation", "Replacements of this rank before this process", m.incarnation);
  for (const RequestTracker::ServerTimer& t : m.timers) {
    const std::string server = absl::StrCat(t.rank);
    const std::string lane = LaneName(t.lane);
    w.Gauge("tessera_worker_resend_timer_seconds",
            "Each server's resend timer per lane (pushes, other requests), learned from its answers' round trips",
            t.rto / 1e9, {{"server", server}, {"lane", lane}})
        .Gauge("tessera_worker_round_trip_seconds",
               "Each server's smoothed round trip per lane (holds left out)", t.smoothed / 1e9,
               {{"server", server}, {"lane", lane}})
        .Counter("tessera_worker_server_resends_total",
                 "Requests sent again to each server per lane: unanswered past its timer, or its connection made again",
                 t.resends, {{"server", server}, {"lane", lane}});
  }
  if (m.last_restore_to_answer >= 0) {
    w.Gauge("tessera_worker_restore_to_answer_seconds",
            "From the last connection to a server made again to that server's first answer",
            m.last_restore_to_answer / 1e9);
  }
  WriteTransportMetrics(w, m.transport);
  return w.text();
}

std::string StatsJson(const WorkerStats& s) {
  std::string hist;
  for (size_t i = 0; i < s.staleness.size(); ++i) absl::StrAppend(&hist, i ? "," : "", s.staleness[i]);
  return absl::StrCat("{\"pushes\":", s.pushes, ",\"pulls\":", s.pulls, ",\"bytes_pushed\":", s.bytes_pushed,
                      ",\"bytes_pulled\":", s.bytes_pulled, ",\"clocks\":", s.clocks,
                      ",\"clock_wait_seconds\":", static_cast<double>(s.clock_wait) / kSeconds,
                      ",\"pull_held_seconds\":", static_cast<double>(s.pull_held) / kSeconds,
                      ",\"staleness_histogram\":[", hist, "],\"wire_bytes_pushed\":", s.wire_bytes_pushed,
                      ",\"wire_bytes_pulled\":", s.wire_bytes_pulled, ",\"wire_bytes_other\":", s.wire_bytes_other,
                      ",\"resends\":", s.resends, "}");
}

proto::WorkerDone MakeWorkerDone(const WorkerStats& stats, uint64_t steps, double final_loss,
                                 const std::string& report_json) {
  proto::WorkerDone done;
  done.set_steps(steps);
  done.set_final_loss(final_loss);
  done.set_bytes_pushed(stats.bytes_pushed);
  done.set_bytes_pulled(stats.bytes_pulled);
  done.set_report_json(report_json);
  return done;
}

}  // namespace tessera

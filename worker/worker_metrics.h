#pragma once
// What a worker reports about itself: the Prometheus text its metrics
// endpoint serves (WorkerMetricsText: the Worker shell, worker/worker.cc,
// gathers a WorkerMetrics and calls it for every scrape), and the
// definitions of StatsJson and MakeWorkerDone (declared in worker/worker.h,
// for a worker program's report).
//
// Contract: pure functions of what they are given; the names, help texts
// and labels of the metrics are the ones dashboards and tests read
// (tessera_worker_*, then the transport's, transport/transport_metrics.h).
// Thread safety: WorkerMetricsText reads the histograms' atomics only.
#include <cstdint>
#include <string>
#include <vector>

#include "common/clock.h"
#include "common/metrics.h"
#include "transport/transport.h"
#include "worker/request_tracker.h"
#include "worker/worker.h"

namespace tessera {

// One scrape's inputs, taken by the shell.
struct WorkerMetrics {
  WorkerStats stats;
  uint64_t clock = 0;        // the worker's clock()
  uint32_t incarnation = 0;  // the worker's incarnation()
  const metrics::Histogram& push_latency;  // push issue to completion, seconds
  const metrics::Histogram& pull_latency;  // pull issue to completion, seconds
  std::vector<RequestTracker::ServerTimer> timers;  // the core's tracker's Timers()
  Nanos last_restore_to_answer = -1;  // the last wait from a connection made again to its first answer (-1: none)
  TransportStats transport;           // the worker's transport's counts
};

std::string WorkerMetricsText(const WorkerMetrics& m);

}  // namespace tessera

#pragma once
// A workload and a checker for the consistency promises I1-I4
// (../shared/DESIGN.md section 5), shared by the in-process and the
// multi-process tests.
//
// Workload: one SPARSE table of width W (one column per worker) with the
// ACCUMULATE optimizer. At every clock each worker pushes +1 into its own
// column of a random subset of the keys, a random number of times, pulls a
// random subset, sleeps a random while (stragglers), and calls Clock(). A
// pulled value in column v of key k therefore counts exactly the pushes of
// worker v to key k that the server had applied.
//
// Every event carries a CLOCK_MONOTONIC timestamp taken on the safe side
// (a push before it is sent; a pull after it completed; a Clock() call
// before the announcement and after it returned), and that clock is shared
// by all processes of one host, so the checker can order events across
// processes.
#include <cstdint>
#include <functional>
#include <mutex>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "worker/worker.h"

namespace tessera::consistency {

struct PushEvent {
  uint32_t worker;
  uint64_t clock;
  std::vector<uint32_t> keys;
  int64_t issued_ns;
  // Never acknowledged (its process died, or it failed): it may be applied
  // in part or not at all, so no pull is required to reflect it (I2, I3);
  // it still bounds what a pull may reflect (I4). Not written to files (the
  // multi-process workload stops at a failed push).
  bool may_be_missing = false;
};
struct PullEvent {
  uint32_t worker;
  uint64_t clock;
  std::vector<uint32_t> keys;
  std::vector<float> values;  // keys.size() x num_workers
  int64_t issued_ns;
  int64_t completed_ns;
};
struct ClockEvent {
  uint32_t worker;
  uint64_t new_clock;
  int64_t called_ns;
  int64_t returned_ns;  // kNotReturned: announced, but the call never returned (the job ended first)
};
// A Clock() that announced its clock and never returned: it tells the
// checker what the others could count on, and is not checked itself.
constexpr int64_t kNotReturned = INT64_MAX;
struct FinishEvent {
  uint32_t worker;
  int64_t finished_ns;
};
// A worker that joined the running job (cluster.max_workers) started at
// `clock`, announced to every server by `joined_ns`. Before then nobody
// waited for it (I1). Not written to files (only the simulator has joins).
struct JoinEvent {
  uint32_t worker;
  uint64_t clock;
  int64_t joined_ns;
};

// Thread-safe collection of events; can be written to and read from a file
// (one line per event) for the multi-process test.
class Recorder {
 public:
  void Add(PushEvent e);
  void Add(PullEvent e);
  void Add(ClockEvent e);
  void Add(FinishEvent e);
  void Add(JoinEvent e);
  absl::Status WriteTo(const std::string& path) const;
  absl::Status ReadFrom(const std::string& path);  // appends

  std::vector<PushEvent> pushes() const;
  std::vector<PullEvent> pulls() const;
  std::vector<ClockEvent> clocks() const;
  std::vector<FinishEvent> finishes() const;
  std::vector<JoinEvent> joins() const;

 private:
  mutable std::mutex mu_;
  std::vector<PushEvent> pushes_;
  std::vector<PullEvent> pulls_;
  std::vector<ClockEvent> clocks_;
  std::vector<FinishEvent> finishes_;
  std::vector<JoinEvent> joins_;
};

struct WorkloadOptions {
  uint32_t table_id = 77;
  uint32_t num_keys = 24;
  uint32_t clocks = 12;
  proto::ConsistencyKind consistency = proto::BSP;
  uint32_t staleness = 0;
  uint32_t max_sleep_us = 3000;   // random pause per clock; worker 0 sleeps 3x longer (a straggler)
  uint64_t seed = 1;
  std::function<void(uint64_t)> on_clock;  // called after each Clock() with the new clock (fault injection)
};

// Runs the workload on one worker (creates the table; every worker calls it).
absl::Status RunWorkload(Worker& worker, const WorkloadOptions& options, Recorder& recorder);

struct CheckResult {
  uint64_t pulls_checked = 0;
  uint64_t clocks_checked = 0;
  std::vector<std::string> violations;  // first few, human-readable
  uint64_t i1 = 0, i2 = 0, i3 = 0, i4 = 0;  // violation counts per invariant
  bool ok() const { return violations.empty(); }
};

// Checks I1-I4 for a table of the given staleness (kUnbounded for ASP:
// then only I3 and I4 apply). `num_workers` = the table width. Workers
// of rank `initial_workers` or more (default: none) joined the running job:
// I1 counts them only from their JoinEvent on, at its clock.
constexpr uint64_t kUnbounded = ~uint64_t{0};
CheckResult Check(const Recorder& recorder, uint32_t num_workers, uint64_t staleness,
                  uint32_t initial_workers = UINT32_MAX);

int64_t NowNs();

}  // namespace tessera::consistency

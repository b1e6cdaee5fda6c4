// tessera-skew-bench: a worker program for the rebalancing experiment
// (bench/run_rebalance.sh): embedding lookups and updates whose ids are
// drawn Zipf(--zipf) over --ids, so a few rows, and the virtual shards that
// hold them, carry much of the traffic.
//
// It creates one SPARSE table of width --dim (SGD, ASP), then for
// --seconds keeps --inflight steps in flight, a step being a batch of
// --batch ids (deduplicated on the worker, as a trainer does): a pull of
// its rows, then a push of a gradient for them. Every --report-every
// seconds it prints one line
//   TESSERA_PROGRESS {"t":S,"steps":N,"rows":R}
// (totals since the start, S seconds since the start), and at the end a
// TESSERA_RESULT line with the totals; then Worker::Finish.
#include <chrono>
#include <cstdio>
#include <deque>
#include <string>
#include <vector>

#include "bench/bench_util.h"
#include "CLI/CLI.hpp"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/logging.h"
#include "common/sparse_batch.h"
#include "examples/synthetic_clicklog.h"
#include "worker/worker.h"
#include "worker/worker_flags.h"

namespace tessera::bench {
namespace {

struct Flags {
  WorkerProcessFlags process;
  uint32_t dim = 64;
  uint64_t ids = 20'000;
  double zipf = 1.3;
  size_t batch = 16;
  size_t batches = 256;
  int inflight = 8;
  double seconds = 60;
  double report_every = 1;
};

absl::Status Run(const Flags& f, Worker& worker) {
  auto sampler = examples::ZipfSampler::Create(f.ids, f.zipf);
  if (!sampler.ok()) return sampler.status();
  examples::SplitMixRng rng(7000 + worker.rank());
  std::vector<std::vector<Key>> batches(f.batches);
  for (auto& b : batches) {
    std::vector<Key> ids(f.batch);
    for (Key& k : ids) k = Mix64(sampler->Sample(rng) + 0x5bd1e995);
    absl::StatusOr<SparseBatch> sb = SparseBatch::Build(ids);
    if (!sb.ok()) return sb.status();
    b.assign(sb->unique().begin(), sb->unique().end());
  }
  constexpr uint32_t kTable = 300;
  TableOptions t{.id = kTable, .name = "skewed_embedding", .width = f.dim, .kind = proto::SPARSE,
                 .optimizer = proto::SGD, .learning_rate = 0.001f, .init = proto::UNIFORM, .init_scale = 0.01f,
                 .consistency = proto::ASP};
  if (auto s = worker.CreateTable(t); !s.ok()) return s;
  if (auto s = worker.Barrier("skew-start"); !s.ok()) return s;
  // One buffer per step in flight: the pull lands in it, the push sends it.
  std::vector<std::vector<float>> rows(f.inflight, std::vector<float>(f.batch * f.dim, 0.0f));
  struct Step {
    size_t batch, slot;
    bool pushed;
    Future future;
  };
  std::deque<Step> window;
  uint64_t steps = 0, moved = 0;
  size_t next = 0, slot = 0;
  const double start = Now();
  double next_report = start + f.report_every;
  auto report = [&](const char* tag, double now) {
    Emit(tag, absl::StrFormat("{\"t\":%.3f,\"steps\":%d,\"rows\":%d}", now - start, steps, moved));
  };
  while (true) {
    const double now = Now();
    if (now >= next_report) {
      report("TESSERA_PROGRESS", now);
      next_report += f.report_every;
    }
    const bool more = now - start < f.seconds;
    while (more && window.size() < static_cast<size_t>(f.inflight)) {
      const size_t b = next++ % batches.size(), s = slot++ % rows.size();
      std::span<float> out = std::span<float>(rows[s]).first(batches[b].size() * f.dim);
      window.push_back(Step{b, s, false, worker.Pull(kTable, batches[b], out)});
    }
    if (window.empty()) break;
    Step step = std::move(window.front());
    window.pop_front();
    if (auto s = step.future.Wait(); !s.ok()) return s;
    const std::vector<Key>& keys = batches[step.batch];
    moved += keys.size();
    if (!step.pushed) {  // the gradient: a small step toward zero
      std::span<float> v = std::span<float>(rows[step.slot]).first(keys.size() * f.dim);
      for (float& x : v) x *= 0.01f;
      window.push_front(Step{step.batch, step.slot, true, worker.Push(kTable, keys, v)});
    } else {
      ++steps;
    }
  }
  const double end = Now();
  report("TESSERA_PROGRESS", end);
  const std::string result = absl::StrFormat("{\"seconds\":%.3f,\"steps\":%d,\"rows\":%d,\"steps_per_s\":%.3f}",
                                             end - start, steps, moved, steps / (end - start));
  Emit("TESSERA_RESULT", result);
  return worker.Finish(MakeWorkerDone(worker.stats(), steps, 0, result));
}

int Main(int argc, char** argv) {
  Flags f;
  CLI::App app{"tessera-skew-bench: a skewed embedding workload (Zipf ids: a few shards carry much of the "
               "traffic) that reports its throughput every second. A worker program, started by "
               "bench/run_rebalance.sh."};
  app.option_defaults()->always_capture_default();
  f.process.AddTo(app);
  app.add_option("--dim", f.dim, "row width (floats)")->check(CLI::PositiveNumber);
  app.add_option("--ids", f.ids, "ids the Zipf draw ranges over")->check(CLI::PositiveNumber);
  app.add_option("--zipf", f.zipf, "Zipf exponent")->check(CLI::NonNegativeNumber);
  app.add_option("--batch", f.batch, "ids per step (before deduplication)")->check(CLI::PositiveNumber);
  app.add_option("--batches", f.batches, "distinct batches, cycled")->check(CLI::PositiveNumber);
  app.add_option("--inflight", f.inflight, "steps in flight")->check(CLI::PositiveNumber);
  app.add_option("--seconds", f.seconds, "how long to run")->check(CLI::PositiveNumber);
  app.add_option("--report-every", f.report_every, "seconds between progress lines")->check(CLI::PositiveNumber);
  CLI11_PARSE(app, argc, argv);
  return f.process.Run("benchmark", [&f](Worker& worker) { return Run(f, worker); });
}

}  // namespace
}  // namespace tessera::bench

int main(int argc, char** argv) { return tessera::bench::Main(argc, argv); }

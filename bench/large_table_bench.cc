// tessera-large-table-bench: a worker program that fills one embedding
// table with --ids distinct ids, checks every row it samples came back
// right, and then measures Zipf training steps over the whole id space; for
// bench/run_large_table.sh (10^8 ids across 4 servers with a disk tier).
//
// The table: SPARSE, --dim wide, Adagrad (lr 0.05, accumulator 0.1), zero
// rows to start, ASP, with --memory_budget_bytes per server and, with
// --disk_tier 1, the rows past it on the servers' disks (docs/embeddings.md,
// "Disk tier"). Ids are the numbers 0 .. ids-1, scrambled into 64-bit keys
// (Mix64), so every server gets its share.
//
// Phases, all workers together (a barrier between them):
// 1. fill: worker r of W pushes a gradient of ones to its stripe of the ids,
//    --fill_batch ids per push, --inflight pushes in flight; a progress line
//    every 5% with rows/s and the time left.
// 2. check: each worker pulls --check ids drawn uniformly from all of them
//    (most rows are on disk by now) and compares each, bit for bit, with a
//    row that took the same one push in a small table without a budget. A
//    difference fails the run naming the id.
// 3. zipf: for --seconds, training steps: a batch of --batch ids drawn
//    Zipf(--zipf) over all ids, deduplicated, pulled, then a gradient pushed
//    for them (the next step's pull waits for nothing but its own answer).
//    Reported: steps/s, rows/s (unique rows per step times steps).
//
// Process contract: as tessera-sparse-bench (TESSERA_PROGRESS lines, one
// TESSERA_RESULT line; Worker::Finish with the report).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <deque>
#include <string>
#include <vector>

#include "bench/bench_util.h"
#include "CLI/CLI.hpp"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/keys.h"
#include "common/sparse_batch.h"
#include "examples/synthetic_clicklog.h"
#include "worker/worker.h"
#include "worker/worker_flags.h"

namespace tessera::bench {
namespace {

constexpr uint32_t kTable = 300;
constexpr uint32_t kReferenceTable = 301;
constexpr uint64_t kSalt = 0x6c8e9cf570932bd5ULL;

struct Flags {
  WorkerProcessFlags process;
  uint64_t ids = 100'000'000;
  uint32_t dim = 16;
  uint64_t memory_budget_bytes = 0;
  bool disk_tier = true;
  size_t fill_batch = 65536;
  int inflight = 4;
  size_t check = 100'000;
  double zipf = 1.1;
  size_t batch = 4096;
  double seconds = 30;
};

Key KeyOf(uint64_t id) { return Mix64(id ^ kSalt); }

TableOptions LargeTable(const Flags& f, uint32_t id, bool budget) {
  TableOptions t{.id = id, .name = id == kTable ? "large" : "reference", .width = f.dim, .kind = proto::SPARSE,
                 .optimizer = proto::ADAGRAD, .learning_rate = 0.05f, .init = proto::ZEROS,
                 .consistency = proto::ASP};
  t.initial_accumulator = 0.1f;
  if (budget) {
    t.memory_budget_bytes = f.memory_budget_bytes;
    t.disk_tier = f.disk_tier;
  }
  return t;
}

// Keeps up to `depth` operations in flight: Add waits for the oldest first
// when full; Drain waits for the rest.
class Window {
 public:
  explicit Window(size_t depth) : depth_(depth) {}
  absl::Status Add(Future f) {
    window_.push_back(std::move(f));
    if (window_.size() <= depth_) return absl::OkStatus();
    absl::Status s = window_.front().Wait();
    window_.pop_front();
    return s;
  }
  absl::Status Drain() {
    absl::Status first;
    for (Future& f : window_)
      if (absl::Status s = f.Wait(); !s.ok() && first.ok()) first = s;
    window_.clear();
    return first;
  }

 private:
  size_t depth_;
  std::deque<Future> window_;
};

absl::Status Fill(const Flags& f, Worker& worker, std::string& report) {
  const uint64_t workers = worker.num_workers();
  const uint64_t lo = f.ids * worker.rank() / workers, hi = f.ids * (worker.rank() + 1) / workers;
  // Each in-flight push owns its keys until it is answered.
  std::vector<std::vector<Key>> keys(f.inflight + 1, std::vector<Key>(f.fill_batch));
  const std::vector<float> ones(f.fill_batch * f.dim, 1.0f);
  Window window(f.inflight);
  const double start = Now();
  uint64_t next_report = lo + (hi - lo) / 20;
  size_t slot = 0;
  for (uint64_t i = lo; i < hi;) {
    const size_t n = static_cast<size_t>(std::min<uint64_t>(f.fill_batch, hi - i));
    std::vector<Key>& k = keys[slot++ % keys.size()];
    for (size_t j = 0; j < n; ++j) k[j] = KeyOf(i + j);
    i += n;
    if (auto s = window.Add(worker.Push(kTable, std::span<const Key>(k).first(n),
                                        std::span<const float>(ones).first(n * f.dim)));
        !s.ok())
      return s;
    if (i >= next_report || i == hi) {
      const double secs = Now() - start;
      const double rate = static_cast<double>(i - lo) / secs;
      Emit("TESSERA_PROGRESS",
           absl::StrFormat("{\"phase\":\"fill\",\"rows\":%d,\"of\":%d,\"rows_per_s\":%.4g,\"seconds_left\":%.0f}",
                           i - lo, hi - lo, rate, static_cast<double>(hi - i) / rate));
      next_report += (hi - lo) / 20;
    }
  }
  if (auto s = window.Drain(); !s.ok()) return s;
  const double secs = Now() - start;
  absl::StrAppend(&report, absl::StrFormat("\"fill\":{\"rows\":%d,\"seconds\":%.2f,\"rows_per_s\":%.4g}", hi - lo,
                                           secs, static_cast<double>(hi - lo) / secs));
  return absl::OkStatus();
}

absl::Status Check(const Flags& f, Worker& worker, std::string& report) {
  // The row one push of ones makes, from a table that keeps everything in memory.
  if (auto s = worker.CreateTable(LargeTable(f, kReferenceTable, false)); !s.ok()) return s;
  const Key probe = worker.rank();  // one push each: every worker probes its own row
  std::vector<float> ones(f.dim, 1.0f), expected(f.dim);
  if (auto s = worker.Push(kReferenceTable, std::span<const Key>(&probe, 1), ones).Wait(); !s.ok()) return s;
  if (auto s = worker.Pull(kReferenceTable, std::span<const Key>(&probe, 1), expected).Wait(); !s.ok()) return s;
  examples::SplitMixRng rng(77 + worker.rank());
  const size_t chunk = 4096;
  std::vector<Key> keys;
  std::vector<uint64_t> ids;
  std::vector<float> rows(chunk * f.dim);
  const double start = Now();
  for (size_t done = 0; done < f.check;) {
    const size_t n = std::min(chunk, f.check - done);
    keys.clear();
    ids.clear();
    for (size_t j = 0; j < n; ++j) {
      ids.push_back(rng.Next() % f.ids);
      keys.push_back(KeyOf(ids.back()));
    }
    if (auto s = worker.Pull(kTable, keys, std::span<float>(rows).first(n * f.dim)).Wait(); !s.ok()) return s;
    for (size_t j = 0; j < n; ++j) {
      if (std::memcmp(rows.data() + j * f.dim, expected.data(), f.dim * sizeof(float)) != 0) {
        return absl::DataLossError(absl::StrFormat(
            "id %d (key %#x): its row is not the row one push of ones makes (first value %g, expected %g)", ids[j],
            keys[j], rows[j * f.dim], expected[0]));
      }
    }
    done += n;
  }
  absl::StrAppend(&report, absl::StrFormat(",\"check\":{\"rows\":%d,\"seconds\":%.2f,\"all_equal\":true}", f.check,
                                           Now() - start));
  return absl::OkStatus();
}

absl::Status Zipf(const Flags& f, Worker& worker, std::string& report) {
  auto sampler = examples::ZipfSampler::Create(f.ids, f.zipf);
  if (!sampler.ok()) return sampler.status();
  examples::SplitMixRng rng(1000 + worker.rank());
  std::vector<Key> ids(f.batch);
  std::vector<float> rows(f.batch * f.dim), gradient(f.batch * f.dim, 0.01f);
  std::vector<Key> pushed;  // the keys of the push in flight
  Future push_in_flight;
  bool pushing = false;
  uint64_t steps = 0, rows_moved = 0;
  const double start = Now();
  double now = start;
  while (now - start < f.seconds) {
    for (Key& k : ids) k = KeyOf(sampler->Sample(rng) - 1);
    absl::StatusOr<SparseBatch> sb = SparseBatch::Build(ids);
    if (!sb.ok()) return sb.status();
    std::vector<Key> unique(sb->unique().begin(), sb->unique().end());
    if (auto s = worker.Pull(kTable, unique, std::span<float>(rows).first(unique.size() * f.dim)).Wait(); !s.ok())
      return s;
    if (pushing)
      if (auto s = push_in_flight.Wait(); !s.ok()) return s;
    pushed = std::move(unique);
    push_in_flight = worker.Push(kTable, pushed, std::span<const float>(gradient).first(pushed.size() * f.dim));
    pushing = true;
    rows_moved += pushed.size();
    ++steps;
    now = Now();
  }
  if (pushing)
    if (auto s = push_in_flight.Wait(); !s.ok()) return s;
  const double secs = Now() - start;
  absl::StrAppend(&report,
                  absl::StrFormat(",\"zipf\":{\"steps\":%d,\"seconds\":%.2f,\"steps_per_s\":%.4g,\"rows_per_s\":%.4g,"
                                  "\"unique_per_step\":%.1f}",
                                  steps, secs, steps / secs, rows_moved / secs,
                                  steps ? static_cast<double>(rows_moved) / steps : 0.0));
  return absl::OkStatus();
}

absl::Status Run(const Flags& f, Worker& worker) {
  if (auto s = worker.CreateTable(LargeTable(f, kTable, true)); !s.ok()) return s;
  std::string report = "{";
  if (auto s = Fill(f, worker, report); !s.ok()) return s;
  if (auto s = worker.Barrier("filled"); !s.ok()) return s;
  if (auto s = Check(f, worker, report); !s.ok()) return s;
  if (auto s = worker.Barrier("checked"); !s.ok()) return s;
  if (auto s = Zipf(f, worker, report); !s.ok()) return s;
  absl::StrAppend(&report, "}");
  Emit("TESSERA_RESULT", report);
  return worker.Finish(MakeWorkerDone(worker.stats(), 0, 0, report));
}

int Main(int argc, char** argv) {
  Flags f;
  CLI::App app{"tessera-large-table-bench: fills one Adagrad embedding table with --ids distinct ids (most of them on "
               "the servers' disks with --disk_tier 1), checks sampled rows bit for bit, then measures Zipf training "
               "steps over all of them. A worker program, started by bench/run_large_table.sh through "
               "tessera-launch."};
  app.option_defaults()->always_capture_default();
  f.process.AddTo(app);
  app.add_option("--ids", f.ids, "distinct ids in the table")->check(CLI::PositiveNumber);
  app.add_option("--dim", f.dim, "row width")->check(CLI::PositiveNumber);
  app.add_option("--memory_budget_bytes,--memory-budget-bytes", f.memory_budget_bytes,
                 "per server: the table's memory budget (0: none)");
  app.add_option("--disk_tier,--disk-tier", f.disk_tier, "1: rows past the budget go to the servers' disks");
  app.add_option("--fill_batch,--fill-batch", f.fill_batch, "ids per push while filling")
      ->check(CLI::PositiveNumber);
  app.add_option("--inflight", f.inflight, "pushes in flight while filling")->check(CLI::PositiveNumber);
  app.add_option("--check", f.check, "ids each worker pulls and checks after the fill (0: none)");
  app.add_option("--zipf", f.zipf, "Zipf exponent of the training steps' ids")->check(CLI::NonNegativeNumber);
  app.add_option("--batch", f.batch, "ids per training step (before deduplication)")->check(CLI::PositiveNumber);
  app.add_option("--seconds", f.seconds, "how long the training steps run")->check(CLI::NonNegativeNumber);
  CLI11_PARSE(app, argc, argv);
  if (f.disk_tier && f.memory_budget_bytes == 0) {
    std::fputs("tessera-large-table-bench: --disk_tier 1 needs --memory_budget_bytes\n", stderr);
    return 2;
  }
  return f.process.Run("benchmark", [&f](Worker& worker) { return Run(f, worker); });
}

}  // namespace
}  // namespace tessera::bench

int main(int argc, char** argv) { return tessera::bench::Main(argc, argv); }

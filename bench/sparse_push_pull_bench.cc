// tessera-sparse-bench: a worker program that measures sparse (embedding)
// push and pull throughput against a server, for bench/run_sparse.sh.
//
// For each row width D in --dims it creates one SPARSE table (SGD), draws
// --batches batches of --batch ids Zipf(--zipf) over --ids ranks (scrambled
// into 64-bit keys, a different stream per worker), deduplicates each batch
// on the worker (common/sparse_batch.h) as a trainer does, and then, for
// each op in --ops (push, pull), keeps --inflight requests of one batch's unique
// rows in flight for --seconds. All workers start each measurement at a
// barrier, so with several workers the server is measured under their
// combined load. A warm-up pass over every batch first creates the rows.
//
// Reported per op and width: rows/s (unique rows moved), ids/s (ids before
// deduplication), and payload bytes/s (keys + values, as raw ZeroMQ's
// payload is counted in bench/raw_zmq_bench.cc).
//
// Process contract: as tessera-push-pull-bench (TESSERA_PROGRESS and one
// TESSERA_RESULT line; Worker::Finish with the report).
#include <algorithm>
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
#include "examples/synthetic_clicklog.h"
#include "common/sparse_batch.h"
#include "worker/worker.h"
#include "worker/worker_flags.h"

namespace tessera::bench {
namespace {

struct Flags {
  WorkerProcessFlags process;
  std::vector<uint32_t> dims = {16, 64};
  uint64_t ids = 10'000'000;
  double zipf = 1.1;
  size_t batch = 8192;
  size_t batches = 32;
  int inflight = 4;
  double seconds = 3.0;
  std::vector<std::string> ops = {"push", "pull"};
};

struct Batch {
  std::vector<Key> unique;
  size_t ids = 0;
};

absl::Status Run(const Flags& f, Worker& worker) {
  auto sampler = examples::ZipfSampler::Create(f.ids, f.zipf);
  if (!sampler.ok()) return sampler.status();
  examples::SplitMixRng rng(1000 + worker.rank());
  std::vector<Batch> batches(f.batches);
  size_t unique_total = 0;
  for (Batch& b : batches) {
    std::vector<Key> ids(f.batch);
    for (Key& k : ids) k = Mix64(sampler->Sample(rng) + 0x5bd1e995);
    absl::StatusOr<SparseBatch> sb = SparseBatch::Build(ids);
    if (!sb.ok()) return sb.status();
    b.unique.assign(sb->unique().begin(), sb->unique().end());
    b.ids = ids.size();
    unique_total += b.unique.size();
  }
  std::string results;
  for (uint32_t dim : f.dims) {
    const uint32_t table = 200 + dim;
    TableOptions t{.id = table, .name = absl::StrCat("emb", dim), .width = dim, .kind = proto::SPARSE,
                   .optimizer = proto::SGD, .learning_rate = 0.001f, .init = proto::UNIFORM, .init_scale = 0.01f,
                   .consistency = proto::ASP};
    if (auto s = worker.CreateTable(t); !s.ok()) return s;
    std::vector<std::vector<float>> values(f.inflight, std::vector<float>(f.batch * dim, 0.001f));
    // Warm-up: create every row.
    for (const Batch& b : batches) {
      if (auto s = worker.Push(table, b.unique, std::span<const float>(values[0]).first(b.unique.size() * dim)).Wait();
          !s.ok())
        return s;
    }
    for (const std::string& op : f.ops) {
      if (auto s = worker.Barrier(absl::StrCat("sparse-", dim, "-", op)); !s.ok()) return s;
      const bool push = op == "push";
      std::deque<Future> window;
      size_t rows = 0, ids = 0, next = 0, slot = 0;
      const double start = Now();
      double end = start;
      while (true) {
        while (window.size() < static_cast<size_t>(f.inflight)) {
          const Batch& b = batches[next++ % batches.size()];
          std::span<float> v = std::span<float>(values[slot++ % f.inflight]).first(b.unique.size() * dim);
          window.push_back(push ? worker.Push(table, b.unique, v) : worker.Pull(table, b.unique, v));
          rows += b.unique.size();
          ids += b.ids;
        }
        if (auto s = window.front().Wait(); !s.ok()) return s;
        window.pop_front();
        end = Now();
        if (end - start >= f.seconds) break;
      }
      for (Future& w : window)
        if (auto s = w.Wait(); !s.ok()) return s;
      end = Now();
      const double secs = end - start;
      const double bytes = static_cast<double>(rows) * (dim * sizeof(float) + sizeof(Key));
      const std::string r =
          absl::StrFormat("{\"dim\":%d,\"op\":\"%s\",\"seconds\":%.3f,\"rows_per_s\":%.6g,\"ids_per_s\":%.6g,"
                          "\"payload_bytes_per_s\":%.6g,\"unique_per_batch\":%.1f}",
                          dim, op.c_str(), secs, rows / secs, ids / secs, bytes / secs,
                          static_cast<double>(unique_total) / static_cast<double>(batches.size()));
      Emit("TESSERA_PROGRESS", r);
      absl::StrAppend(&results, results.empty() ? "" : ",", r);
    }
  }
  const std::string report = absl::StrCat("{\"results\":[", results, "]}");
  Emit("TESSERA_RESULT", report);
  return worker.Finish(MakeWorkerDone(worker.stats(), 0, 0, report));
}

int Main(int argc, char** argv) {
  Flags f;
  CLI::App app{"tessera-sparse-bench: sparse push and pull throughput (rows/s, bytes/s) of embedding batches drawn "
               "Zipf from many ids. A worker program, started by bench/run_sparse.sh through tessera-launch."};
  app.option_defaults()->always_capture_default();
  f.process.AddTo(app);
  app.add_option("--dims", f.dims, "row widths, comma-separated")->delimiter(',')->check(CLI::PositiveNumber);
  app.add_option("--ids", f.ids, "ids the Zipf draw ranges over")->check(CLI::PositiveNumber);
  app.add_option("--zipf", f.zipf, "Zipf exponent")->check(CLI::NonNegativeNumber);
  app.add_option("--batch", f.batch, "ids per batch (before deduplication)")->check(CLI::PositiveNumber);
  app.add_option("--batches", f.batches, "distinct batches, cycled")->check(CLI::PositiveNumber);
  app.add_option("--inflight", f.inflight, "requests in flight")->check(CLI::PositiveNumber);
  app.add_option("--seconds", f.seconds, "duration of each measurement")->check(CLI::PositiveNumber);
  app.add_option("--ops", f.ops, "what to measure, in this order, comma-separated")
      ->delimiter(',')
      ->check(CLI::IsMember({"push", "pull"}));
  CLI11_PARSE(app, argc, argv);
  return f.process.Run("benchmark", [&f](Worker& worker) { return Run(f, worker); });
}

}  // namespace
}  // namespace tessera::bench

int main(int argc, char** argv) { return tessera::bench::Main(argc, argv); }

// disk_tier_bench: a sparse table many times larger than its memory budget,
// with a disk tier (server/table.h, "Disk tier"; RocksDB store), against the
// same table all in memory, on the same Zipf-distributed pushes and pulls,
// in one process, one thread, measured in the same run (interleaved
// repeats). Prints one Markdown table (rows/s of each, their ratio with the
// min-max over repeats, the share of touched rows found in memory, disk
// rows read and written per second, bytes on disk) and the resident memory
// of the process against the budget. A benchmark: it measures, never asserts.
//
// Ids: --ids ranks drawn Zipf(--zipf), scrambled into 64-bit keys, drawn
// afresh for every pass; every id has a row in both tables before the
// timing (a table of --ids rows, which is --times times the tiered table's
// memory budget). Two passes warm the tiered table's memory first.
#include <malloc.h>
#include <stdlib.h>
#include <unistd.h>

#include <algorithm>
#include <time.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "bench/bench_util.h"
#include "CLI/CLI.hpp"
#include "absl/strings/str_format.h"
#include "common/memory.h"
#include "examples/synthetic_clicklog.h"
#include "server/disk_tier.h"
#include "server/rocks_cold_rows.h"
#include "server/table.h"

namespace tessera::bench {
namespace {

double CpuSeconds(clockid_t clock) {
  timespec ts{};
  clock_gettime(clock, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

struct Flags {
  std::vector<uint32_t> dims = {16, 64};
  std::string optimizer = "adagrad";
  uint64_t ids = 4'000'000;
  double times = 8;  // the table is this many times its memory budget
  double zipf = 1.1;
  size_t batch = 4096;
  size_t batches = 64;
  int repeats = 3;
  uint64_t write_buffer_mb = 4;
  uint64_t block_cache_mb = 8;
  std::string dir = "/tmp";
  std::string store = "bucket";  // or log, rocks
  std::string json;
};

proto::OptimizerKind OptimizerOf(const std::string& name) {
  if (name == "sgd") return proto::SGD;
  if (name == "adagrad") return proto::ADAGRAD;
  if (name == "adam") return proto::ADAM;
  return proto::MOMENTUM;
}

struct Rates {
  double pull = 0, push = 0, step = 0;  // rows/s
  double cpu = 0;                       // CPU seconds of this thread for the whole pass
};

// Each batch as a training step uses it: pull its rows, then push their
// gradients.
Rates Measure(Table& t, const std::vector<std::vector<Key>>& batches, std::vector<float>& grads,
              std::vector<float>& out, uint32_t dim) {
  double pull_s = 0, push_s = 0;
  size_t rows = 0;
  const double cpu0 = CpuSeconds(CLOCK_THREAD_CPUTIME_ID);
  for (const auto& b : batches) {
    const double t0 = Now();
    (void)t.ReadRows(b, std::span<float>(out).first(b.size() * dim));
    const double t1 = Now();
    (void)t.ApplyPush(b, std::span<const float>(grads).first(b.size() * dim));
    const double t2 = Now();
    pull_s += t1 - t0;
    push_s += t2 - t1;
    rows += b.size();
  }
  const double n = static_cast<double>(rows);
  return Rates{.pull = n / pull_s,
               .push = n / push_s,
               .step = n / (pull_s + push_s),
               .cpu = CpuSeconds(CLOCK_THREAD_CPUTIME_ID) - cpu0};
}

int Run(const Flags& f) {
  auto sampler = examples::ZipfSampler::Create(f.ids, f.zipf);
  if (!sampler.ok()) {
    std::fprintf(stderr, "disk_tier_bench: %s\n", std::string(sampler.status().message()).c_str());
    return 2;
  }
  examples::SplitMixRng rng(42);
  // Fresh draws for every pass (the same for both tables): ids of the
  // distribution's tail keep arriving, as in training, instead of one fixed
  // set that would end up all in memory.
  std::vector<std::vector<Key>> batches(f.batches);
  auto draw = [&] {
    for (auto& b : batches) {
      b.resize(f.batch);
      for (Key& k : b) k = Mix64(sampler->Sample(rng) + 0x5bd1e995);
    }
  };
  std::string md =
      "| store | dim | optimizer | budget (MiB) | rows in memory | step: in RAM (rows/s) | step: tiered | ratio (min-max) | "
      "pull ratio | push ratio | rows per CPU-s ratio | store's background CPU share | found in memory | disk "
      "reads/s | disk writes/s | on disk (MiB) | resident (MiB) "
      "|\n|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n";
  std::string json = "[";
  for (size_t d = 0; d < f.dims.size(); ++d) {
    const uint32_t dim = f.dims[d];
    proto::TableConfig c;
    c.set_table_id(1);
    c.set_width(dim);
    c.set_kind(proto::SPARSE);
    c.set_optimizer(OptimizerOf(f.optimizer));
    c.set_learning_rate(0.05f);
    c.mutable_optimizer_params()->set_epsilon(1e-8f);
    c.mutable_optimizer_params()->set_initial_accumulator(0.1f);
    c.mutable_optimizer_params()->set_momentum(0.9f);
    c.mutable_optimizer_params()->set_beta1(0.9f);
    c.mutable_optimizer_params()->set_beta2(0.999f);
    proto::TableConfig ram = c;
    ram.set_memory_budget_bytes(uint64_t{1} << 50);  // same rules, never reached
    const uint64_t table_bytes = f.ids * Table::RowBytes(ram);
    // The server's own factory (a directory per process under f.dir, removed with the store).
    RocksColdRowsOptions so;
    so.write_buffer_bytes = f.write_buffer_mb << 20;
    so.block_cache_bytes = f.block_cache_mb << 20;
    absl::StatusOr<std::unique_ptr<ColdRows>> store = absl::InternalError("no store");
    if (auto kind = ParseDiskStore(f.store); !kind.ok()) {
      store = kind.status();
    } else if (auto factory = MakeDiskTierFactory(f.dir, *kind, so); !factory.ok()) {
      store = factory.status();
    } else {
      store = (*factory)(1, StoredRowFloats(c));
    }
    if (!store.ok()) {
      std::fprintf(stderr, "disk_tier_bench: %s\n", std::string(store.status().message()).c_str());
      return 2;
    }
    proto::TableConfig tiered_config = c;
    tiered_config.set_memory_budget_bytes(static_cast<uint64_t>(static_cast<double>(table_bytes) / f.times));
    if (auto s = Table::CheckDiskTier(tiered_config, (*store)->memory_bytes(0)); !s.ok()) {
      std::fprintf(stderr, "disk_tier_bench: %s (raise --ids or lower --times)\n", std::string(s.message()).c_str());
      return 2;
    }
    malloc_trim(0);
    const uint64_t resident_before = ResidentAnonymousBytes().value_or(0);
    Table tiered(tiered_config, [](Key) { return true; }, std::move(*store));
    std::vector<float> grads(f.batch * dim, 0.01f);
    std::vector<float> out(f.batch * dim);
    auto populate = [&](Table& t) {  // every id gets a row
      std::vector<Key> keys(f.batch);
      for (uint64_t r = 1; r <= f.ids; r += keys.size()) {
        const size_t n = std::min<uint64_t>(keys.size(), f.ids - r + 1);
        for (size_t i = 0; i < n; ++i) keys[i] = Mix64(r + i + 0x5bd1e995);
        (void)t.ApplyPush(std::span<const Key>(keys).first(n), std::span<const float>(grads).first(n * dim));
      }
    };
    populate(tiered);  // (first: the in-RAM table would count in its resident size)
    for (int w = 0; w < 2; ++w) {  // the hot rows come into memory
      draw();
      Measure(tiered, batches, grads, out, dim);
    }
    malloc_trim(0);
    const uint64_t resident_tiered = ResidentAnonymousBytes().value_or(0) - resident_before;
    Table in_ram(ram, [](Key) { return true; });
    populate(in_ram);
    std::vector<double> step_ratio, push_ratio, pull_ratio;
    Rates ram_best, tiered_best;
    uint64_t touched = 0, loaded = 0, reads = 0, writes = 0;
    double tiered_seconds = 0;
    double ram_cpu = 0, tiered_cpu = 0;
    // The store's background threads (flushes, compactions) work for the
    // tiered table only: their CPU time over the repeats is charged to it.
    const double background0 = CpuSeconds(CLOCK_PROCESS_CPUTIME_ID) - CpuSeconds(CLOCK_THREAD_CPUTIME_ID);
    for (int r = 0; r < f.repeats; ++r) {
      draw();
      const Rates a = Measure(in_ram, batches, grads, out, dim);
      const TableCounters before = tiered.counters();
      const ColdRowStats disk_before = tiered.disk_stats();
      const double start = Now();
      const Rates b = Measure(tiered, batches, grads, out, dim);
      tiered_seconds += Now() - start;
      touched += f.batches * f.batch;  // the pull brings a row in; its push then finds it
      loaded += tiered.counters().loaded_from_disk - before.loaded_from_disk;
      reads += tiered.disk_stats().rows_read - disk_before.rows_read;
      writes += tiered.disk_stats().rows_written - disk_before.rows_written;
      ram_cpu += a.cpu;
      tiered_cpu += b.cpu;
      step_ratio.push_back(b.step / a.step);
      push_ratio.push_back(b.push / a.push);
      pull_ratio.push_back(b.pull / a.pull);
      ram_best.step = std::max(ram_best.step, a.step);
      tiered_best.step = std::max(tiered_best.step, b.step);
    }
    const double background =
        CpuSeconds(CLOCK_PROCESS_CPUTIME_ID) - CpuSeconds(CLOCK_THREAD_CPUTIME_ID) - background0;
    const double cpu_ratio = ram_cpu / (tiered_cpu + background);  // rows per CPU-second, tiered / in RAM
    std::sort(step_ratio.begin(), step_ratio.end());
    std::sort(push_ratio.begin(), push_ratio.end());
    std::sort(pull_ratio.begin(), pull_ratio.end());
    const double step_med = step_ratio[step_ratio.size() / 2];
    const double push_med = push_ratio[push_ratio.size() / 2], pull_med = pull_ratio[pull_ratio.size() / 2];
    const double found_in_memory = 1.0 - static_cast<double>(loaded) / static_cast<double>(touched);
    const ColdRowStats disk = tiered.disk_stats();
    absl::StrAppendFormat(&md,
                          "| %s | %d | %s | %.1f | %d | %.3g | %.3g | %.2f (%.2f-%.2f) | %.2f | %.2f | %.2f | %.2f | "
                          "%.4f | %.3g | %.3g | %.1f | %.1f |\n",
                          f.store, dim, f.optimizer, tiered_config.memory_budget_bytes() / 1048576.0,
                          tiered.rows_in_memory(),
                          ram_best.step, tiered_best.step, step_med, step_ratio.front(), step_ratio.back(), pull_med,
                          push_med, cpu_ratio, background / (tiered_cpu + background), found_in_memory, reads / tiered_seconds, writes / tiered_seconds,
                          disk.bytes_on_disk / 1048576.0, resident_tiered / 1048576.0);
    absl::StrAppendFormat(&json,
                          "%s{\"dim\":%d,\"optimizer\":\"%s\",\"ids\":%d,\"budget_bytes\":%d,\"rows_in_memory\":%d,"
                          "\"step_ratio\":%.4f,\"step_ratio_min\":%.4f,\"push_ratio\":%.4f,\"pull_ratio\":%.4f,"
                          "\"cpu_ratio\":%.4f,"
                          "\"found_in_memory\":%.5f,\"resident_bytes\":%d,\"bytes_on_disk\":%d}",
                          d ? "," : "", dim, f.optimizer, f.ids, tiered_config.memory_budget_bytes(),
                          tiered.rows_in_memory(), step_med, step_ratio.front(), push_med, pull_med, cpu_ratio,
                          found_in_memory, resident_tiered, disk.bytes_on_disk);
  }
  json += "]";
  std::printf("Disk tier: %llu ids (the table is %.3gx its memory budget), batches of %zu ids drawn Zipf(%g), %zu "
              "training steps (pull a batch's rows, push its gradients) per repeat, %d repeats interleaved; one "
              "thread\n\n%s",
              static_cast<unsigned long long>(f.ids), f.times, f.batch, f.zipf, f.batches, f.repeats, md.c_str());
  std::printf("\n(rows per CPU-s ratio: rows per CPU-second of the whole process, the store's background threads "
              "charged to the tiered table; steadier than wall-clock rates on a busy machine)\n");
  std::printf("(resident: anonymous memory of the tiered table after the hot rows came in, against its budget; "
              "the store's files are in the page cache, not in it)\n");
  if (!f.json.empty()) std::ofstream(f.json) << json << "\n";
  return 0;
}

}  // namespace
}  // namespace tessera::bench

int main(int argc, char** argv) {
  tessera::bench::Flags f;
  CLI::App app{"disk_tier_bench: a sparse table larger than its memory budget with a disk tier, against the same "
               "table all in memory (rows/s of pushes and pulls, Zipf ids, one thread)"};
  app.add_option("--dims", f.dims, "row widths")->delimiter(',')->capture_default_str();
  app.add_option("--optimizer", f.optimizer, "sgd, adagrad, momentum or adam")
      ->check(CLI::IsMember({"sgd", "adagrad", "momentum", "adam"}))
      ->capture_default_str();
  app.add_option("--ids", f.ids, "distinct ids (every one has a row)")->check(CLI::PositiveNumber)->capture_default_str();
  app.add_option("--times", f.times, "the table is this many times the tiered table's memory budget")
      ->check(CLI::Range(1.0, 1000.0))
      ->capture_default_str();
  app.add_option("--zipf", f.zipf, "exponent of the id distribution")->check(CLI::NonNegativeNumber)->capture_default_str();
  app.add_option("--batch", f.batch, "ids per push and pull")->check(CLI::PositiveNumber)->capture_default_str();
  app.add_option("--batches", f.batches, "batches per repeat")->check(CLI::PositiveNumber)->capture_default_str();
  app.add_option("--repeats", f.repeats, "interleaved repeats")->check(CLI::PositiveNumber)->capture_default_str();
  app.add_option("--write_buffer_mb", f.write_buffer_mb, "rocks: the store's memtable size")->capture_default_str();
  app.add_option("--block_cache_mb", f.block_cache_mb, "rocks: the store's block cache")->capture_default_str();
  app.add_option("--store", f.store, "the disk tier's store (server/disk_tier.h): bucket, log or rocks")
      ->check(CLI::IsMember({"bucket", "log", "rocks"}))
      ->capture_default_str();
  app.add_option("--dir", f.dir, "where the store's directory goes (removed at the end)")->capture_default_str();
  app.add_option("--json", f.json, "also write the numbers as JSON to this file");
  CLI11_PARSE(app, argc, argv);
  return tessera::bench::Run(f);
}

// sparse_lookup_bench: embedding-row lookups in one process, one core, no
// network: Table::ReadRows (the server's pull path) against a plain loop of
// absl::flat_hash_map::find plus a row copy over the same ids, and
// Table::ApplyPush with SGD (the push path) against find plus the SGD step,
// measured in the same run; and the memory a row really costs (the process's resident
// growth per row) against Table::RowBytes.
//
// Ids: batches of --batch ids drawn Zipf(--zipf) from --ids ranks, scrambled
// into 64-bit keys; every id drawn has a row in both structures before the
// timing starts. Prints one Markdown table and, with --json, the numbers.
// A benchmark: it measures and never asserts.
#include <malloc.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "bench/bench_util.h"
#include "CLI/CLI.hpp"
#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "examples/synthetic_clicklog.h"
#include "server/table.h"

namespace tessera::bench {
namespace {

uint64_t ResidentBytes() {
  std::ifstream statm("/proc/self/statm");
  uint64_t size = 0, resident = 0;
  statm >> size >> resident;
  return resident * static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
}

struct Flags {
  std::vector<uint32_t> dims = {16, 64};
  uint64_t ids = 10'000'000;
  double zipf = 1.1;
  size_t batch = 8192;
  size_t batches = 64;
  int repeats = 5;
  uint64_t memory_rows = 2'000'000;
  bool populate = true;
  std::string json;
};

// The baseline: the plain loop the issue names.
struct PlainMap {
  uint32_t width;
  absl::flat_hash_map<Key, uint32_t> index;
  std::vector<float> rows;
  void Add(Key k) {
    if (index.try_emplace(k, static_cast<uint32_t>(index.size())).second) rows.resize(rows.size() + width, 0.5f);
  }
  void Sgd(std::span<const Key> keys, const float* g, float lr) {
    for (size_t i = 0; i < keys.size(); ++i) {
      float* w = rows.data() + size_t{index.find(keys[i])->second} * width;
      for (uint32_t j = 0; j < width; ++j) w[j] -= lr * g[i * width + j];
    }
  }
  void Read(std::span<const Key> keys, float* out) const {
    for (size_t i = 0; i < keys.size(); ++i) {
      auto it = index.find(keys[i]);
      std::memcpy(out + i * width, rows.data() + size_t{it->second} * width, width * sizeof(float));
    }
  }
};

template <typename Fn>
double BestRowsPerSecond(const Flags& f, const std::vector<std::vector<Key>>& batches, Fn&& read) {
  std::vector<double> rates;
  for (int r = 0; r <= f.repeats; ++r) {  // repeat 0 warms up
    const double start = Now();
    size_t rows = 0;
    for (const auto& b : batches) {
      read(b);
      rows += b.size();
    }
    if (r > 0) rates.push_back(static_cast<double>(rows) / (Now() - start));
  }
  std::sort(rates.begin(), rates.end());
  return rates[rates.size() / 2];  // the median
}

int Run(const Flags& f) {
  auto sampler = examples::ZipfSampler::Create(f.ids, f.zipf);
  if (!sampler.ok()) {
    std::fprintf(stderr, "sparse_lookup_bench: %s\n", std::string(sampler.status().message()).c_str());
    return 2;
  }
  examples::SplitMixRng rng(42);
  std::vector<std::vector<Key>> batches(f.batches);
  for (auto& b : batches) {
    b.resize(f.batch);
    for (Key& k : b) k = Mix64(sampler->Sample(rng) + 0x5bd1e995);
  }
  std::string table_md =
      "| dim | Table::ReadRows (rows/s) | plain find + copy (rows/s) | ratio | Table::ApplyPush, SGD (rows/s) | "
      "plain find + SGD step (rows/s) | ratio |\n|---|---|---|---|---|---|---|\n";
  std::string json = "{\"lookups\":[";
  for (size_t d = 0; d < f.dims.size(); ++d) {
    const uint32_t dim = f.dims[d];
    proto::TableConfig c;
    c.set_table_id(1);
    c.set_width(dim);
    c.set_kind(proto::SPARSE);
    c.set_optimizer(proto::SGD);
    c.set_learning_rate(0.1f);
    Table table(c, [](Key) { return true; });
    PlainMap plain{dim, {}, {}};
    std::vector<float> grads(f.batch * dim, 0.01f);
    if (f.populate) {  // every id has a row, as in a trained table
      std::vector<Key> keys(f.batch);
      plain.index.reserve(f.ids);
      plain.rows.reserve(f.ids * dim);
      for (uint64_t r = 1; r <= f.ids; r += keys.size()) {
        const size_t n = std::min<uint64_t>(keys.size(), f.ids - r + 1);
        for (size_t i = 0; i < n; ++i) keys[i] = Mix64(r + i + 0x5bd1e995);
        (void)table.ApplyPush(std::span<const Key>(keys).first(n), std::span<const float>(grads).first(n * dim));
        for (size_t i = 0; i < n; ++i) plain.Add(keys[i]);
      }
    }
    for (const auto& b : batches) {
      (void)table.ApplyPush(b, grads);
      for (Key k : b) plain.Add(k);
    }
    std::vector<float> out(f.batch * dim);
    const double ours = BestRowsPerSecond(f, batches, [&](const std::vector<Key>& b) {
      (void)table.ReadRows(b, out);
    });
    const double base = BestRowsPerSecond(f, batches, [&](const std::vector<Key>& b) { plain.Read(b, out.data()); });
    // Pushes (the server's sparse push path, SGD): rows exist already.
    const double push = BestRowsPerSecond(f, batches, [&](const std::vector<Key>& b) {
      (void)table.ApplyPush(b, std::span<const float>(grads).first(b.size() * dim));
    });
    const double push_base = BestRowsPerSecond(f, batches, [&](const std::vector<Key>& b) {
      plain.Sgd(b, grads.data(), c.learning_rate());
    });
    absl::StrAppendFormat(&table_md, "| %d | %.3g | %.3g | %.2f | %.3g | %.3g | %.2f |\n", dim, ours, base,
                          ours / base, push, push_base, push / push_base);
    absl::StrAppendFormat(&json,
                          "%s{\"dim\":%d,\"rows\":%d,\"table_rows_per_s\":%.6g,\"plain_rows_per_s\":%.6g,"
                          "\"push_rows_per_s\":%.6g,\"plain_push_rows_per_s\":%.6g}",
                          d ? "," : "", dim, table.num_rows(), ours, base, push, push_base);
  }
  json += "],\"memory\":[";
  std::string mem_md = "\n| dim | optimizer | eviction | Table::RowBytes | measured bytes/row |\n|---|---|---|---|---|\n";
  struct MemCase {
    uint32_t dim;
    proto::OptimizerKind opt;
    bool evict;
  };
  const MemCase cases[] = {{16, proto::SGD, false}, {16, proto::ADAGRAD, true}, {64, proto::ADAM, true}};
  bool first = true;
  for (const MemCase& m : cases) {
    proto::TableConfig c;
    c.set_table_id(2);
    c.set_width(m.dim);
    c.set_kind(proto::SPARSE);
    c.set_optimizer(m.opt);
    c.set_learning_rate(0.1f);
    c.mutable_optimizer_params()->set_epsilon(1e-8f);
    c.mutable_optimizer_params()->set_beta1(0.9f);
    c.mutable_optimizer_params()->set_beta2(0.999f);
    if (m.evict) c.set_evict_after_clocks(1000);
    malloc_trim(0);
    const uint64_t before = ResidentBytes();
    double per_row = 0;
    {
      Table table(c, [](Key) { return true; });
      std::vector<Key> keys(4096);
      std::vector<float> g(keys.size() * m.dim, 0.01f);
      for (uint64_t n = 0; n < f.memory_rows; n += keys.size()) {
        for (size_t i = 0; i < keys.size(); ++i) keys[i] = Mix64(n + i + 1);
        (void)table.ApplyPush(keys, g);
      }
      per_row = static_cast<double>(ResidentBytes() - before) / static_cast<double>(table.num_rows());
    }
    absl::StrAppendFormat(&mem_md, "| %d | %s | %s | %d | %.1f |\n", m.dim, proto::OptimizerKind_Name(m.opt),
                          m.evict ? "yes" : "no", Table::RowBytes(c), per_row);
    absl::StrAppendFormat(&json, "%s{\"dim\":%d,\"optimizer\":\"%s\",\"eviction\":%s,\"row_bytes\":%d,"
                          "\"measured_bytes_per_row\":%.1f}", first ? "" : ",", m.dim,
                          proto::OptimizerKind_Name(m.opt), m.evict ? "true" : "false", Table::RowBytes(c), per_row);
    first = false;
  }
  json += "]}";
  std::printf("Lookups: %zu batches of %zu ids, Zipf(%g) over %llu ids (%s), median of %d passes, one core\n\n%s",
              f.batches, f.batch, f.zipf, static_cast<unsigned long long>(f.ids),
              f.populate ? "every id has a row" : "only the ids drawn have rows", f.repeats, table_md.c_str());
  std::printf("\nMemory: %llu rows, resident growth of this process per row%s", static_cast<unsigned long long>(f.memory_rows),
              mem_md.c_str());
  if (!f.json.empty()) std::ofstream(f.json) << json << "\n";
  return 0;
}

}  // namespace
}  // namespace tessera::bench

int main(int argc, char** argv) {
  tessera::bench::Flags f;
  CLI::App app{"Embedding lookups in one process: Table::ReadRows against a plain absl::flat_hash_map loop, "
               "and the measured memory per row. Measures only; asserts nothing."};
  app.add_option("--dims", f.dims, "row widths (floats), comma-separated")->delimiter(',');
  app.add_option("--ids", f.ids, "ids the Zipf draw ranges over")->check(CLI::PositiveNumber);
  app.add_option("--zipf", f.zipf, "Zipf exponent")->check(CLI::NonNegativeNumber);
  app.add_option("--batch", f.batch, "ids per lookup")->check(CLI::PositiveNumber);
  app.add_option("--batches", f.batches, "distinct batches per pass")->check(CLI::PositiveNumber);
  app.add_option("--repeats", f.repeats, "measured passes (the median is reported)")->check(CLI::PositiveNumber);
  app.add_option("--memory_rows", f.memory_rows, "rows for the memory measurement")->check(CLI::PositiveNumber);
  app.add_option("--populate", f.populate, "give every one of --ids ids a row first (else only the ids drawn)");
  app.add_option("--json", f.json, "also write the numbers as JSON to this file");
  CLI11_PARSE(app, argc, argv);
  return tessera::bench::Run(f);
}

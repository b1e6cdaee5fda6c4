// The memory baseline of the same-host comparison: single-thread memcpy
// bandwidth between two buffers of each size, in one process. The shared-
// memory path of a push costs one such copy (into the ring) plus the
// server's update; bench/run_push_pull.sh reports Tessera's same-host
// throughput as a fraction of this, measured in the same run.
//
//   memcpy_bench --sizes 4096,1048576,16777216 [--repeats 5] [--min_seconds 0.5] [--json FILE]
//
// Source and destination are distinct, touched before timing, and each copy
// goes to the next of several destination buffers, so that a size beyond the
// last-level cache is measured against memory, not cache. A result is the
// median MB/s (1 MB = 1e6 bytes copied) over the repeats, each at least
// min_seconds long, after one warm-up repeat. Output: one JSON object,
//   {"sizes":[...],"results":[{"size":N,"mode":"memcpy","median_mbps":X,"mbps":[...]}]}
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "CLI/CLI.hpp"

namespace {

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : (v.size() % 2 ? v[v.size() / 2] : (v[v.size() / 2 - 1] + v[v.size() / 2]) / 2);
}

// One repeat: MB/s of copies of `size` bytes for at least `min_seconds`.
double Repeat(const char* src, std::vector<char*>& dsts, size_t size, double min_seconds) {
  using Clock = std::chrono::steady_clock;
  const auto start = Clock::now();
  size_t copies = 0;
  double elapsed = 0;
  do {
    for (int i = 0; i < 8; ++i) {
      std::memcpy(dsts[copies % dsts.size()], src, size);
      ++copies;
    }
    elapsed = std::chrono::duration<double>(Clock::now() - start).count();
  } while (elapsed < min_seconds);
  // Keep the copies observable.
  volatile char sink = dsts[0][size / 2];
  (void)sink;
  return static_cast<double>(copies) * static_cast<double>(size) / elapsed / 1e6;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Single-thread memcpy bandwidth: the baseline of the same-host push/pull comparison"};
  std::vector<size_t> sizes = {4096, 1 << 20, 16 << 20};
  int repeats = 5;
  double min_seconds = 0.5;
  std::string json_path;
  app.add_option("--sizes", sizes, "bytes per copy, comma-separated")->delimiter(',');
  app.add_option("--repeats", repeats, "timed repeats per size (median reported)")->check(CLI::PositiveNumber);
  app.add_option("--min_seconds", min_seconds, "length of each repeat")->check(CLI::PositiveNumber);
  app.add_option("--json", json_path, "write the JSON result here instead of stdout");
  CLI11_PARSE(app, argc, argv);

  std::string json = "{\"sizes\":[";
  for (size_t i = 0; i < sizes.size(); ++i) json += (i ? "," : "") + std::to_string(sizes[i]);
  json += "],\"results\":[";
  for (size_t s = 0; s < sizes.size(); ++s) {
    const size_t size = sizes[s];
    // Enough destinations to cover 64 MiB, so large sizes miss the cache.
    const size_t n_dst = std::max<size_t>(1, std::min<size_t>(16, (64u << 20) / std::max<size_t>(size, 1)));
    std::vector<char> src(size, 1);
    std::vector<std::vector<char>> dst_storage(n_dst, std::vector<char>(size, 2));
    std::vector<char*> dsts;
    for (auto& d : dst_storage) dsts.push_back(d.data());
    Repeat(src.data(), dsts, size, min_seconds / 2);  // warm-up
    std::vector<double> mbps;
    for (int r = 0; r < repeats; ++r) mbps.push_back(Repeat(src.data(), dsts, size, min_seconds));
    const double median = Median(mbps);
    std::fprintf(stderr, "memcpy   size %9zu  median %9.1f MB/s\n", size, median);
    char item[160];
    std::snprintf(item, sizeof item, "%s{\"size\":%zu,\"mode\":\"memcpy\",\"median_mbps\":%.1f,\"mbps\":[",
                  s ? "," : "", size, median);
    json += item;
    for (size_t i = 0; i < mbps.size(); ++i) {
      std::snprintf(item, sizeof item, "%s%.1f", i ? "," : "", mbps[i]);
      json += item;
    }
    json += "]}";
  }
  json += "]}\n";
  if (json_path.empty()) {
    std::fputs(json.c_str(), stdout);
    return 0;
  }
  std::ofstream out(json_path);
  out << json;
  if (!out) {
    std::fprintf(stderr, "memcpy_bench: cannot write %s\n", json_path.c_str());
    return 1;
  }
  return 0;
}

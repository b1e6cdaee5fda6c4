// tessera-consistency-check: reads the event records of every worker of a
// run and checks I1-I4. Exits 0 if they hold, 1 with the violations if not.
#include <cstdio>
#include <filesystem>

#include "CLI/CLI.hpp"
#include "tests/consistency/consistency_checker.h"

int main(int argc, char** argv) {
  std::string dir, consistency = "bsp";
  uint32_t workers = 0;
  uint64_t staleness = 0;
  CLI::App app{"Checks the consistency invariants I1-I4 on recorded events."};
  app.add_option("--records", dir, "Directory with worker-*.txt records")->required();
  app.add_option("--workers", workers, "Number of workers (the table width)")->required();
  app.add_option("--consistency", consistency, "bsp | ssp | asp")->check(CLI::IsMember({"bsp", "ssp", "asp"}));
  app.add_option("--staleness", staleness, "SSP bound");
  CLI11_PARSE(app, argc, argv);
  tessera::consistency::Recorder rec;
  size_t files = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    if (e.path().extension() != ".txt") continue;
    if (auto s = rec.ReadFrom(e.path().string()); !s.ok()) {
      std::fprintf(stderr, "%s\n", std::string(s.message()).c_str());
      return 2;
    }
    ++files;
  }
  if (files != workers) {
    std::fprintf(stderr, "expected %u record files in %s, found %zu\n", workers, dir.c_str(), files);
    return 2;
  }
  uint64_t s = consistency == "asp" ? tessera::consistency::kUnbounded : consistency == "bsp" ? 0 : staleness;
  auto r = tessera::consistency::Check(rec, workers, s);
  std::printf("checked %lu pulls and %lu clocks: I1 %lu, I2 %lu, I3 %lu, I4 %lu violations\n",
              static_cast<unsigned long>(r.pulls_checked), static_cast<unsigned long>(r.clocks_checked),
              static_cast<unsigned long>(r.i1), static_cast<unsigned long>(r.i2), static_cast<unsigned long>(r.i3),
              static_cast<unsigned long>(r.i4));
  for (const auto& v : r.violations) std::printf("  %s\n", v.c_str());
  return r.ok() && r.pulls_checked > 0 ? 0 : 1;
}

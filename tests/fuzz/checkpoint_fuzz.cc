// Fuzz target: a checkpoint file of any bytes. ReadCheckpointFile must
// refuse a corrupt or truncated file with an error and never half-load
// one: what it returns has passed ValidateSnapshot. Replayed over
// tests/fuzz/corpus/checkpoint.
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

#include "server/checkpoint.h"

namespace {
std::string ScratchFile() {
  static const std::string path = "/tmp/tessera-checkpoint-fuzz-" + std::to_string(::getpid()) + ".tckpt";
  return path;
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = ScratchFile();
  {
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out.write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
  }
  auto file = tessera::ReadCheckpointFile(path);
  if (file.ok() && !tessera::ValidateSnapshot(file->snapshot).ok()) __builtin_trap();
  std::remove(path.c_str());
  return 0;
}

void WriteSeeds(const std::string& dir) {
  tessera::ShardSnapshot s;
  s.server_rank = 0;
  s.epoch = 3;
  s.vshards = {0, 2, 5};
  s.applied_pushes_by_vshard = {{0, 4}, {2, 1}};
  tessera::TableSnapshot t;
  t.config.set_table_id(1);
  t.config.set_width(2);
  t.config.set_kind(tessera::proto::SPARSE);
  t.config.set_optimizer(tessera::proto::ACCUMULATE);
  t.keys = {1, 7, 9};
  t.values = {1, 2, 3, 4, 5, 6};
  s.tables.push_back(t);
  s.core_state = "opaque";
  const std::string scratch = dir + "/.write";
  std::filesystem::create_directories(scratch);
  auto written = tessera::WriteCheckpoint(scratch, s, {});
  if (written.ok()) std::filesystem::rename(written->path, dir + "/small.tckpt");
  std::filesystem::remove_all(scratch);
}

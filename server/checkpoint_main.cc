// tessera-checkpoint: looks into checkpoint files (docs/checkpoints.md).
//   inspect PATH   header, sections, vshards, applied push counts, tables and
//                  their first rows
//   verify PATH... reads every file completely, checking every length and
//                  checksum; exit 1 at the first bad one, with its error
//   list DIR       the complete checkpoints in DIR, newest first
// Exit status: 0 on success, 1 on any error (one line on stderr saying why),
// 2 for bad usage.
#include <cstdio>
#include <string>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "server/checkpoint.h"

namespace tessera {
namespace {

std::string DescribeConfig(const proto::TableConfig& c) {
  std::string s = absl::StrFormat("%s, width %d", proto::TableKind_Name(c.kind()), c.width());
  if (c.kind() == proto::DENSE) absl::StrAppendFormat(&s, ", dense_rows %d", c.dense_rows());
  absl::StrAppendFormat(&s, ", optimizer %s lr %g, init %s scale %g seed %d, %s", proto::OptimizerKind_Name(c.optimizer()),
                        c.learning_rate(), proto::InitKind_Name(c.init()), c.init_scale(), c.init_seed(),
                        proto::ConsistencyKind_Name(c.consistency()));
  if (c.consistency() == proto::SSP) absl::StrAppendFormat(&s, " staleness %d", c.staleness());
  if (!c.compression().empty()) absl::StrAppendFormat(&s, ", compression %s", c.compression());
  if (!c.pull_compression().empty()) absl::StrAppendFormat(&s, ", pull_compression %s", c.pull_compression());
  return s;
}

int Inspect(const std::string& path, int64_t max_rows, int64_t max_values) {
  auto file = ReadCheckpointFile(path);
  if (!file.ok()) {
    std::fprintf(stderr, "tessera-checkpoint: %s\n", std::string(file.status().message()).c_str());
    return 1;
  }
  const ShardSnapshot& snap = file->snapshot;
  std::printf("checkpoint %s\n", path.c_str());
  std::printf("  format version %u, %llu bytes, %zu sections, checksums OK\n", file->version,
              static_cast<unsigned long long>(file->file_bytes), file->sections.size());
  std::printf("  server rank %u, epoch %llu, sequence %llu\n", snap.server_rank,
              static_cast<unsigned long long>(snap.epoch), static_cast<unsigned long long>(file->sequence));
  std::printf("  vshards (%zu): %s\n", snap.vshards.size(), absl::StrJoin(snap.vshards, " ").c_str());
  std::printf("  applied pushes by vshard (%zu):", snap.applied_pushes_by_vshard.size());
  for (const auto& [vshard, count] : snap.applied_pushes_by_vshard)
    std::printf(" %u=%llu", vshard, static_cast<unsigned long long>(count));
  std::printf("\n  core state: %zu bytes\n", snap.core_state.size());
  std::printf("  tables (%zu):\n", snap.tables.size());
  for (const TableSnapshot& t : snap.tables) {
    const std::string name = t.config.name().empty() ? "" : " \"" + t.config.name() + "\"";
    std::printf("    table %u%s: %zu rows; %s\n", t.config.table_id(), name.c_str(), t.keys.size(),
                DescribeConfig(t.config).c_str());
    // The weights of each row (the optimizer state stored after them is not shown).
    const size_t w = t.config.width();
    const size_t stride = StoredRowFloats(t.config);
    const size_t rows = max_rows < 0 ? t.keys.size() : std::min<size_t>(t.keys.size(), static_cast<size_t>(max_rows));
    const size_t values = max_values < 0 ? w : std::min<size_t>(w, static_cast<size_t>(max_values));
    for (size_t i = 0; i < rows; ++i) {
      std::string line = absl::StrFormat("      key %d: [", t.keys[i]);
      for (size_t j = 0; j < values; ++j)
        absl::StrAppendFormat(&line, "%s%g", j ? ", " : "", t.values[i * stride + j]);
      if (values < w) absl::StrAppendFormat(&line, ", ... %d more", w - values);
      std::printf("%s]\n", line.c_str());
    }
    if (rows < t.keys.size()) std::printf("      ... %zu more rows\n", t.keys.size() - rows);
  }
  std::printf("  sections:\n    %12s  %-10s  %8s  %14s  %8s\n", "offset", "type", "table", "payload bytes", "crc32c");
  for (const SectionInfo& s : file->sections) {
    const bool has_table = s.type == SectionType::kTable || s.type == SectionType::kRows;
    std::printf("    %12llu  %-10s  %8s  %14llu  %08x\n", static_cast<unsigned long long>(s.offset),
                SectionTypeName(s.type), has_table ? std::to_string(s.table_id).c_str() : "-",
                static_cast<unsigned long long>(s.payload_bytes), s.payload_crc);
  }
  return 0;
}

int Verify(const std::vector<std::string>& paths) {
  for (const std::string& path : paths) {
    auto file = ReadCheckpointFile(path);
    if (!file.ok()) {
      std::fprintf(stderr, "tessera-checkpoint: %s\n", std::string(file.status().message()).c_str());
      return 1;
    }
    size_t rows = 0;
    for (const TableSnapshot& t : file->snapshot.tables) rows += t.keys.size();
    std::printf("%s: OK (%llu bytes, %zu sections, %zu tables, %zu rows, server rank %u, epoch %llu)\n",
                path.c_str(), static_cast<unsigned long long>(file->file_bytes), file->sections.size(),
                file->snapshot.tables.size(), rows, file->snapshot.server_rank,
                static_cast<unsigned long long>(file->snapshot.epoch));
  }
  return 0;
}

int List(const std::string& dir) {
  auto list = ListCheckpoints(dir);
  if (!list.ok()) {
    std::fprintf(stderr, "tessera-checkpoint: %s\n", std::string(list.status().message()).c_str());
    return 1;
  }
  if (list->empty()) std::printf("no checkpoints in %s\n", dir.c_str());
  for (const CheckpointInfo& c : *list)
    std::printf("rank %u  sequence %llu  %s\n", c.server_rank, static_cast<unsigned long long>(c.sequence),
                c.path.c_str());
  return 0;
}

}  // namespace
}  // namespace tessera

int main(int argc, char** argv) {
  CLI::App app{
      "tessera-checkpoint: inspects and verifies Tessera server checkpoints (DIR/server-RANK-SEQUENCE.tckpt).\n"
      "Every command reads whole files and checks the magic number, the format version, every length and every\n"
      "CRC32C; a damaged file is an error naming the file, the section and the byte offset. Exit status: 0 OK,\n"
      "1 error, 2 bad usage. Format: docs/checkpoints.md."};
  app.require_subcommand(1);

  std::string inspect_path;
  int64_t max_rows = 3, max_values = 8;
  CLI::App* inspect = app.add_subcommand(
      "inspect", "Print a checkpoint: header, vshards, applied push counts, tables with their first rows, sections");
  inspect->add_option("PATH", inspect_path, "Checkpoint file")->required();
  inspect->add_option("--rows", max_rows, "Rows to print per table (-1 = all)")->capture_default_str();
  inspect->add_option("--values", max_values, "Values to print per row (-1 = all)")->capture_default_str();

  std::vector<std::string> verify_paths;
  CLI::App* verify =
      app.add_subcommand("verify", "Check every length and checksum of each file; exit 1 at the first bad one");
  verify->add_option("PATH", verify_paths, "Checkpoint files")->required();

  std::string list_dir;
  CLI::App* list = app.add_subcommand("list", "List the complete checkpoints in a directory, newest first");
  list->add_option("DIR", list_dir, "Checkpoint directory")->required();

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;  // --help is a "parse error" that exits 0
  }
  if (*inspect) return tessera::Inspect(inspect_path, max_rows, max_values);
  if (*verify) return tessera::Verify(verify_paths);
  if (*list) return tessera::List(list_dir);
  return 2;
}

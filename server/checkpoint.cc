#include "server/checkpoint.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <filesystem>
#include <limits>
#include <optional>
#include <system_error>

#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/env.h"
#include "server/checkpoint_format.h"

// Checkpoints: the snapshot's invariants, file names, the directory (list,
// latest, prune) and the whole write (temporary file, rename, directory
// sync). The bytes are written by server/checkpoint_write.cc and read by
// server/checkpoint_read.cc; CRC32C is server/checkpoint_crc.cc.

namespace tessera {

// ---- validation ----

namespace {

// Checks one table's invariants; errors start with "table ID".
absl::Status ValidateTableSnapshot(const TableSnapshot& t) {
  if (auto s = ValidateTableConfig(t.config); !s.ok()) return s;
  const uint32_t id = t.config.table_id();
  const size_t w = StoredRowFloats(t.config);
  if (t.values.size() != t.keys.size() * w) {
    return absl::InvalidArgumentError(absl::StrCat("table ", id, ": ", t.keys.size(), " keys of width ", w,
                                                   " need ", t.keys.size() * w, " values, got ", t.values.size()));
  }
  for (size_t i = 0; i < t.keys.size(); ++i) {
    if (i > 0 && t.keys[i] <= t.keys[i - 1]) {
      return absl::InvalidArgumentError(absl::StrCat("table ", id, ": key ", t.keys[i], " (row ", i,
                                                     ") follows key ", t.keys[i - 1],
                                                     "; keys must be strictly increasing"));
    }
  }
  if (t.config.kind() == proto::DENSE && !t.keys.empty() && t.keys.back() >= t.config.dense_rows()) {
    return absl::InvalidArgumentError(absl::StrCat("table ", id, " is dense with ", t.config.dense_rows(),
                                                   " rows; key ", t.keys.back(), " is out of range"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status ValidateSnapshot(const ShardSnapshot& snapshot) {
  for (size_t i = 1; i < snapshot.vshards.size(); ++i) {
    if (snapshot.vshards[i] <= snapshot.vshards[i - 1]) {
      return absl::InvalidArgumentError(absl::StrCat("vshard ", snapshot.vshards[i], " follows vshard ",
                                                     snapshot.vshards[i - 1],
                                                     "; vshards must be strictly increasing"));
    }
  }
  std::vector<uint32_t> ids;
  for (const TableSnapshot& t : snapshot.tables) {
    if (auto s = ValidateTableSnapshot(t); !s.ok()) return s;
    ids.push_back(t.config.table_id());
  }
  std::sort(ids.begin(), ids.end());
  if (auto dup = std::adjacent_find(ids.begin(), ids.end()); dup != ids.end())
    return absl::InvalidArgumentError(absl::StrCat("table ", *dup, " appears more than once"));
  return absl::OkStatus();
}

// ---- names ----

namespace {

const char kFileSuffix[] = ".tckpt";
const char kTemporarySuffix[] = ".tmp";

// "server-<rank>-<sequence>.tckpt" (temporary = false) or the same with
// ".tmp" appended (temporary = true), as rank and sequence; nullopt for any
// other name.
std::optional<std::pair<uint32_t, uint64_t>> ParseName(const std::string& name, bool temporary) {
  std::string rest = name;
  const std::string suffix = std::string(kFileSuffix) + (temporary ? kTemporarySuffix : "");
  if (rest.size() <= suffix.size() || rest.compare(rest.size() - suffix.size(), suffix.size(), suffix) != 0)
    return std::nullopt;
  rest.resize(rest.size() - suffix.size());
  const std::string prefix = "server-";
  if (rest.compare(0, prefix.size(), prefix) != 0) return std::nullopt;
  rest = rest.substr(prefix.size());
  const size_t dash = rest.find('-');
  if (dash == std::string::npos) return std::nullopt;
  auto number = [](const std::string& digits, uint64_t max) -> std::optional<uint64_t> {
    if (digits.empty() || digits.size() > 20) return std::nullopt;
    uint64_t v = 0;
    for (char c : digits) {
      if (c < '0' || c > '9') return std::nullopt;
      const uint64_t d = static_cast<uint64_t>(c - '0');
      if (v > (max - d) / 10) return std::nullopt;
      v = v * 10 + d;
    }
    return v;
  };
  auto rank = number(rest.substr(0, dash), std::numeric_limits<uint32_t>::max());
  auto sequence = number(rest.substr(dash + 1), std::numeric_limits<uint64_t>::max());
  if (!rank || !sequence) return std::nullopt;
  return std::make_pair(static_cast<uint32_t>(*rank), *sequence);
}

struct DirectoryEntries {
  std::vector<CheckpointInfo> complete;
  std::vector<CheckpointInfo> temporaries;
};

absl::StatusOr<DirectoryEntries> ScanDirectory(const std::string& dir) {
  namespace fs = std::filesystem;
  DirectoryEntries out;
  std::error_code ec;
  fs::directory_iterator it(dir, ec);
  if (ec == std::errc::no_such_file_or_directory) return out;
  if (ec) return absl::InternalError(absl::StrCat("checkpoint directory ", dir, ": ", ec.message()));
  for (; it != fs::directory_iterator(); it.increment(ec)) {
    if (ec) break;
    const std::string name = it->path().filename().string();
    for (bool temporary : {false, true}) {
      auto parsed = ParseName(name, temporary);
      if (!parsed) continue;
      std::error_code type_ec;
      if (!temporary && !it->is_regular_file(type_ec)) continue;
      (temporary ? out.temporaries : out.complete)
          .push_back(CheckpointInfo{.path = it->path().string(), .server_rank = parsed->first,
                                    .sequence = parsed->second});
    }
  }
  if (ec) return absl::InternalError(absl::StrCat("checkpoint directory ", dir, ": ", ec.message()));
  auto newest_first = [](const CheckpointInfo& a, const CheckpointInfo& b) {
    return a.sequence != b.sequence ? a.sequence > b.sequence : a.server_rank < b.server_rank;
  };
  std::sort(out.complete.begin(), out.complete.end(), newest_first);
  return out;
}

}  // namespace

const char* SectionTypeName(SectionType type) {
  switch (type) {
    case SectionType::kMeta: return "META";
    case SectionType::kCoreState: return "CORE_STATE";
    case SectionType::kTable: return "TABLE";
    case SectionType::kRows: return "ROWS";
    case SectionType::kEnd: return "END";
  }
  return "UNKNOWN";
}

std::string CheckpointPath(const std::string& dir, uint32_t server_rank, uint64_t sequence) {
  return (std::filesystem::path(dir) / absl::StrFormat("server-%d-%010d%s", server_rank, sequence, kFileSuffix))
      .string();
}

std::string CheckpointTemporaryPath(const std::string& dir, uint32_t server_rank, uint64_t sequence) {
  return CheckpointPath(dir, server_rank, sequence) + kTemporarySuffix;
}

absl::StatusOr<CheckpointInfo> WriteCheckpoint(const std::string& dir, const ShardSnapshot& snapshot,
                                               const CheckpointWriteOptions& options) {
  if (auto s = ValidateSnapshot(snapshot); !s.ok())
    return absl::InvalidArgumentError(absl::StrCat("checkpoint not written: ", s.message()));
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return absl::InternalError(absl::StrCat("cannot create checkpoint directory ", dir, ": ", ec.message()));
  auto entries = ScanDirectory(dir);
  if (!entries.ok()) return entries.status();
  uint64_t last = 0;
  for (const CheckpointInfo& c : entries->complete)
    if (c.server_rank == snapshot.server_rank) last = std::max(last, c.sequence);
  if (last == std::numeric_limits<uint64_t>::max())
    return absl::FailedPreconditionError(absl::StrCat("checkpoint directory ", dir, ": sequence numbers exhausted"));
  CheckpointInfo info{.path = CheckpointPath(dir, snapshot.server_rank, last + 1),
                      .server_rank = snapshot.server_rank,
                      .sequence = last + 1};
  const std::string temporary = CheckpointTemporaryPath(dir, info.server_rank, info.sequence);
  if (auto s = checkpoint_internal::WriteSnapshotFile(temporary, snapshot, info.sequence, options); !s.ok()) {
    return s;  // the temporary is removed
  }
  if (::rename(temporary.c_str(), info.path.c_str()) != 0) {
    const int e = errno;
    ::unlink(temporary.c_str());
    return absl::InternalError(absl::StrCat("cannot rename ", temporary, " to ", info.path, ": ", ErrnoText(e)));
  }
  if (auto s = SyncDirectory(dir); !s.ok()) return s;
  if (options.keep_last > 0) {
    if (auto s = PruneCheckpoints(dir, info.server_rank, options.keep_last); !s.ok())
      return absl::Status(s.code(), absl::StrCat("checkpoint ", info.path, " written, but pruning failed: ", s.message()));
  }
  return info;
}


absl::StatusOr<std::vector<CheckpointInfo>> ListCheckpoints(const std::string& dir) {
  auto entries = ScanDirectory(dir);
  if (!entries.ok()) return entries.status();
  return std::move(entries->complete);
}

absl::StatusOr<CheckpointInfo> LatestCheckpoint(const std::string& dir, uint32_t server_rank) {
  auto list = ListCheckpoints(dir);
  if (!list.ok()) return list.status();
  for (const CheckpointInfo& c : *list)
    if (c.server_rank == server_rank) return c;
  return absl::NotFoundError(absl::StrCat("no checkpoint of server rank ", server_rank, " in ", dir));
}

absl::StatusOr<LoadedCheckpoint> LoadLatestCheckpoint(const std::string& dir, uint32_t server_rank) {
  auto list = ListCheckpoints(dir);
  if (!list.ok()) return list.status();
  LoadedCheckpoint out;
  bool any = false;
  for (const CheckpointInfo& c : *list) {
    if (c.server_rank != server_rank) continue;
    any = true;
    auto snapshot = ReadCheckpoint(c.path);
    if (snapshot.ok() && snapshot->server_rank != server_rank) {
      snapshot = absl::DataLossError(absl::StrCat("checkpoint ", c.path, ": its header says server rank ",
                                                  snapshot->server_rank, ", its name rank ", server_rank));
    }
    if (!snapshot.ok()) {
      out.skipped.push_back(snapshot.status());
      continue;
    }
    out.info = c;
    out.snapshot = std::move(*snapshot);
    return out;
  }
  if (!any) return absl::NotFoundError(absl::StrCat("no checkpoint of server rank ", server_rank, " in ", dir));
  return absl::DataLossError(absl::StrCat(
      "no checkpoint of server rank ", server_rank, " in ", dir, " reads cleanly: ",
      absl::StrJoin(out.skipped, "; ", [](std::string* o, const absl::Status& s) { absl::StrAppend(o, s.message()); })));
}

absl::Status PruneCheckpoints(const std::string& dir, uint32_t server_rank, uint32_t keep_last) {
  if (keep_last == 0)
    return absl::InvalidArgumentError("PruneCheckpoints: keep_last must be at least 1 (it would remove every checkpoint)");
  auto entries = ScanDirectory(dir);
  if (!entries.ok()) return entries.status();
  absl::Status first_error;
  auto remove = [&](const std::string& path) {
    if (::unlink(path.c_str()) != 0 && errno != ENOENT && first_error.ok())
      first_error = absl::InternalError(absl::StrCat("cannot remove ", path, ": ", ErrnoText(errno)));
  };
  uint32_t kept = 0;
  for (const CheckpointInfo& c : entries->complete) {  // newest first
    if (c.server_rank != server_rank) continue;
    if (kept < keep_last) {
      ++kept;
    } else {
      remove(c.path);
    }
  }
  for (const CheckpointInfo& c : entries->temporaries)
    if (c.server_rank == server_rank) remove(c.path);
  return first_error;
}

}  // namespace tessera

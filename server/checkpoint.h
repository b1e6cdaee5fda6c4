#pragma once
// Checkpoints: a server's shards as a file, and back.
//
// A ShardSnapshot is a plain value: what one server holds (its virtual
// shards, the rows of its tables, how many pushes each shard has applied,
// and an opaque blob from the server core). The value types and the helpers
// that move rows between a Table and a TableSnapshot are pure and live in
// server/shard_snapshot.h (usable from the server core); the functions here
// that read and write files do I/O and belong to the shell (library
// tessera_checkpoint).
//
// Files (docs/checkpoints.md has the byte layout):
// - One file per checkpoint: DIR/server-<rank>-<sequence>.tckpt, where the
//   sequence (zero-padded to 10 digits; more digits once it outgrows them)
//   numbers the checkpoints of one rank in one directory from 1, in the
//   order they were written.
// - Written to DIR/server-<rank>-<sequence>.tckpt.tmp, fsynced, renamed to
//   the final name, then the directory is fsynced: a checkpoint under its
//   final name is complete; a crash leaves at most a temporary, which
//   readers ignore and the next prune removes.
// - A versioned header with a magic number, then sections, each with a
//   CRC32C of its header and one of its payload; an END section holds the
//   section count and the END's own offset, and nothing may follow it. So
//   any corruption or truncation is an error, never a wrong snapshot.
// - One writer per (directory, rank) at a time; readers may run at any time
//   (they only ever see complete files).
//
// Errors: ReadCheckpoint returns DataLoss for corrupt or truncated files,
// naming the file, the section and its byte offset; FailedPrecondition for a
// format version this build does not read; NotFound / PermissionDenied etc.
// for files it cannot open. A reader never allocates more than the file
// holds: every length is checked against the bytes that remain first.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "common/keys.h"
#include "proto/tessera.pb.h"
#include "server/shard_snapshot.h"
#include "server/table.h"

namespace tessera {

// ---- values (server/shard_snapshot.h) ----

// OK when the snapshot keeps the invariants of ShardSnapshot and
// TableSnapshot; else InvalidArgument naming the table, the row and what is wrong.
absl::Status ValidateSnapshot(const ShardSnapshot& snapshot);

// ---- files ----

inline constexpr char kCheckpointMagic[8] = {'T', 'E', 'S', 'S', 'C', 'K', 'P', 'T'};
inline constexpr uint32_t kCheckpointVersion = 1;

struct CheckpointWriteOptions {
  // Rows go into sections of at most this many bytes each (a single row
  // larger than that gets a section of its own). Smaller sections locate
  // damage more precisely; larger ones cost fewer headers.
  uint64_t max_section_bytes = uint64_t{64} << 20;
  // After a successful write, keep only the newest keep_last checkpoints of
  // this rank in the directory (and remove its leftover temporaries);
  // 0 = prune nothing.
  uint32_t keep_last = 0;
};

// A complete checkpoint file, as named in its directory.
struct CheckpointInfo {
  std::string path;
  uint32_t server_rank = 0;
  uint64_t sequence = 0;
};

// "DIR/server-<rank>-<sequence>.tckpt" and the name of its temporary.
std::string CheckpointPath(const std::string& dir, uint32_t server_rank, uint64_t sequence);
std::string CheckpointTemporaryPath(const std::string& dir, uint32_t server_rank, uint64_t sequence);

// Writes `snapshot` as the next checkpoint of snapshot.server_rank in `dir`
// (created if missing): sequence = 1 + the largest complete one there. The
// file appears under its final name complete and durable (fsynced, renamed,
// directory fsynced) or not at all; on failure the temporary is removed and
// the previous checkpoints are untouched. InvalidArgument if
// ValidateSnapshot fails (nothing is written); the OS error, naming the path
// and the step, otherwise. A pruning failure after a successful write is
// returned as an error too, though the new checkpoint is in place.
absl::StatusOr<CheckpointInfo> WriteCheckpoint(const std::string& dir, const ShardSnapshot& snapshot,
                                               const CheckpointWriteOptions& options);
inline absl::Status WriteCheckpoint(const std::string& dir, const ShardSnapshot& snapshot) {
  return WriteCheckpoint(dir, snapshot, CheckpointWriteOptions{}).status();
}

// Where each section of a file lies, for the inspect tool and for tests.
enum class SectionType : uint32_t {
  kMeta = 1,       // vshards, applied push counts, table count
  kCoreState = 2,  // the opaque core state
  kTable = 3,      // one table's config and row count
  kRows = 4,       // a run of one table's rows (keys, then values)
  kEnd = 5,        // section count and own offset; last in the file
};
const char* SectionTypeName(SectionType type);

struct SectionInfo {
  SectionType type;
  uint32_t table_id = 0;   // kTable and kRows; 0 otherwise
  uint64_t offset = 0;     // of the section header in the file
  uint64_t payload_bytes = 0;
  uint32_t payload_crc = 0;
};

// Everything a file says: its header, where its sections are, the snapshot.
struct CheckpointFile {
  uint32_t version = 0;
  uint64_t sequence = 0;   // as recorded in the header (the name may differ if the file was copied)
  uint64_t file_bytes = 0;
  std::vector<SectionInfo> sections;  // in file order, END last
  ShardSnapshot snapshot;
};

// Reads and checks a checkpoint file: magic, version, every length and every
// checksum, the section order and counts, and the snapshot's invariants.
// Errors: see the top of this file.
absl::StatusOr<CheckpointFile> ReadCheckpointFile(const std::string& path);
inline absl::StatusOr<ShardSnapshot> ReadCheckpoint(const std::string& path) {
  auto file = ReadCheckpointFile(path);
  if (!file.ok()) return file.status();
  return std::move(file->snapshot);
}

// The complete checkpoints in `dir` (files named as CheckpointPath; never
// temporaries or anything else), newest first: by sequence, descending, then
// by rank, ascending. Names only: the contents are not read. A directory that
// does not exist holds none (an empty list); other errors are returned.
absl::StatusOr<std::vector<CheckpointInfo>> ListCheckpoints(const std::string& dir);
// The newest complete checkpoint of `server_rank` in `dir`; NotFound when
// there is none.
absl::StatusOr<CheckpointInfo> LatestCheckpoint(const std::string& dir, uint32_t server_rank);

// Reads the newest checkpoint of `server_rank` in `dir` that reads cleanly,
// falling back to older ones; `skipped` holds the errors of newer ones that
// did not (so the caller can say what was lost). NotFound when there is no
// checkpoint; DataLoss (listing every error) when none reads cleanly.
struct LoadedCheckpoint {
  CheckpointInfo info;
  ShardSnapshot snapshot;
  std::vector<absl::Status> skipped;
};
absl::StatusOr<LoadedCheckpoint> LoadLatestCheckpoint(const std::string& dir, uint32_t server_rank);

// Removes all but the newest keep_last (>= 1, else InvalidArgument)
// complete checkpoints of `server_rank` in `dir`, and that rank's
// temporaries (leftovers of crashed writes; call it only while no write for
// the rank is in progress). Other ranks' files are never touched. Returns
// the first error, after trying every file.
absl::Status PruneCheckpoints(const std::string& dir, uint32_t server_rank, uint32_t keep_last);

// ---- restoring shards (pure) ----
// Choosing the newest copy of each shard among checkpoints read, restoring
// it and the report: server/checkpoint_restore.h (in the pure core).

// ---- CRC32C ----

// CRC32C (Castagnoli, reflected polynomial 0x82F63B78), continuing from
// `crc` (0 to start): Crc32cExtend(Crc32cExtend(0, a), b) == CRC of a then b.
// Uses the SSE4.2 instruction where the CPU has it; same result either way.
uint32_t Crc32cExtend(uint32_t crc, const void* data, size_t size);
inline uint32_t Crc32c(const void* data, size_t size) { return Crc32cExtend(0, data, size); }

namespace checkpoint_internal {
// The two implementations behind Crc32cExtend, for tests.
uint32_t Crc32cPortable(uint32_t crc, const void* data, size_t size);
bool Crc32cHardwareAvailable();
uint32_t Crc32cHardware(uint32_t crc, const void* data, size_t size);  // requires Crc32cHardwareAvailable()
}  // namespace checkpoint_internal

}  // namespace tessera

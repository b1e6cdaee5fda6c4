#pragma once
// The byte layout of checkpoint files (docs/checkpoints.md): sizes, the
// little-endian integer helpers and the section types, shared by the writer
// (server/checkpoint_write.cc) and the reader (server/checkpoint_read.cc).
// Internal to server/checkpoint*.cc; users include server/checkpoint.h.
#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>

#include "absl/status/status.h"
#include "server/checkpoint.h"

namespace tessera::checkpoint_internal {

// Keys and values are written as their in-memory bytes; the format is
// little-endian.
static_assert(std::endian::native == std::endian::little, "checkpoint files are little-endian; add byte swaps");
static_assert(sizeof(float) == 4 && std::numeric_limits<float>::is_iec559);

inline constexpr uint64_t kHeaderBytes = 48;
inline constexpr uint64_t kSectionHeaderBytes = 24;
inline constexpr uint64_t kEndPayloadBytes = 12;
inline constexpr uint64_t kMinRowsPayloadBytes = 8;  // the row count

inline void PutU32(std::string& out, uint32_t v) { out.append(reinterpret_cast<const char*>(&v), 4); }
inline void PutU64(std::string& out, uint64_t v) { out.append(reinterpret_cast<const char*>(&v), 8); }
inline uint32_t GetU32(const std::byte* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}
inline uint64_t GetU64(const std::byte* p) {
  uint64_t v;
  std::memcpy(&v, p, 8);
  return v;
}

inline bool IsKnownSectionType(uint32_t t) { return t >= 1 && t <= 5; }

// Writes `snapshot` as checkpoint `sequence` into a new file at `path`,
// synced; on any error the file is removed (server/checkpoint_write.cc).
absl::Status WriteSnapshotFile(const std::string& path, const ShardSnapshot& snapshot, uint64_t sequence,
                               const CheckpointWriteOptions& options);

}  // namespace tessera::checkpoint_internal

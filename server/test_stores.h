#pragma once
// The disk tier's stores, for the tests of server/cold_rows.h and of tables
// with a disk tier (cold_rows_test): one place that opens each kind.
#include <cstdlib>
#include <memory>
#include <string>

#include "gtest/gtest.h"
#include "server/bucket_file_cold_rows.h"
#include "server/cold_rows.h"
#include "server/log_cold_rows.h"
#include "server/rocks_cold_rows.h"

namespace tessera {

enum class StoreKind { kMemory, kRocks, kBucketFile, kLog };

inline std::string StoreName(StoreKind kind) {
  switch (kind) {
    case StoreKind::kMemory: return "Memory";
    case StoreKind::kRocks: return "Rocks";
    case StoreKind::kBucketFile: return "BucketFile";
    case StoreKind::kLog: return "Log";
  }
  return "?";
}

// A store of `kind` in `directory` (unused for kMemory). Small buffers and
// segments, unless `small` is false, so that a test's few rows reach the
// files and the log compacts. Null (with a test failure) if it cannot open.
inline std::unique_ptr<ColdRows> OpenTestStore(StoreKind kind, const std::string& directory, uint32_t row_floats,
                                               bool small = true) {
  absl::StatusOr<std::unique_ptr<ColdRows>> made;
  switch (kind) {
    case StoreKind::kMemory: return std::make_unique<MemoryColdRows>(row_floats);
    case StoreKind::kBucketFile: made = BucketFileColdRows::Open(directory, row_floats); break;
    case StoreKind::kLog:
      made = LogColdRows::Open(directory, row_floats, small ? 64 << 10 : LogColdRows::kSegmentBytes);
      break;
    case StoreKind::kRocks: {
      RocksColdRowsOptions o;
      o.directory = directory;
      o.write_buffer_bytes = small ? 256 << 10 : 2 << 20;
      o.block_cache_bytes = small ? 256 << 10 : 2 << 20;
      made = RocksColdRows::Open(o, row_floats);
      break;
    }
  }
  EXPECT_TRUE(made.ok()) << made.status();
  return made.ok() ? std::move(*made) : nullptr;
}

}  // namespace tessera

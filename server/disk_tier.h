#pragma once
// The disk tiers of one server process (tessera-server --disk_dir): which
// store holds the rows its tables' budgets have no room for, and where.
//
// MakeDiskTierFactory(disk_dir, kind) returns the ColdRowsFactory the
// server gives its core (ServerCoreOptions::disk_tiers). Each table's store
// goes in DISK_DIR/tessera-HOST-PID/table-ID-N (N counts the stores the
// factory made), so that servers sharing a disk_dir never share a store, nor
// two copies of a table in one process (a server that rejoins makes a new
// core while the old one may still be closing). It makes disk_dir if
// missing and removes the directories that processes of this host left
// there when they died without cleaning up (their pid no longer exists);
// other files there are left alone. The process's directory goes when the
// last of the factory's copies and its stores does: each store keeps it.
//
// Stores (all fulfil server/cold_rows.h; bench/disk_tier_bench compares):
//   bucket  BucketFileColdRows (server/bucket_file_cold_rows.h), the default:
//           a hash table on disk of our own, no per-row memory, no
//           background threads; measured 3x RocksDB's rows per CPU-second.
//   log     LogColdRows (server/log_cold_rows.h): a log of records with the
//           index in memory (21-43 bytes a row on disk); sequential writes,
//           none for a row taken back, compaction of its own.
//   rocks   RocksColdRows (server/rocks_cold_rows.h): ~3 bytes of memory a
//           row, sequential writes (for disks that dislike random ones),
//           background flushes and compactions.
// Errors: a disk_dir it cannot make (FailedPrecondition naming --disk_dir);
// an unknown kind name (ParseDiskStore).
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "server/cold_rows.h"
#include "server/rocks_cold_rows.h"

namespace tessera {

enum class DiskStore { kBucketFile, kLog, kRocks };

// "bucket", "log" or "rocks"; anything else is InvalidArgument listing them.
absl::StatusOr<DiskStore> ParseDiskStore(std::string_view name);
const char* DiskStoreName(DiskStore store);

absl::StatusOr<ColdRowsFactory> MakeDiskTierFactory(const std::string& disk_dir, DiskStore store,
                                                    RocksColdRowsOptions rocks = {});

}  // namespace tessera

#pragma once
// Load summary: what a server's tables hold, for metrics and the
// coordinator's heartbeats, as pure functions over the tables. A part of
// ServerCore (docs/design.md, "Server parts"): table_summaries(), rows()
// and FillHeartbeat read it.
//
// Contract:
// - SummarizeTables(tables): one TableSummary per table, sorted by id: its
//   name, rows (in memory and on disk), the bytes of its rows in memory as
//   its budget counts them (Table::RowBytes each), rows on disk, whether it
//   has a disk tier and that store's statistics, and its counters.
//   With a disk tier also the store's own memory and the table's budget.
// - StoreTakesBudget(summary): whether a table's disk tier store's own
//   memory leaves no room for even one row in memory beside it: the table
//   then keeps one row in memory anyway and its server passes the budget
//   by what the store grows (the log store's index grows with every row on
//   disk). False for a table without a disk tier.
// - TotalRows(tables): the rows of every table (in memory and on disk).
// - TotalRowBytes(tables): every table's rows times Table::RowBytes (what
//   the heartbeat reports as memory).
// - AppliedByPrimary(map, rank, applied): (vshard, pushes applied) for each
//   shard `rank` is primary of in `map`, ascending (0 where `applied` has
//   none).
// Pure: no I/O, threads or clocks. Thread safety: none; reads only.
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "common/keys.h"
#include "server/cold_rows.h"
#include "server/state_transfer.h"
#include "server/table.h"

namespace tessera {

// Per table, for metrics (ServerCore::table_summaries()).
struct TableSummary {
  uint32_t id = 0;
  std::string name;
  uint64_t rows = 0;          // in memory and on disk
  uint64_t bytes = 0;         // of the rows in memory, as the budget counts them
  uint64_t rows_on_disk = 0;  // disk tier
  bool disk_tier = false;
  ColdRowStats disk;          // the disk tier's store (zeros without one)
  TableCounters counters;
  uint64_t store_memory_bytes = 0;   // the disk tier's store's own memory (Table::store_memory_bytes)
  uint64_t memory_budget_bytes = 0;  // the table's budget (0: none)
  uint64_t row_bytes = 0;            // Table::RowBytes of the table
};

bool StoreTakesBudget(const TableSummary& summary);

std::vector<TableSummary> SummarizeTables(const TableMap& tables);
uint64_t TotalRows(const TableMap& tables);
uint64_t TotalRowBytes(const TableMap& tables);
std::vector<std::pair<uint32_t, uint64_t>> AppliedByPrimary(const ShardMapView& map, uint32_t rank,
                                                            const absl::flat_hash_map<uint32_t, uint64_t>& applied);

}  // namespace tessera

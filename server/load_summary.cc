#include "server/load_summary.h"

#include <algorithm>

namespace tessera {

std::vector<TableSummary> SummarizeTables(const TableMap& tables) {
  std::vector<TableSummary> out;
  for (const auto& [id, t] : tables) {
    out.push_back(TableSummary{.id = id,
                               .name = t->config().name(),
                               .rows = t->num_rows(),
                               .bytes = t->rows_in_memory() * Table::RowBytes(t->config()),
                               .rows_on_disk = t->rows_on_disk(),
                               .disk_tier = t->has_disk_tier(),
                               .disk = t->disk_stats(),
                               .counters = t->counters(),
                               .store_memory_bytes = t->store_memory_bytes(),
                               .memory_budget_bytes = t->config().memory_budget_bytes(),
                               .row_bytes = Table::RowBytes(t->config())});
  }
  std::sort(out.begin(), out.end(), [](const TableSummary& a, const TableSummary& b) { return a.id < b.id; });
  return out;
}

bool StoreTakesBudget(const TableSummary& t) {
  return t.disk_tier && t.store_memory_bytes + t.row_bytes > t.memory_budget_bytes;
}

uint64_t TotalRows(const TableMap& tables) {
  uint64_t rows = 0;
  for (const auto& [id, t] : tables) rows += t->num_rows();
  return rows;
}

uint64_t TotalRowBytes(const TableMap& tables) {
  uint64_t bytes = 0;
  for (const auto& [id, t] : tables) bytes += t->num_rows() * Table::RowBytes(t->config());
  return bytes;
}

std::vector<std::pair<uint32_t, uint64_t>> AppliedByPrimary(const ShardMapView& map, uint32_t rank,
                                                            const absl::flat_hash_map<uint32_t, uint64_t>& applied) {
  std::vector<std::pair<uint32_t, uint64_t>> out;
  for (uint32_t v = 0; v < map.num_vshards(); ++v) {
    if (map.ServerRankOf(v) != rank) continue;
    auto it = applied.find(v);
    out.emplace_back(v, it == applied.end() ? 0 : it->second);
  }
  return out;
}

}  // namespace tessera

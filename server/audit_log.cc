#include "server/audit_log.h"

#include <algorithm>
#include <map>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace tessera {

void AuditLog::Applied(uint32_t table_id, std::span<const Key> keys, const PushOrigin& origin, Columns piece) {
  for (Key k : keys) rows_[{table_id, k}].push_back(Entry{origin.worker, origin.incarnation, origin.seq, piece});
}

void AuditLog::Export(const RowFilter& keep, proto::ShardTransfer* t) const {
  std::vector<std::pair<uint32_t, Key>> rows;
  for (const auto& [row, entries] : rows_)
    if (keep(row.first, row.second)) rows.push_back(row);
  std::sort(rows.begin(), rows.end());
  for (const auto& row : rows) {
    proto::AuditRow* a = t->add_audit();
    a->set_table_id(row.first);
    a->set_key(row.second);
    for (const Entry& e : rows_.at(row)) {
      a->add_workers(e.worker);
      a->add_incarnations(e.incarnation);
      a->add_seqs(e.seq);
      a->add_first_columns(e.piece.first);
      a->add_columns(e.piece.count);
    }
  }
}

void AuditLog::Import(const proto::ShardTransfer& t, const RowFilter& keep) {
  for (const proto::AuditRow& a : t.audit()) {
    if (!keep(a.table_id(), a.key())) continue;
    std::vector<Entry>& entries = rows_[{a.table_id(), a.key()}];
    entries.clear();
    const bool pieces = a.first_columns_size() == a.seqs_size() && a.columns_size() == a.seqs_size();
    for (int i = 0; i < a.workers_size() && i < a.incarnations_size() && i < a.seqs_size(); ++i) {
      entries.push_back(Entry{a.workers(i), a.incarnations(i), a.seqs(i),
                              pieces ? Columns{a.first_columns(i), a.columns(i)} : Columns{}});
    }
  }
}

void AuditLog::Forget(const RowFilter& drop) {
  absl::erase_if(rows_, [&](const auto& e) { return drop(e.first.first, e.first.second); });
}

void AuditLog::Restored(const proto::ShardTransfer& state, std::span<const uint32_t> vshards, uint32_t num_vshards) {
  std::map<uint32_t, std::vector<std::string>> windows;
  for (uint32_t v : vshards) windows[v];
  for (const proto::DedupWindow& d : state.dedup()) {
    auto it = windows.find(d.vshard());
    if (it == windows.end()) continue;
    std::vector<uint64_t> seqs(d.seqs().begin(), d.seqs().end());
    std::sort(seqs.begin(), seqs.end());
    std::string w = absl::StrCat(d.worker_id(), ":", d.incarnation(), ":", d.floor());
    if (!seqs.empty()) absl::StrAppend(&w, ":", absl::StrJoin(seqs, "/"));
    it->second.push_back(std::move(w));
  }
  for (auto& [v, list] : windows) {
    std::sort(list.begin(), list.end());
    restores_.push_back(
        absl::StrCat("restored ", v, " of ", num_vshards, list.empty() ? "" : " ", absl::StrJoin(list, " ")));
  }
}

void AuditLog::AppendEntries(uint32_t table_id, Key key, std::string* out) const {
  auto it = rows_.find({table_id, key});
  if (it == rows_.end()) return;
  for (const Entry& e : it->second) {
    absl::StrAppend(out, " ", e.worker, ":", e.incarnation, ":", e.seq);
    if (!e.piece.whole()) absl::StrAppend(out, ":", e.piece.first, ":", e.piece.count);  // a piece of the row
  }
}

std::string AuditDump(const AuditLog& audit, const TableMap& tables, const ShardMapView& map, uint32_t rank) {
  const bool deposed = map.IsDead(rank);
  std::string out =
      absl::StrCat("# tessera audit server ", rank, " epoch ", map.epoch(), deposed ? " deposed" : "", "\n");
  if (deposed) return out;
  for (const std::string& line : audit.RestoreLines()) absl::StrAppend(&out, line, "\n");
  std::vector<uint32_t> ids;
  for (const auto& [id, table] : tables) ids.push_back(id);
  std::sort(ids.begin(), ids.end());
  for (uint32_t id : ids) {
    std::vector<std::pair<Key, std::vector<float>>> rows;
    tables.at(id)->ForEachRow([&](Key k, std::span<const float> row) {
      if (map.Holds(rank, map.VShardOfKey(id, k))) rows.emplace_back(k, std::vector<float>(row.begin(), row.end()));
    });
    std::sort(rows.begin(), rows.end());
    for (const auto& [k, values] : rows) {
      const bool primary = map.ServerRankOfKey(id, k) == rank;
      absl::StrAppend(&out, "row ", id, " ", k, primary ? " primary " : " backup ");
      for (size_t i = 0; i < values.size(); ++i) absl::StrAppend(&out, i ? "," : "", values[i]);
      audit.AppendEntries(id, k, &out);
      out += "\n";
    }
  }
  return out;
}

}  // namespace tessera

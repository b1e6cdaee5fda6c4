#pragma once
// AuditLog: in audit mode (fault experiments), which pushes were applied to
// each row, and which pushes each checkpoint restored inside the running
// job, for ServerCore::AuditDump. A part of ServerCore (docs/design.md,
// "Server parts"); the core calls it only when ServerCoreOptions::audit is
// set, so outside audit mode it stays empty.
//
// Contract:
// - Applied(table, keys, origin, piece) appends (worker, incarnation, seq,
//   piece) to each key's row record, in the order called.
// - Export(keep, t) writes the records of the rows keep(table, key) accepts
//   to t->audit, sorted by (table, key), entries in applied order; Import
//   replaces the records of the rows it carries that keep accepts (an entry
//   list without per-entry columns, from an older sender, reads as whole
//   rows). Export then Import gives the same records.
// - Forget(drop) removes the records of the rows drop(table, key) accepts.
// - Restored(state, vshards, num_vshards) adds one line per distinct shard
//   of `vshards`, in shard order:
//     restored VSHARD of NUM_VSHARDS [WORKER:INCARNATION:FLOOR[:SEQ/SEQ/..] ...]
//   from the de-duplication windows `state` holds for that shard (sorted
//   text, seqs ascending); RestoreLines() returns them in restore order.
// - AppendEntries(table, key, out) appends " WORKER:INCARNATION:SEQ" per
//   entry of the row, with ":FIRST:COUNT" for a piece of the row.
// - AuditDump(audit, tables, map, rank): ServerCore::AuditDump's text for
//   server `rank` (server/server_core.h): the "# tessera audit server"
//   line (with " deposed" when the map names it dead, and nothing after
//   it then), the restore lines, then one "row" line per row of `tables`
//   whose shard `rank` holds, sorted by (table, key), with its values and
//   entries.
// Pure: no I/O, threads or clocks. Thread safety: none; the caller serializes.
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "common/keys.h"
#include "proto/tessera.pb.h"
#include "server/optimizer.h"
#include "server/push_dedup.h"
#include "server/state_transfer.h"

namespace tessera {

class AuditLog {
 public:
  using RowFilter = std::function<bool(uint32_t table_id, Key key)>;

  void Applied(uint32_t table_id, std::span<const Key> keys, const PushOrigin& origin, Columns piece);
  void Export(const RowFilter& keep, proto::ShardTransfer* t) const;
  void Import(const proto::ShardTransfer& t, const RowFilter& keep);
  void Forget(const RowFilter& drop);
  void Restored(const proto::ShardTransfer& state, std::span<const uint32_t> vshards, uint32_t num_vshards);

  const std::vector<std::string>& RestoreLines() const { return restores_; }
  void AppendEntries(uint32_t table_id, Key key, std::string* out) const;
  size_t rows() const { return rows_.size(); }

 private:
  struct Entry {
    uint32_t worker, incarnation;
    uint64_t seq;
    Columns piece;  // the columns the push carried (whole rows: count 0)
  };
  absl::flat_hash_map<std::pair<uint32_t, Key>, std::vector<Entry>> rows_;  // (table, key) -> pushes applied
  std::vector<std::string> restores_;  // "restored ..." lines, in restore order
};

std::string AuditDump(const AuditLog& audit, const TableMap& tables, const ShardMapView& map, uint32_t rank);

}  // namespace tessera

#pragma once
// State transfer: the ShardTransfer messages that give a backup a copy of
// shards (new backups, moves, restores), checked and cut down, as pure
// functions over the tables and the shard map. A part of ServerCore
// (docs/design.md, "Server parts"): the core adds the de-duplication
// windows, audit rows and clocks to the first message, numbers the messages
// in the backup's stream, and applies a checked transfer.
//
// Contract:
// - BuildTransfer(tables, map, vshards, applied, max_message_bytes, sender)
//   returns the Replicate.transfer messages (no stream, position or epoch
//   yet) that carry the rows of `vshards` (each the shard of map.VShardOfKey)
//   of every table, tables in id order: per table a keys frame and a rows
//   frame (StoredRowFloats per row, optimizer state included). A message
//   holds at most max(max_message_bytes / 2, 1) bytes of keys and rows
//   unless one row alone is larger; the rows go on in the next message
//   (ShardTransfer.continued set on every message after the first). The
//   first message lists every table's config (with empty frames for tables
//   without rows there), `vshards` and `applied` (one count per shard); the
//   later ones list only the tables whose rows they carry. `rows` counts the
//   rows in all of them. An empty `vshards` gives one message with every
//   table's config and no rows (a table's config for the backups).
// - CheckTransfer(m, map, my_rank, from, tables) accepts a transfer only if
//   it has two frames per table; every shard it names is one `from` is
//   primary of and `my_rank` backs up; every table config is valid and
//   equal to the table of that id here, if any; frame sizes match the
//   configs' row sizes; every key is in a transferred shard (and below
//   dense_rows for a dense table); and every window is of a transferred
//   shard. Returns those shards, or an error naming the first problem.
//   Changes nothing.
// - RescopeTransfer(m, kept, map) cuts a built transfer down to the shards
//   `kept` accepts: their shards, applied counts, rows, windows and audit
//   rows stay (tables and clocks stay whole); a transfer whose shards all
//   stay is left as it is.
// - GatherRows copies rows `idx` of (keys, values) into fresh frames (also
//   for forwards: a push's keys of one backup).
// - SetTransferRows(m, tables, create): at the backup, after CheckTransfer:
//   for each table of the transfer in order, create(config) (which must
//   leave the table in `tables`; its error is returned), then the rows the
//   message carries for it are set (Table::RestoreRows, dense rows
//   adopted).
// - AddClocks(clocks, t) lists every worker of `clocks` in t->clocks (its
//   node, clock and whether it is live); TakeClocks(t, clocks), at the
//   backup, moves each worker `clocks` knows to the clock listed (a clock
//   never goes back: ClockTable::Advance) or removes it if listed as not
//   live; workers it does not know are skipped.
// - ShardsInSyncOf(done, more, backup_rank): for an acknowledged message
//   `done` that is a transfer of shards and its last message (`more`
//   false), that backup and those shards (the coordinator may promote it
//   for them); nullopt for anything else.
// Pure: no I/O, threads or clocks. Thread safety: none; the caller serializes.
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/statusor.h"
#include "common/buffer.h"
#include "common/keys.h"
#include "common/message.h"
#include "server/clock_table.h"
#include "server/table.h"

namespace tessera {

using TableMap = absl::flat_hash_map<uint32_t, std::unique_ptr<Table>>;

struct BuiltTransfer {
  std::vector<Message> messages;
  uint64_t rows = 0;
};
BuiltTransfer BuildTransfer(const TableMap& tables, const ShardMapView& map, std::span<const uint32_t> vshards,
                            std::span<const uint64_t> applied, size_t max_message_bytes, uint32_t sender_id);

absl::StatusOr<absl::flat_hash_set<uint32_t>> CheckTransfer(const Message& m, const ShardMapView& map,
                                                            uint32_t my_rank, uint32_t from, const TableMap& tables);

void RescopeTransfer(Message& m, const std::function<bool(uint32_t)>& kept, const ShardMapView& map);

void GatherRows(const Buffer& keys, const Buffer& values, std::span<const uint32_t> idx, size_t row_bytes,
                Buffer* out_keys, Buffer* out_values);

absl::Status SetTransferRows(const Message& m, const TableMap& tables,
                             const std::function<absl::Status(const proto::TableConfig&)>& create);
void AddClocks(const ClockTable& clocks, proto::ShardTransfer* t);
void TakeClocks(const proto::ShardTransfer& t, ClockTable& clocks);
std::optional<proto::ShardsInSync> ShardsInSyncOf(const Message& done, bool more, uint32_t backup_rank);

}  // namespace tessera

#include "server/request_checks.h"

#include <google/protobuf/util/message_differencer.h>

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "compress/row_compressor.h"
#include "server/request_clocks.h"

namespace tessera {

void SetError(Message& reply, const absl::Status& status) {
  reply.frames.clear();
  auto* e = reply.header.mutable_error();
  e->set_code(static_cast<int>(status.code()));
  e->set_message(std::string(status.message()));
}

absl::Status CheckNotLent(const Message& m) {
  // Frames lent by a same-host peer (Buffer::remote()) are read only with
  // CopyOut, which the worker does for pull replies; no request may carry
  // them (a peer's bug would otherwise make the core read null data).
  for (const Buffer& f : m.frames) {
    if (f.remote()) {
      return absl::InvalidArgumentError("a request with lent (remote) frames; only pull replies may be lent");
    }
  }
  return absl::OkStatus();
}

bool IsWorkerRequest(const proto::Envelope& h) {
  return h.has_push() || h.has_pull() || h.has_clock_advance() || h.has_create_table() || h.has_stats_request() ||
         h.has_clock_query();
}

absl::Status BusyError(const PeerBacklog& backlog, const std::string& to, uint64_t max_requests, uint64_t max_bytes) {
  return absl::UnavailableError(absl::StrCat(
      "busy: ", backlog.messages, " answers (", backlog.bytes, " bytes) to ", to,
      " are not sent yet; this server keeps at most ", max_requests, " answers and ", max_bytes,
      " bytes in flight per peer (tessera-server --max-requests-in-flight-per-peer, "
      "--max-mb-in-flight-per-peer); send it again once they are read"));
}

std::optional<Refusal> RefuseBeforeRouting(const proto::Envelope& h, const ShardMapView& map, uint32_t my_rank,
                                           const ClockTable& clocks, Nanos max_hold) {
  const bool data_request = h.has_push() || h.has_pull() || h.has_replicate() || h.has_create_table();
  if (map.IsDead(my_rank) && data_request) {
    return Refusal{.status = absl::AbortedError(absl::StrCat("server ", my_rank, " was removed from the job at map ",
                                                             "epoch ", map.epoch(), "; it holds nothing")),
                   .replicate_rejected = h.has_replicate()};
  }
  if ((h.has_push() || h.has_pull()) && h.epoch() > map.epoch()) {
    // Sent by a newer map than this server has: its shards may have moved to
    // or from this server, and answering by the old map could acknowledge
    // keys a resend skips as not its own. Aborted at this server's epoch: the
    // worker sends it again shortly; by then this server has the map (its
    // heartbeats catch it up).
    return Refusal{.status = absl::AbortedError(absl::StrCat("server ", my_rank, " has shard map epoch ", map.epoch(),
                                                             ", older than the request's ", h.epoch(),
                                                             "; send it again")),
                   .behind_epoch = true};
  }
  if (absl::Status s = CheckClockFields(h, max_hold); !s.ok()) return Refusal{.status = s, .bad_request = true};
  if ((h.has_push() || h.has_pull()) && clocks.IsKnown(h.sender_id()) && !clocks.IsLive(h.sender_id())) {
    // The coordinator announced it left (done, or lost and the job went on
    // without it): its clock no longer counts, so neither may its data.
    return Refusal{.status = absl::FailedPreconditionError(absl::StrCat(
                       "worker ", clocks.RankOf(h.sender_id()), " has left the job; server ", my_rank,
                       " takes no more pushes or pulls from it")),
                   .bad_request = true};
  }
  return std::nullopt;
}

uint32_t RankOfNode(const ShardMapView& map, uint32_t node_id) {
  for (uint32_t r = 0; r < map.num_servers(); ++r)
    if (map.server(r).node_id() == node_id) return r;
  return kNoRank;
}

ForwardSender CheckForwardSender(const proto::Envelope& h, const ShardMapView& map, bool accept_old_epoch) {
  using Verdict = ForwardSender::Verdict;
  const bool old_epoch_accepted = accept_old_epoch && h.epoch() < map.epoch();
  if (h.epoch() < map.epoch() && !old_epoch_accepted) {
    return ForwardSender{.verdict = Verdict::kReject,
                         .rejection = absl::FailedPreconditionError(absl::StrCat(
                             "forward of map epoch ", h.epoch(), " is older than this server's epoch ", map.epoch())),
                         .stale = true};
  }
  if (h.epoch() > map.epoch()) return ForwardSender{.verdict = Verdict::kIgnore};
  const uint32_t from = RankOfNode(map, h.sender_id());
  if (from == kNoRank) {
    return ForwardSender{.verdict = Verdict::kReject,
                         .rejection = absl::FailedPreconditionError(absl::StrCat(
                             "node ", h.sender_id(), " is not a server of map epoch ", map.epoch()))};
  }
  return ForwardSender{.from = from, .old_epoch_accepted = old_epoch_accepted};
}

absl::StatusOr<Table*> FindTable(const TableMap& tables, uint32_t id) {
  auto it = tables.find(id);
  if (it == tables.end()) return absl::NotFoundError(absl::StrCat("no table ", id, " on this server"));
  return it->second.get();
}

absl::StatusOr<std::span<const Key>> CheckKeysFrame(const Buffer& f, uint64_t num_keys, uint64_t max_keys) {
  if (num_keys > max_keys) {
    return absl::ResourceExhaustedError(absl::StrCat("a request of ", num_keys, " keys; this server takes at most ",
                                                     max_keys, " in one (tessera-server --max-keys-per-request)"));
  }
  if (num_keys > f.size() || f.size() != num_keys * sizeof(Key)) {
    return absl::InvalidArgumentError(absl::StrCat("keys frame has ", f.size(), " bytes, expected ",
                                                   num_keys * sizeof(Key), " for ", num_keys, " keys"));
  }
  return f.As<Key>();
}

absl::Status CheckPrimaryOf(std::span<const Key> keys, uint32_t table_id, const ShardMapView& map, uint32_t my_rank,
                            std::vector<uint32_t>* shards) {
  if (shards != nullptr) shards->resize(keys.size());
  for (size_t i = 0; i < keys.size(); ++i) {
    const uint32_t v = map.VShardOfKey(table_id, keys[i]);
    const uint32_t owner = map.ServerRankOf(v);
    if (owner != my_rank) return NotPrimaryError(table_id, keys[i], owner, my_rank, map.epoch());
    if (shards != nullptr) (*shards)[i] = v;
  }
  return absl::OkStatus();
}

absl::Status NotPrimaryError(uint32_t table_id, Key key, uint32_t owner, uint32_t my_rank, uint64_t epoch) {
  return absl::AbortedError(absl::StrCat("key ", key, " of table ", table_id, " belongs to server ", owner,
                                         ", not to server ", my_rank, " (not the primary of its shard at map epoch ",
                                         epoch, ")"));
}

absl::Status CheckGrowth(const Table& table, std::span<const Key> keys, uint64_t max_table_bytes) {
  if (max_table_bytes == 0) return absl::OkStatus();
  const uint64_t row_bytes = Table::RowBytes(table.config());
  // Every key new is the most a request can add: only a request that might
  // cross the limit pays for looking its keys up (a pass of cache misses over
  // the index, 12% of a server's time on sparse pushes of 3,500 rows).
  if ((table.num_rows() + keys.size()) * row_bytes <= max_table_bytes) return absl::OkStatus();
  const uint64_t rows = table.num_rows() + table.CountAbsent(keys);
  if (rows * row_bytes <= max_table_bytes) return absl::OkStatus();
  return absl::ResourceExhaustedError(absl::StrCat(
      "table ", table.config().table_id(), " would grow to ", rows, " rows (", rows * row_bytes,
      " bytes), past its limit of ", max_table_bytes, " bytes (tessera-server --max-table-mb)"));
}

absl::Status CheckSameTable(const proto::TableConfig& existing, const proto::TableConfig& c) {
  if (google::protobuf::util::MessageDifferencer::Equals(existing, c)) return absl::OkStatus();
  return absl::AlreadyExistsError(absl::StrCat("table ", c.table_id(), " exists with a different config (",
                                               existing.ShortDebugString(), ") than requested (",
                                               c.ShortDebugString(), ")"));
}

absl::StatusOr<std::unique_ptr<ColdRows>> MakeDiskTier(const proto::TableConfig& c, const ColdRowsFactory& disk_tiers) {
  if (!c.disk_tier()) return nullptr;
  if (!disk_tiers) {
    return absl::FailedPreconditionError(absl::StrCat("table ", c.table_id(),
                                                      " asks for a disk tier, but this server has no directory for "
                                                      "one (tessera-server --disk_dir)"));
  }
  auto made = disk_tiers(c.table_id(), StoredRowFloats(c));
  if (!made.ok()) return made.status();
  if (auto s = Table::CheckDiskTier(c, (*made)->memory_bytes(0)); !s.ok()) return s;
  return made;
}

absl::Status CheckDenseShare(const proto::TableConfig& c, const std::function<bool(Key)>& holds,
                             uint64_t max_table_bytes) {
  if (c.kind() != proto::DENSE || max_table_bytes == 0) return absl::OkStatus();
  // A dense table makes its rows at once: its share here must fit the
  // per-table limit as a sparse table's growth must (CheckGrowth). The
  // count stops at the first row past the limit.
  const uint64_t row_bytes = Table::RowBytes(c);
  uint64_t held = 0;
  for (uint64_t k = 0; k < c.dense_rows(); ++k) {
    if (holds(k) && ++held * row_bytes > max_table_bytes) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "dense table ", c.table_id(), " (", c.dense_rows(), " rows of ", row_bytes, " bytes) would hold more than ",
          max_table_bytes, " bytes on this server (tessera-server --max-table-mb)"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<Columns> PieceOf(uint32_t first_column, uint32_t columns, const Table& table) {
  const Columns piece{first_column, columns};
  if (auto s = table.CheckColumns(piece); !s.ok()) return s;
  return piece;
}

namespace {

absl::Status CheckPushFields(const proto::Push& req, size_t frames, bool sender_live, uint64_t sender_clock) {
  if (frames != 2) {
    return absl::InvalidArgumentError(absl::StrCat("push needs 2 frames (keys, values), got ", frames));
  }
  // acked_below is the lowest push of the worker still in flight, this one
  // included: past its own number it would mark this push and later ones as
  // seen, and every later push of the worker would be dropped as a duplicate.
  if (req.seq() != 0 && req.acked_below() > req.seq()) {
    return absl::InvalidArgumentError(absl::StrCat("push number ", req.seq(), " says every push below acked_below ",
                                                   req.acked_below(),
                                                   " was acknowledged, itself included; acked_below must be at "
                                                   "most the push's own number"));
  }
  // A resend may carry an earlier clock than the worker has announced since
  // (it went to a server that was lost); it is the same push, not a late one.
  if (!req.resend() && sender_live && req.clock() < sender_clock) {
    return absl::InvalidArgumentError(absl::StrCat("push stamped clock ", req.clock(), " arrived after the worker ",
                                                   "announced clock ", sender_clock));
  }
  return absl::OkStatus();
}

// The table, keys and piece of a push or forward (table_id, num_keys and
// the piece from its header), with the bytes of each key's values.
absl::StatusOr<CheckedRows> CheckRows(const Message& m, const TableMap& tables, uint32_t table_id, uint64_t num_keys,
                                      uint32_t first_column, uint32_t columns, uint64_t max_keys) {
  CheckedRows c;
  auto table = FindTable(tables, table_id);
  if (!table.ok()) return table.status();
  c.table = *table;
  auto keys = CheckKeysFrame(m.frames[0], num_keys, max_keys);
  if (!keys.ok()) return keys.status();
  c.keys = *keys;
  auto piece = PieceOf(first_column, columns, *c.table);
  if (!piece.ok()) return piece.status();
  c.piece = *piece;
  // The bytes of each key's values: its row, or the piece of it carried.
  c.row_bytes = size_t{piece->Width(c.table->width())} * sizeof(float);
  return c;
}

}  // namespace

absl::StatusOr<CheckedRows> CheckPush(const proto::Push& req, const Message& m, const TableMap& tables,
                                      const ShardMapView& map, uint32_t my_rank, const RequestLimits& limits,
                                      bool sender_live, uint64_t sender_clock) {
  if (auto s = CheckPushFields(req, m.frames.size(), sender_live, sender_clock); !s.ok()) return s;
  auto c = CheckRows(m, tables, req.table_id(), req.num_keys(), req.first_column(), req.columns(),
                     limits.max_keys_per_request);
  if (!c.ok()) return c.status();
  if (m.frames[1].size() != c->keys.size() * c->row_bytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "values frame has ", m.frames[1].size(), " bytes, expected ", c->keys.size() * c->row_bytes, " for ",
        req.num_keys(), " keys of width ", c->table->width(),
        c->piece.whole() ? "" : absl::StrCat(" (", c->piece.count, " columns)")));
  }
  if (auto s = CheckGrowth(*c->table, c->keys, limits.max_table_bytes); !s.ok()) return s;
  // Each key's shard; which keys are this server's to take.
  c->vshard.resize(c->keys.size());
  for (size_t i = 0; i < c->keys.size(); ++i) {
    c->vshard[i] = map.VShardOfKey(req.table_id(), c->keys[i]);
    const uint32_t owner = map.ServerRankOf(c->vshard[i]);
    if (owner == my_rank) continue;
    // A resend of an older map went to the servers of that map: keys it
    // gives others may now be this server's, or neither's (a shard that
    // moved); the worker sends it again by this map.
    if (!req.resend() || m.header.epoch() < map.epoch()) {
      return NotPrimaryError(req.table_id(), c->keys[i], owner, my_rank, map.epoch());
    }
    c->all_mine = false;
  }
  return c;
}

absl::StatusOr<CheckedRows> CheckForward(const Message& m, const TableMap& tables, const ShardMapView& map,
                                         uint32_t my_rank, uint32_t from, bool check_keys, uint64_t max_keys) {
  const proto::Replicate& r = m.header.replicate();
  if (m.frames.size() != 2) return absl::InvalidArgumentError("forward needs 2 frames (keys, values)");
  auto c = CheckRows(m, tables, r.table_id(), r.num_keys(), r.first_column(), r.columns(), max_keys);
  if (!c.ok()) return c.status();
  if (m.frames[1].size() != c->keys.size() * c->row_bytes) {
    return absl::InvalidArgumentError(absl::StrCat("forward values frame has ", m.frames[1].size(),
                                                   " bytes, expected ", c->keys.size() * c->row_bytes));
  }
  c->vshard.resize(c->keys.size());
  for (size_t i = 0; i < c->keys.size(); ++i) {
    const uint32_t v = c->vshard[i] = map.VShardOfKey(r.table_id(), c->keys[i]);
    if (!check_keys) continue;
    auto bs = map.BackupsOf(v);
    if (map.ServerRankOf(v) != from || std::find(bs.begin(), bs.end(), my_rank) == bs.end()) {
      return absl::FailedPreconditionError(absl::StrCat("key ", c->keys[i], " of table ", r.table_id(), " (shard ", v,
                                                        ") is not backed up here for server ", from,
                                                        " at map epoch ", map.epoch()));
    }
  }
  return c;
}

absl::StatusOr<Buffer> DecodePushValues(const proto::Push& req, std::span<const Buffer> frames,
                                        const TableMap& tables, uint64_t max_keys, BufferPool* pool) {
  if (frames.size() != size_t{req.value_parts()} + 1) {
    return absl::InvalidArgumentError(absl::StrCat("compressed push needs 1 + ", req.value_parts(),
                                                   " frames (keys, parts), got ", frames.size()));
  }
  auto table = FindTable(tables, req.table_id());
  if (!table.ok()) return table.status();
  // Before anything is allocated: the keys frame holds num_keys keys (so the
  // values are no more than an uncompressed push of these keys would carry),
  // and the parts' headers tile exactly those values.
  if (auto keys = CheckKeysFrame(frames[0], req.num_keys(), max_keys); !keys.ok()) return keys.status();
  auto piece = PieceOf(req.first_column(), req.columns(), **table);
  if (!piece.ok()) return piece.status();
  const uint64_t n = req.num_keys() * piece->Width((*table)->width());
  if (auto s = compress::CheckRowParts(frames.subspan(1), n); !s.ok()) {
    return absl::Status(s.code(), absl::StrCat("push to table ", req.table_id(), ": ", s.message()));
  }
  Buffer decoded = pool ? pool->Get(n * sizeof(float)) : Buffer::Allocate(n * sizeof(float));
  if (auto s = compress::DecodeRowParts(frames.subspan(1), decoded.AsMutable<float>()); !s.ok()) {
    return absl::Status(s.code(), absl::StrCat("push to table ", req.table_id(), ": ", s.message()));
  }
  return decoded;
}

}  // namespace tessera

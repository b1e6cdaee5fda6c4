#include "server/state_transfer.h"

#include <google/protobuf/util/message_differencer.h>

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace tessera {

void GatherRows(const Buffer& keys, const Buffer& values, std::span<const uint32_t> idx, size_t row_bytes,
                Buffer* out_keys, Buffer* out_values) {
  *out_keys = Buffer::Allocate(idx.size() * sizeof(Key));
  *out_values = Buffer::Allocate(idx.size() * row_bytes);
  auto k = keys.As<Key>();
  auto kd = out_keys->AsMutable<Key>();
  const std::byte* src = values.data();
  std::byte* dst = out_values->mutable_data();
  for (size_t i = 0; i < idx.size(); ++i) {
    kd[i] = k[idx[i]];
    std::memcpy(dst + i * row_bytes, src + size_t{idx[i]} * row_bytes, row_bytes);
  }
}

BuiltTransfer BuildTransfer(const TableMap& tables, const ShardMapView& map, std::span<const uint32_t> vshards,
                            std::span<const uint64_t> applied, size_t max_message_bytes, uint32_t sender_id) {
  const absl::flat_hash_set<uint32_t> shards(vshards.begin(), vshards.end());
  // Each message carries at most this many bytes of keys and rows (half the
  // limit: the first one's header holds windows and clocks too).
  const size_t chunk = std::max<size_t>(max_message_bytes / 2, 1);
  auto new_message = [&](bool continued) {
    Message f;
    f.header.set_sender_id(sender_id);
    proto::ShardTransfer* t = f.header.mutable_replicate()->mutable_transfer();
    for (uint32_t v : vshards) t->add_vshards(v);
    t->set_continued(continued);
    return f;
  };
  BuiltTransfer built;
  std::vector<Message>& messages = built.messages;
  messages.push_back(new_message(false));
  for (uint64_t n : applied) messages[0].header.mutable_replicate()->mutable_transfer()->add_applied(n);
  size_t filled = 0;  // key and row bytes in messages.back()
  std::vector<uint32_t> ids;
  for (const auto& [id, table] : tables) ids.push_back(id);
  std::sort(ids.begin(), ids.end());
  for (uint32_t id : ids) {
    const Table& table = *tables.at(id);
    const size_t row_bytes = sizeof(Key) + size_t{StoredRowFloats(table.config())} * sizeof(float);
    std::vector<Key> keys;
    std::vector<float> values;
    // Closes this table's rows in the current message.
    auto flush = [&] {
      *messages.back().header.mutable_replicate()->mutable_transfer()->add_tables() = table.config();
      messages.back().frames.push_back(Buffer::CopyOf(keys.data(), keys.size() * sizeof(Key)));
      messages.back().frames.push_back(Buffer::CopyOf(values.data(), values.size() * sizeof(float)));
      built.rows += keys.size();
      keys.clear();
      values.clear();
    };
    // No shards (the configs alone, for a new table): no row to walk. The
    // walk reads every row, those on disk too: minutes for 10^8.
    if (!shards.empty()) table.ForEachRow([&](Key k, std::span<const float> row) {
      if (!shards.contains(map.VShardOfKey(id, k))) return;
      if (filled > 0 && filled + row_bytes > chunk) {  // the message is full: the rows go on in the next
        if (!keys.empty()) flush();
        messages.push_back(new_message(true));
        filled = 0;
      }
      keys.push_back(k);
      values.insert(values.end(), row.begin(), row.end());
      filled += row_bytes;
    });
    if (!keys.empty() || messages.size() == 1) flush();
  }
  // Every table's config goes in the first message (a backup learns of
  // tables without rows of these shards too, and creates each before its
  // rows come); the later ones list the tables they hold rows of.
  proto::ShardTransfer* first = messages[0].header.mutable_replicate()->mutable_transfer();
  for (uint32_t id : ids) {
    if (std::any_of(first->tables().begin(), first->tables().end(),
                    [&](const proto::TableConfig& c) { return c.table_id() == id; })) {
      continue;
    }
    *first->add_tables() = tables.at(id)->config();
    messages[0].frames.push_back(Buffer::CopyOf(nullptr, 0));
    messages[0].frames.push_back(Buffer::CopyOf(nullptr, 0));
  }
  return built;
}

absl::StatusOr<absl::flat_hash_set<uint32_t>> CheckTransfer(const Message& m, const ShardMapView& map,
                                                            uint32_t my_rank, uint32_t from, const TableMap& tables) {
  const proto::ShardTransfer& t = m.header.replicate().transfer();
  if (m.frames.size() != 2 * size_t(t.tables_size())) {
    return absl::InvalidArgumentError(absl::StrCat("transfer of ", t.tables_size(), " tables needs ",
                                                   2 * t.tables_size(), " frames, got ", m.frames.size()));
  }
  absl::flat_hash_set<uint32_t> shards;
  for (uint32_t v : t.vshards()) {
    auto bs = v < map.num_vshards() ? map.BackupsOf(v) : std::span<const uint32_t>();
    if (v >= map.num_vshards() || map.ServerRankOf(v) != from || std::find(bs.begin(), bs.end(), my_rank) == bs.end()) {
      return absl::FailedPreconditionError(absl::StrCat("transfer of shard ", v, " from server ", from,
                                                        ", which this server does not back up for it at map epoch ",
                                                        map.epoch()));
    }
    shards.insert(v);
  }
  for (int i = 0; i < t.tables_size(); ++i) {
    const proto::TableConfig& c = t.tables(i);
    if (auto s = ValidateTableConfig(c); !s.ok()) return s;
    if (auto it = tables.find(c.table_id());
        it != tables.end() && !google::protobuf::util::MessageDifferencer::Equals(it->second->config(), c)) {
      return absl::AlreadyExistsError(absl::StrCat("transfer: table ", c.table_id(), " exists here with another config"));
    }
    const Buffer& keys = m.frames[2 * i];
    const Buffer& values = m.frames[2 * i + 1];
    if (keys.size() % sizeof(Key) != 0 ||
        values.size() != keys.size() / sizeof(Key) * size_t{StoredRowFloats(c)} * sizeof(float)) {
      return absl::InvalidArgumentError(absl::StrCat("transfer: table ", c.table_id(), " has ", keys.size(),
                                                     " key bytes and ", values.size(), " value bytes"));
    }
    for (Key k : keys.As<Key>()) {
      if (!shards.contains(map.VShardOfKey(c.table_id(), k)) || (c.kind() == proto::DENSE && k >= c.dense_rows())) {
        return absl::InvalidArgumentError(absl::StrCat("transfer: key ", k, " of table ", c.table_id(),
                                                       " is not in the shards transferred"));
      }
    }
  }
  for (const proto::DedupWindow& d : t.dedup()) {
    if (!shards.contains(d.vshard())) {
      return absl::InvalidArgumentError(absl::StrCat("transfer: a window of shard ", d.vshard(), " not transferred"));
    }
  }
  return shards;
}

void RescopeTransfer(Message& m, const std::function<bool(uint32_t)>& kept, const ShardMapView& map) {
  proto::Replicate& r = *m.header.mutable_replicate();
  proto::ShardTransfer& t = *r.mutable_transfer();
  if (std::all_of(t.vshards().begin(), t.vshards().end(), kept)) return;
  if (m.frames.size() != 2 * size_t(t.tables_size())) return;  // (built by BuildTransfer: not reached)
  proto::ShardTransfer next;
  next.set_continued(t.continued());
  for (int i = 0; i < t.vshards_size(); ++i) {
    if (!kept(t.vshards(i))) continue;
    next.add_vshards(t.vshards(i));
    if (i < t.applied_size()) next.add_applied(t.applied(i));
  }
  std::vector<Buffer> frames;
  for (int i = 0; i < t.tables_size(); ++i) {
    const proto::TableConfig& c = t.tables(i);
    *next.add_tables() = c;
    const auto keys = m.frames[2 * i].As<Key>();
    std::vector<uint32_t> idx;
    for (size_t k = 0; k < keys.size(); ++k)
      if (kept(map.VShardOfKey(c.table_id(), keys[k]))) idx.push_back(static_cast<uint32_t>(k));
    Buffer k, v;
    GatherRows(m.frames[2 * i], m.frames[2 * i + 1], idx, size_t{StoredRowFloats(c)} * sizeof(float), &k, &v);
    frames.push_back(std::move(k));
    frames.push_back(std::move(v));
  }
  for (const proto::DedupWindow& d : t.dedup())
    if (kept(d.vshard())) *next.add_dedup() = d;
  *next.mutable_clocks() = t.clocks();
  for (const proto::AuditRow& a : t.audit())
    if (kept(map.VShardOfKey(a.table_id(), a.key()))) *next.add_audit() = a;
  t = std::move(next);
  m.frames = std::move(frames);
}

absl::Status SetTransferRows(const Message& m, const TableMap& tables,
                             const std::function<absl::Status(const proto::TableConfig&)>& create) {
  const proto::ShardTransfer& t = m.header.replicate().transfer();
  for (int i = 0; i < t.tables_size(); ++i) {
    if (auto s = create(t.tables(i)); !s.ok()) return s;
    Table* table = tables.at(t.tables(i).table_id()).get();
    if (auto s = table->RestoreRows(m.frames[2 * i].As<Key>(), m.frames[2 * i + 1].As<float>(), true); !s.ok()) {
      return s;
    }
  }
  return absl::OkStatus();
}

void AddClocks(const ClockTable& clocks, proto::ShardTransfer* t) {
  clocks.ForEach([&](uint32_t node, uint64_t clock, bool live) {
    proto::WorkerClock* c = t->add_clocks();
    c->set_worker_id(node);
    c->set_clock(clock);
    c->set_live(live);
  });
}

void TakeClocks(const proto::ShardTransfer& t, ClockTable& clocks) {
  for (const proto::WorkerClock& c : t.clocks()) {
    if (!clocks.IsKnown(c.worker_id())) continue;
    if (c.live()) {
      (void)clocks.Advance(c.worker_id(), c.clock());
    } else {
      clocks.Remove(c.worker_id());
    }
  }
}

std::optional<proto::ShardsInSync> ShardsInSyncOf(const Message& done, bool more, uint32_t backup_rank) {
  const proto::Replicate& r = done.header.replicate();
  if (!r.has_transfer() || more || r.transfer().vshards_size() == 0) return std::nullopt;
  proto::ShardsInSync s;
  s.set_backup_rank(backup_rank);
  *s.mutable_vshards() = r.transfer().vshards();
  return s;
}

}  // namespace tessera

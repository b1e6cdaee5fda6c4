#include "server/server_core.h"

#include <google/protobuf/util/message_differencer.h>

#include <algorithm>
#include <cassert>
#include <cstring>
#include <limits>

#include "absl/strings/str_cat.h"
#include "compress/row_compressor.h"

namespace tessera {
namespace {

constexpr uint64_t kUnbounded = std::numeric_limits<uint64_t>::max();

// Staleness of a table: BSP 0, SSP its bound, ASP unbounded.
uint64_t Staleness(const proto::TableConfig& c) {
  switch (c.consistency()) {
    case proto::SSP: return c.staleness();
    case proto::ASP: return kUnbounded;
    default: return 0;
  }
}

// The min clock a reader at `clock` needs: clock - staleness, saturating.
uint64_t Required(uint64_t clock, uint64_t staleness) {
  return staleness == kUnbounded || clock <= staleness ? 0 : clock - staleness;
}

void SetError(Message& reply, const absl::Status& status) {
  reply.frames.clear();
  auto* e = reply.header.mutable_error();
  e->set_code(static_cast<int>(status.code()));
  e->set_message(std::string(status.message()));
}

}  // namespace

absl::Status ServerCore::InstallShardMap(const proto::ShardMap& map, uint32_t my_rank) {
  auto view = ShardMapView::Create(map);
  if (!view.ok()) return view.status();
  if (my_rank >= view->num_servers()) {
    return absl::InvalidArgumentError(absl::StrCat("rank ", my_rank, " is not in a shard map of ",
                                                   view->num_servers(), " servers"));
  }
  if (!tables_.empty() && map_ && map_->epoch() != view->epoch()) {
    return absl::UnimplementedError("moving shards between servers is not supported yet");
  }
  map_ = std::move(*view);
  my_rank_ = my_rank;
  return absl::OkStatus();
}

void ServerCore::SetWorkers(const absl::flat_hash_map<uint32_t, uint32_t>& worker_rank_by_node) {
  clocks_.Reset(worker_rank_by_node);
}

const Table* ServerCore::table(uint32_t id) const {
  auto it = tables_.find(id);
  return it == tables_.end() ? nullptr : it->second.get();
}

Message ServerCore::Reply(const Message& request) const {
  Message reply;
  reply.header.set_request_id(request.header.request_id());
  reply.header.set_sender_id(options_.node_id);
  if (map_) reply.header.set_epoch(map_->epoch());
  return reply;
}

void ServerCore::Emit(std::vector<Outgoing>& out, std::string to, Message reply) const {
  const size_t piece = options_.pull_reply_piece_bytes;
  if (piece == 0 || !reply.header.has_pull_reply() || reply.header.pull_reply().value_parts() > 0 ||
      reply.frames.size() != 1 || reply.frames[0].size() <= piece) {
    out.push_back(Outgoing{std::move(to), std::move(reply)});
    return;
  }
  const Buffer values = std::move(reply.frames[0]);
  const uint64_t total = values.size();
  for (uint64_t offset = 0; offset < total; offset += piece) {
    Message m;
    if (offset == 0) {
      m.header = std::move(reply.header);
    } else {
      m.header.set_request_id(out.back().message.header.request_id());
      m.header.set_sender_id(options_.node_id);
      if (map_) m.header.set_epoch(map_->epoch());
    }
    const uint64_t n = std::min<uint64_t>(piece, total - offset);
    Buffer descriptor = Buffer::Allocate(kPullPieceDescriptorBytes);
    const uint64_t words[2] = {offset, total};  // little-endian hosts only (as every frame here)
    std::memcpy(descriptor.mutable_data(), words, sizeof(words));
    m.frames.push_back(values.Slice(offset, n));
    m.frames.push_back(std::move(descriptor));
    out.push_back(Outgoing{to, std::move(m)});
  }
}

uint64_t ServerCore::StrictestStaleness() const {
  uint64_t s = kUnbounded;
  for (const auto& [id, t] : tables_) s = std::min(s, Staleness(t->config()));
  return s;
}

absl::StatusOr<uint64_t> ServerCore::RequiredMinClock(const Message& m) {
  const proto::Envelope& h = m.header;
  if (options_.answer_early) return 0;
  if (h.has_pull()) {
    auto table = FindTable(h.pull().table_id());
    if (!table.ok()) return table.status();
    return Required(h.pull().clock(), Staleness((*table)->config()));
  }
  if (h.has_clock_advance()) return Required(h.clock_advance().clock(), StrictestStaleness());
  return 0;
}

void ServerCore::ApplyPending() {
  for (PendingPush& p : pending_) {
    const Message& m = p.request;
    // Validated in HandlePush, and nothing since can make it fail.
    absl::Status s = p.table->ApplyPush(m.frames[0].As<Key>(), m.frames[1].As<float>());
    assert(s.ok());
    (void)s;
  }
  pending_.clear();
}

std::vector<Outgoing> ServerCore::Step(Message request, Nanos now) {
  ApplyPending();
  std::vector<Outgoing> out;
  const proto::Envelope& h = request.header;
  const bool wants_reply = h.request_id() != 0 && !h.sender_address().empty();
  const std::string reply_to = h.sender_address();  // `request` may be moved below
  auto send = [&](Message reply) {
    if (wants_reply) Emit(out, reply_to, std::move(reply));
  };
  if (!map_) {
    Message reply = Reply(request);
    SetError(reply, absl::UnavailableError("server has no shard map yet"));
    stats_.bad_requests++;
    send(std::move(reply));
    return out;
  }
  bool clocks_moved = false;
  if (h.has_clock_advance()) {
    if (auto s = clocks_.Advance(h.sender_id(), h.clock_advance().clock()); !s.ok()) {
      Message reply = Reply(request);
      SetError(reply, s);
      stats_.bad_requests++;
      send(std::move(reply));
      return out;
    }
    clocks_moved = true;
  } else if (h.has_workers_left()) {
    for (uint32_t node : h.workers_left().worker_node_ids()) clocks_.Remove(node);
    clocks_moved = true;
  }
  // A malformed pull is answered (with its error) at once, never held.
  const bool well_formed_pull = h.has_pull() && request.frames.size() == 1 &&
                                FindTable(h.pull().table_id()).ok() &&
                                KeysFrame(request, h.pull().num_keys(), h.pull().table_id()).ok();
  // A clock notice (no reply wanted) only records the clock; nothing to hold.
  if (well_formed_pull || (h.has_clock_advance() && wants_reply)) {
    auto required = RequiredMinClock(request);
    if (required.ok() && clocks_.min_clock() < *required) {
      uint64_t timeout_ms = h.has_pull() ? h.pull().hold_timeout_ms() : h.clock_advance().hold_timeout_ms();
      Nanos timeout = timeout_ms ? static_cast<Nanos>(timeout_ms) * kMillis : options_.default_hold_timeout;
      stats_.held_requests++;
      held_.push_back(Held{std::move(request), *required, now, now + timeout});
      if (clocks_moved) ReleaseHeld(now, out);
      return out;
    }
  }
  const bool is_workers_left = h.has_workers_left();
  if (!is_workers_left) send(Answer(std::move(request), 0));
  if (clocks_moved) ReleaseHeld(now, out);
  return out;
}

void ServerCore::ReleaseHeld(Nanos now, std::vector<Outgoing>& out) {
  const uint64_t min = clocks_.min_clock();
  for (auto it = held_.begin(); it != held_.end();) {
    if (it->required_min_clock <= min) {
      std::string to = it->request.header.sender_address();
      Nanos held_for = now - it->arrived;
      Emit(out, std::move(to), Answer(std::move(it->request), held_for));
      it = held_.erase(it);
    } else {
      ++it;
    }
  }
}

std::vector<Outgoing> ServerCore::Tick(Nanos now) {
  ApplyPending();
  std::vector<Outgoing> out;
  for (auto it = held_.begin(); it != held_.end();) {
    if (now < it->deadline) {
      ++it;
      continue;
    }
    const proto::Envelope& h = it->request.header;
    Message reply = Reply(it->request);
    std::string what = h.has_pull() ? absl::StrCat("pull of table ", h.pull().table_id(), " at clock ", h.pull().clock())
                                    : absl::StrCat("clock ", h.clock_advance().clock());
    SetError(reply, absl::DeadlineExceededError(absl::StrCat(
                        what, " waited ", (now - it->arrived) / kMillis, " ms for slower workers: ",
                        clocks_.DescribeBehind(it->required_min_clock), " (needs every live worker at clock >= ",
                        it->required_min_clock, ")")));
    out.push_back(Outgoing{h.sender_address(), std::move(reply)});
    it = held_.erase(it);
  }
  return out;
}

Message ServerCore::Answer(Message request, Nanos held_for) {
  const proto::Envelope& h = request.header;
  absl::Status status;
  Message reply = Reply(request);
  const uint64_t min = clocks_.min_clock();
  switch (h.body_case()) {
    case proto::Envelope::kCreateTable:
      status = HandleCreateTable(h.create_table());
      if (status.ok()) reply.header.mutable_ack();
      break;
    case proto::Envelope::kPush: {
      stats_.push_requests++;
      stats_.bytes_in += request.FrameBytes();
      if (h.push().value_parts() > 0) {  // compressed: decoded here, applied like any push
        status = DecodePushValues(h.push(), request);
        if (!status.ok()) break;
      }
      // Borrowed frames (owner() null: an in-process sender's own memory) may
      // be reused by the sender as soon as it sees the ack: apply those now.
      const bool defer = options_.apply_after_ack &&
                         std::all_of(request.frames.begin(), request.frames.end(),
                                     [](const Buffer& f) { return f.empty() || f.owner() != nullptr; });
      status = HandlePush(h.push(), request, defer);
      if (status.ok()) {
        reply.header.mutable_ack();
        if (defer) {
          Table* table = *FindTable(h.push().table_id());
          pending_.push_back(PendingPush{table, std::move(request)});
        }
      }
      break;
    }
    case proto::Envelope::kPull: {
      stats_.pull_requests++;
      auto values = HandlePull(h.pull(), request);
      status = values.status();
      if (status.ok()) {
        auto* pr = reply.header.mutable_pull_reply();
        pr->set_num_keys(h.pull().num_keys());
        pr->set_width(values->size() / sizeof(float) / std::max<uint64_t>(1, h.pull().num_keys()));
        pr->set_min_clock(min);
        pr->set_held_us(held_for / 1000);
        pr->set_staleness(min == ClockTable::kNoWorkers || min >= h.pull().clock() ? 0 : h.pull().clock() - min);
        if (auto codec = pull_codecs_.find(h.pull().table_id()); codec != pull_codecs_.end()) {
          auto encoded = compress::EncodeValues(codec->second, values->As<float>(), ++pull_encodes_);
          if (!encoded.ok()) {
            status = encoded.status();
            break;
          }
          if (!encoded->raw) {
            pr->set_value_parts(static_cast<uint32_t>(encoded->parts.size()));
            stats_.bytes_out += encoded->wire_bytes;
            for (Buffer& b : encoded->parts) reply.frames.push_back(std::move(b));
            break;
          }
        }
        stats_.bytes_out += values->size();
        reply.frames.push_back(std::move(*values));
      }
      break;
    }
    case proto::Envelope::kClockAdvance:
    case proto::Envelope::kClockQuery: {
      if (!clocks_.IsKnown(h.sender_id())) {
        status = absl::NotFoundError(absl::StrCat("node ", h.sender_id(), " is not a worker of this job"));
        break;
      }
      auto* ack = reply.header.mutable_clock_ack();
      ack->set_min_clock(min);
      ack->set_held_us(held_for / 1000);
      const uint64_t mine = clocks_.ClockOf(h.sender_id());
      ack->set_worker_clock(mine == ClockTable::kNoWorkers ? 0 : mine);  // 0 once it left
      break;
    }
    case proto::Envelope::kStatsRequest: {
      auto* s = reply.header.mutable_stats_reply();
      s->set_push_requests(stats_.push_requests);
      s->set_pull_requests(stats_.pull_requests);
      s->set_bytes_in(stats_.bytes_in);
      s->set_bytes_out(stats_.bytes_out);
      uint64_t rows = 0;
      for (const auto& [id, t] : tables_) rows += t->num_rows();
      s->set_rows(rows);
      break;
    }
    default:
      status = absl::InvalidArgumentError(absl::StrCat("server does not handle message type ", h.body_case()));
  }
  if (!status.ok()) {
    stats_.bad_requests++;
    SetError(reply, status);
  }
  return reply;
}

absl::Status ServerCore::HandleCreateTable(const proto::CreateTable& req) {
  const proto::TableConfig& c = req.config();
  if (auto s = ValidateTableConfig(c); !s.ok()) return s;
  if (auto it = tables_.find(c.table_id()); it != tables_.end()) {
    if (google::protobuf::util::MessageDifferencer::Equals(it->second->config(), c)) return absl::OkStatus();
    return absl::AlreadyExistsError(absl::StrCat("table ", c.table_id(), " exists with a different config (",
                                                 it->second->config().ShortDebugString(), ") than requested (",
                                                 c.ShortDebugString(), ")"));
  }
  const ShardMapView& map = *map_;
  const uint32_t rank = my_rank_;
  const uint32_t id = c.table_id();
  if (!c.pull_compression().empty()) {  // validated above
    pull_codecs_.try_emplace(id, *compress::Codec::Create(*compress::ParsePullSpec(c.pull_compression())));
  }
  tables_.emplace(id, std::make_unique<Table>(c, [&](Key k) { return map.ServerRankOfKey(id, k) == rank; }));
  return absl::OkStatus();
}

absl::Status ServerCore::DecodePushValues(const proto::Push& req, Message& m) {
  if (m.frames.size() != size_t{req.value_parts()} + 1) {
    return absl::InvalidArgumentError(absl::StrCat("compressed push needs 1 + ", req.value_parts(),
                                                   " frames (keys, parts), got ", m.frames.size()));
  }
  auto table = FindTable(req.table_id());
  if (!table.ok()) return table.status();
  // Before anything is allocated: the keys frame holds num_keys keys (so the
  // values are no more than an uncompressed push of these keys would carry),
  // and the parts' headers tile exactly those values.
  if (auto keys = KeysFrame(m, req.num_keys(), req.table_id()); !keys.ok()) return keys.status();
  const uint64_t n = req.num_keys() * (*table)->width();
  if (auto s = compress::CheckRowParts(std::span<const Buffer>(m.frames).subspan(1), n); !s.ok()) {
    return absl::Status(s.code(), absl::StrCat("push to table ", req.table_id(), ": ", s.message()));
  }
  Buffer decoded = options_.pool ? options_.pool->Get(n * sizeof(float)) : Buffer::Allocate(n * sizeof(float));
  if (auto s = compress::DecodeRowParts(std::span<const Buffer>(m.frames).subspan(1), decoded.AsMutable<float>());
      !s.ok()) {
    return absl::Status(s.code(), absl::StrCat("push to table ", req.table_id(), ": ", s.message()));
  }
  m.frames.resize(1);
  m.frames.push_back(std::move(decoded));
  stats_.compressed_pushes++;
  return absl::OkStatus();
}

uint64_t ServerCore::rows() const {
  uint64_t rows = 0;
  for (const auto& [id, t] : tables_) rows += t->num_rows();
  return rows;
}

absl::StatusOr<Table*> ServerCore::FindTable(uint32_t id) {
  auto it = tables_.find(id);
  if (it == tables_.end()) return absl::NotFoundError(absl::StrCat("no table ", id, " on this server"));
  return it->second.get();
}

absl::StatusOr<std::span<const Key>> ServerCore::KeysFrame(const Message& m, uint64_t num_keys, uint32_t table_id) {
  const Buffer& f = m.frames[0];
  if (num_keys > f.size() || f.size() != num_keys * sizeof(Key)) {
    return absl::InvalidArgumentError(absl::StrCat("keys frame has ", f.size(), " bytes, expected ",
                                                   num_keys * sizeof(Key), " for ", num_keys, " keys"));
  }
  auto keys = f.As<Key>();
  for (Key k : keys) {
    uint32_t owner = map_->ServerRankOfKey(table_id, k);
    if (owner != my_rank_) {
      return absl::FailedPreconditionError(absl::StrCat("key ", k, " of table ", table_id, " belongs to server ",
                                                        owner, ", not to server ", my_rank_, " (map epoch ",
                                                        map_->epoch(), ")"));
    }
  }
  return keys;
}

absl::Status ServerCore::HandlePush(const proto::Push& req, const Message& m, bool check_only) {
  if (m.frames.size() != 2) {
    return absl::InvalidArgumentError(absl::StrCat("push needs 2 frames (keys, values), got ", m.frames.size()));
  }
  const uint32_t sender = m.header.sender_id();
  if (clocks_.IsLive(sender) && req.clock() < clocks_.ClockOf(sender)) {
    return absl::InvalidArgumentError(absl::StrCat("push stamped clock ", req.clock(), " arrived after the worker ",
                                                   "announced clock ", clocks_.ClockOf(sender)));
  }
  auto table = FindTable(req.table_id());
  if (!table.ok()) return table.status();
  auto keys = KeysFrame(m, req.num_keys(), req.table_id());
  if (!keys.ok()) return keys.status();
  const Buffer& values = m.frames[1];
  const uint64_t expected = req.num_keys() * (*table)->width() * sizeof(float);
  if (values.size() != expected) {
    return absl::InvalidArgumentError(absl::StrCat("values frame has ", values.size(), " bytes, expected ", expected,
                                                   " for ", req.num_keys(), " keys of width ", (*table)->width()));
  }
  if (check_only) return (*table)->CheckPush(*keys, values.As<float>());  // Answer queues it
  return (*table)->ApplyPush(*keys, values.As<float>());
}

absl::StatusOr<Buffer> ServerCore::HandlePull(const proto::Pull& req, const Message& m) {
  if (m.frames.size() != 1) {
    return absl::InvalidArgumentError(absl::StrCat("pull needs 1 frame (keys), got ", m.frames.size()));
  }
  stats_.bytes_in += m.FrameBytes();
  auto table = FindTable(req.table_id());
  if (!table.ok()) return table.status();
  auto keys = KeysFrame(m, req.num_keys(), req.table_id());
  if (!keys.ok()) return keys.status();
  // Large rows go out as views of table memory (copy-on-write protects them
  // from later pushes while the reply is in flight); the rest is copied.
  return (*table)->ReadRowsShared(*keys, options_.pool);
}

}  // namespace tessera

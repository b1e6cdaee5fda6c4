#include "server/server_core.h"

#include <google/protobuf/util/message_differencer.h>

#include <algorithm>
#include <cstring>
#include <limits>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/check.h"
#include "compress/row_compressor.h"

namespace tessera {
namespace {

void SetError(Message& reply, const absl::Status& status) {
  reply.frames.clear();
  auto* e = reply.header.mutable_error();
  e->set_code(static_cast<int>(status.code()));
  e->set_message(std::string(status.message()));
}

// The piece of each row a push (or its forward) carries, checked against
// the table: whole rows (columns 0), or columns inside its rows.
absl::StatusOr<Columns> PieceOf(uint32_t first_column, uint32_t columns, const Table& table) {
  const Columns piece{first_column, columns};
  if (auto s = table.CheckColumns(piece); !s.ok()) return s;
  return piece;
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

void ServerCore::SendAnswer(std::vector<Outgoing>& out, std::string to, Message reply, bool pull) {
  if (!pull || reply.header.has_error() || options_.testing.read_during_move) {
    Emit(out, std::move(to), std::move(reply));
    return;
  }
  // shard_scratch_: the shards of this pull's keys (HandlePull).
  ShardMoves::HeldReply held = moves_.WaitsFor(shard_scratch_, streams_);
  if (held.waits.empty()) {
    Emit(out, std::move(to), std::move(reply));
    return;
  }
  held.header = reply.header;
  held.to = to;
  Emit(held.pieces, std::move(to), std::move(reply));
  stats_.replies_held_for_moves++;
  moves_.Hold(std::move(held));
}

void ServerCore::ForgetShards(const absl::flat_hash_set<uint32_t>& shards) {
  for (auto& [id, table] : tables_) {
    const uint32_t table_id = id;
    table->EraseRows([&](Key k) { return shards.contains(map_->VShardOfKey(table_id, k)); });
  }
  dedup_.Forget(shards);
  audit_.Forget([&](uint32_t table_id, Key k) { return shards.contains(map_->VShardOfKey(table_id, k)); });
}

void ServerCore::AbortHeldReplies(const std::function<bool(uint32_t)>& moved, std::vector<Outgoing>& out) {
  for (auto& [held, shard] : moves_.TakeReadersOf(moved)) {
    Message reply;
    reply.header = std::move(held.header);
    reply.header.clear_pull_reply();
    reply.header.set_epoch(map_->epoch());
    SetError(reply, absl::AbortedError(absl::StrCat("shard ", shard, " moved from server ", my_rank_,
                                                    " at map epoch ", map_->epoch(),
                                                    " before its new primary had what this pull read")));
    out.push_back(Outgoing{std::move(held.to), std::move(reply)});
  }
}

void ServerCore::Emit(std::vector<Outgoing>& out, std::string to, Message reply) const {
  ReplyPieceRules rules{.piece_bytes = options_.pull_reply_piece_bytes,
                        .max_whole_bytes = options_.max_whole_reply_bytes,
                        .reads_in_place = &options_.reads_in_place,
                        .sender_id = options_.node_id};
  if (map_) rules.epoch = map_->epoch();
  AppendReply(out, std::move(to), std::move(reply), rules);
}

uint64_t ServerCore::StrictestStaleness() const {
  uint64_t s = kUnboundedStaleness;
  for (const auto& [id, t] : tables_) s = std::min(s, Staleness(t->config()));
  return s;
}

absl::StatusOr<uint64_t> ServerCore::RequiredMinClock(const Message& m) {
  const proto::Envelope& h = m.header;
  if (options_.testing.answer_early) return 0;
  if (h.has_pull()) {
    auto table = FindTable(h.pull().table_id());
    if (!table.ok()) return table.status();
    return tessera::RequiredMinClock(h.pull().clock(), Staleness((*table)->config()));
  }
  if (h.has_clock_advance()) return tessera::RequiredMinClock(h.clock_advance().clock(), StrictestStaleness());
  return 0;
}

void ServerCore::ApplyPending() {
  for (PendingPush& p : pending_) {
    // Validated in AcceptPush, and nothing since can make it fail.
    absl::Status s = p.table->ApplyPush(p.keys.As<Key>(), p.values.As<float>(), p.clock, p.columns);
    TESSERA_CHECK_MSG(s.ok(), s.message());
  }
  pending_.clear();
}

bool ServerCore::RefusedAsBusy(const Message& request, std::vector<Outgoing>& out) {
  const proto::Envelope& h = request.header;
  const std::string& reply_to = h.sender_address();
  if (options_.backlog_of &&
      (h.has_push() || h.has_pull() || h.has_clock_advance() || h.has_create_table() || h.has_stats_request() ||
       h.has_clock_query())) {
    const PeerBacklog backlog = options_.backlog_of(reply_to);
    if (backlog.bytes >= options_.max_bytes_in_flight_per_peer ||
        backlog.messages >= options_.max_requests_in_flight_per_peer) {
      stats_.busy_refused++;
      last_busy_peer_ = reply_to;
      if (backlog.messages >= options_.max_requests_in_flight_per_peer + kBusyAnswerSlack) {
        stats_.busy_dropped++;
        return true;
      }
      Message reply = Reply(request);
      SetError(reply, absl::UnavailableError(absl::StrCat(
                          "busy: ", backlog.messages, " answers (", backlog.bytes, " bytes) to ", reply_to,
                          " are not sent yet; this server keeps at most ", options_.max_requests_in_flight_per_peer,
                          " answers and ", options_.max_bytes_in_flight_per_peer,
                          " bytes in flight per peer (tessera-server --max-requests-in-flight-per-peer, "
                          "--max-mb-in-flight-per-peer); send it again once they are read")));
      Emit(out, reply_to, std::move(reply));
      return true;
    }
  }
  return false;
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
  // Frames lent by a same-host peer (Buffer::remote()) are read only with
  // CopyOut, which the worker does for pull replies; no request may carry
  // them (a peer's bug would otherwise make this core read null data).
  for (const Buffer& f : request.frames) {
    if (!f.remote()) continue;
    Message reply = Reply(request);
    SetError(reply, absl::InvalidArgumentError("a request with lent (remote) frames; only pull replies may be lent"));
    stats_.bad_requests++;
    send(std::move(reply));
    return out;
  }
  if (!map_) {
    Message reply = Reply(request);
    SetError(reply, absl::UnavailableError("server has no shard map yet"));
    stats_.bad_requests++;
    send(std::move(reply));
    return out;
  }
  if (wants_reply && RefusedAsBusy(request, out)) return out;
  const bool data_request = h.has_push() || h.has_pull() || h.has_replicate() || h.has_create_table();
  if (deposed() && data_request) {
    Message reply = Reply(request);
    SetError(reply, absl::AbortedError(absl::StrCat("server ", my_rank_, " was removed from the job at map epoch ",
                                                    map_->epoch(), "; it holds nothing")));
    if (h.has_replicate()) reply.header.mutable_replicate_ack()->set_rejected(true);
    send(std::move(reply));
    return out;
  }
  if ((h.has_push() || h.has_pull()) && h.epoch() > map_->epoch()) {
    // Sent by a newer map than this server has: its shards may have moved to
    // or from this server, and answering by the old map could acknowledge
    // keys a resend skips as not its own. Aborted at this server's epoch: the
    // worker sends it again shortly; by then this server has the map (its
    // heartbeats catch it up).
    Message reply = Reply(request);
    SetError(reply, absl::AbortedError(absl::StrCat("server ", my_rank_, " has shard map epoch ", map_->epoch(),
                                                    ", older than the request's ", h.epoch(), "; send it again")));
    stats_.behind_epoch++;
    send(std::move(reply));
    return out;
  }
  if (absl::Status s = CheckClockFields(h, options_.max_hold); !s.ok()) {
    Message reply = Reply(request);
    SetError(reply, s);
    stats_.bad_requests++;
    send(std::move(reply));
    return out;
  }
  if ((h.has_push() || h.has_pull()) && clocks_.IsKnown(h.sender_id()) && !clocks_.IsLive(h.sender_id())) {
    // The coordinator announced it left (done, or lost and the job went on
    // without it): its clock no longer counts, so neither may its data.
    Message reply = Reply(request);
    SetError(reply, absl::FailedPreconditionError(absl::StrCat(
                        "worker ", clocks_.RankOf(h.sender_id()), " has left the job; server ", my_rank_,
                        " takes no more pushes or pulls from it")));
    stats_.bad_requests++;
    send(std::move(reply));
    return out;
  }
  switch (h.body_case()) {
    case proto::Envelope::kPush:
      HandlePush(std::move(request), now, out);
      return out;
    case proto::Envelope::kReplicate:
      HandleReplicate(request, out);
      return out;
    case proto::Envelope::kReplicateAck:
      HandleReplicateAck(request, now, out);
      moves_.Release(streams_, out);
      return out;
    default:
      break;
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
  if (const HoldOutcome held = HoldIfBehind(request, now, out); held != HoldOutcome::kNotHeld) {
    if (held == HoldOutcome::kHeld && clocks_moved) ReleaseHeld(now, out);
    return out;
  }
  const bool is_workers_left = h.has_workers_left();
  const size_t tables_before = tables_.size();
  if (!is_workers_left && wants_reply) {
    const bool pull = h.has_pull();
    SendAnswer(out, reply_to, Answer(std::move(request), 0), pull);
  }
  if (tables_.size() > tables_before) SendTablesToBackups(now, out);  // this request created a table
  if (clocks_moved) ReleaseHeld(now, out);
  return out;
}

ServerCore::HoldOutcome ServerCore::HoldIfBehind(Message& request, Nanos now, std::vector<Outgoing>& out) {
  const proto::Envelope& h = request.header;
  const bool wants_reply = h.request_id() != 0 && !h.sender_address().empty();
  // A malformed pull is answered (with its error) at once, never held.
  const bool well_formed_pull = h.has_pull() && request.frames.size() == 1 &&
                                FindTable(h.pull().table_id()).ok() &&
                                KeysFrame(request, h.pull().num_keys(), h.pull().table_id(), true).ok();
  // A clock notice (no reply wanted) only records the clock; nothing to hold.
  if (!well_formed_pull && !(h.has_clock_advance() && wants_reply)) return HoldOutcome::kNotHeld;
  auto required = RequiredMinClock(request);
  if (!required.ok() || clocks_.min_clock() >= *required) return HoldOutcome::kNotHeld;
  const std::string& from = h.sender_address();
  // Sent again while an earlier send is held here: keep holding that one, to
  // be answered under the newest id (the sender has given up on the older
  // ones), its held time counted from now (the sender times its round trips
  // from this send).
  if (held_.Renew(from, h.first_request_id(), h.request_id(), now)) {
    stats_.held_resends++;
    return HoldOutcome::kHeld;
  }
  const size_t held_here = held_.HeldFrom(from);
  if (held_here >= options_.max_held_per_peer) {
    Message reply = Reply(request);
    SetError(reply, absl::ResourceExhaustedError(absl::StrCat(
                        held_here, " requests of ", from, " are held already, waiting for slower workers; ",
                        "this server holds at most ", options_.max_held_per_peer,
                        " per sender (tessera-server --max-held-per-peer)")));
    stats_.bad_requests++;
    if (wants_reply) out.push_back(Outgoing{from, std::move(reply)});
    return HoldOutcome::kRefused;
  }
  const uint64_t timeout_ms = h.has_pull() ? h.pull().hold_timeout_ms() : h.clock_advance().hold_timeout_ms();
  const Nanos timeout = timeout_ms ? static_cast<Nanos>(timeout_ms) * kMillis : options_.default_hold_timeout;
  stats_.held_requests++;
  held_.Hold(std::move(request), *required, now, now + timeout);
  return HoldOutcome::kHeld;
}

void ServerCore::ReleaseHeld(Nanos now, std::vector<Outgoing>& out) {
  for (HeldRequest& x : held_.TakeReady(clocks_.min_clock())) {
    std::string to = x.request.header.sender_address();
    const bool pull = x.request.header.has_pull();
    SendAnswer(out, std::move(to), Answer(std::move(x.request), now - x.arrived), pull);
  }
}

std::vector<Outgoing> ServerCore::OnLinkRestored(std::string_view address, Nanos now) {
  std::vector<Outgoing> out;
  if (!map_) return out;
  for (uint32_t rank : streams_.Ranks()) {
    const BackupStream& stream = *streams_.Find(rank);
    if (stream.unacked.empty() || rank >= map_->num_servers() || map_->server(rank).address() != address) continue;
    stats_.forwards_link_resent += stream.unacked.size();
    SendForwards(rank, now, out, /*due_only=*/false);
  }
  return out;
}

std::vector<Outgoing> ServerCore::Tick(Nanos now) {
  ApplyPending();
  std::vector<Outgoing> out;
  for (uint32_t rank : streams_.Ranks())  // in rank order, so that simulations replay exactly
    if (!streams_.Find(rank)->unacked.empty()) SendForwards(rank, now, out, /*due_only=*/true);
  for (HeldRequest& x : held_.TakeExpired(now)) {
    const proto::Envelope& h = x.request.header;
    Message reply = Reply(x.request);
    std::string what = h.has_pull() ? absl::StrCat("pull of table ", h.pull().table_id(), " at clock ", h.pull().clock())
                                    : absl::StrCat("clock ", h.clock_advance().clock());
    SetError(reply, absl::DeadlineExceededError(absl::StrCat(
                        what, " waited ", (now - x.arrived) / kMillis, " ms for slower workers: ",
                        clocks_.DescribeBehind(x.required_min_clock), " (needs every live worker at clock >= ",
                        x.required_min_clock, ")")));
    out.push_back(Outgoing{h.sender_address(), std::move(reply)});
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
    case proto::Envelope::kPull: {
      stats_.pull_requests++;
      auto values = HandlePull(h.pull(), request);
      status = values.status();
      if (status.ok()) {
        reply.unsplit = h.pull().whole();
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
      if (h.has_clock_query() && h.clock_query().join() && !clocks_.IsKnown(h.sender_id()) && h.sender_id() != 0) {
        clocks_.Join(h.sender_id(), h.clock_query().rank(), options_.testing.join_at_zero);  // joined the running job
      }
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
    if (status.code() != absl::StatusCode::kAborted) stats_.bad_requests++;  // Aborted: ask a newer map
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
  std::unique_ptr<ColdRows> disk;
  if (c.disk_tier()) {
    if (!options_.disk_tiers) {
      return absl::FailedPreconditionError(absl::StrCat(
          "table ", id, " asks for a disk tier, but this server has no directory for one (tessera-server --disk_dir)"));
    }
    auto made = options_.disk_tiers(id, StoredRowFloats(c));
    if (!made.ok()) return made.status();
    if (auto s = Table::CheckDiskTier(c, (*made)->memory_bytes(0)); !s.ok()) return s;
    disk = std::move(*made);
  }
  if (!c.pull_compression().empty()) {  // validated above
    pull_codecs_.try_emplace(id, *compress::Codec::Create(*compress::ParsePullSpec(c.pull_compression())));
  }
  auto holds = [&](Key k) { return map.Holds(rank, map.VShardOfKey(id, k)); };
  if (c.kind() == proto::DENSE && options_.max_table_bytes > 0) {
    // A dense table makes its rows at once: its share here must fit the
    // per-table limit as a sparse table's growth must (CheckGrowth). The
    // count stops at the first row past the limit.
    const uint64_t row_bytes = Table::RowBytes(c);
    uint64_t held = 0;
    for (uint64_t k = 0; k < c.dense_rows(); ++k) {
      if (holds(k) && ++held * row_bytes > options_.max_table_bytes) {
        return absl::ResourceExhaustedError(absl::StrCat(
            "dense table ", id, " (", c.dense_rows(), " rows of ", row_bytes, " bytes) would hold more than ",
            options_.max_table_bytes, " bytes on this server (tessera-server --max-table-mb)"));
      }
    }
  }
  tables_.emplace(id, std::make_unique<Table>(c, holds, std::move(disk)));
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
  if (auto keys = KeysFrame(m, req.num_keys(), req.table_id(), false); !keys.ok()) return keys.status();
  auto piece = PieceOf(req.first_column(), req.columns(), **table);
  if (!piece.ok()) return piece.status();
  const uint64_t n = req.num_keys() * piece->Width((*table)->width());
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

std::vector<ServerCore::TableSummary> ServerCore::table_summaries() const {
  std::vector<TableSummary> out;
  for (const auto& [id, t] : tables_) {
    out.push_back(TableSummary{.id = id,
                               .name = t->config().name(),
                               .rows = t->num_rows(),
                               .bytes = t->rows_in_memory() * Table::RowBytes(t->config()),
                               .rows_on_disk = t->rows_on_disk(),
                               .disk_tier = t->has_disk_tier(),
                               .disk = t->disk_stats(),
                               .counters = t->counters()});
  }
  std::sort(out.begin(), out.end(), [](const TableSummary& a, const TableSummary& b) { return a.id < b.id; });
  return out;
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

absl::StatusOr<std::span<const Key>> ServerCore::KeysFrame(const Message& m, uint64_t num_keys, uint32_t table_id,
                                                            bool primary_only, std::vector<uint32_t>* shards) {
  if (num_keys > options_.max_keys_per_request) {
    return absl::ResourceExhaustedError(absl::StrCat("a request of ", num_keys, " keys; this server takes at most ",
                                                     options_.max_keys_per_request,
                                                     " in one (tessera-server --max-keys-per-request)"));
  }
  const Buffer& f = m.frames[0];
  if (num_keys > f.size() || f.size() != num_keys * sizeof(Key)) {
    return absl::InvalidArgumentError(absl::StrCat("keys frame has ", f.size(), " bytes, expected ",
                                                   num_keys * sizeof(Key), " for ", num_keys, " keys"));
  }
  auto keys = f.As<Key>();
  if (!primary_only) return keys;
  if (shards != nullptr) shards->resize(keys.size());
  for (size_t i = 0; i < keys.size(); ++i) {
    const uint32_t v = map_->VShardOfKey(table_id, keys[i]);
    const uint32_t owner = map_->ServerRankOf(v);
    if (owner != my_rank_) return NotPrimary(table_id, keys[i], owner);
    if (shards != nullptr) (*shards)[i] = v;
  }
  return keys;
}

absl::Status ServerCore::CheckGrowth(const Table& table, std::span<const Key> keys) const {
  if (options_.max_table_bytes == 0) return absl::OkStatus();
  const uint64_t row_bytes = Table::RowBytes(table.config());
  // Every key new is the most a request can add: only a request that might
  // cross the limit pays for looking its keys up (a pass of cache misses over
  // the index, 12% of a server's time on sparse pushes of 3,500 rows).
  if ((table.num_rows() + keys.size()) * row_bytes <= options_.max_table_bytes) return absl::OkStatus();
  const uint64_t rows = table.num_rows() + table.CountAbsent(keys);
  if (rows * row_bytes <= options_.max_table_bytes) return absl::OkStatus();
  return absl::ResourceExhaustedError(absl::StrCat(
      "table ", table.config().table_id(), " would grow to ", rows, " rows (", rows * row_bytes,
      " bytes), past its limit of ", options_.max_table_bytes, " bytes (tessera-server --max-table-mb)"));
}

absl::Status ServerCore::NotPrimary(uint32_t table_id, Key key, uint32_t owner) const {
  return absl::AbortedError(absl::StrCat("key ", key, " of table ", table_id, " belongs to server ", owner,
                                         ", not to server ", my_rank_, " (not the primary of its shard at map epoch ",
                                         map_->epoch(), ")"));
}

void ServerCore::ForwardsDone(const Forward& f, const absl::Status& status, std::vector<Outgoing>& out) {
  if (f.push_id != 0) ForwardDone(f.push_id, status, out);
  for (uint64_t id : f.carried) ForwardDone(id, status, out);
}

void ServerCore::ExportShardState(const absl::flat_hash_set<uint32_t>& shards, proto::ShardTransfer* t) const {
  dedup_.Export(shards, t);
  if (!options_.audit) return;
  audit_.Export([&](uint32_t table_id, Key k) { return shards.contains(map_->VShardOfKey(table_id, k)); }, t);
}

void ServerCore::ImportShardState(const proto::ShardTransfer& t, const std::function<bool(uint32_t)>& keep) {
  dedup_.Import(t, keep);
  if (options_.audit) audit_.Import(t, [&](uint32_t table_id, Key k) { return keep(map_->VShardOfKey(table_id, k)); });
}

void ServerCore::SendTablesToBackups(Nanos now, std::vector<Outgoing>& out) {
  std::set<uint32_t> ranks;
  for (uint32_t v = 0; v < map_->num_vshards(); ++v) {
    if (map_->ServerRankOf(v) != my_rank_) continue;
    for (uint32_t b : map_->BackupsOf(v))
      if (b != my_rank_) ranks.insert(b);
  }
  for (uint32_t rank : ranks) SendTransfer(rank, {}, {}, now, out);
}

void ServerCore::SendTransfer(uint32_t rank, const std::vector<uint32_t>& vshards, std::vector<uint64_t> carried,
                              Nanos now, std::vector<Outgoing>& out) {
  std::vector<uint64_t> counts;
  for (uint32_t v : vshards) counts.push_back(applied(v));
  BuiltTransfer built = BuildTransfer(tables_, *map_, vshards, counts, options_.max_message_bytes, options_.node_id);
  std::vector<Message>& messages = built.messages;
  proto::ShardTransfer* first = messages[0].header.mutable_replicate()->mutable_transfer();
  ExportShardState(absl::flat_hash_set<uint32_t>(vshards.begin(), vshards.end()), first);
  clocks_.ForEach([&](uint32_t node, uint64_t clock, bool live) {
    proto::WorkerClock* c = first->add_clocks();
    c->set_worker_id(node);
    c->set_clock(clock);
    c->set_live(live);
  });
  BackupStream& stream = streams_.To(rank, map_->server(rank).node_id());
  for (size_t i = 0; i < messages.size(); ++i) {
    const bool last = i + 1 == messages.size();
    // The pushes carried wait for the last message: a backup applies its
    // stream in order, so its ack covers the ones before.
    const Forward& f = streams_.Append(stream, std::move(messages[i]), 0, now,
                                       last ? std::move(carried) : std::vector<uint64_t>{}, /*more=*/!last);
    Message wire = f.message;
    wire.header.set_epoch(map_->epoch());
    out.push_back(Outgoing{map_->server(rank).address(), std::move(wire)});
  }
  if (vshards.empty()) {
    stats_.table_configs_sent++;  // SendTablesToBackups
  } else {
    stats_.forwards_sent += messages.size();
    stats_.transfers_sent++;
  }
  stats_.rows_transferred += built.rows;
}

absl::Status ServerCore::ApplyTransfer(const Message& m, uint32_t from) {
  const proto::ShardTransfer& t = m.header.replicate().transfer();
  // Everything is checked before anything changes.
  auto checked = CheckTransfer(m, *map_, my_rank_, from, tables_);
  if (!checked.ok()) return checked.status();
  const absl::flat_hash_set<uint32_t>& shards = *checked;
  // The transfer replaces this server's copy of those shards: rows, windows
  // and audit records it has and the primary lacks (forwards of a deposed
  // primary that reached only this copy, never acknowledged) go. A
  // continued one adds more rows of the shards the one before it began.
  if (!t.continued()) ForgetShards(shards);
  for (int i = 0; i < t.tables_size(); ++i) {
    proto::CreateTable create;
    *create.mutable_config() = t.tables(i);
    if (auto s = HandleCreateTable(create); !s.ok()) return s;
    Table* table = tables_.at(t.tables(i).table_id()).get();
    if (auto s = table->RestoreRows(m.frames[2 * i].As<Key>(), m.frames[2 * i + 1].As<float>(), true); !s.ok()) {
      return s;  // (checked above: not reached)
    }
  }
  if (t.continued()) return absl::OkStatus();  // (its first part brought the windows, counts and clocks)
  ImportShardState(t, [](uint32_t) { return true; });
  for (int i = 0; i < t.vshards_size() && i < t.applied_size(); ++i) applied_[t.vshards(i)] = t.applied(i);
  for (const proto::WorkerClock& c : t.clocks()) {
    if (!clocks_.IsKnown(c.worker_id())) continue;
    if (c.live()) {
      (void)clocks_.Advance(c.worker_id(), c.clock());
    } else {
      clocks_.Remove(c.worker_id());
    }
  }
  return absl::OkStatus();
}

std::vector<Outgoing> ServerCore::TransferShards(std::span<const uint32_t> vshards, Nanos now) {
  std::vector<Outgoing> out;
  if (!map_ || deposed()) return out;
  absl::flat_hash_map<uint32_t, std::vector<uint32_t>> by_backup;
  for (uint32_t v : vshards) {
    if (v >= map_->num_vshards() || map_->ServerRankOf(v) != my_rank_) continue;
    for (uint32_t b : map_->BackupsOf(v)) by_backup[b].push_back(v);
  }
  std::vector<uint32_t> ranks;
  for (const auto& [b, vs] : by_backup) ranks.push_back(b);
  std::sort(ranks.begin(), ranks.end());
  for (uint32_t b : ranks) SendTransfer(b, by_backup.at(b), {}, now, out);
  return out;
}

std::vector<std::pair<uint32_t, uint64_t>> ServerCore::AppliedByPrimaryShard() const {
  std::vector<std::pair<uint32_t, uint64_t>> out;
  if (!map_ || deposed()) return out;
  for (uint32_t v = 0; v < map_->num_vshards(); ++v)
    if (map_->ServerRankOf(v) == my_rank_) out.emplace_back(v, applied(v));
  return out;
}

void ServerCore::FillHeartbeat(proto::Heartbeat* hb) const {
  for (const auto& [v, n] : AppliedByPrimaryShard()) {
    hb->add_vshards(v);
    hb->add_applied(n);
  }
  uint32_t left = 0;
  clocks_.ForEach([&](uint32_t, uint64_t, bool live) { left += !live; });
  hb->set_workers_left(left);
  if (map_ && !deposed()) {
    traffic_.AddLoads(*map_, my_rank_, hb);
    for (uint32_t v : moves_.InSync(*map_, my_rank_, streams_)) hb->add_moves_in_sync(v);
  }
  uint64_t rows = 0, memory = 0;
  for (const auto& [id, table] : tables_) {
    rows += table->num_rows();
    memory += table->num_rows() * Table::RowBytes(table->config());
  }
  hb->set_rows(rows);
  hb->set_memory_bytes(memory);
}

void ServerCore::NoteTraffic(std::span<const uint32_t> shards, size_t value_bytes, bool push) {
  if (map_) traffic_.Note(*map_, my_rank_, shards, value_bytes, push);
}

ShardSnapshot ServerCore::SnapshotPrimaryShards() const {
  ShardSnapshot snap;
  if (!map_) return snap;
  snap.server_rank = my_rank_;
  snap.epoch = map_->epoch();
  for (auto& [v, n] : AppliedByPrimaryShard()) {
    snap.vshards.push_back(v);
    snap.applied_pushes_by_vshard[v] = n;
  }
  std::vector<uint32_t> ids;
  for (const auto& [id, table] : tables_) ids.push_back(id);
  std::sort(ids.begin(), ids.end());
  for (uint32_t id : ids) {
    snap.tables.push_back(
        SnapshotTable(*tables_.at(id), KeysOfVShards(id, map_->num_vshards(), std::span<const uint32_t>(snap.vshards))));
  }
  // The windows (and audit rows) of those shards, as a ShardTransfer.
  proto::ShardTransfer state;
  ExportShardState(absl::flat_hash_set<uint32_t>(snap.vshards.begin(), snap.vshards.end()), &state);
  snap.core_state = state.SerializeAsString();
  return snap;
}

absl::StatusOr<uint64_t> ServerCore::RestoreShards(const ShardSnapshot& snapshot, std::span<const uint32_t> vshards,
                                                   bool with_windows) {
  if (!map_) return absl::FailedPreconditionError("no shard map yet");
  std::vector<uint32_t> wanted(vshards.begin(), vshards.end());
  std::sort(wanted.begin(), wanted.end());
  if (auto s = CheckHasShards(snapshot, wanted); !s.ok()) return s;
  proto::ShardTransfer state;
  if ((with_windows || options_.audit) && !state.ParseFromString(snapshot.core_state)) {
    return absl::DataLossError("the checkpoint's de-duplication windows do not parse");
  }
  // Checks first.
  if (auto s = CheckTablesFit(snapshot, tables_); !s.ok()) return s;
  uint64_t rows = 0;
  for (const TableSnapshot& t : snapshot.tables) {
    const uint32_t id = t.config.table_id();
    if (!tables_.contains(id)) {
      proto::CreateTable create;
      *create.mutable_config() = t.config;
      if (auto s = HandleCreateTable(create); !s.ok()) return s;
    }
    std::vector<Key> keys;
    std::vector<float> values;
    RowsOfShards(t, wanted, *map_, &keys, &values);
    if (auto s = tables_.at(id)->RestoreRows(keys, values, /*adopt_dense=*/true); !s.ok()) return s;
    rows += keys.size();
  }
  if (with_windows) {
    ImportShardState(state, [&](uint32_t v) { return std::binary_search(wanted.begin(), wanted.end(), v); });
    if (options_.audit) audit_.Restored(state, wanted, map_->num_vshards());
    for (uint32_t v : wanted) {
      auto it = snapshot.applied_pushes_by_vshard.find(v);
      applied_[v] = it == snapshot.applied_pushes_by_vshard.end() ? 0 : it->second;
    }
  }
  return rows;
}

std::string ServerCore::AuditDump() const {
  if (!options_.audit || !map_) return {};
  std::string out = absl::StrCat("# tessera audit server ", my_rank_, " epoch ", map_->epoch(),
                                 deposed() ? " deposed" : "", "\n");
  if (deposed()) return out;
  for (const std::string& line : audit_.RestoreLines()) absl::StrAppend(&out, line, "\n");
  std::vector<uint32_t> ids;
  for (const auto& [id, table] : tables_) ids.push_back(id);
  std::sort(ids.begin(), ids.end());
  for (uint32_t id : ids) {
    std::vector<std::pair<Key, std::vector<float>>> rows;
    tables_.at(id)->ForEachRow([&](Key k, std::span<const float> row) {
      if (map_->Holds(my_rank_, map_->VShardOfKey(id, k))) rows.emplace_back(k, std::vector<float>(row.begin(), row.end()));
    });
    std::sort(rows.begin(), rows.end());
    for (const auto& [k, values] : rows) {
      const bool primary = map_->ServerRankOfKey(id, k) == my_rank_;
      absl::StrAppend(&out, "row ", id, " ", k, primary ? " primary " : " backup ");
      for (size_t i = 0; i < values.size(); ++i) absl::StrAppend(&out, i ? "," : "", values[i]);
      audit_.AppendEntries(id, k, &out);
      out += "\n";
    }
  }
  return out;
}

uint32_t ServerCore::RankOfNode(uint32_t node_id) const {
  for (uint32_t r = 0; r < map_->num_servers(); ++r)
    if (map_->server(r).node_id() == node_id) return r;
  return std::numeric_limits<uint32_t>::max();
}

void ServerCore::NoteApplied(std::span<const uint32_t> shards, const absl::flat_hash_set<uint32_t>& duplicate,
                             const Origin& origin) {
  for (uint32_t v : shards) {
    if (duplicate.contains(v)) continue;
    dedup_.RecordApplied(v, origin);
    applied_[v]++;
  }
}

bool ServerCore::IsDuplicate(uint32_t vshard, const Origin& origin) const {
  return !options_.testing.apply_duplicates && dedup_.IsDuplicate(vshard, origin);
}

void ServerCore::RescopeForwards(uint32_t rank) {
  BackupStream& stream = *streams_.Find(rank);
  auto kept = [&](uint32_t v) {
    const auto bs = map_->BackupsOf(v);
    return map_->ServerRankOf(v) == my_rank_ && std::find(bs.begin(), bs.end(), rank) != bs.end();
  };
  for (Forward& f : stream.unacked) {
    proto::Replicate& r = *f.message.header.mutable_replicate();
    if (r.has_transfer()) {
      RescopeTransfer(f.message, kept, *map_);
      continue;
    }
    if (r.num_keys() == 0 || f.message.frames.size() != 2) continue;
    auto table = tables_.find(r.table_id());
    if (table == tables_.end()) continue;
    const size_t row_bytes = size_t{table->second->width()} * sizeof(float);
    const auto keys = f.message.frames[0].As<Key>();
    std::vector<uint32_t> idx;
    for (size_t i = 0; i < keys.size(); ++i)
      if (kept(map_->VShardOfKey(r.table_id(), keys[i]))) idx.push_back(static_cast<uint32_t>(i));
    if (idx.size() == keys.size()) continue;
    Buffer k, values;
    GatherRows(f.message.frames[0], f.message.frames[1], idx, row_bytes, &k, &values);
    f.message.frames = {std::move(k), std::move(values)};
    r.set_num_keys(idx.size());
  }
}

void ServerCore::SendForwards(uint32_t rank, Nanos now, std::vector<Outgoing>& out, bool due_only) {
  for (Message& m : streams_.TakeDue(rank, now, due_only)) SendResent(rank, std::move(m), out);
}

void ServerCore::SendResent(uint32_t rank, Message m, std::vector<Outgoing>& out) {
  m.header.set_epoch(map_->epoch());
  stats_.forwards_sent++;
  stats_.forwards_resent++;
  out.push_back(Outgoing{map_->server(rank).address(), std::move(m)});
}

void ServerCore::HandlePush(Message request, Nanos now, std::vector<Outgoing>& out) {
  const proto::Envelope& h = request.header;
  const bool wants_reply = h.request_id() != 0 && !h.sender_address().empty();
  const std::string reply_to = h.sender_address();
  stats_.push_requests++;
  stats_.bytes_in += request.FrameBytes();
  Message reply = Reply(request);
  const proto::Push req = h.push();
  absl::Status status;
  if (req.value_parts() > 0) status = DecodePushValues(req, request);  // then handled like any push
  const uint64_t push_id = next_push_id_++;
  std::vector<uint32_t> shards;
  absl::StatusOr<uint32_t> forwards = status.ok() ? AcceptPush(req, request, push_id, now, out, &shards) : status;
  if (!forwards.ok()) {
    if (forwards.status().code() != absl::StatusCode::kAborted) stats_.bad_requests++;
    SetError(reply, forwards.status());
    if (wants_reply) out.push_back(Outgoing{reply_to, std::move(reply)});
    return;
  }
  reply.header.mutable_ack();
  if (*forwards == 0 || options_.testing.ack_before_replication) {
    if (wants_reply) out.push_back(Outgoing{reply_to, std::move(reply)});
    return;
  }
  acks_.Wait(push_id, wants_reply ? reply_to : std::string(), std::move(reply), *forwards, std::move(shards));
}

absl::StatusOr<uint32_t> ServerCore::AcceptPush(const proto::Push& req, Message& m, uint64_t push_id, Nanos now,
                                                std::vector<Outgoing>& out, std::vector<uint32_t>* shards_out) {
  if (m.frames.size() != 2) {
    return absl::InvalidArgumentError(absl::StrCat("push needs 2 frames (keys, values), got ", m.frames.size()));
  }
  const uint32_t sender = m.header.sender_id();
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
  if (!req.resend() && clocks_.IsLive(sender) && req.clock() < clocks_.ClockOf(sender)) {
    return absl::InvalidArgumentError(absl::StrCat("push stamped clock ", req.clock(), " arrived after the worker ",
                                                   "announced clock ", clocks_.ClockOf(sender)));
  }
  auto table_or = FindTable(req.table_id());
  if (!table_or.ok()) return table_or.status();
  Table* table = *table_or;
  auto keys_or = KeysFrame(m, req.num_keys(), req.table_id(), false);
  if (!keys_or.ok()) return keys_or.status();
  const std::span<const Key> keys = *keys_or;
  auto piece = PieceOf(req.first_column(), req.columns(), *table);
  if (!piece.ok()) return piece.status();
  // The bytes of each key's values: its row, or the piece of it the push carries.
  const size_t row_bytes = size_t{piece->Width(table->width())} * sizeof(float);
  if (m.frames[1].size() != keys.size() * row_bytes) {
    return absl::InvalidArgumentError(absl::StrCat("values frame has ", m.frames[1].size(), " bytes, expected ",
                                                   keys.size() * row_bytes, " for ", req.num_keys(),
                                                   " keys of width ", table->width(),
                                                   piece->whole() ? "" : absl::StrCat(" (", piece->count, " columns)")));
  }
  if (auto s = CheckGrowth(*table, keys); !s.ok()) return s;
  // Each key's shard; which keys are this server's to take.
  std::vector<uint32_t> vshard(keys.size());
  bool all_mine = true;
  for (size_t i = 0; i < keys.size(); ++i) {
    vshard[i] = map_->VShardOfKey(req.table_id(), keys[i]);
    const uint32_t owner = map_->ServerRankOf(vshard[i]);
    if (owner != my_rank_) {
      // A resend of an older map went to the servers of that map: keys it
      // gives others may now be this server's, or neither's (a shard that
      // moved); the worker sends it again by this map.
      if (!req.resend() || m.header.epoch() < map_->epoch()) return NotPrimary(req.table_id(), keys[i], owner);
      all_mine = false;
    }
  }
  NoteTraffic(vshard, keys.empty() ? 0 : m.frames[1].size() / keys.size(), /*push=*/true);
  // The distinct shards this server takes keys of.
  const std::vector<uint32_t> shards = DistinctShards(
      vshard, map_->num_vshards(), [&](uint32_t v) { return map_->ServerRankOf(v) == my_rank_; });
  if (shards.empty()) {
    return absl::AbortedError(absl::StrCat("none of the ", keys.size(), " keys of this resend to table ",
                                           req.table_id(), " is in a shard server ", my_rank_,
                                           " is primary of at map epoch ", map_->epoch()));
  }
  const Origin origin{sender, req.incarnation(), req.seq(), req.acked_below()};
  if (auto s = dedup_.CheckIncarnation(origin, shards); !s.ok()) return s;
  absl::flat_hash_set<uint32_t> duplicate;
  for (uint32_t v : shards)
    if (IsDuplicate(v, origin)) duplicate.insert(v);
  // The rows to apply here: this server's shards that do not have the push yet.
  Buffer apply_keys = m.frames[0], apply_values = m.frames[1];
  if (!all_mine || !duplicate.empty()) {
    std::vector<uint32_t> idx;
    for (size_t i = 0; i < keys.size(); ++i)
      if (map_->ServerRankOf(vshard[i]) == my_rank_ && !duplicate.contains(vshard[i])) idx.push_back(i);
    GatherRows(m.frames[0], m.frames[1], idx, row_bytes, &apply_keys, &apply_values);
  }
  if (auto s = table->CheckPush(apply_keys.As<Key>(), apply_values.As<float>(), *piece); !s.ok()) return s;
  // Borrowed frames (owner() null: an in-process sender's own memory) may
  // be reused by the sender as soon as it sees the ack: apply those now.
  const bool defer = options_.apply_after_ack && apply_keys.owner() != nullptr && apply_values.owner() != nullptr;
  // The clock the push moves its table's clock to: its stamp, but no further
  // than kPushClockLead past the highest clock any worker announced here
  // ("Push clocks" in server_core.h). Backups get this clock, not the stamp.
  const uint64_t table_clock = PushTableClock(req.clock(), clocks_.highest_clock());
  if (table_clock < req.clock()) stats_.push_clocks_bounded++;
  if (!apply_keys.empty()) {
    if (defer) {
      pending_.push_back(PendingPush{table, apply_keys, apply_values, table_clock, *piece});
    } else {
      absl::Status s = table->ApplyPush(apply_keys.As<Key>(), apply_values.As<float>(), table_clock, *piece);
      TESSERA_CHECK_MSG(s.ok(), s.message());  // checked above
    }
  }
  NoteApplied(shards, duplicate, origin);
  if (!duplicate.empty()) stats_.duplicate_pushes++;
  AuditApplied(req.table_id(), apply_keys.As<Key>(), origin, *piece);

  // Forwards: each backup gets the keys (of this server's shards, applied
  // here now or before) of the shards it backs up; backups de-duplicate.
  proto::Replicate forward;
  forward.set_worker_id(origin.worker);
  forward.set_incarnation(origin.incarnation);
  forward.set_seq(origin.seq);
  forward.set_acked_below(origin.acked_below);
  forward.set_table_id(req.table_id());
  forward.set_clock(table_clock);
  forward.set_first_column(piece->first);
  forward.set_columns(piece->count);
  const uint32_t forwards = ForwardPush(m, vshard, shards, forward, row_bytes, push_id, now, out);
  if (forwards > 0) *shards_out = shards;
  return forwards;
}

uint32_t ServerCore::ForwardPush(const Message& m, std::span<const uint32_t> vshard, std::span<const uint32_t> shards,
                                 const proto::Replicate& forward, size_t row_bytes, uint64_t push_id, Nanos now,
                                 std::vector<Outgoing>& out) {
  std::vector<uint32_t> backups;
  for (uint32_t v : shards)
    for (uint32_t b : map_->BackupsOf(v)) backups.push_back(b);
  std::sort(backups.begin(), backups.end());
  backups.erase(std::unique(backups.begin(), backups.end()), backups.end());
  uint32_t forwards = 0;
  for (uint32_t b : backups) {
    std::vector<uint32_t> idx;
    for (size_t i = 0; i < vshard.size(); ++i) {
      if (map_->ServerRankOf(vshard[i]) != my_rank_) continue;
      auto bs = map_->BackupsOf(vshard[i]);
      if (std::find(bs.begin(), bs.end(), b) != bs.end()) idx.push_back(i);
    }
    Message f;
    f.header.set_sender_id(options_.node_id);
    *f.header.mutable_replicate() = forward;
    f.header.mutable_replicate()->set_num_keys(idx.size());
    if (idx.size() == vshard.size()) {
      f.frames = {m.frames[0], m.frames[1]};
    } else {
      f.frames.resize(2);
      GatherRows(m.frames[0], m.frames[1], idx, row_bytes, &f.frames[0], &f.frames[1]);
    }
    Message wire = streams_.Append(streams_.To(b, map_->server(b).node_id()), std::move(f), push_id, now).message;
    wire.header.set_epoch(map_->epoch());
    stats_.forwards_sent++;
    out.push_back(Outgoing{map_->server(b).address(), std::move(wire)});
    forwards++;
  }
  return forwards;
}

void ServerCore::ForwardDone(uint64_t push_id, const absl::Status& status, std::vector<Outgoing>& out) {
  std::optional<PushAcks::Waiting> w = acks_.Done(push_id, status);
  if (!w) return;
  if (!w->status.ok()) {
    stats_.bad_requests++;
    SetError(w->reply, w->status);
  }
  if (!w->to.empty()) out.push_back(Outgoing{std::move(w->to), std::move(w->reply)});
}

void ServerCore::HandleReplicateAck(const Message& m, Nanos now, std::vector<Outgoing>& out) {
  // A backup that is no longer one, or an ack of a stream that ended:
  // nothing waits on it (BackupStreams ignores it).
  const uint32_t rank = RankOfNode(m.header.sender_id());
  const proto::ReplicateAck& a = m.header.replicate_ack();
  if (!a.rejected()) {
    BackupStreams::AckResult acked = streams_.Acked(rank, a.stream(), a.position(), a.gap(), now);
    for (const Forward& done : acked.done) {
      if (done.message.header.replicate().has_transfer() && !done.more &&
          done.message.header.replicate().transfer().vshards_size() > 0) {
        proto::ShardsInSync s;
        s.set_backup_rank(rank);
        *s.mutable_vshards() = done.message.header.replicate().transfer().vshards();
        in_sync_.push_back(std::move(s));
      }
      ForwardsDone(done, absl::OkStatus(), out);
    }
    // A gap notice: the backup holds a later forward and misses the next
    // one; it goes again now (once per notice of that position), not after
    // the timer.
    if (acked.gap_resend) {
      stats_.forwards_gap_resent++;
      SendResent(rank, std::move(*acked.gap_resend), out);
    }
    return;
  }
  // Refused for an older epoch: the forwards stay and go again with the
  // newer epoch (UpdateShardMap sends every unacknowledged forward again, and
  // Tick keeps resending); a deposed server's never do.
  if (a.stale_epoch() || m.header.has_error()) return;
  if (std::optional<Forward> refused = streams_.Refused(rank, a.stream(), a.position())) {
    ForwardsDone(*refused,
                 absl::FailedPreconditionError(absl::StrCat("backup server ", rank, " refused the push: ", a.reason())),
                 out);
  }
}

void ServerCore::HandleReplicate(const Message& m, std::vector<Outgoing>& out) {
  const uint32_t from = m.header.sender_id();
  ReplicateOne(m, out);
  // Forwards that arrived ahead of their turn (reordered) and are next now.
  while (std::optional<Message> next = inbox_.TakeNext(from)) ReplicateOne(*next, out);
}

void ServerCore::ReplicateOne(const Message& m, std::vector<Outgoing>& out) {
  const proto::Envelope& h = m.header;
  const proto::Replicate& r = h.replicate();
  auto ack = [&](uint64_t position, const absl::Status& rejection, bool stale = false, bool gap = false) {
    if (h.sender_address().empty()) return;
    Message reply;
    reply.header.set_sender_id(options_.node_id);
    reply.header.set_epoch(map_->epoch());
    auto* a = reply.header.mutable_replicate_ack();
    a->set_position(position);
    a->set_stream(r.stream());
    a->set_gap(gap);
    if (!rejection.ok()) {
      stats_.forwards_rejected++;
      a->set_rejected(true);
      a->set_stale_epoch(stale);
      a->set_reason(std::string(rejection.message()));
    }
    out.push_back(Outgoing{h.sender_address(), std::move(reply)});
  };
  const bool old_epoch_accepted = options_.testing.accept_old_epoch && h.epoch() < map_->epoch();
  if (h.epoch() < map_->epoch() && !old_epoch_accepted) {
    ack(r.position(),
        absl::FailedPreconditionError(absl::StrCat("forward of map epoch ", h.epoch(),
                                                   " is older than this server's epoch ", map_->epoch())),
        /*stale=*/true);
    return;
  }
  if (h.epoch() > map_->epoch()) return;  // this server's map is behind: the primary sends again
  const uint32_t from = RankOfNode(h.sender_id());
  if (from == std::numeric_limits<uint32_t>::max()) {
    ack(r.position(), absl::FailedPreconditionError(absl::StrCat("node ", h.sender_id(),
                                                                 " is not a server of map epoch ", map_->epoch())));
    return;
  }
  // In stream order (server/forward_inbox.h): a newer stream from this
  // primary starts again at position 1; a resend of what is applied is
  // acknowledged again; a forward past a gap is kept until its turn, and
  // the gap is reported once (the primary sends it again now rather than
  // after its timer).
  const ForwardInbox::Decision next = inbox_.Receive(h.sender_id(), r.stream(), r.position(), m);
  switch (next.verdict) {
    case ForwardInbox::Verdict::kIgnore:
      return;
    case ForwardInbox::Verdict::kAckAgain:
      ack(next.ack_position, absl::OkStatus());
      return;
    case ForwardInbox::Verdict::kKept:
      if (next.gap_notice) {
        stats_.forward_gaps_reported++;
        ack(next.ack_position, absl::OkStatus(), /*stale=*/false, /*gap=*/true);
      }
      return;
    case ForwardInbox::Verdict::kApply:
      break;
  }
  if (r.has_transfer()) {
    absl::Status status = ApplyTransfer(m, from);
    if (status.ok() && r.transfer().vshards_size() > 0 && !r.transfer().continued()) stats_.transfers_applied++;
    ack(r.position(), status);
    return;
  }
  const absl::Status status = ApplyForward(m, from, old_epoch_accepted);
  if (status.ok()) stats_.forwards_applied++;
  ack(r.position(), status);
}

absl::Status ServerCore::ApplyForward(const Message& m, uint32_t from, bool old_epoch_accepted) {
  const proto::Replicate& r = m.header.replicate();
  if (m.frames.size() != 2) return absl::InvalidArgumentError("forward needs 2 frames (keys, values)");
  auto table_or = FindTable(r.table_id());
  if (!table_or.ok()) return table_or.status();
  Table* table = *table_or;
  auto keys_or = KeysFrame(m, r.num_keys(), r.table_id(), false);
  if (!keys_or.ok()) return keys_or.status();
  const std::span<const Key> keys = *keys_or;
  auto piece = PieceOf(r.first_column(), r.columns(), *table);
  if (!piece.ok()) return piece.status();
  const size_t row_bytes = size_t{piece->Width(table->width())} * sizeof(float);
  if (m.frames[1].size() != keys.size() * row_bytes) {
    return absl::InvalidArgumentError(absl::StrCat("forward values frame has ", m.frames[1].size(),
                                                   " bytes, expected ", keys.size() * row_bytes));
  }
  std::vector<uint32_t> vshard(keys.size());
  for (size_t i = 0; i < keys.size(); ++i) {
    vshard[i] = map_->VShardOfKey(r.table_id(), keys[i]);
    auto bs = map_->BackupsOf(vshard[i]);
    if (old_epoch_accepted) continue;
    if (map_->ServerRankOf(vshard[i]) != from || std::find(bs.begin(), bs.end(), my_rank_) == bs.end()) {
      return absl::FailedPreconditionError(absl::StrCat("key ", keys[i], " of table ", r.table_id(), " (shard ",
                                                        vshard[i], ") is not backed up here for server ", from,
                                                        " at map epoch ", map_->epoch()));
    }
  }
  const std::vector<uint32_t> shards = DistinctShards(vshard, map_->num_vshards(), [](uint32_t) { return true; });
  const Origin origin{r.worker_id(), r.incarnation(), r.seq(), r.acked_below()};
  if (auto s = dedup_.CheckIncarnation(origin, shards); !s.ok()) return s;
  absl::flat_hash_set<uint32_t> duplicate;
  for (uint32_t v : shards)
    if (IsDuplicate(v, origin)) duplicate.insert(v);
  Buffer apply_keys = m.frames[0], apply_values = m.frames[1];
  if (!duplicate.empty()) {
    std::vector<uint32_t> idx;
    for (size_t i = 0; i < keys.size(); ++i)
      if (!duplicate.contains(vshard[i])) idx.push_back(i);
    GatherRows(m.frames[0], m.frames[1], idx, row_bytes, &apply_keys, &apply_values);
    stats_.duplicate_pushes++;
  }
  if (auto s = table->ApplyPush(apply_keys.As<Key>(), apply_values.As<float>(), r.clock(), *piece); !s.ok()) {
    return s;
  }
  NoteApplied(shards, duplicate, origin);
  AuditApplied(r.table_id(), apply_keys.As<Key>(), origin, *piece);
  return absl::OkStatus();
}

absl::StatusOr<std::vector<Outgoing>> ServerCore::UpdateShardMap(const proto::ShardMap& map, Nanos now) {
  auto view = ShardMapView::Create(map);
  if (!view.ok()) return view.status();
  std::vector<Outgoing> out;
  if (!map_) {
    if (auto s = InstallShardMap(map, my_rank_); !s.ok()) return s;
    return out;
  }
  if (view->epoch() == map_->epoch() || (view->epoch() < map_->epoch() && !options_.testing.accept_old_epoch)) return out;
  if (view->num_servers() < map_->num_servers()) {  // (servers join a job; ranks never go)
    return absl::InvalidArgumentError(absl::StrCat("shard map of epoch ", view->epoch(), " has ",
                                                   view->num_servers(), " servers, fewer than ", map_->num_servers()));
  }
  ApplyPending();  // a transfer below must see every accepted push
  const ShardMapView old = std::move(*map_);
  map_ = std::move(*view);
  if (deposed()) {
    // Another server took over this one's shards: nothing waiting here may
    // be acknowledged; the workers send it again where the map says.
    for (PushAcks::Waiting& w : acks_.TakeAll()) {
      SetError(w.reply, absl::AbortedError(absl::StrCat("server ", my_rank_, " was removed from the job at map epoch ",
                                                        map_->epoch(), " before its backups had the push")));
      w.reply.header.set_epoch(map_->epoch());  // the worker resends once it has this map
      if (!w.to.empty()) out.push_back(Outgoing{std::move(w.to), std::move(w.reply)});
    }
    streams_.Clear();
    moves_.Clear();
    AbortHeldReplies([](uint32_t) { return true; }, out);
    return out;
  }
  LetMovedShardsGo(old, out);
  // Per backup: the shards it holds for this server now; a stream to a
  // server that holds none any more ends (every live copy has what waited
  // on it); a server that newly holds some gets their state first.
  for (BackupPlan& plan : PlanBackups(old, *map_, my_rank_, streams_.Ranks())) {
    const uint32_t rank = plan.rank;
    const uint32_t node = map_->server(rank).node_id();
    BackupStream* stream = streams_.Find(rank);
    if (plan.held.empty()) {
      if (stream != nullptr) {
        for (Forward& f : stream->unacked) ForwardsDone(f, absl::OkStatus(), out);
        streams_.End(rank);
      }
      continue;
    }
    std::vector<uint64_t> carried;
    if (stream != nullptr && stream->node_id != node) {
      // A new process at this rank: what the old one had not acknowledged
      // reaches it in the transfer, and waits for that.
      for (Forward& f : stream->unacked) {
        if (f.push_id != 0) carried.push_back(f.push_id);
        carried.insert(carried.end(), f.carried.begin(), f.carried.end());
      }
      streams_.End(rank);
      stream = nullptr;
    }
    if (stream != nullptr) {
      RescopeForwards(rank);
      SendForwards(rank, now, out);  // with the new epoch, in case the backup refused the old one
    }
    if (!plan.fresh.empty()) SendTransfer(rank, plan.fresh, std::move(carried), now, out);
  }
  moves_.Note(*map_, my_rank_, streams_);
  moves_.Release(streams_, out);
  return out;
}

void ServerCore::LetMovedShardsGo(const ShardMapView& old, std::vector<Outgoing>& out) {
  // Shards this server was primary of and is not now (moved: it is alive).
  absl::flat_hash_set<uint32_t> moved, released;
  for (uint32_t v = 0; v < map_->num_vshards(); ++v) {
    if (old.ServerRankOf(v) == my_rank_ && map_->ServerRankOf(v) != my_rank_) moved.insert(v);
    if (old.Holds(my_rank_, v) && !map_->Holds(my_rank_, v)) released.insert(v);
  }
  // A push that touched a moved shard and waits for backups is not
  // acknowledged: its forward may never reach the new primary (refused for
  // the old epoch), so the worker must send it there again; the new primary
  // applies it once (de-duplication) and acknowledges it when its own
  // backups have it.
  if (!moved.empty()) {
    for (auto& [w, shard] : acks_.TakeTouching([&](uint32_t v) { return moved.contains(v); })) {
      SetError(w.reply, absl::AbortedError(absl::StrCat("shard ", shard, " moved from server ", my_rank_, " to server ",
                                                        map_->ServerRankOf(shard), " at map epoch ", map_->epoch(),
                                                        " before its backups had the push")));
      w.reply.header.set_epoch(map_->epoch());  // the worker resends once it has this map
      if (!w.to.empty()) out.push_back(Outgoing{std::move(w.to), std::move(w.reply)});
    }
  }
  if (!moved.empty()) AbortHeldReplies([&](uint32_t v) { return moved.contains(v); }, out);
  if (released.empty()) return;
  // The shards this server holds no copy of any more: their rows, windows
  // and counts go (a later copy here starts from a state transfer).
  ForgetShards(released);
  for (uint32_t v : released) applied_.erase(v);
  stats_.shards_released += released.size();
}

absl::StatusOr<Buffer> ServerCore::HandlePull(const proto::Pull& req, const Message& m) {
  if (m.frames.size() != 1) {
    return absl::InvalidArgumentError(absl::StrCat("pull needs 1 frame (keys), got ", m.frames.size()));
  }
  stats_.bytes_in += m.FrameBytes();
  auto table = FindTable(req.table_id());
  if (!table.ok()) return table.status();
  auto keys = KeysFrame(m, req.num_keys(), req.table_id(), true, &shard_scratch_);
  if (!keys.ok()) return keys.status();
  if (auto s = CheckGrowth(**table, *keys); !s.ok()) return s;
  NoteTraffic(shard_scratch_, size_t{(*table)->width()} * sizeof(float), /*push=*/false);
  // Large rows go out as views of table memory (copy-on-write protects them
  // from later pushes while the reply is in flight); the rest is copied.
  return (*table)->ReadRowsShared(*keys, options_.pool);
}

}  // namespace tessera

#include "server/server_core.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/check.h"
#include "compress/row_compressor.h"
#include "server/answers.h"
#include "server/map_change.h"
#include "server/push_rows.h"
#include "server/request_checks.h"
#include "server/snapshot_restore.h"

namespace tessera {

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
  // None (a transfer of configs alone): finding rows to erase walks every
  // row, those on disk too.
  if (shards.empty()) return;
  for (auto& [id, table] : tables_) {
    const uint32_t table_id = id;
    table->EraseRows([&](Key k) { return shards.contains(map_->VShardOfKey(table_id, k)); });
  }
  dedup_.Forget(shards);
  audit_.Forget([&](uint32_t table_id, Key k) { return shards.contains(map_->VShardOfKey(table_id, k)); });
}

void ServerCore::AbortHeldReplies(const std::function<bool(uint32_t)>& moved, std::vector<Outgoing>& out) {
  for (auto& [held, shard] : moves_.TakeReadersOf(moved))
    AnswerAborted(std::move(held), MovedBeforeReadError(shard, my_rank_, map_->epoch()), map_->epoch(), out);
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
    auto table = tessera::FindTable(tables_, h.pull().table_id());
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
  const std::string& reply_to = request.header.sender_address();
  if (!options_.backlog_of || !IsWorkerRequest(request.header)) return false;
  const uint64_t max_requests = options_.max_requests_in_flight_per_peer;
  const PeerBacklog backlog = options_.backlog_of(reply_to);
  if (!IsBusy(backlog, max_requests, options_.max_bytes_in_flight_per_peer)) return false;
  stats_.busy_refused++;
  last_busy_peer_ = reply_to;
  if (backlog.messages >= max_requests + kBusyAnswerSlack) {
    stats_.busy_dropped++;
    return true;
  }
  Message reply = Reply(request);
  SetError(reply, BusyError(backlog, reply_to, max_requests, options_.max_bytes_in_flight_per_peer));
  Emit(out, reply_to, std::move(reply));
  return true;
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
  auto refuse = [&](const absl::Status& status, bool bad, bool replicate_rejected = false) {
    Message reply = Reply(request);
    SetError(reply, status);
    if (replicate_rejected) reply.header.mutable_replicate_ack()->set_rejected(true);
    if (bad) stats_.bad_requests++;
    send(std::move(reply));
    return out;
  };
  if (absl::Status s = CheckNotLent(request); !s.ok()) return refuse(s, /*bad=*/true);
  if (!map_) return refuse(absl::UnavailableError("server has no shard map yet"), /*bad=*/true);
  if (wants_reply && RefusedAsBusy(request, out)) return out;
  if (std::optional<Refusal> r = RefuseBeforeRouting(h, *map_, my_rank_, clocks_, options_.max_hold)) {
    if (r->behind_epoch) stats_.behind_epoch++;
    return refuse(r->status, r->bad_request, r->replicate_rejected);
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
    if (auto s = clocks_.Advance(h.sender_id(), h.clock_advance().clock()); !s.ok()) return refuse(s, /*bad=*/true);
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
                                tessera::FindTable(tables_, h.pull().table_id()).ok() &&
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
    SetError(reply, TooManyHeldError(held_here, from, options_.max_held_per_peer));
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
    SetError(reply, HeldTooLongError(h, now - x.arrived, clocks_, x.required_min_clock));
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
      status = CreateTable(h.create_table().config());
      if (status.ok()) reply.header.mutable_ack();
      break;
    case proto::Envelope::kPull: {
      stats_.pull_requests++;
      auto values = HandlePull(h.pull(), request);
      status = values.status();
      if (!status.ok()) break;
      auto codec = pull_codecs_.find(h.pull().table_id());
      const compress::Codec* c = codec == pull_codecs_.end() ? nullptr : &codec->second;
      status = FillPullReply(h.pull(), std::move(*values), min, held_for, c, c ? ++pull_encodes_ : 0, reply,
                             &stats_.bytes_out);
      break;
    }
    case proto::Envelope::kClockAdvance:
    case proto::Envelope::kClockQuery:
      if (h.has_clock_query() && h.clock_query().join() && !clocks_.IsKnown(h.sender_id()) && h.sender_id() != 0) {
        clocks_.Join(h.sender_id(), h.clock_query().rank(), options_.testing.join_at_zero);  // joined the running job
      }
      status = FillClockAck(h.sender_id(), clocks_, min, held_for, reply);
      break;
    case proto::Envelope::kStatsRequest: {
      auto* s = reply.header.mutable_stats_reply();
      s->set_push_requests(stats_.push_requests);
      s->set_pull_requests(stats_.pull_requests);
      s->set_bytes_in(stats_.bytes_in);
      s->set_bytes_out(stats_.bytes_out);
      s->set_rows(rows());
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

absl::Status ServerCore::CreateTable(const proto::TableConfig& c) {
  if (auto s = ValidateTableConfig(c); !s.ok()) return s;
  if (auto it = tables_.find(c.table_id()); it != tables_.end()) return CheckSameTable(it->second->config(), c);
  const ShardMapView& map = *map_;
  const uint32_t rank = my_rank_;
  const uint32_t id = c.table_id();
  absl::StatusOr<std::unique_ptr<ColdRows>> disk = MakeDiskTier(c, options_.disk_tiers);
  if (!disk.ok()) return disk.status();
  if (!c.pull_compression().empty()) {  // validated above
    pull_codecs_.try_emplace(id, *compress::Codec::Create(*compress::ParsePullSpec(c.pull_compression())));
  }
  auto holds = [&](Key k) { return map.Holds(rank, map.VShardOfKey(id, k)); };
  if (auto s = CheckDenseShare(c, holds, options_.max_table_bytes); !s.ok()) return s;
  tables_.emplace(id, std::make_unique<Table>(c, holds, std::move(*disk)));
  return absl::OkStatus();
}

absl::Status ServerCore::DecodePushValues(const proto::Push& req, Message& m) {
  auto decoded = tessera::DecodePushValues(req, m.frames, tables_, options_.max_keys_per_request, options_.pool);
  if (!decoded.ok()) return decoded.status();
  m.frames.resize(1);
  m.frames.push_back(std::move(*decoded));
  stats_.compressed_pushes++;
  return absl::OkStatus();
}

absl::StatusOr<std::span<const Key>> ServerCore::KeysFrame(const Message& m, uint64_t num_keys, uint32_t table_id,
                                                            bool primary_only, std::vector<uint32_t>* shards) {
  auto keys = CheckKeysFrame(m.frames[0], num_keys, options_.max_keys_per_request);
  if (!keys.ok() || !primary_only) return keys;
  if (auto s = CheckPrimaryOf(*keys, table_id, *map_, my_rank_, shards); !s.ok()) return s;
  return keys;
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
  for (uint32_t rank : BackupsOfLed(*map_, my_rank_)) SendTransfer(rank, {}, {}, now, out);
}

void ServerCore::SendTransfer(uint32_t rank, const std::vector<uint32_t>& vshards, std::vector<uint64_t> carried,
                              Nanos now, std::vector<Outgoing>& out) {
  std::vector<uint64_t> counts;
  for (uint32_t v : vshards) counts.push_back(applied(v));
  BuiltTransfer built = BuildTransfer(tables_, *map_, vshards, counts, options_.max_message_bytes, options_.node_id);
  std::vector<Message>& messages = built.messages;
  proto::ShardTransfer* first = messages[0].header.mutable_replicate()->mutable_transfer();
  ExportShardState(absl::flat_hash_set<uint32_t>(vshards.begin(), vshards.end()), first);
  AddClocks(clocks_, first);
  for (size_t i = 0; i < messages.size(); ++i) {
    // The pushes carried wait for the last message: a backup applies its
    // stream in order, so its ack covers the ones before.
    const bool last = i + 1 == messages.size();
    SendInStream(rank, std::move(messages[i]), 0, last ? std::move(carried) : std::vector<uint64_t>{}, !last, now, out);
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
  auto create = [&](const proto::TableConfig& config) { return CreateTable(config); };
  if (auto s = SetTransferRows(m, tables_, create); !s.ok()) return s;  // (rows checked above)
  if (t.continued()) return absl::OkStatus();  // (its first part brought the windows, counts and clocks)
  ImportShardState(t, [](uint32_t) { return true; });
  for (int i = 0; i < t.vshards_size() && i < t.applied_size(); ++i) applied_[t.vshards(i)] = t.applied(i);
  TakeClocks(t, clocks_);
  return absl::OkStatus();
}

std::vector<Outgoing> ServerCore::TransferShards(std::span<const uint32_t> vshards, Nanos now) {
  std::vector<Outgoing> out;
  if (!map_ || deposed()) return out;
  for (const auto& [b, shards] : TransferTargets(*map_, my_rank_, vshards)) SendTransfer(b, shards, {}, now, out);
  return out;
}

std::vector<std::pair<uint32_t, uint64_t>> ServerCore::AppliedByPrimaryShard() const {
  if (!map_ || deposed()) return {};
  return AppliedByPrimary(*map_, my_rank_, applied_);
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
  hb->set_rows(TotalRows(tables_));
  hb->set_memory_bytes(TotalRowBytes(tables_));
}

void ServerCore::NoteTraffic(std::span<const uint32_t> shards, size_t value_bytes, bool push) {
  if (map_) traffic_.Note(*map_, my_rank_, shards, value_bytes, push);
}

ShardSnapshot ServerCore::SnapshotPrimaryShards() const {
  if (!map_) return ShardSnapshot();
  ShardSnapshot snap = SnapshotShards(tables_, *map_, my_rank_, AppliedByPrimaryShard());
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
  auto create = [&](const proto::TableConfig& config) { return CreateTable(config); };
  // In a running job it replaces this server's copy of them (a move's destination may hold part), as a transfer does.
  if (with_windows) ForgetShards(absl::flat_hash_set<uint32_t>(wanted.begin(), wanted.end()));
  absl::StatusOr<uint64_t> rows = RestoreShardRows(snapshot, wanted, *map_, tables_, create);
  if (!rows.ok() || !with_windows) return rows;
  ImportShardState(state, [&](uint32_t v) { return std::binary_search(wanted.begin(), wanted.end(), v); });
  if (options_.audit) audit_.Restored(state, wanted, map_->num_vshards());
  RestoreAppliedCounts(snapshot, wanted, applied_);
  return rows;
}

std::string ServerCore::AuditDump() const {
  if (!options_.audit || !map_) return {};
  return tessera::AuditDump(audit_, tables_, *map_, my_rank_);
}

void ServerCore::SendInStream(uint32_t rank, Message m, uint64_t push_id, std::vector<uint64_t> carried, bool more,
                              Nanos now, std::vector<Outgoing>& out) {
  BackupStream& stream = streams_.To(rank, map_->server(rank).node_id());
  Message wire = streams_.Append(stream, std::move(m), push_id, now, std::move(carried), more).message;
  wire.header.set_epoch(map_->epoch());
  out.push_back(Outgoing{map_->server(rank).address(), std::move(wire)});
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
  const uint32_t sender = m.header.sender_id();
  const bool live = clocks_.IsLive(sender);
  const RequestLimits limits{options_.max_keys_per_request, options_.max_table_bytes};
  auto checked = CheckPush(req, m, tables_, *map_, my_rank_, limits, live, live ? clocks_.ClockOf(sender) : 0);
  if (!checked.ok()) return checked.status();
  Table* table = checked->table;
  const std::span<const Key> keys = checked->keys;
  const Columns piece = checked->piece;
  const std::vector<uint32_t>& vshard = checked->vshard;
  NoteTraffic(vshard, keys.empty() ? 0 : m.frames[1].size() / keys.size(), /*push=*/true);
  // The distinct shards this server takes keys of.
  auto mine = [&](uint32_t v) { return map_->ServerRankOf(v) == my_rank_; };
  const std::vector<uint32_t> shards = DistinctShards(vshard, map_->num_vshards(), mine);
  if (shards.empty()) {
    return absl::AbortedError(absl::StrCat("none of the ", keys.size(), " keys of this resend to table ",
                                           req.table_id(), " is in a shard server ", my_rank_,
                                           " is primary of at map epoch ", map_->epoch()));
  }
  const Origin origin{sender, req.incarnation(), req.seq(), req.acked_below()};
  // The rows to apply here: this server's shards that do not have the push yet.
  auto rows = SelectRowsToApply(dedup_, origin, shards, options_.testing.apply_duplicates, m.frames[0], m.frames[1],
                                vshard, checked->row_bytes, checked->all_mine ? std::function<bool(uint32_t)>() : mine);
  if (!rows.ok()) return rows.status();
  if (auto s = table->CheckPush(rows->keys.As<Key>(), rows->values.As<float>(), piece); !s.ok()) return s;
  // Borrowed frames (owner() null: an in-process sender's own memory) may
  // be reused by the sender as soon as it sees the ack: apply those now.
  const bool defer = options_.apply_after_ack && rows->keys.owner() != nullptr && rows->values.owner() != nullptr;
  // The clock the push moves its table's clock to: its stamp, but no further
  // than kPushClockLead past the highest clock any worker announced here
  // ("Push clocks" in server_core.h). Backups get this clock, not the stamp.
  const uint64_t table_clock = PushTableClock(req.clock(), clocks_.highest_clock());
  if (table_clock < req.clock()) stats_.push_clocks_bounded++;
  if (!rows->keys.empty()) {
    if (defer) {
      pending_.push_back(PendingPush{table, rows->keys, rows->values, table_clock, piece});
    } else {
      absl::Status s = table->ApplyPush(rows->keys.As<Key>(), rows->values.As<float>(), table_clock, piece);
      TESSERA_CHECK_MSG(s.ok(), s.message());  // checked above
    }
  }
  RecordApplied(dedup_, applied_, shards, rows->duplicate, origin);
  if (!rows->duplicate.empty()) stats_.duplicate_pushes++;
  AuditApplied(req.table_id(), rows->keys.As<Key>(), origin, piece);

  // Forwards: each backup gets the keys (of this server's shards, applied
  // here now or before) of the shards it backs up; backups de-duplicate.
  const proto::Replicate forward = ForwardOf(origin, req.table_id(), table_clock, piece);
  uint32_t forwards = 0;
  for (BackupForward& f : ForwardsOfPush(*map_, my_rank_, m.frames[0], m.frames[1], vshard, shards, forward,
                                         checked->row_bytes, options_.node_id)) {
    SendInStream(f.rank, std::move(f.message), push_id, {}, /*more=*/false, now, out);
    stats_.forwards_sent++;
    forwards++;
  }
  if (forwards > 0) *shards_out = shards;
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
  const uint32_t rank = RankOfNode(*map_, m.header.sender_id());
  const proto::ReplicateAck& a = m.header.replicate_ack();
  if (!a.rejected()) {
    BackupStreams::AckResult acked = streams_.Acked(rank, a.stream(), a.position(), a.gap(), now);
    for (const Forward& done : acked.done) {
      if (auto in_sync = ShardsInSyncOf(done.message, done.more, rank)) in_sync_.push_back(std::move(*in_sync));
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
    if (!rejection.ok()) stats_.forwards_rejected++;
    out.push_back(Outgoing{h.sender_address(), ReplicateAckOf(options_.node_id, map_->epoch(), r.stream(), position,
                                                              rejection, stale, gap)});
  };
  const ForwardSender sender = CheckForwardSender(h, *map_, options_.testing.accept_old_epoch);
  if (sender.verdict == ForwardSender::Verdict::kIgnore) return;
  if (sender.verdict == ForwardSender::Verdict::kReject) return ack(r.position(), sender.rejection, sender.stale);
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
    absl::Status status = ApplyTransfer(m, sender.from);
    if (status.ok() && r.transfer().vshards_size() > 0 && !r.transfer().continued()) stats_.transfers_applied++;
    ack(r.position(), status);
    return;
  }
  const absl::Status status = ApplyForward(m, sender.from, sender.old_epoch_accepted);
  if (status.ok()) stats_.forwards_applied++;
  ack(r.position(), status);
}

absl::Status ServerCore::ApplyForward(const Message& m, uint32_t from, bool old_epoch_accepted) {
  const proto::Replicate& r = m.header.replicate();
  auto c = CheckForward(m, tables_, *map_, my_rank_, from, !old_epoch_accepted, options_.max_keys_per_request);
  if (!c.ok()) return c.status();
  const std::vector<uint32_t> shards = DistinctShards(c->vshard, map_->num_vshards(), [](uint32_t) { return true; });
  const Origin origin{r.worker_id(), r.incarnation(), r.seq(), r.acked_below()};
  auto rows = SelectRowsToApply(dedup_, origin, shards, options_.testing.apply_duplicates, m.frames[0], m.frames[1],
                                c->vshard, c->row_bytes, nullptr);
  if (!rows.ok()) return rows.status();
  if (!rows->duplicate.empty()) stats_.duplicate_pushes++;
  if (auto s = c->table->ApplyPush(rows->keys.As<Key>(), rows->values.As<float>(), r.clock(), c->piece); !s.ok()) {
    return s;
  }
  RecordApplied(dedup_, applied_, shards, rows->duplicate, origin);
  AuditApplied(r.table_id(), rows->keys.As<Key>(), origin, c->piece);
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
  absl::StatusOr<bool> replaces = ReplacesMap(*map_, *view, options_.testing.accept_old_epoch);
  if (!replaces.ok()) return replaces.status();
  if (!*replaces) return out;
  ApplyPending();  // a transfer below must see every accepted push
  const ShardMapView old = std::move(*map_);
  map_ = std::move(*view);
  if (deposed()) {
    // Another server took over this one's shards: nothing waiting here may
    // be acknowledged; the workers send it again where the map says.
    for (PushAcks::Waiting& w : acks_.TakeAll())
      AnswerAborted(std::move(w), RemovedError(my_rank_, map_->epoch()), map_->epoch(), out);
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
    BackupStream* stream = streams_.Find(rank);
    if (plan.held.empty()) {
      if (stream != nullptr) {
        for (Forward& f : stream->unacked) ForwardsDone(f, absl::OkStatus(), out);
        streams_.End(rank);
      }
      continue;
    }
    std::vector<uint64_t> carried;
    if (stream != nullptr && stream->node_id != map_->server(rank).node_id()) {
      // A new process at this rank: what the old one had not acknowledged
      // reaches it in the transfer, and waits for that.
      carried = CarriedPushes(*stream);
      streams_.End(rank);
      stream = nullptr;
    }
    if (stream != nullptr) {
      // Forwards not yet acknowledged keep only the keys of shards this
      // server still leads and `rank` still backs up (a forward may mix
      // shards; the backup would refuse it whole, and the keys of the
      // shards that stayed must reach it); they go again with the new
      // epoch, in case the backup refused the old one.
      const std::function<bool(uint32_t)> kept = KeptFor(*map_, my_rank_, rank);
      for (Forward& f : stream->unacked) RescopeForward(f.message, kept, *map_, tables_);
      SendForwards(rank, now, out);
    }
    if (!plan.fresh.empty()) SendTransfer(rank, plan.fresh, std::move(carried), now, out);
  }
  moves_.Note(*map_, my_rank_, streams_);
  moves_.Release(streams_, out);
  return out;
}

void ServerCore::LetMovedShardsGo(const ShardMapView& old, std::vector<Outgoing>& out) {
  const ShardsLost lost = ShardsLostIn(old, *map_, my_rank_);
  // A push that touched a moved shard and waits for backups is not
  // acknowledged: its forward may never reach the new primary (refused for
  // the old epoch), so the worker must send it there again; the new primary
  // applies it once (de-duplication) and acknowledges it when its own
  // backups have it.
  if (!lost.moved.empty()) {
    auto moved = [&](uint32_t v) { return lost.moved.contains(v); };
    for (auto& [w, shard] : acks_.TakeTouching(moved)) {
      const absl::Status status = MovedBeforeBackupsError(shard, my_rank_, map_->ServerRankOf(shard), map_->epoch());
      AnswerAborted(std::move(w), status, map_->epoch(), out);
    }
    AbortHeldReplies(moved, out);
  }
  if (lost.released.empty()) return;
  // The shards this server holds no copy of any more: their rows, windows
  // and counts go (a later copy here starts from a state transfer).
  ForgetShards(lost.released);
  for (uint32_t v : lost.released) applied_.erase(v);
  stats_.shards_released += lost.released.size();
}

absl::StatusOr<Buffer> ServerCore::HandlePull(const proto::Pull& req, const Message& m) {
  if (m.frames.size() != 1) {
    return absl::InvalidArgumentError(absl::StrCat("pull needs 1 frame (keys), got ", m.frames.size()));
  }
  stats_.bytes_in += m.FrameBytes();
  auto table = tessera::FindTable(tables_, req.table_id());
  if (!table.ok()) return table.status();
  auto keys = KeysFrame(m, req.num_keys(), req.table_id(), true, &shard_scratch_);
  if (!keys.ok()) return keys.status();
  if (auto s = CheckGrowth(**table, *keys, options_.max_table_bytes); !s.ok()) return s;
  NoteTraffic(shard_scratch_, size_t{(*table)->width()} * sizeof(float), /*push=*/false);
  // Large rows go out as views of table memory (copy-on-write protects them
  // from later pushes while the reply is in flight); the rest is copied.
  return (*table)->ReadRowsShared(*keys, options_.pool);
}

}  // namespace tessera

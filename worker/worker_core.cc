// WorkerCore: the worker's data protocol as a pure state machine (see
// worker/worker_core.h). Moved out of the Worker shell (worker/worker.cc),
// which now only locks around it and hands its Effects to the transport.
#include "worker/worker_core.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "compress/row_compressor.h"

namespace tessera {

namespace {

// Calls single(server) if every key lives on one server, else multi(server,
// rows of that server) for each server that holds some keys.
template <typename Single, typename Multi>
void Slice(const ShardMapView& map, uint32_t table, std::span<const Key> keys, Single&& single, Multi&& multi) {
  const uint32_t first = map.ServerRankOfKey(table, keys[0]);
  std::vector<uint32_t> owner(keys.size());
  bool all_same = true;
  for (size_t i = 0; i < keys.size(); ++i) {
    owner[i] = map.ServerRankOfKey(table, keys[i]);
    all_same &= owner[i] == first;
  }
  if (all_same) {
    single(first);
    return;
  }
  std::vector<std::vector<uint32_t>> rows(map.num_servers());
  for (size_t i = 0; i < keys.size(); ++i) rows[owner[i]].push_back(static_cast<uint32_t>(i));
  for (uint32_t s = 0; s < rows.size(); ++s)
    if (!rows[s].empty()) multi(s, rows[s]);
}

// A compressed pull reply becomes a plain one (one fp32 values frame), so
// the tracker scatters it as usual; bad parts turn it into an Error reply.
// `expected`: the values the pull asked for (0: no such pull in flight, and
// the tracker will ignore the reply). Nothing is allocated before the
// reply's size and its parts' headers agree with it.
void DecodePullReply(Message& m, uint64_t expected) {
  const auto& pr = m.header.pull_reply();
  const uint64_t n = pr.num_keys() * uint64_t{pr.width()};
  absl::Status s;
  if (m.frames.size() != pr.value_parts()) {
    s = absl::InvalidArgumentError(absl::StrCat("pull reply announces ", pr.value_parts(), " parts, has ",
                                                m.frames.size(), " frames"));
  } else if (n != expected) {
    s = absl::InvalidArgumentError(absl::StrCat("pull reply of ", n, " values to a pull of ", expected));
  } else {
    s = compress::CheckRowParts(m.frames, n);
  }
  if (s.ok()) {
    Buffer decoded = Buffer::Allocate(n * sizeof(float));
    s = compress::DecodeRowParts(m.frames, decoded.AsMutable<float>());
    if (s.ok()) {
      m.frames.clear();
      m.frames.push_back(std::move(decoded));
      m.header.mutable_pull_reply()->set_value_parts(0);
      return;
    }
  }
  m.frames.clear();
  auto* e = m.header.mutable_error();
  e->set_code(static_cast<int>(absl::StatusCode::kDataLoss));
  e->set_message(absl::StrCat("compressed pull reply: ", s.message()));
}

}  // namespace

absl::StatusOr<std::unique_ptr<WorkerCore>> WorkerCore::Create(WorkerCoreOptions options,
                                                               const proto::ShardMap& map) {
  auto view = ShardMapView::Create(map);
  if (!view.ok()) return view.status();
  std::vector<std::string> names;
  for (size_t r = 0; r < view->num_servers(); ++r) names.push_back(view->server(r).address());
  return std::unique_ptr<WorkerCore>(
      new WorkerCore(std::move(options), std::make_shared<const ShardMapView>(std::move(*view)), std::move(names)));
}

WorkerCore::WorkerCore(WorkerCoreOptions options, std::shared_ptr<const ShardMapView> map,
                       std::vector<std::string> names)
    : options_(std::move(options)),
      map_(std::move(map)),
      tracker_(std::move(names), RetransmitOptions{.initial = options_.resend_after,
                                                   .floor = options_.resend_floor,
                                                   .ceiling = options_.resend_ceiling,
                                                   .bytes_per_second = options_.resend_bytes_per_second}) {}

Message WorkerCore::NewRequest() {
  Message m;
  m.header.set_request_id(++next_request_);
  m.header.set_sender_id(options_.node_id);
  m.header.set_epoch(map_->epoch());
  // The transport stamps this too; set here, the header the wire counts
  // measure is the one that is sent.
  m.header.set_sender_address(options_.address);
  return m;
}

WorkerCore::Effects WorkerCore::ToEveryServer(Handle handle, std::string what, const proto::Envelope& body, Nanos now,
                                              Nanos hold) {
  Effects effects;
  std::vector<RequestTracker::PartSpec> parts;
  for (uint32_t r : map_->LiveServers()) {
    Message m = NewRequest();
    m.header.MergeFrom(body);
    parts.push_back({m.header.request_id(), r, {}, m});
    effects.sends.push_back({map_->server(r).address(), std::move(m)});
  }
  // `hold` is how long servers may hold the request for slower workers, on
  // top of the request timeout.
  tracker_.Begin(std::move(handle), std::move(what), std::move(parts), now + options_.request_timeout + hold, {}, 0,
                 now);
  return effects;
}

WorkerCore::Effects WorkerCore::CreateTable(Handle handle, const proto::TableConfig& config, Nanos now) {
  asp_tables_[config.table_id()] = config.consistency() == proto::ASP;
  proto::Envelope body;
  *body.mutable_create_table()->mutable_config() = config;
  return ToEveryServer(std::move(handle), absl::StrCat("create table ", config.table_id()), body, now, 0);
}

WorkerCore::Effects WorkerCore::ClockQuery(Handle handle, Nanos now) {
  proto::Envelope body;
  body.mutable_clock_query();
  return ToEveryServer(std::move(handle), "clock query", body, now, 0);
}

WorkerCore::Effects WorkerCore::JoinClock(Handle handle, uint32_t rank, Nanos now) {
  proto::Envelope body;
  body.mutable_clock_query()->set_join(true);
  body.mutable_clock_query()->set_rank(rank);
  return ToEveryServer(std::move(handle), "clock query (joining)", body, now, 0);
}

WorkerCore::Effects WorkerCore::ClockAdvance(Handle handle, uint64_t clock, Nanos now) {
  announced_clock_ = std::max(announced_clock_, clock);
  proto::Envelope body;
  body.mutable_clock_advance()->set_clock(clock);
  body.mutable_clock_advance()->set_hold_timeout_ms(options_.hold_timeout / kMillis);
  return ToEveryServer(std::move(handle), absl::StrCat("clock ", clock), body, now, options_.hold_timeout);
}

Outgoing WorkerCore::ClockNoticeTo(std::string address, uint64_t clock) {
  Message m = NewRequest();
  m.header.set_request_id(0);  // a notice: servers record it and answer nothing
  m.header.mutable_clock_advance()->set_clock(clock);
  return {std::move(address), std::move(m)};
}

std::vector<Outgoing> WorkerCore::ClockNotice(uint64_t clock) {
  announced_clock_ = std::max(announced_clock_, clock);
  std::vector<Outgoing> sends;
  for (uint32_t r : map_->LiveServers()) sends.push_back(ClockNoticeTo(map_->server(r).address(), clock));
  return sends;
}

namespace {

// The error of a push whose rows do not fit a message and may not be cut.
absl::Status RowTooWide(const std::string& what, size_t row_bytes, size_t max_message_bytes, bool compressed) {
  return absl::InvalidArgumentError(absl::StrCat(
      what, ": a row of ", row_bytes, " bytes does not fit in one message of at most ", max_message_bytes,
      " bytes (the servers' --max-message-mb, the worker's --transfer_max_message_mb; limits.max_message_mb in "
      "the launcher), and this push cannot go in pieces of rows (", compressed ? "it is compressed" :
      "the table's optimizer needs whole rows", ")"));
}

// The keys and rows of positions `rows` of a push, copied together (the
// keys of one server among others').
std::pair<Buffer, Buffer> GatherRows(std::span<const Key> keys, std::span<const float> values,
                                     std::span<const uint32_t> rows, size_t row_bytes) {
  const auto* src = reinterpret_cast<const std::byte*>(values.data());
  Buffer k = Buffer::Allocate(rows.size() * sizeof(Key));
  Buffer v = Buffer::Allocate(rows.size() * row_bytes);
  auto kd = k.AsMutable<Key>();
  auto* vd = v.mutable_data();
  for (size_t i = 0; i < rows.size(); ++i) {
    kd[i] = keys[rows[i]];
    std::memcpy(vd + i * row_bytes, src + size_t{rows[i]} * row_bytes, row_bytes);
  }
  return {std::move(k), std::move(v)};
}

}  // namespace

absl::StatusOr<WorkerCore::Effects> WorkerCore::Push(Handle handle, uint32_t table, std::span<const Key> keys,
                                                     std::span<const float> values, uint32_t width, uint64_t clock,
                                                     compress::RowCompressor* compressor, Nanos now,
                                                     std::string what, int32_t priority, bool row_pieces) {
  if (what.empty()) what = absl::StrCat("push to table ", table);
  const size_t row_bytes = size_t{width} * sizeof(float);
  const size_t rows_per_part = RowsPerPart(row_bytes);
  // Rows wider than a part go in pieces of columns (uncompressed pushes of
  // tables that allow it), each a slice of the caller's row.
  const size_t piece_columns = PieceColumns(row_bytes, compressor == nullptr && row_pieces);
  if (piece_columns == 0 && !keys.empty() && sizeof(Key) + row_bytes > MessageBudget()) {
    return RowTooWide(what, row_bytes, options_.max_message_bytes, compressor != nullptr);
  }
  const ShardMapView& map = *map_;
  Effects effects;
  std::vector<RequestTracker::PartSpec> parts;
  absl::Status encode_error;
  // Every part of this push carries its number: servers apply it once per
  // shard, however often a failover makes us send it. Split into parts
  // (part_bytes), each part has its own number, so that two parts reaching
  // the same shard are both applied. acked_below is the lowest number still
  // in flight (every push numbered below it is complete).
  const bool number_per_part = options_.part_bytes > 0 || piece_columns > 0 || keys.size() > rows_per_part;
  const uint64_t first_seq = last_push_seq_ + 1;
  const uint64_t acked_below = pushes_in_flight_.empty() ? first_seq : *pushes_in_flight_.begin();
  auto next_seq = [&] {
    pushes_in_flight_.insert(++last_push_seq_);
    return last_push_seq_;
  };
  if (!number_per_part) next_seq();
  // A part: n keys, and their whole rows or (columns > 0) those columns of
  // one row from first_column.
  auto add_part = [&](uint32_t server, Buffer k, Buffer v, uint64_t n, uint32_t first_column = 0,
                      uint32_t columns = 0) {
    Message m = NewRequest();
    auto* p = m.header.mutable_push();
    p->set_table_id(table);
    p->set_num_keys(n);
    p->set_clock(clock);
    p->set_first_column(first_column);
    p->set_columns(columns);
    p->set_seq(number_per_part ? next_seq() : first_seq);
    p->set_acked_below(acked_below);
    p->set_incarnation(options_.incarnation);
    std::optional<compress::EncodedRows> encoded;
    if (compressor != nullptr) {
      auto e = compressor->Encode(k.As<Key>(), v.As<float>());
      if (!e.ok()) {
        encode_error.Update(e.status());
        return;
      }
      if (!e->raw) encoded = std::move(*e);
    }
    m.frames.push_back(std::move(k));
    if (encoded) {
      p->set_value_parts(static_cast<uint32_t>(encoded->parts.size()));
      for (Buffer& b : encoded->parts) m.frames.push_back(std::move(b));
    } else {
      m.frames.push_back(std::move(v));
    }
    const uint64_t id = m.header.request_id();
    const uint64_t bytes = columns > 0 ? uint64_t{columns} * sizeof(float) : n * row_bytes;
    parts.push_back({id, server, {}, std::move(m), {priority, id, bytes}});
  };
  // Key i's row from column c, in pieces: slices of the caller's row.
  auto add_pieces = [&](uint32_t server, size_t i) {  // key i and its row: slices of the caller's memory
    for (size_t c = 0; c < width && encode_error.ok(); c += piece_columns) {
      const size_t n = std::min(piece_columns, width - c);
      add_part(server, Buffer::Borrow(keys.data() + i, sizeof(Key)),
               Buffer::Borrow(values.data() + i * width + c, n * sizeof(float)), 1, static_cast<uint32_t>(c),
               static_cast<uint32_t>(n));
    }
  };
  // Pieces where the row must be cut to fit a message, where part_bytes
  // asks for them, or (row_piece_bytes) where the server is not one that
  // rows go to whole.
  const bool must_cut = sizeof(Key) + row_bytes > MessageBudget() || options_.part_bytes > 0;
  auto pieces_to = [&](uint32_t server) {
    return piece_columns > 0 &&
           (must_cut || !options_.whole_rows_to || !options_.whole_rows_to(map.server(server).address()));
  };
  Slice(map, table, keys, [&](uint32_t server) {  // all keys on one server: no copy (slices of the caller's memory)
    if (pieces_to(server)) {
      for (size_t i = 0; i < keys.size() && encode_error.ok(); ++i) add_pieces(server, i);
      return;
    }
    for (size_t b = 0; b < keys.size() && encode_error.ok(); b += rows_per_part) {
      const size_t n = std::min(rows_per_part, keys.size() - b);
      add_part(server, Buffer::Borrow(keys.data() + b, n * sizeof(Key)),
               Buffer::Borrow(values.data() + b * width, n * row_bytes), n);
    }
  }, [&](uint32_t server, const std::vector<uint32_t>& rows) {
    if (pieces_to(server)) {
      for (size_t r = 0; r < rows.size() && encode_error.ok(); ++r) add_pieces(server, rows[r]);
      return;
    }
    for (size_t b = 0; b < rows.size() && encode_error.ok(); b += rows_per_part) {
      const size_t n = std::min(rows_per_part, rows.size() - b);
      auto [k, v] = GatherRows(keys, values, std::span(rows).subspan(b, n), row_bytes);
      add_part(server, std::move(k), std::move(v), n);
    }
  });
  if (!encode_error.ok()) {
    // Nothing was registered or sent: the numbers are no longer in flight
    // (they are spent, not reused).
    for (uint64_t seq = first_seq; seq <= last_push_seq_; ++seq) pushes_in_flight_.erase(seq);
    return absl::Status(encode_error.code(), absl::StrCat(what, ": compressing: ", encode_error.message()));
  }
  for (RequestTracker::PartSpec& part : parts) Dispatch(part, effects);
  push_seq_of_[handle.get()] = {first_seq, last_push_seq_};
  tracker_.Begin(std::move(handle), std::move(what), std::move(parts), now + options_.request_timeout, {}, 0, now);
  Pump(now, effects);
  return effects;
}

WorkerCore::Effects WorkerCore::Pull(Handle handle, uint32_t table, std::span<const Key> keys,
                                     RequestTracker::Destination dest, uint32_t width, uint64_t clock, Nanos now,
                                     std::string what, int32_t priority) {
  if (what.empty()) what = absl::StrCat("pull from table ", table, " at clock ", clock);
  const size_t row_bytes = size_t{width} * sizeof(float);
  const size_t rows_per_part = RowsPerPart(row_bytes);
  const ShardMapView& map = *map_;
  // Nobody holds a pull of an ASP table: no hold time on top of the timeout.
  const auto asp = asp_tables_.find(table);
  const Nanos hold = asp != asp_tables_.end() && asp->second ? 0 : options_.hold_timeout;
  Effects effects;
  std::vector<RequestTracker::PartSpec> parts;
  auto add_part = [&](uint32_t server, Buffer k, RequestTracker::Scatter scatter) {
    Message m = NewRequest();
    auto* p = m.header.mutable_pull();
    p->set_table_id(table);
    p->set_num_keys(scatter.num_keys);
    p->set_clock(clock);
    p->set_hold_timeout_ms(hold / kMillis);
    p->set_whole(dest.view != nullptr);  // a view keeps the reply as it arrives: no pieces to assemble
    m.frames.push_back(std::move(k));
    const uint64_t id = m.header.request_id();
    const uint64_t bytes = scatter.num_keys * row_bytes;
    parts.push_back({id, server, std::move(scatter), std::move(m), {priority, id, bytes}});
  };
  Slice(map, table, keys, [&](uint32_t server) {
    for (size_t b = 0; b < keys.size(); b += rows_per_part) {
      const size_t n = std::min(rows_per_part, keys.size() - b);
      add_part(server, Buffer::Borrow(keys.data() + b, n * sizeof(Key)), {b, {}, n});
    }
  }, [&](uint32_t server, const std::vector<uint32_t>& rows) {
    for (size_t b = 0; b < rows.size(); b += rows_per_part) {
      const size_t n = std::min(rows_per_part, rows.size() - b);
      Buffer k = Buffer::Allocate(n * sizeof(Key));
      auto kd = k.AsMutable<Key>();
      for (size_t i = 0; i < n; ++i) kd[i] = keys[rows[b + i]];
      add_part(server, std::move(k), {0, std::vector<uint32_t>(rows.begin() + b, rows.begin() + b + n), n});
    }
  });
  for (RequestTracker::PartSpec& part : parts) Dispatch(part, effects);
  // Servers may hold a pull for slower workers up to hold_timeout, on top of
  // the request timeout (not one of an ASP table).
  tracker_.Begin(std::move(handle), std::move(what), std::move(parts), now + options_.request_timeout + hold, dest,
                 width, now);
  Pump(now, effects);
  return effects;
}

size_t WorkerCore::MessageBudget() const {
  const size_t limit = options_.max_message_bytes;
  if (limit == 0) return std::numeric_limits<size_t>::max();
  return limit - std::max(limit / 64, std::min<size_t>(limit / 2, 4096));  // room for the header
}

size_t WorkerCore::PieceColumns(size_t row_bytes, bool allowed) const {
  size_t piece_bytes = options_.part_bytes > 0       ? options_.part_bytes
                       : options_.row_piece_bytes > 0 ? options_.row_piece_bytes
                                                      : std::numeric_limits<size_t>::max();
  const size_t budget = MessageBudget();
  if (sizeof(Key) + row_bytes > budget) piece_bytes = std::min(piece_bytes, budget - std::min(budget, sizeof(Key)));
  if (!allowed || row_bytes <= piece_bytes) return 0;
  const size_t columns = std::max<size_t>(1, piece_bytes / sizeof(float));
  return columns * sizeof(float) >= row_bytes ? 0 : columns;  // a "piece" of the whole row is the row
}

size_t WorkerCore::RowsPerPart(size_t row_bytes) const {
  size_t rows = std::numeric_limits<size_t>::max();
  if (options_.part_bytes > 0 && row_bytes > 0) rows = std::max<size_t>(1, options_.part_bytes / row_bytes);
  const size_t budget = MessageBudget();
  if (budget != std::numeric_limits<size_t>::max()) rows = std::min(rows, std::max<size_t>(1, budget / (sizeof(Key) + row_bytes)));
  return rows;
}

WorkerCore::Effects WorkerCore::OnReply(Message reply, std::optional<Nanos> now) {
  Effects effects;
  if (reply.header.has_pull_reply()) {
    if (reply.header.pull_reply().value_parts() > 0) {
      DecodePullReply(reply, tracker_.ExpectedValues(reply.header.request_id()));
    }
  } else if (reply.header.has_clock_ack()) {
    known_clock_ = std::max(known_clock_, reply.header.clock_ack().worker_clock());
  }
  effects.done = tracker_.OnReply(reply, now.value_or(-1));
  Forget(effects.done);
  Pump(now.value_or(last_now_), effects);
  return effects;
}

WorkerCore::Effects WorkerCore::OnMapUpdate(const proto::ShardMap& map, Nanos now, bool* changed) {
  if (changed != nullptr) *changed = false;
  Effects effects;
  auto view = ShardMapView::Create(map);
  if (!view.ok() || view->epoch() <= map_->epoch()) return effects;
  // Servers new to this worker (added to the job, or a rank now held by
  // another process) have not heard the clock it announced: tell them first,
  // ahead of anything else this map sends them (one worker's messages to one
  // server arrive in order). Without it a server that joined after the
  // worker's last Clock() holds its pulls for a clock the worker already
  // announced elsewhere, and the job waits forever (simulator, seed 160843).
  std::vector<std::string> fresh;
  if (announced_clock_ > 0) {
    const std::vector<uint32_t> was_live = map_->LiveServers();
    for (uint32_t r : view->LiveServers()) {
      const bool known = r < map_->num_servers() && map_->server(r).node_id() == view->server(r).node_id() &&
                         std::find(was_live.begin(), was_live.end(), r) != was_live.end();
      if (!known) fresh.push_back(view->server(r).address());
    }
  }
  map_ = std::make_shared<const ShardMapView>(std::move(*view));
  if (changed != nullptr) *changed = true;
  for (std::string& to : fresh) effects.sends.push_back(ClockNoticeTo(std::move(to), announced_clock_));
  // A server was lost (or moved): resend what went to it, and what waited
  // for this map.
  SendAgain(now, false, effects);
  RouteQueued(now, effects);
  Pump(now, effects);
  return effects;
}

WorkerCore::Effects WorkerCore::Tick(Nanos now) {
  Effects effects;
  effects.done = tracker_.Tick(now);
  Forget(effects.done);
  // Parts a lagging server refused go again with our map, and parts nobody
  // answered for their server's resend timer go again (a lost message).
  SendAgain(now, options_.resend_after > 0, effects);
  Pump(now, effects);
  return effects;
}

WorkerCore::Effects WorkerCore::OnLinkRestored(const std::string& address, Nanos now) {
  Effects effects;
  const std::optional<uint32_t> rank = RankAt(address);
  if (!rank) return effects;
  if (tracker_.LinkRestored(*rank) > 0) SendAgain(now, false, effects);
  Pump(now, effects);
  return effects;
}

void WorkerCore::OnLinkDown(const std::string& address) {
  if (const std::optional<uint32_t> rank = RankAt(address)) tracker_.LinkDown(*rank, true);
}

std::optional<uint32_t> WorkerCore::RankAt(const std::string& address) const {
  for (uint32_t r = 0; r < map_->num_servers(); ++r)
    if (!map_->IsDead(r) && map_->server(r).address() == address) return r;
  return std::nullopt;
}

Nanos WorkerCore::NextResendDue() const {
  return options_.resend_after > 0 ? tracker_.NextDue() : std::numeric_limits<Nanos>::max();
}

WorkerCore::Effects WorkerCore::FailAll(const absl::Status& status) {
  Effects effects;
  effects.done = tracker_.FailAll(status);
  Forget(effects.done);
  Pump(last_now_, effects);  // drops what waited in the queues
  return effects;
}

void WorkerCore::Forget(const std::vector<Completion>& done) {
  for (const Completion& c : done) {
    auto it = push_seq_of_.find(c.handle.get());
    if (it == push_seq_of_.end()) continue;
    for (uint64_t seq = it->second.first; seq <= it->second.second; ++seq) pushes_in_flight_.erase(seq);
    push_seq_of_.erase(it);
  }
}

// Sends again, by the current map, the parts the tracker hands back (and,
// with `silence`, those unanswered past their timer: see the tracker).
void WorkerCore::SendAgain(Nanos now, bool silence, Effects& effects) {
  const std::shared_ptr<const ShardMapView> map = map_;
  std::vector<Completion> done;
  for (RequestTracker::Resend& r : tracker_.TakeResends(
           map->epoch(), [&](uint32_t rank) { return map->IsDead(rank); }, &done, now, silence)) {
    for (auto& c : tracker_.Reissue(r, Redirect(r, effects), now)) done.push_back(std::move(c));
    effects.resent_parts++;
  }
  Forget(done);
  for (Completion& c : done) effects.done.push_back(std::move(c));
}

// The requests that replace part `r` under the current map (sent or
// queued, see Dispatch), marked Message::at_once: a resend goes to a server
// that has not answered, so a transport that holds requests until the
// answer comes (transport/coalescing_transport.h) must not hold it. A push goes whole, marked as a resend, to every
// server that is now the primary of some of its keys (each takes its own;
// the same bytes, so a compressed push is not encoded twice). A pull is
// split by primary. Parts keep their transfer priority and place.
std::vector<RequestTracker::PartSpec> WorkerCore::Redirect(const RequestTracker::Resend& r, Effects& effects) {
  const ShardMapView& map = *map_;
  std::vector<RequestTracker::PartSpec> parts;
  const proto::Envelope& h = r.request.header;
  // Every send after the first names the first (a server holding it keeps that one).
  const uint64_t first_id = h.first_request_id() != 0 ? h.first_request_id() : h.request_id();
  if (!h.has_push() && !h.has_pull()) {  // a clock, a table, a query: again, to the same server (never queued)
    Message m = r.request;
    m.header.set_request_id(++next_request_);
    m.header.set_first_request_id(first_id);
    m.header.set_epoch(map.epoch());
    m.at_once = true;
    parts.push_back({m.header.request_id(), r.server_rank, {}, m});
    effects.sends.push_back({map.server(r.server_rank).address(), std::move(m)});
    return parts;
  }
  if (h.epoch() == map.epoch() && !map.IsDead(r.server_rank)) {
    // Sent under this very map (silent, or refused by a server whose map
    // was behind): its route has not changed, so it goes again where it
    // went, as it is. (Sending such a push whole to every primary of its
    // keys made a copy per primary at every resend; with two lagging
    // servers refusing theirs the copies doubled each time, until the
    // simulator ran out of memory: seed 30783.)
    Message m = r.request;
    m.header.set_request_id(++next_request_);
    m.header.set_first_request_id(first_id);
    m.at_once = true;
    if (h.has_push()) m.header.mutable_push()->set_resend(true);
    parts.push_back({m.header.request_id(), r.server_rank, r.scatter, std::move(m), r.transfer});
    Dispatch(parts.back(), effects);
    return parts;
  }
  const uint32_t table = h.has_push() ? h.push().table_id() : h.pull().table_id();
  const auto keys = r.request.frames[0].As<Key>();
  std::vector<std::vector<uint32_t>> rows(map.num_servers());
  for (size_t i = 0; i < keys.size(); ++i) rows[map.ServerRankOfKey(table, keys[i])].push_back(static_cast<uint32_t>(i));
  for (uint32_t s = 0; s < rows.size(); ++s) {
    if (rows[s].empty()) continue;
    Message m;
    m.header = h;
    m.header.set_request_id(++next_request_);
    m.header.set_first_request_id(first_id);
    m.header.set_epoch(map.epoch());
    m.at_once = true;
    RequestTracker::Scatter scatter;
    RequestTracker::Transfer transfer = r.transfer;
    if (h.has_push()) {
      m.header.mutable_push()->set_resend(true);
      m.frames = r.request.frames;
    } else if (rows[s].size() == keys.size()) {
      m.frames = r.request.frames;
      scatter = r.scatter;
    } else {
      Buffer k = Buffer::Allocate(rows[s].size() * sizeof(Key));
      auto kd = k.AsMutable<Key>();
      for (size_t i = 0; i < rows[s].size(); ++i) {
        const uint32_t row = rows[s][i];
        kd[i] = keys[row];
        scatter.rows.push_back(r.scatter.rows.empty() ? static_cast<uint32_t>(r.scatter.first_row + row)
                                                      : r.scatter.rows[row]);
      }
      scatter.num_keys = rows[s].size();
      m.header.mutable_pull()->set_num_keys(rows[s].size());
      m.frames.push_back(std::move(k));
      transfer.bytes = r.transfer.bytes / keys.size() * rows[s].size();
    }
    parts.push_back({m.header.request_id(), s, std::move(scatter), std::move(m), transfer});
    Dispatch(parts.back(), effects);
  }
  return parts;
}

void WorkerCore::RouteQueued(Nanos now, Effects& effects) {
  if (!scheduled()) return;
  const ShardMapView& map = *map_;
  std::vector<Completion> done;
  // Only parts queued for a server the map names dead go again now. A part
  // whose keys moved to another live server is sent where it was queued:
  // that server answers Aborted at the newer epoch and the part goes again
  // by the map, as a part in flight does. (Routing such parts here sent a
  // push whole to every primary of its keys, each copy again at the next
  // map, and so on: the simulator found the copies doubling with every map,
  // seed 14713, out of memory.)
  for (RequestTracker::Resend& r :
       tracker_.TakeQueued([&](uint32_t rank, const Message&) { return map.IsDead(rank); })) {
    for (auto& c : tracker_.Reissue(r, Redirect(r, effects), now)) done.push_back(std::move(c));
  }
  Forget(done);
  for (Completion& c : done) effects.done.push_back(std::move(c));
}

void WorkerCore::Dispatch(RequestTracker::PartSpec& part, Effects& effects) {
  Outgoing send{map_->server(part.server_rank).address(), part.request};
  if (!scheduled()) {
    effects.sends.push_back(std::move(send));
    return;
  }
  part.queued = true;
  ServerQueue& q = queues_[part.server_rank];
  const bool push = part.request.header.has_push();
  const RequestTracker::Transfer& t = part.transfer;
  q.queue.emplace(QueueKey{t.priority, t.order, part.request_id}, Queued{t.bytes, push, std::move(send)});
  if (push) q.pushes.emplace(t.order, t.priority, part.request_id);
}

void WorkerCore::Pump(Nanos now, Effects& effects) {
  if (!scheduled()) return;
  last_now_ = std::max(last_now_, now);
  const uint64_t bound = options_.max_bytes_in_flight_per_server;
  for (auto& [rank, q] : queues_) {
    // Answered (or parked, or taken for a resend, or ended) parts free their bytes.
    for (auto it = q.in_flight.begin(); it != q.in_flight.end();) {
      if (tracker_.Awaiting(it->first)) {
        ++it;
        continue;
      }
      q.in_flight_bytes -= it->second;
      q.in_flight.erase(it++);
    }
    while (!q.queue.empty()) {
      auto next = q.queue.begin();
      // A pull never overtakes an earlier push to the same server.
      if (!next->second.push && !q.pushes.empty() && std::get<0>(*q.pushes.begin()) < next->first.order) {
        const auto& [order, priority, id] = *q.pushes.begin();
        next = q.queue.find(QueueKey{priority, order, id});
      }
      const QueueKey key = next->first;
      const bool fits = q.in_flight_bytes == 0 || q.in_flight_bytes + next->second.bytes <= bound;
      const bool live = tracker_.Queued(key.request_id);
      if (live && !fits) break;
      if (live) {
        tracker_.MarkSent(key.request_id, now);
        q.in_flight.emplace(key.request_id, next->second.bytes);
        q.in_flight_bytes += next->second.bytes;
        effects.sends.push_back(std::move(next->second.send));
      }
      if (next->second.push) q.pushes.erase({key.order, key.priority, key.request_id});
      q.queue.erase(next);
    }
  }
}

uint64_t WorkerCore::bytes_in_flight(uint32_t rank) const {
  auto it = queues_.find(rank);
  return it == queues_.end() ? 0 : it->second.in_flight_bytes;
}

}  // namespace tessera

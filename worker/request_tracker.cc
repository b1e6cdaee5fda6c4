#include "worker/request_tracker.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"

namespace tessera {

std::string RequestTracker::ServerName(uint32_t rank) const {
  if (rank < server_names_.size()) return absl::StrCat("server ", rank, " (", server_names_[rank], ")");
  return absl::StrCat("server ", rank);
}

void RequestTracker::Begin(Handle handle, std::string what, std::vector<PartSpec> parts, Nanos deadline,
                           Destination dest, uint32_t width, Nanos now) {
  auto op = std::make_unique<Op>();
  op->handle = std::move(handle);
  op->what = std::move(what);
  op->out = dest.out;
  op->view = dest.view;
  if (op->view != nullptr) {
    uint64_t rows = 0;
    for (const PartSpec& p : parts) rows += p.scatter.num_keys;
    op->view->Reset(rows, width);
  }
  op->width = width;
  op->deadline = deadline;
  op->begun = now;
  op->serial = next_op_serial_++;
  op->remaining = parts.size();
  Op* raw = op.get();
  for (PartSpec& p : parts) {
    raw->request_ids.push_back(p.request_id);
    Part& part = parts_.emplace(p.request_id, Part{raw, p.server_rank, std::move(p.scatter), std::move(p.request)})
                     .first->second;
    part.sent_at = now;
    part.transfer = p.transfer;
    part.queued = p.queued;
    if (!part.queued) Sent(part, now);
  }
  ops_.emplace(raw, std::move(op));
}

TimerLane RequestTracker::LaneOf(const Part& part) {
  return part.request.header.has_push() ? TimerLane::kPushes : TimerLane::kRequests;
}

RequestTracker::Peer& RequestTracker::PeerOf(uint32_t rank) {
  auto it = peers_.find(rank);
  if (it == peers_.end()) it = peers_.emplace(rank, Peer{{RetransmitTimer(retransmit_), RetransmitTimer(retransmit_)}}).first;
  return it->second;
}

void RequestTracker::Sent(Part& part, Nanos now) {
  Uncount(part);
  part.sent_at = now;
  part.due = false;
  part.wire_bytes = part.request.FrameBytes() + part.scatter.num_keys * part.op->width * sizeof(float);
  Peer& peer = PeerOf(part.server_rank);
  peer.awaiting += part.wire_bytes;
  part.ahead_bytes = peer.awaiting;
  part.counted = true;
}

void RequestTracker::Uncount(Part& part) {
  if (!part.counted) return;
  part.counted = false;
  Peer& peer = PeerOf(part.server_rank);
  peer.awaiting -= std::min(peer.awaiting, part.wire_bytes);
}

Nanos RequestTracker::DueAt(const Part& part) const {
  if (part.parked || part.queued || part.request.header.body_case() == proto::Envelope::BODY_NOT_SET) {
    return std::numeric_limits<Nanos>::max();
  }
  if (part.due) return std::numeric_limits<Nanos>::min();
  auto it = peers_.find(part.server_rank);
  if (part.received != 0 || (it != peers_.end() && it->second.link_down)) return std::numeric_limits<Nanos>::max();
  const Nanos wait = it == peers_.end() ? RetransmitTimer(retransmit_).After(part.resends, part.ahead_bytes)
                                        : it->second.timers[static_cast<size_t>(LaneOf(part))].After(
                                              part.resends, part.ahead_bytes);
  return part.sent_at + wait;
}

bool RequestTracker::SilentPast(const Part& part, Nanos now) const {
  const Nanos due = DueAt(part);
  return due != std::numeric_limits<Nanos>::max() && now >= due;
}

Nanos RequestTracker::NextDue() const {
  Nanos next = std::numeric_limits<Nanos>::max();
  for (const auto& [id, part] : parts_) next = std::min(next, DueAt(part));
  return next;
}

Nanos RequestTracker::ShortestTimer() const {
  Nanos shortest = RetransmitTimer(retransmit_).rto();
  for (const auto& [rank, peer] : peers_) {
    for (const RetransmitTimer& timer : peer.timers) shortest = std::min(shortest, timer.rto());
  }
  return shortest;
}

size_t RequestTracker::LinkRestored(uint32_t rank) {
  PeerOf(rank).link_down = false;
  size_t n = 0;
  for (auto& [id, part] : parts_) {
    if (part.server_rank != rank || part.parked || part.queued ||
        part.request.header.body_case() == proto::Envelope::BODY_NOT_SET) {
      continue;
    }
    part.due = true;
    part.received = 0;  // its reply starts over under the new id
    part.assembled = Buffer();
    ++n;
  }
  return n;
}

void RequestTracker::LinkDown(uint32_t rank, bool down) { PeerOf(rank).link_down = down; }

std::vector<RequestTracker::ServerTimer> RequestTracker::Timers() const {
  std::vector<ServerTimer> out;
  for (const auto& [rank, peer] : peers_) {
    const size_t before = out.size();
    for (size_t lane = 0; lane < kLanes; ++lane) {
      const RetransmitTimer& timer = peer.timers[lane];
      if (timer.samples() == 0 && peer.resends[lane] == 0) continue;  // never used on this lane
      out.push_back(ServerTimer{rank, static_cast<TimerLane>(lane), timer.rto(), timer.smoothed(), timer.variation(),
                                timer.samples(), peer.resends[lane], peer.link_down});
    }
    // Neither lane answered or resent yet: the server still shows (its
    // initial timer, its link), on the requests lane.
    if (out.size() == before) {
      const RetransmitTimer& timer = peer.timers[0];
      out.push_back(ServerTimer{rank, TimerLane::kRequests, timer.rto(), timer.smoothed(), timer.variation(), 0, 0,
                                peer.link_down});
    }
  }
  std::sort(out.begin(), out.end(), [](const ServerTimer& a, const ServerTimer& b) {
    return std::pair(a.rank, a.lane) < std::pair(b.rank, b.lane);
  });
  return out;
}

namespace {

constexpr size_t kPieceDescriptorBytes = 16;  // {offset, total} as uint64 (server/server_core.h)

// Copies bytes [offset, offset + len) of a part's values, which `src` holds
// from its start (rows of row_bytes, row i going to output row rows[i], or
// first_row + i when rows is empty). Rows that land next to each other are
// copied as one range. `src` may be a frame lent by a same-host server
// (Buffer::remote()): then all ranges are read in one CopyOut, or, when the
// ranges are small (a cross-memory read costs per range), the frame is read
// whole into `scratch` and scattered from there.
absl::Status PlaceBytes(const RequestTracker::Scatter& sc, std::byte* dst, const Buffer& src, uint64_t offset,
                        uint64_t len, size_t row_bytes, std::vector<std::byte>& scratch) {
  if (sc.rows.empty()) {
    const CopyRange whole{0, dst + sc.first_row * row_bytes + offset, len};
    return src.CopyOut({&whole, 1});
  }
  std::vector<CopyRange> ranges;
  ranges.reserve(len / row_bytes + 2);
  uint64_t at = 0;
  while (at < len) {
    const uint64_t row = (offset + at) / row_bytes, in_row = (offset + at) % row_bytes;
    const uint64_t n = std::min<uint64_t>(len - at, row_bytes - in_row);
    std::byte* to = dst + sc.rows[row] * row_bytes + in_row;
    CopyRange* last = ranges.empty() ? nullptr : &ranges.back();
    if (last != nullptr && static_cast<std::byte*>(last->dst) + last->length == to) {
      last->length += n;
    } else {
      ranges.push_back(CopyRange{at, to, n});
    }
    at += n;
  }
  constexpr uint64_t kSmallestRemoteRange = 16 * 1024;
  if (!src.remote() || ranges.size() == 1 || len / ranges.size() >= kSmallestRemoteRange) return src.CopyOut(ranges);
  if (scratch.size() < len) scratch.resize(len);
  const CopyRange whole{0, scratch.data(), len};
  if (absl::Status s = src.CopyOut({&whole, 1}); !s.ok()) return s;
  for (const CopyRange& r : ranges) std::memcpy(r.dst, scratch.data() + r.offset, r.length);
  if (scratch.size() > (64u << 20)) std::vector<std::byte>().swap(scratch);  // keep no huge buffer
  return absl::OkStatus();
}

}  // namespace

absl::Status RequestTracker::ApplyReply(Part& part, const Message& reply, bool* part_done) {
  const proto::Envelope& h = reply.header;
  Op& op = *part.op;
  *part_done = true;
  if (h.has_error()) {
    return absl::Status(static_cast<absl::StatusCode>(h.error().code()),
                        absl::StrCat(op.what, ": ", ServerName(part.server_rank), ": ", h.error().message()));
  }
  if (op.width == 0) {  // push, clock or control: an acknowledgement is all we expect
    if (h.has_ack() || h.has_clock_ack()) return absl::OkStatus();
    return absl::InternalError(absl::StrCat(op.what, ": ", ServerName(part.server_rank),
                                            " sent an unexpected reply type ", h.body_case()));
  }
  const Scatter& sc = part.scatter;
  const size_t row_bytes = size_t{op.width} * sizeof(float);
  const uint64_t total = sc.num_keys * row_bytes;
  auto malformed = [&](const std::string& why) {
    return absl::InternalError(absl::StrCat(op.what, ": ", ServerName(part.server_rank), " sent a malformed reply (",
                                            why, ")"));
  };
  // The first (or only) message of a reply carries the PullReply; later
  // pieces carry no body.
  const bool first = part.received == 0;
  if (first ? !h.has_pull_reply() : h.body_case() != proto::Envelope::BODY_NOT_SET) {
    return malformed(absl::StrCat("unexpected reply type ", h.body_case()));
  }
  if (reply.frames.size() == 1 && first) {
    if (reply.frames[0].size() != total) {
      return malformed(absl::StrCat(reply.frames[0].size(), " bytes for ", sc.num_keys, " rows of width ", op.width));
    }
    return Place(part, reply.frames[0], 0, total, true);
  }
  if (reply.frames.size() != 2 || reply.frames[1].size() != kPieceDescriptorBytes) {
    return malformed(absl::StrCat(reply.frames.size(), " frames"));
  }
  uint64_t words[2];
  const CopyRange descriptor{0, words, sizeof(words)};
  if (absl::Status s = reply.frames[1].CopyOut({&descriptor, 1}); !s.ok()) return s;
  const uint64_t offset = words[0], piece_total = words[1], len = reply.frames[0].size();
  if (piece_total != total || offset != part.received || len == 0 || len > total - offset) {
    return malformed(absl::StrCat("piece of ", len, " bytes at offset ", offset, " of ", piece_total, "; expected offset ",
                                  part.received, " of ", total, " bytes for ", sc.num_keys, " rows of width ",
                                  op.width));
  }
  if (absl::Status s = Place(part, reply.frames[0], offset, len, part.received + len == total); !s.ok()) return s;
  part.received += len;
  *part_done = part.received == total;
  return absl::OkStatus();
}

absl::Status RequestTracker::Place(Part& part, const Buffer& frame, uint64_t offset, uint64_t len, bool done) {
  Op& op = *part.op;
  const Scatter& sc = part.scatter;
  const size_t row_bytes = size_t{op.width} * sizeof(float);
  if (op.view == nullptr) {
    return PlaceBytes(sc, reinterpret_cast<std::byte*>(op.out.data()), frame, offset, len, row_bytes, scratch_);
  }
  // Rows of the part i -> rows of the view, pointing into `values`.
  auto point = [&](const Buffer& values) {
    const auto* base = reinterpret_cast<const float*>(values.data());
    for (uint64_t i = 0; i < sc.num_keys; ++i) {
      op.view->rows_[sc.rows.empty() ? sc.first_row + i : sc.rows[i]] = base + i * op.width;
    }
    op.view->held_.push_back(values);
  };
  const bool in_place = offset == 0 && done && !frame.remote() && !frame.transient() &&
                        reinterpret_cast<uintptr_t>(frame.data()) % alignof(float) == 0;
  if (in_place) {
    point(frame);
    return absl::OkStatus();
  }
  if (part.assembled.empty()) part.assembled = Buffer::Allocate(sc.num_keys * row_bytes);
  const CopyRange range{0, part.assembled.mutable_data() + offset, len};
  if (absl::Status s = frame.CopyOut({&range, 1}); !s.ok()) return s;
  if (done) point(std::exchange(part.assembled, Buffer()));
  return absl::OkStatus();
}

RequestTracker::Completion RequestTracker::Finish(Op* op) {
  for (uint64_t id : op->request_ids) {
    if (auto it = parts_.find(id); it != parts_.end()) {
      Uncount(it->second);
      parts_.erase(it);
    }
    resend_ops_.erase(id);
  }
  auto node = ops_.extract(op);
  return Completion{std::move(node.mapped()->handle), node.mapped()->status};
}

uint64_t RequestTracker::ExpectedValues(uint64_t request_id) const {
  auto it = parts_.find(request_id);
  if (it == parts_.end()) return 0;
  return it->second.scatter.num_keys * it->second.op->width;
}

std::optional<RequestTracker::OutRange> RequestTracker::PullRange(uint64_t request_id) const {
  auto it = parts_.find(request_id);
  if (it == parts_.end()) return std::nullopt;
  const Part& part = it->second;
  const Op& op = *part.op;
  if (op.width == 0 || op.view != nullptr || !part.scatter.rows.empty()) return std::nullopt;  // not one run of out
  const uint64_t first = part.scatter.first_row, rows = part.scatter.num_keys;
  if ((first + rows) * op.width > op.out.size()) return std::nullopt;  // no such run (a caller's error)
  return OutRange{op.handle.get(), first, rows, op.out.subspan(first * op.width, rows * op.width)};
}

std::vector<RequestTracker::Completion> RequestTracker::OnReply(const Message& reply, Nanos now) {
  std::vector<Completion> done;
  auto it = parts_.find(reply.header.request_id());
  if (it == parts_.end()) {
    ++ignored_replies_;
    return done;
  }
  Part& part = it->second;
  Op* op = part.op;
  const proto::Envelope& h = reply.header;
  if (now >= 0 && part.received == 0 && part.counted) {
    // A round trip: this request id was sent once, at sent_at; the server
    // says how long it held it on purpose.
    const uint64_t held_us = h.has_pull_reply() ? h.pull_reply().held_us()
                             : h.has_clock_ack() ? h.clock_ack().held_us()
                                                 : 0;
    PeerOf(part.server_rank)
        .timers[static_cast<size_t>(LaneOf(part))]
        .Sample(now - part.sent_at - static_cast<Nanos>(held_us) * 1000, part.ahead_bytes);
  }
  // A table creation is refused this way too, by a server removed from the
  // job (drained) under a map this worker does not have yet; under that
  // map the server is dead and its part is done (TakeResends). The
  // simulator found the job failing on it instead (seed 296058).
  const bool resendable =
      part.request.header.has_push() || part.request.header.has_pull() || part.request.header.has_create_table();
  if (resendable && h.has_error() && h.error().code() == static_cast<int>(absl::StatusCode::kAborted) &&
      h.epoch() != part.request.header.epoch()) {
    // Not (or no longer) the primary: wait for the map of the server's
    // epoch, or, if the server is behind, send again with ours.
    part.parked = true;
    part.ready_epoch = std::max(h.epoch(), part.request.header.epoch());
    part.received = 0;
    part.assembled = Buffer();
    Uncount(part);
    return done;
  }
  if (h.has_error() && h.error().code() == static_cast<int>(absl::StatusCode::kUnavailable) && part.received == 0) {
    // Not served now (busy, or no map yet): as if unanswered; the part goes
    // again when its resend timer runs out.
    ++unavailable_replies_;
    op->unavailable = absl::StrCat(ServerName(part.server_rank), ": ", h.error().message());
    return done;
  }
  bool part_done = true;
  if (op->status.ok()) {
    absl::Status s = ApplyReply(part, reply, &part_done);
    if (absl::IsUnavailable(s)) {
      // Lent values whose server is gone before they were read (the only
      // Unavailable ApplyReply gives): as if this message never came. The
      // part is sent again when the map drops that server, or when it
      // stays silent.
      ++lost_lent_replies_;
      return done;
    }
    if (!s.ok()) op->status = s;
  }
  if (!part_done) return done;  // more pieces to come
  Uncount(part);
  parts_.erase(it);
  if (--op->remaining == 0) done.push_back(Finish(op));
  return done;
}

std::vector<RequestTracker::Resend> RequestTracker::TakeResends(uint64_t epoch,
                                                                const std::function<bool(uint32_t)>& dead,
                                                                std::vector<Completion>* done, Nanos now,
                                                                bool silence) {
  std::vector<uint64_t> ids;
  for (const auto& [id, part] : parts_) {
    const bool silent = (silence || part.due) && SilentPast(part, now);
    if (part.parked ? part.ready_epoch <= epoch : (dead(part.server_rank) || silent)) ids.push_back(id);
  }
  std::sort(ids.begin(), ids.end());  // issue order
  std::vector<Resend> resends;
  for (uint64_t id : ids) {
    auto node = parts_.extract(id);
    Part& part = node.mapped();
    Uncount(part);
    if (part.request.header.has_push() || part.request.header.has_pull() ||
        (!dead(part.server_rank) && part.request.header.body_case() != proto::Envelope::BODY_NOT_SET)) {
      const bool lost = !part.parked && !dead(part.server_rank);  // resent for silence, not for a new map
      if (lost) PeerOf(part.server_rank).resends[static_cast<size_t>(LaneOf(part))]++;
      resends.push_back(Resend{id, part.server_rank, std::move(part.scatter), std::move(part.request),
                               part.resends + (lost ? 1 : 0), part.transfer});
      // The op keeps counting this part until Reissue.
      resend_ops_.emplace(id, part.op);
      continue;
    }
    Op* op = part.op;
    if (--op->remaining == 0) done->push_back(Finish(op));
  }
  return resends;
}

std::vector<RequestTracker::Completion> RequestTracker::Reissue(const Resend& old, std::vector<PartSpec> parts,
                                                                Nanos now) {
  std::vector<Completion> done;
  auto it = resend_ops_.find(old.request_id);
  if (it == resend_ops_.end()) return done;
  Op* op = it->second;
  resend_ops_.erase(it);
  if (!ops_.contains(op)) return done;  // the op ended meanwhile (timeout, FailAll)
  op->remaining += parts.size();
  for (PartSpec& p : parts) {
    op->request_ids.push_back(p.request_id);
    Part& part = parts_.emplace(p.request_id, Part{op, p.server_rank, std::move(p.scatter), std::move(p.request)})
                     .first->second;
    part.sent_at = now;
    part.resends = old.resends;
    part.transfer = p.transfer;
    part.queued = p.queued;
    if (!part.queued) Sent(part, now);
  }
  if (--op->remaining == 0) done.push_back(Finish(op));
  return done;
}

void RequestTracker::MarkSent(uint64_t request_id, Nanos now) {
  auto it = parts_.find(request_id);
  if (it == parts_.end() || !it->second.queued) return;
  it->second.queued = false;
  Sent(it->second, now);
}

bool RequestTracker::Queued(uint64_t request_id) const {
  auto it = parts_.find(request_id);
  return it != parts_.end() && it->second.queued;
}

bool RequestTracker::Awaiting(uint64_t request_id) const {
  auto it = parts_.find(request_id);
  return it != parts_.end() && !it->second.queued && !it->second.parked;
}

std::vector<RequestTracker::Resend> RequestTracker::TakeQueued(
    const std::function<bool(uint32_t, const Message&)>& take) {
  std::vector<uint64_t> ids;
  for (const auto& [id, part] : parts_)
    if (part.queued && take(part.server_rank, part.request)) ids.push_back(id);
  std::sort(ids.begin(), ids.end());  // issue order
  std::vector<Resend> out;
  for (uint64_t id : ids) {
    auto node = parts_.extract(id);
    Part& part = node.mapped();
    out.push_back(Resend{id, part.server_rank, std::move(part.scatter), std::move(part.request), part.resends,
                         part.transfer});
    resend_ops_.emplace(id, part.op);  // the op keeps counting this part until Reissue
  }
  return out;
}

size_t RequestTracker::queued() const {
  size_t n = 0;
  for (const auto& [id, part] : parts_) n += part.queued;
  return n;
}

size_t RequestTracker::parked() const {
  size_t n = 0;
  for (const auto& [id, part] : parts_) n += part.parked;
  return n;
}

void RequestTracker::SortBySerial(std::vector<Op*>& ops) {
  // (ops_ iterates in an order that depends on the ops' addresses: what
  // ends together ends in Begin's order, so that a run is a function of its
  // inputs alone; the simulator replays a seed by it.)
  std::sort(ops.begin(), ops.end(), [](const Op* a, const Op* b) { return a->serial < b->serial; });
}

std::vector<RequestTracker::Completion> RequestTracker::Tick(Nanos now) {
  std::vector<Op*> expired;
  for (const auto& [raw, op] : ops_)
    if (now >= op->deadline) expired.push_back(raw);
  SortBySerial(expired);
  std::vector<Completion> done;
  for (Op* op : expired) {
    std::vector<std::string> silent;
    for (uint64_t id : op->request_ids)
      if (auto p = parts_.find(id); p != parts_.end()) silent.push_back(ServerName(p->second.server_rank));
    std::string names;
    for (size_t i = 0; i < silent.size(); ++i) absl::StrAppend(&names, i ? ", " : "", silent[i]);
    op->status = absl::DeadlineExceededError(
        absl::StrCat(op->what, " timed out waiting for ", names,
                     op->unavailable.empty() ? "" : absl::StrCat(" (last answered Unavailable by ", op->unavailable, ")")));
    done.push_back(Finish(op));
  }
  return done;
}

std::vector<RequestTracker::Owed> RequestTracker::OwedBy(Nanos now, Nanos older_than) const {
  absl::flat_hash_map<uint32_t, Owed> by_server;
  for (const auto& [id, part] : parts_) {
    const Op& op = *part.op;
    if (now - op.begun < older_than) continue;
    Owed& owed = by_server[part.server_rank];
    ++owed.parts;
    const Nanos waited = now - op.begun;
    if (owed.parts > 1 && (waited < owed.waited || (waited == owed.waited && id > owed.request_id))) continue;
    owed.server_rank = part.server_rank;
    owed.what = op.what;
    owed.request_id = id;
    owed.waited = waited;
    owed.left = op.deadline - now;
    owed.resends = part.resends;
    owed.parked = part.parked;
    owed.queued = part.queued;
  }
  std::vector<Owed> out;
  for (auto& [rank, owed] : by_server) {
    owed.server = ServerName(rank);
    out.push_back(std::move(owed));
  }
  std::sort(out.begin(), out.end(), [](const Owed& a, const Owed& b) {
    return a.waited != b.waited ? a.waited > b.waited : a.server_rank < b.server_rank;
  });
  return out;
}

std::vector<RequestTracker::Completion> RequestTracker::FailAll(const absl::Status& status) {
  std::vector<Op*> all;
  for (const auto& [raw, op] : ops_) all.push_back(raw);
  SortBySerial(all);
  std::vector<Completion> done;
  for (Op* op : all) {
    op->status = absl::Status(status.code(), absl::StrCat(op->what, ": ", status.message()));
    done.push_back(Finish(op));
  }
  return done;
}

}  // namespace tessera

#include "worker/request_tracker.h"

#include <cstring>

#include "absl/strings/str_cat.h"

namespace tessera {

std::string RequestTracker::ServerName(uint32_t rank) const {
  if (rank < server_names_.size()) return absl::StrCat("server ", rank, " (", server_names_[rank], ")");
  return absl::StrCat("server ", rank);
}

void RequestTracker::Begin(Handle handle, std::string what, std::vector<PartSpec> parts, Nanos deadline,
                           std::span<float> out, uint32_t width) {
  auto op = std::make_unique<Op>();
  op->handle = std::move(handle);
  op->what = std::move(what);
  op->out = out;
  op->width = width;
  op->deadline = deadline;
  op->remaining = parts.size();
  Op* raw = op.get();
  for (PartSpec& p : parts) {
    raw->request_ids.push_back(p.request_id);
    parts_.emplace(p.request_id, Part{raw, p.server_rank, std::move(p.scatter)});
  }
  ops_.emplace(raw, std::move(op));
}

absl::Status RequestTracker::ApplyReply(const Part& part, const Message& reply) {
  const proto::Envelope& h = reply.header;
  Op& op = *part.op;
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
  if (!h.has_pull_reply() || reply.frames.size() != 1 || reply.frames[0].size() != sc.num_keys * row_bytes) {
    return absl::InternalError(absl::StrCat(op.what, ": ", ServerName(part.server_rank), " sent a malformed reply (",
                                            reply.frames.size() ? reply.frames[0].size() : 0, " bytes for ",
                                            sc.num_keys, " rows of width ", op.width, ")"));
  }
  const std::byte* src = reply.frames[0].data();
  auto* dst = reinterpret_cast<std::byte*>(op.out.data());
  if (sc.rows.empty()) {
    std::memcpy(dst + sc.first_row * row_bytes, src, sc.num_keys * row_bytes);
  } else {
    for (size_t i = 0; i < sc.rows.size(); ++i) std::memcpy(dst + sc.rows[i] * row_bytes, src + i * row_bytes, row_bytes);
  }
  return absl::OkStatus();
}

RequestTracker::Completion RequestTracker::Finish(Op* op) {
  for (uint64_t id : op->request_ids) parts_.erase(id);
  auto node = ops_.extract(op);
  return Completion{std::move(node.mapped()->handle), node.mapped()->status};
}

std::vector<RequestTracker::Completion> RequestTracker::OnReply(const Message& reply) {
  std::vector<Completion> done;
  auto it = parts_.find(reply.header.request_id());
  if (it == parts_.end()) {
    ++ignored_replies_;
    return done;
  }
  Part part = std::move(it->second);
  parts_.erase(it);
  Op* op = part.op;
  if (op->status.ok()) {
    absl::Status s = ApplyReply(part, reply);
    if (!s.ok()) op->status = s;
  }
  if (--op->remaining == 0) done.push_back(Finish(op));
  return done;
}

std::vector<RequestTracker::Completion> RequestTracker::Tick(Nanos now) {
  std::vector<Op*> expired;
  for (const auto& [raw, op] : ops_)
    if (now >= op->deadline) expired.push_back(raw);
  std::vector<Completion> done;
  for (Op* op : expired) {
    std::vector<std::string> silent;
    for (uint64_t id : op->request_ids)
      if (auto p = parts_.find(id); p != parts_.end()) silent.push_back(ServerName(p->second.server_rank));
    std::string names;
    for (size_t i = 0; i < silent.size(); ++i) absl::StrAppend(&names, i ? ", " : "", silent[i]);
    op->status = absl::DeadlineExceededError(absl::StrCat(op->what, " timed out waiting for ", names));
    done.push_back(Finish(op));
  }
  return done;
}

std::vector<RequestTracker::Completion> RequestTracker::FailAll(const absl::Status& status) {
  std::vector<Op*> all;
  for (const auto& [raw, op] : ops_) all.push_back(raw);
  std::vector<Completion> done;
  for (Op* op : all) {
    op->status = absl::Status(status.code(), absl::StrCat(op->what, ": ", status.message()));
    done.push_back(Finish(op));
  }
  return done;
}

}  // namespace tessera

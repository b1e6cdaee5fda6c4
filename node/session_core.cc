#include "node/session_core.h"

#include <utility>

#include "absl/strings/str_cat.h"

namespace tessera {

std::string SessionCore::FormatSeconds(Nanos n) {
  return absl::StrCat(static_cast<double>(n / kMillis) / 1000.0, " s");
}

SessionCore::SessionCore(SessionCoreOptions options) : options_(std::move(options)) {}

bool SessionCore::Registering() const {
  // Until both the RegisterReply and the JobReady are in: a JobReady can
  // arrive while the reply was lost, and the node still needs to know itself.
  return joining_ && !registration_over_ && !register_error_ && !(registered_ && ready_) && !ended_;
}

bool SessionCore::JoinFailedUnregistered(Nanos now) const {
  return !registered_ && (register_error_.has_value() || (joining_ && now >= join_deadline_));
}

Nanos SessionCore::heartbeat_interval() const {
  Nanos interval = options_.heartbeat_interval;
  if (registered_ && registered_->heartbeat_interval_ms() > 0) {
    interval = std::min<Nanos>(interval, static_cast<Nanos>(registered_->heartbeat_interval_ms()) * kMillis);
  }
  return interval;
}

void SessionCore::End(absl::Status status) {
  if (!ended_) ended_ = std::move(status);
}

bool SessionCore::Handle(const Message& m, Nanos now) {
  const proto::Envelope& h = m.header;
  switch (h.body_case()) {
    case proto::Envelope::kRegisterReply:
      // A reply after the join failed (an error, or its deadline) starts nothing.
      if (!registered_ && !JoinFailedUnregistered(now)) {
        registered_ = h.register_reply();
        next_heartbeat_ = now;                                // the first heartbeat goes at once
        next_register_ = now + 4 * options_.register_retry;  // then wait for the JobReady
      }
      break;
    case proto::Envelope::kJobReady:
      if (!ready_) {
        ready_ = h.job_ready();
        set_map_epoch(ready_->shard_map().epoch());
      }
      break;
    case proto::Envelope::kHeartbeatAck:
      break;
    case proto::Envelope::kBarrierRelease:
      barriers_[h.barrier_release().name()].released = true;
      break;
    case proto::Envelope::kShutdown:
      End(h.shutdown().ok() ? absl::OkStatus()
                            : absl::AbortedError(absl::StrCat("job failed: ", h.shutdown().reason())));
      break;
    case proto::Envelope::kAck:
    case proto::Envelope::kError: {
      if ((h.request_id() & kSessionRequestBit) == 0) return false;
      absl::Status s = h.has_error() ? absl::Status(static_cast<absl::StatusCode>(h.error().code()),
                                                    absl::StrCat("coordinator: ", h.error().message()))
                                     : absl::OkStatus();
      if (!registered_ && h.has_error()) {
        if (s.code() == absl::StatusCode::kUnavailable) {
          register_refused_ = s;  // for now: registration goes on
        } else if (!register_error_) {
          register_error_ = s;
        }
      }
      if (!s.ok()) {
        for (auto& [name, barrier] : barriers_) {
          if (barrier.request_id == h.request_id()) barrier.error = s;
        }
      }
      if (auto it = dones_.find(h.request_id()); it != dones_.end() && !it->second.reply) it->second.reply = s;
      break;
    }
    default:
      return false;
  }
  last_heard_ = now;
  silent_ = false;
  return true;
}

void SessionCore::StartJoin(Nanos now, Nanos deadline) {
  joining_ = true;
  registration_over_ = false;
  join_deadline_ = deadline;
  next_register_ = now;
}

void SessionCore::StartRejoin(Nanos now, Nanos deadline) {
  if (!registered_ || ended_) return;
  options_.rank = static_cast<int>(self().rank());
  registered_.reset();
  ready_.reset();
  register_error_.reset();
  register_refused_.reset();
  StartJoin(now, deadline);
}

std::optional<absl::StatusOr<proto::JobReady>> SessionCore::JoinResult(Nanos now) const {
  auto ended = [&]() -> absl::Status {
    return ended_->ok() ? absl::AbortedError("job ended before it started") : *ended_;
  };
  if (register_error_) return absl::StatusOr<proto::JobReady>(*register_error_);
  if (!registered_) {
    if (ended_) return absl::StatusOr<proto::JobReady>(ended());
    if (now >= join_deadline_) {
      if (register_refused_) {
        return absl::StatusOr<proto::JobReady>(absl::DeadlineExceededError(
            absl::StrCat("the coordinator at ", options_.coordinator, " refused to register this node until the ",
                         FormatSeconds(options_.connect_timeout), " deadline; last: ", register_refused_->message())));
      }
      return absl::StatusOr<proto::JobReady>(
          absl::DeadlineExceededError(absl::StrCat("coordinator at ", options_.coordinator, " did not answer within ",
                                                   FormatSeconds(options_.connect_timeout))));
    }
    return std::nullopt;
  }
  if (ended_) return absl::StatusOr<proto::JobReady>(ended());
  if (ready_) return absl::StatusOr<proto::JobReady>(*ready_);
  if (now >= join_deadline_) {
    return absl::StatusOr<proto::JobReady>(absl::DeadlineExceededError(
        absl::StrCat("the job did not assemble within ", FormatSeconds(options_.connect_timeout), " (coordinator at ",
                     options_.coordinator, " did not send the shard map)")));
  }
  return std::nullopt;
}

std::vector<proto::Envelope> SessionCore::Tick(Nanos now) {
  std::vector<proto::Envelope> out;
  if (ended_) return out;
  if (Registering() && now >= next_register_) {
    if (now >= join_deadline_) {
      registration_over_ = true;
    } else {
      proto::Envelope h;
      h.set_request_id(NextRequestId());
      auto* r = h.mutable_register_request();
      r->set_role(options_.role);
      // Again after the reply (waiting for the JobReady): the assigned rank.
      r->set_rank(registered_ ? static_cast<int>(self().rank()) : options_.rank);
      out.push_back(std::move(h));
      next_register_ = now + (registered_ ? 4 : 1) * options_.register_retry;
    }
  }
  if (Heartbeating() && now >= next_heartbeat_) {
    if (now - last_heard_ >= std::max(options_.give_up, options_.lease)) {
      End(absl::UnavailableError(absl::StrCat("lost the coordinator at ", options_.coordinator,
                                              options_.coordinator_note, ": no answer for ",
                                              FormatSeconds(now - last_heard_))));
      return {};
    }
    if (now - last_heard_ >= options_.lease) silent_ = true;
    proto::Envelope h;
    h.set_request_id(NextRequestId());
    h.set_epoch(map_epoch_);
    h.mutable_heartbeat();
    if (fill_heartbeat_) fill_heartbeat_(h.mutable_heartbeat());
    out.push_back(std::move(h));
    next_heartbeat_ = now + heartbeat_interval();
  }
  for (auto& [id, done] : dones_) {
    if (done.reply || done.expired || now < done.next_send) continue;
    if (now >= done.deadline) {
      done.expired = true;
      continue;
    }
    out.push_back(done.request);
    done.next_send = now + options_.register_retry;
  }
  // Barriers not yet released or refused: the same request again (the
  // coordinator sends a lost release again).
  for (auto& [name, barrier] : barriers_) {
    if (barrier.released || barrier.error || !Heartbeating()) continue;
    if (barrier.next_send == 0) {
      barrier.next_send = now + options_.register_retry;  // sent by the caller just now
    } else if (now >= barrier.next_send) {
      out.push_back(barrier.request);
      barrier.next_send = now + options_.register_retry;
    }
  }
  for (proto::Envelope& h : out) h.set_sender_id(self().node_id());
  return out;
}

std::optional<Nanos> SessionCore::NextTickAt() const {
  if (ended_) return std::nullopt;
  std::optional<Nanos> next;
  auto consider = [&](Nanos t) {
    if (!next || t < *next) next = t;
  };
  if (Registering()) consider(next_register_);
  if (Heartbeating()) consider(next_heartbeat_);
  for (const auto& [id, done] : dones_) {
    if (!done.reply && !done.expired) consider(done.next_send);
  }
  for (const auto& [name, barrier] : barriers_) {
    if (!barrier.released && !barrier.error && barrier.next_send != 0) consider(barrier.next_send);
  }
  return next;
}

proto::Envelope SessionCore::Barrier(const std::string& name) {
  proto::Envelope h;
  h.set_request_id(NextRequestId());
  h.set_sender_id(self().node_id());
  h.mutable_barrier_request()->set_name(name);
  barriers_[name] = BarrierState{.request_id = h.request_id(), .request = h};
  return h;
}

std::optional<absl::Status> SessionCore::barrier_result(const std::string& name) const {
  auto it = barriers_.find(name);
  if (it == barriers_.end()) return std::nullopt;
  if (it->second.error) return *it->second.error;
  if (it->second.released) return absl::OkStatus();
  return std::nullopt;
}

bool SessionCore::barrier_released(const std::string& name) const {
  auto it = barriers_.find(name);
  return it != barriers_.end() && it->second.released;
}

proto::Envelope SessionCore::ReportDone(const proto::WorkerDone& report, Nanos now, Nanos deadline) {
  proto::Envelope h;
  h.set_request_id(NextRequestId());
  h.set_sender_id(self().node_id());
  *h.mutable_worker_done() = report;
  dones_[h.request_id()] = DoneReport{
      .request = h, .next_send = now + options_.register_retry, .deadline = deadline, .expired = false, .reply = {}};
  last_done_ = h.request_id();
  return h;
}

std::optional<absl::Status> SessionCore::done_reply(uint64_t request_id) const {
  auto it = dones_.find(request_id);
  if (it == dones_.end()) return std::nullopt;
  return it->second.reply;
}

}  // namespace tessera

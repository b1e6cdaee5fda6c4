#include "node/coordinator_session.h"

#include <algorithm>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/logging.h"

namespace tessera {
namespace {
std::string Secs(Nanos n) { return absl::StrCat(static_cast<double>(n / kMillis) / 1000.0, " s"); }
}  // namespace

CoordinatorSession::CoordinatorSession(Options options, Transport* transport)
    : options_(std::move(options)), transport_(transport) {
  if (IsEtcdAddress(options_.coordinator)) {
    // A bad address leaves etcd_ unset: Join() then fails with the parse error (Resolve).
    if (auto a = ParseEtcdCoordinatorAddress(options_.coordinator); a.ok()) {
      if (auto client = EtcdClient::Create(a->endpoints, 1 * kSeconds); client.ok()) {
        etcd_ = std::move(*client);
        etcd_job_ = a->job;
        leader_key_ = EtcdLeaderKey(a->job);
      }
    }
  } else {
    coordinator_ = options_.coordinator;
  }
}

std::string CoordinatorSession::coordinator() const {
  std::lock_guard lock(address_mu_);
  return coordinator_.empty() ? options_.coordinator : coordinator_;
}

absl::Status CoordinatorSession::Resolve(bool force) {
  if (!IsEtcdAddress(options_.coordinator)) return absl::OkStatus();
  if (!etcd_) return absl::InvalidArgumentError(ParseEtcdCoordinatorAddress(options_.coordinator).status().message());
  {
    std::lock_guard lock(address_mu_);
    if (!force && MonotonicNow() - last_resolve_ < 250 * kMillis) return absl::OkStatus();
    last_resolve_ = MonotonicNow();
  }
  auto leader = etcd_->Get(leader_key_);
  if (!leader.ok()) return leader.status();
  if (!leader->has_value()) {
    return absl::NotFoundError(absl::StrCat("no coordinator leads job ", etcd_job_, " (no key ", leader_key_,
                                            " in etcd at ", etcd_->endpoints(), ")"));
  }
  std::string previous;
  {
    std::lock_guard lock(address_mu_);
    if (coordinator_ == (*leader)->value) return absl::OkStatus();
    previous = std::exchange(coordinator_, (*leader)->value);
  }
  if (previous.empty()) {
    TLOG_INFO("the coordinator of job {} is at {} (etcd at {})", etcd_job_, (*leader)->value, etcd_->endpoints());
  } else {
    TLOG_WARN("the coordinator of job {} moved from {} to {} (a standby took over)", etcd_job_, previous,
              (*leader)->value);
    std::lock_guard lock(mu_);
    last_heard_ = MonotonicNow();  // the new leader gets a whole lease
  }
  return absl::OkStatus();
}

CoordinatorSession::~CoordinatorSession() {
  {
    std::lock_guard lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  if (heartbeat_thread_.joinable()) heartbeat_thread_.join();
}

void CoordinatorSession::Send(proto::Envelope header) {
  Message m;
  header.set_sender_id(self_.node_id());
  m.header = std::move(header);
  const std::string to = coordinator();
  if (IsEtcdAddress(to)) return;  // no leader known yet: Join() resolves first
  if (auto s = transport_->Send(to, std::move(m)); !s.ok()) {
    TLOG_WARN("send to coordinator {} failed: {}", to, s.ToString());
  }
}

void CoordinatorSession::EndLocked(absl::Status status, std::unique_lock<std::mutex>& lock) {
  if (ended_) return;
  ended_ = status;
  cv_.notify_all();
  if (on_end_) {
    lock.unlock();
    on_end_(status);
    lock.lock();
  }
}

bool CoordinatorSession::Handle(const Message& m) {
  const proto::Envelope& h = m.header;
  std::unique_lock lock(mu_);
  switch (h.body_case()) {
    case proto::Envelope::kRegisterReply:
      if (!registered_) registered_ = h.register_reply();
      break;
    case proto::Envelope::kJobReady:
      if (!ready_) {
        ready_ = h.job_ready();
        map_epoch_ = std::max(map_epoch_, ready_->shard_map().epoch());
      }
      break;
    case proto::Envelope::kHeartbeatAck:
      break;
    case proto::Envelope::kBarrierRelease:
      barriers_released_[h.barrier_release().name()] = true;
      break;
    case proto::Envelope::kShutdown:
      EndLocked(h.shutdown().ok() ? absl::OkStatus()
                                  : absl::AbortedError(absl::StrCat("job failed: ", h.shutdown().reason())),
                lock);
      break;
    case proto::Envelope::kAck:
    case proto::Envelope::kError: {
      if ((h.request_id() & kSessionRequestBit) == 0) return false;
      absl::Status s = h.has_error() ? absl::Status(static_cast<absl::StatusCode>(h.error().code()),
                                                    absl::StrCat("coordinator: ", h.error().message()))
                                     : absl::OkStatus();
      if (!registered_ && h.has_error()) register_error_ = s;
      replies_[h.request_id()] = s;
      break;
    }
    default:
      return false;
  }
  last_heard_ = MonotonicNow();
  cv_.notify_all();
  return true;
}

absl::StatusOr<proto::JobReady> CoordinatorSession::Join() {
  const Nanos deadline = MonotonicNow() + options_.connect_timeout;
  // With etcd: find the leader first.
  for (absl::Status found = Resolve(true); !found.ok(); found = Resolve(true)) {
    if (found.code() == absl::StatusCode::kInvalidArgument) return found;
    if (MonotonicNow() >= deadline) {
      return absl::DeadlineExceededError(absl::StrCat("found no coordinator within ", Secs(options_.connect_timeout),
                                                      ": ", found.message()));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
  std::unique_lock lock(mu_);
  // Register, resending until the coordinator answers.
  int unanswered = 0;
  while (!registered_ && !register_error_ && !ended_) {
    if (MonotonicNow() >= deadline) {
      return absl::DeadlineExceededError(absl::StrCat("coordinator at ", coordinator(), " did not answer within ",
                                                      Secs(options_.connect_timeout)));
    }
    if (++unanswered % 3 == 0) {
      // The leader may have changed since it was looked up.
      lock.unlock();
      (void)Resolve(false);
      lock.lock();
    }
    proto::Envelope h;
    h.set_request_id(NextRequestIdLocked());
    auto* r = h.mutable_register_request();
    r->set_role(options_.role);
    r->set_rank(options_.rank);
    lock.unlock();
    Send(std::move(h));
    lock.lock();
    cv_.wait_for(lock, std::chrono::nanoseconds(options_.register_retry),
                 [&] { return registered_ || register_error_ || ended_; });
  }
  if (register_error_) return *register_error_;
  if (ended_) return ended_->ok() ? absl::AbortedError("job ended before it started") : *ended_;
  self_ = registered_->self();
  SetLogNodeId(self_.node_id());
  last_heard_ = MonotonicNow();
  heartbeat_thread_ = std::thread([this] { HeartbeatLoop(); });
  // Wait for the whole job to assemble. The registration goes again now and
  // then: the coordinator answers a repeat with the same reply and, once the
  // job runs, the JobReady again (in case a message was lost).
  bool ok = false;
  while (!(ok = ready_.has_value() || ended_.has_value()) && MonotonicNow() < deadline) {
    cv_.wait_for(lock, std::chrono::nanoseconds(std::min(4 * options_.register_retry, deadline - MonotonicNow())),
                 [&] { return ready_ || ended_; });
    if (ready_ || ended_) continue;
    lock.unlock();
    (void)Resolve(false);
    lock.lock();
    proto::Envelope h;
    h.set_request_id(NextRequestIdLocked());
    auto* r = h.mutable_register_request();
    r->set_role(options_.role);
    r->set_rank(static_cast<int>(self_.rank()));
    lock.unlock();
    Send(std::move(h));
    lock.lock();
  }
  if (ended_) return ended_->ok() ? absl::AbortedError("job ended before it started") : *ended_;
  if (!ok) {
    return absl::DeadlineExceededError(absl::StrCat("the job did not assemble within ",
                                                    Secs(options_.connect_timeout), " (coordinator at ",
                                                    coordinator(), " did not send the shard map)"));
  }
  return *ready_;
}

void CoordinatorSession::HeartbeatLoop() {
  std::unique_lock lock(mu_);
  while (!stopping_ && !ended_) {
    Nanos interval = options_.heartbeat_interval;
    if (registered_ && registered_->heartbeat_interval_ms() > 0) {
      interval = std::min<Nanos>(interval, static_cast<Nanos>(registered_->heartbeat_interval_ms()) * kMillis);
    }
    if (etcd_ && MonotonicNow() - last_heard_ >= 2 * interval) {
      // Silent for two heartbeats: has a standby taken over?
      lock.unlock();
      absl::Status found = Resolve(false);
      if (!found.ok()) TLOG_DEBUG("looking up the coordinator: {}", found.message());
      lock.lock();
    }
    if (MonotonicNow() - last_heard_ >= options_.lease) {
      EndLocked(absl::UnavailableError(absl::StrCat("lost the coordinator at ", coordinator(),
                                                    etcd_ ? absl::StrCat(" (job ", etcd_job_, " in etcd at ",
                                                                         etcd_->endpoints(), ")")
                                                          : std::string(),
                                                    ": no answer for ", Secs(MonotonicNow() - last_heard_))),
                lock);
      break;
    }
    proto::Envelope h;
    h.set_request_id(NextRequestIdLocked());
    h.set_epoch(map_epoch_);
    h.mutable_heartbeat();
    lock.unlock();
    if (fill_heartbeat_) fill_heartbeat_(h.mutable_heartbeat());
    Send(std::move(h));
    lock.lock();
    cv_.wait_for(lock, std::chrono::nanoseconds(interval), [&] { return stopping_ || ended_; });
  }
}

absl::Status CoordinatorSession::Barrier(const std::string& name, Nanos timeout) {
  std::unique_lock lock(mu_);
  proto::Envelope h;
  h.set_request_id(NextRequestIdLocked());
  const uint64_t id = h.request_id();
  h.mutable_barrier_request()->set_name(name);
  barriers_released_.erase(name);
  lock.unlock();
  Send(std::move(h));
  lock.lock();
  bool done = cv_.wait_for(lock, std::chrono::nanoseconds(timeout),
                           [&] { return barriers_released_.contains(name) || ended_ || replies_.contains(id); });
  if (auto it = replies_.find(id); it != replies_.end()) {
    absl::Status s = it->second;
    replies_.erase(it);
    if (!s.ok()) return s;
  }
  if (barriers_released_.contains(name)) {
    barriers_released_.erase(name);
    return absl::OkStatus();
  }
  if (ended_) return ended_->ok() ? absl::AbortedError("job ended during barrier '" + name + "'") : *ended_;
  (void)done;
  return absl::DeadlineExceededError(absl::StrCat("barrier '", name, "' not released within ", Secs(timeout),
                                                  " (the coordinator at ", coordinator(),
                                                  " waits for every worker)"));
}

void CoordinatorSession::set_map_epoch(uint64_t epoch) {
  std::lock_guard lock(mu_);
  map_epoch_ = std::max(map_epoch_, epoch);
}

absl::Status CoordinatorSession::ReportDone(const proto::WorkerDone& report, Nanos timeout) {
  std::unique_lock lock(mu_);
  proto::Envelope h;
  h.set_request_id(NextRequestIdLocked());
  const uint64_t id = h.request_id();
  *h.mutable_worker_done() = report;
  // Sent again until answered (the coordinator takes a repeat as the same report).
  const Nanos deadline = MonotonicNow() + timeout;
  while (!replies_.contains(id) && !ended_ && MonotonicNow() < deadline) {
    lock.unlock();
    Send(h);
    lock.lock();
    cv_.wait_for(lock, std::chrono::nanoseconds(std::min(options_.register_retry, deadline - MonotonicNow())),
                 [&] { return replies_.contains(id) || ended_.has_value(); });
  }
  if (auto it = replies_.find(id); it != replies_.end()) {
    absl::Status s = it->second;
    replies_.erase(it);
    return s;
  }
  if (ended_) return *ended_;
  return absl::DeadlineExceededError(absl::StrCat("coordinator at ", coordinator(),
                                                  " did not acknowledge the done report within ", Secs(timeout)));
}

absl::Status CoordinatorSession::WaitForEnd() {
  std::unique_lock lock(mu_);
  cv_.wait(lock, [&] { return ended_.has_value(); });
  return *ended_;
}

}  // namespace tessera

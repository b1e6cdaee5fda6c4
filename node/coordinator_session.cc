#include "node/coordinator_session.h"

#include <algorithm>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/logging.h"

namespace tessera {
namespace {
std::string Secs(Nanos n) { return SessionCore::FormatSeconds(n); }
std::chrono::steady_clock::time_point TimePoint(Nanos n) {
  return std::chrono::steady_clock::time_point(std::chrono::nanoseconds(n));
}
}  // namespace

SessionCoreOptions CoordinatorSession::CoreOptions(const Options& options) {
  SessionCoreOptions o;
  o.role = options.role;
  o.rank = options.rank;
  o.connect_timeout = options.connect_timeout;
  o.heartbeat_interval = options.heartbeat_interval;
  o.lease = options.lease;
  o.give_up = options.give_up;
  o.register_retry = options.register_retry;
  o.coordinator = options.coordinator;  // an etcd:// address until resolved
  return o;
}

CoordinatorSession::CoordinatorSession(Options options, Transport* transport)
    : options_(std::move(options)), transport_(transport), core_(CoreOptions(options_)) {
  if (IsEtcdAddress(options_.coordinator)) {
    // A bad address leaves etcd_ unset: Join() then fails with the parse error (Resolve).
    if (auto a = ParseEtcdCoordinatorAddress(options_.coordinator); a.ok()) {
      if (auto client = EtcdClient::Create(a->endpoints, 1 * kSeconds); client.ok()) {
        etcd_ = std::move(*client);
        etcd_job_ = a->job;
        leader_key_ = EtcdLeaderKey(a->job);
        core_.set_coordinator_note(absl::StrCat(" (job ", etcd_job_, " in etcd at ", etcd_->endpoints(), ")"));
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
    std::lock_guard lock(mu_);
    core_.set_coordinator((*leader)->value);
  } else {
    TLOG_WARN("the coordinator of job {} moved from {} to {} (a standby took over)", etcd_job_, previous,
              (*leader)->value);
    std::lock_guard lock(mu_);
    core_.set_coordinator((*leader)->value);
    core_.ResetLease(MonotonicNow());  // the new leader gets a whole lease
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
  {
    std::lock_guard lock(mu_);
    header.set_sender_id(core_.self().node_id());
  }
  Transmit(std::move(header));
}

void CoordinatorSession::Transmit(proto::Envelope header) {
  Message m;
  m.header = std::move(header);
  m.at_once = true;  // control messages are not held for later ones
  const std::string to = coordinator();
  if (IsEtcdAddress(to)) return;  // no leader known yet: Join() resolves first
  if (auto s = transport_->Send(to, std::move(m)); !s.ok()) {
    TLOG_WARN("send to coordinator {} failed: {}", to, s.ToString());
  }
}

void CoordinatorSession::NoteSilenceLocked(Nanos now) {
  const std::optional<Nanos> silent = core_.silent_since();
  if (silent == silent_since_ && (!silent || now < next_silence_line_)) return;
  const std::string& at = core_.coordinator();
  if (silent) {
    const Nanos give_up = std::max(options_.give_up, options_.lease);
    TLOG_WARN("{} from the coordinator at {} for {}; going on with shard map epoch {} and waiting for it "
              "(gives up {} after the last answer)",
              silent_since_ ? "still nothing" : "no answer", at, Secs(now - *silent), core_.map_epoch(),
              Secs(give_up));
    next_silence_line_ = now + options_.lease;
  } else if (silent_since_) {
    TLOG_INFO("the coordinator at {} answers again after {} of silence", at, Secs(core_.last_heard() - *silent_since_));
  }
  silent_since_ = silent;
}

void CoordinatorSession::ReportEndLocked(std::unique_lock<std::mutex>& lock) {
  if (!core_.ended() || end_reported_) return;
  end_reported_ = true;
  cv_.notify_all();
  if (on_end_) {
    const absl::Status status = *core_.ended();
    lock.unlock();
    on_end_(status);
    lock.lock();
  }
}

bool CoordinatorSession::Handle(const Message& m) {
  std::unique_lock lock(mu_);
  if (!core_.Handle(m, MonotonicNow())) return false;
  cv_.notify_all();
  ReportEndLocked(lock);
  return true;
}

void CoordinatorSession::StartThreadLocked() {
  if (!heartbeat_thread_.joinable() && !stopping_) heartbeat_thread_ = std::thread([this] { HeartbeatLoop(); });
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
  // The heartbeat thread registers (again until the coordinator answers),
  // heartbeats once registered, and registers again now and then until the
  // whole job has assembled (see SessionCore).
  core_.StartJoin(MonotonicNow(), deadline);
  return AwaitJoinLocked(lock, deadline);
}

absl::StatusOr<proto::JobReady> CoordinatorSession::Rejoin() {
  const Nanos deadline = MonotonicNow() + options_.connect_timeout;
  std::unique_lock lock(mu_);
  if (const auto& ended = core_.ended()) {
    return ended->ok() ? absl::AbortedError("the job has ended") : *ended;
  }
  core_.StartRejoin(MonotonicNow(), deadline);
  return AwaitJoinLocked(lock, deadline);
}

std::optional<absl::Status> CoordinatorSession::ended() {
  std::lock_guard lock(mu_);
  return core_.ended();
}

absl::StatusOr<proto::JobReady> CoordinatorSession::AwaitJoinLocked(std::unique_lock<std::mutex>& lock,
                                                                    Nanos deadline) {
  StartThreadLocked();
  cv_.notify_all();
  bool registered = false;
  while (true) {
    if (!registered && core_.registered() && !core_.register_error()) {
      registered = true;
      self_ = core_.self();
      joined_running_job_ = core_.joined_running_job();
      SetLogNodeId(self_.node_id());
    }
    if (auto result = core_.JoinResult(MonotonicNow())) return *std::move(result);
    cv_.wait_until(lock, TimePoint(deadline));
  }
}

void CoordinatorSession::HeartbeatLoop() {
  std::unique_lock lock(mu_);
  int unanswered = 0;  // registrations sent before the reply
  while (!stopping_ && !core_.ended()) {
    Nanos now = MonotonicNow();
    if (etcd_ && core_.HeartbeatDue(now) && now - core_.last_heard() >= 2 * core_.heartbeat_interval()) {
      // Silent for two heartbeats: has a standby taken over?
      lock.unlock();
      absl::Status found = Resolve(false);
      if (!found.ok()) TLOG_DEBUG("looking up the coordinator: {}", found.message());
      lock.lock();
      if (stopping_ || core_.ended()) break;
      now = MonotonicNow();
    }
    std::vector<proto::Envelope> out = core_.Tick(now);
    if (core_.ended()) {  // lost the coordinator
      ReportEndLocked(lock);
      break;
    }
    NoteSilenceLocked(now);
    if (!out.empty()) {
      // The leader may have changed since it was looked up: before every
      // third registration, and before each one while waiting for the job.
      bool resolve = false;
      for (const proto::Envelope& h : out) {
        if (h.has_register_request()) resolve = core_.registered() || ++unanswered % 3 == 0;
      }
      lock.unlock();
      if (resolve) (void)Resolve(false);
      for (proto::Envelope& h : out) {
        if (h.has_heartbeat() && fill_heartbeat_) fill_heartbeat_(h.mutable_heartbeat());
        Transmit(std::move(h));
      }
      lock.lock();
      if (stopping_ || core_.ended()) break;
    }
    if (std::optional<Nanos> next = core_.NextTickAt(); !next) {
      cv_.wait(lock);
    } else if (*next > MonotonicNow()) {
      cv_.wait_until(lock, TimePoint(*next));
    }
  }
}

absl::Status CoordinatorSession::Barrier(const std::string& name, Nanos timeout) {
  std::unique_lock lock(mu_);
  proto::Envelope h = core_.Barrier(name);
  lock.unlock();
  Transmit(std::move(h));
  lock.lock();
  cv_.wait_for(lock, std::chrono::nanoseconds(timeout),
               [&] { return core_.barrier_result(name).has_value() || core_.ended().has_value(); });
  const std::optional<absl::Status> result = core_.barrier_result(name);  // a refusal, or the release
  core_.ForgetBarrier(name);
  if (result) return *result;
  if (const auto& ended = core_.ended()) {
    return ended->ok() ? absl::AbortedError("job ended during barrier '" + name + "'") : *ended;
  }
  return absl::DeadlineExceededError(absl::StrCat("barrier '", name, "' not released within ", Secs(timeout),
                                                  " (the coordinator at ", coordinator(),
                                                  " waits for every worker)"));
}

void CoordinatorSession::set_map_epoch(uint64_t epoch) {
  std::lock_guard lock(mu_);
  core_.set_map_epoch(epoch);
}

absl::Status CoordinatorSession::ReportDone(const proto::WorkerDone& report, Nanos timeout) {
  std::unique_lock lock(mu_);
  const Nanos deadline = MonotonicNow() + timeout;
  if (!core_.ended() && MonotonicNow() < deadline) {
    // Sent now, and again by the heartbeat thread until answered (the
    // coordinator takes a repeat as the same report).
    proto::Envelope h = core_.ReportDone(report, MonotonicNow(), deadline);
    const uint64_t id = h.request_id();
    StartThreadLocked();
    cv_.notify_all();
    lock.unlock();
    Transmit(std::move(h));
    lock.lock();
    while (!core_.done_reply(id) && !core_.ended() && MonotonicNow() < deadline) {
      cv_.wait_until(lock, TimePoint(deadline));
    }
    const std::optional<absl::Status> reply = core_.done_reply(id);
    core_.ForgetDone(id);
    if (reply) return *reply;
  }
  if (const auto& ended = core_.ended()) return *ended;
  return absl::DeadlineExceededError(absl::StrCat("coordinator at ", coordinator(),
                                                  " did not acknowledge the done report within ", Secs(timeout)));
}

absl::Status CoordinatorSession::WaitForEnd() {
  std::unique_lock lock(mu_);
  cv_.wait(lock, [&] { return core_.ended().has_value(); });
  return *core_.ended();
}

}  // namespace tessera

#include "coordinator/etcd_leadership.h"

#include "absl/strings/str_cat.h"
#include "common/logging.h"

namespace tessera {
namespace {
std::string Secs(Nanos n) { return absl::StrCat(static_cast<double>(n / kMillis) / 1000.0, " s"); }
}  // namespace

absl::StatusOr<std::unique_ptr<EtcdLeadership>> EtcdLeadership::Create(Options options) {
  if (options.job.empty() || options.job.find('/') != std::string::npos) {
    return absl::InvalidArgumentError(absl::StrCat("etcd job name '", options.job, "' must be non-empty, without '/'"));
  }
  if (options.address.empty()) return absl::InvalidArgumentError("the coordinator's address is empty");
  auto client = EtcdClient::Create(options.endpoints, options.etcd_timeout);
  if (!client.ok()) return client.status();
  return std::unique_ptr<EtcdLeadership>(new EtcdLeadership(std::move(options), std::move(*client)));
}

EtcdLeadership::EtcdLeadership(Options options, std::unique_ptr<EtcdClient> client)
    : options_(std::move(options)),
      client_(std::move(client)),
      leader_key_(EtcdLeaderKey(options_.job)),
      state_key_(EtcdStateKey(options_.job)) {}

EtcdLeadership::~EtcdLeadership() {
  {
    std::lock_guard lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  if (keepalive_.joinable()) keepalive_.join();
}

void EtcdLeadership::Lose(std::string reason) const {
  std::lock_guard lock(mu_);
  if (lost_.exchange(true)) return;
  lost_reason_ = std::move(reason);
}

std::string EtcdLeadership::lost_reason() const {
  std::lock_guard lock(mu_);
  return lost_reason_;
}

bool EtcdLeadership::Holds() const {
  if (lost_.load()) return false;
  if (MonotonicNow() < holds_until_.load()) return true;
  Lose(absl::StrCat(
      "no keep-alive of the lease answered by etcd at ", client_->endpoints(), " for 3/4 of its TTL (",
      Secs(lease_.ttl), "): was this process paused or cut off from etcd?"));
  return false;
}

void EtcdLeadership::KeepAliveLoop() {
  std::unique_lock lock(mu_);
  while (!stopping_ && !lost_.load()) {
    cv_.wait_for(lock, std::chrono::nanoseconds(lease_.ttl / 4), [&] { return stopping_; });
    if (stopping_) break;
    const int64_t id = lease_.id;
    lock.unlock();
    const Nanos sent = MonotonicNow();
    auto ttl = client_->KeepAlive(id);
    if (sent >= holds_until_.load()) {
      // Too late: the lease may have run out while this process was away.
      (void)Holds();
    } else if (ttl.ok() && *ttl > 0) {
      holds_until_.store(sent + std::min(*ttl, lease_.ttl) * 3 / 4);
    } else if (ttl.ok()) {
      Lose(absl::StrCat("etcd says the lease ", id, " has expired"));
    } else {
      TLOG_WARN("keep-alive of the coordinator lease failed: {}", ttl.status().message());
    }
    lock.lock();
  }
}

absl::StatusOr<std::optional<proto::CoordinatorState>> EtcdLeadership::Campaign(
    const std::function<void(const std::string& leader)>& on_standby) {
  const Nanos start = MonotonicNow();
  Nanos unreachable_since = 0;
  std::string last_error;
  // Waits out an unreachable etcd for up to `patience`; false when it is spent.
  auto wait_unreachable = [&](const absl::Status& s) {
    const Nanos now = MonotonicNow();
    if (unreachable_since == 0) unreachable_since = now;
    last_error = std::string(s.message());
    if (now - unreachable_since >= options_.patience) return false;
    std::unique_lock lock(mu_);
    cv_.wait_for(lock, std::chrono::nanoseconds(options_.poll), [&] { return stopping_; });
    return true;
  };
  auto unreachable_error = [&] {
    return absl::UnavailableError(absl::StrCat("etcd at ", client_->endpoints(), " did not answer for ",
                                               Secs(MonotonicNow() - unreachable_since), ": ", last_error));
  };
  bool need_lease = true;
  std::string last_leader;
  for (;;) {
    if (need_lease || lost_.load()) {
      // A first lease, or a new one for a standby whose lease lapsed.
      if (keepalive_.joinable()) {
        {
          std::lock_guard lock(mu_);
          stopping_ = true;
        }
        cv_.notify_all();
        keepalive_.join();
        std::lock_guard lock(mu_);
        stopping_ = false;
        lost_.store(false);
        lost_reason_.clear();
      }
      const Nanos asked = MonotonicNow();
      auto lease = client_->GrantLease(options_.lease_ttl);
      if (!lease.ok()) {
        if (!wait_unreachable(lease.status())) return unreachable_error();
        continue;
      }
      unreachable_since = 0;
      {
        std::lock_guard lock(mu_);
        lease_ = *lease;
      }
      holds_until_.store(asked + lease->ttl * 3 / 4);
      keepalive_ = std::thread([this] { KeepAliveLoop(); });
      need_lease = false;
    }
    auto holder = client_->CreateIfAbsent(leader_key_, options_.address, lease_.id);
    if (!holder.ok()) {
      if (!wait_unreachable(holder.status())) return unreachable_error();
      continue;
    }
    unreachable_since = 0;
    if (!holder->has_value() || (*holder)->lease == lease_.id) break;  // ours
    if ((*holder)->value != last_leader) {
      last_leader = (*holder)->value;
      on_standby(last_leader);
    }
    std::unique_lock lock(mu_);
    cv_.wait_for(lock, std::chrono::nanoseconds(options_.poll), [&] { return stopping_; });
  }
  if (!last_leader.empty()) {
    TLOG_INFO("won the leadership of job {} after {} standing by", options_.job, Secs(MonotonicNow() - start));
  }
  for (;;) {
    auto state = client_->Get(state_key_);
    if (!state.ok()) {
      if (!wait_unreachable(state.status())) return unreachable_error();
      continue;
    }
    if (!state->has_value()) return std::optional<proto::CoordinatorState>();
    proto::CoordinatorState parsed;
    if (!parsed.ParseFromString((*state)->value)) {
      return absl::DataLossError(absl::StrCat("the value of ", state_key_, " in etcd at ", client_->endpoints(),
                                              " is not a coordinator state"));
    }
    return std::optional<proto::CoordinatorState>(std::move(parsed));
  }
}

bool EtcdLeadership::Save(const std::string& state_bytes) {
  while (Holds()) {
    auto done = client_->PutIfHeld(leader_key_, lease_.id, state_key_, state_bytes);
    if (done.ok() && *done) return true;
    if (done.ok()) {
      Lose(absl::StrCat(leader_key_, " is no longer held by this coordinator's lease (another took over)"));
      return false;
    }
    TLOG_WARN("cannot save the coordinator state in etcd: {}; trying again", done.status().message());
    std::unique_lock lock(mu_);
    cv_.wait_for(lock, std::chrono::milliseconds(50), [&] { return stopping_; });
  }
  return false;
}

void EtcdLeadership::Resign() {
  {
    std::lock_guard lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  if (keepalive_.joinable()) keepalive_.join();
  if (lease_.id != 0) (void)client_->RevokeLease(lease_.id);
  Lose("resigned");
}

}  // namespace tessera

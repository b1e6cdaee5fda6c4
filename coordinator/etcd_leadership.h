#pragma once
// EtcdLeadership: one coordinator process's candidacy for the leadership
// of a job, and the job's coordinator state, kept in etcd. Any number of
// coordinators may run for one job; one leads, the others stand by.
//
// Keys (etcd/etcd_client.h): /tessera/JOB/leader holds the leader's address
// and is attached to the leader's lease; /tessera/JOB/state holds the
// proto::CoordinatorState, written only by the leader.
//
// Promises:
// - Campaign() returns when this process holds the leader key, with the
//   state the previous leader left (nullopt for a job with no state yet).
//   Until then it stands by, polling every `poll`; it reports the leader it
//   waits on through `on_standby` whenever that leader changes.
// - The lease is kept alive from a thread every ttl/4. Holds() is true
//   while the last keep-alive etcd answered was sent less than 3/4 of the
//   TTL ago; once false it stays false (a lost lease never comes back).
//   A process paused past its TTL finds Holds() false when it resumes,
//   before it can act on anything.
// - Save() writes the state in a transaction that succeeds only while the
//   leader key is attached to this process's lease: a deposed leader can
//   never overwrite its successor's state. False means deposed (or etcd
//   unreachable past the lease): the caller must stop acting as leader.
// - Resign() revokes the lease: the leader key goes at once, and a standby
//   takes over without waiting for the TTL.
// Thread safety: Holds() may be called from any thread; the rest from one.
#include <atomic>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "common/clock.h"
#include "etcd/etcd_client.h"
#include "proto/tessera.pb.h"

namespace tessera {

class EtcdLeadership {
 public:
  struct Options {
    std::string endpoints;           // etcd client URLs, comma-separated
    std::string job;                 // the job's key prefix: /tessera/JOB/
    std::string address;             // this coordinator's address (the leader key's value)
    Nanos lease_ttl = 2 * kSeconds;  // etcd rounds shorter TTLs up to its minimum
    Nanos poll = 200 * kMillis;      // a standby's look at the leader key
    Nanos etcd_timeout = 1 * kSeconds;  // per etcd call
    Nanos patience = 30 * kSeconds;  // how long etcd may be unreachable at the start
  };
  static absl::StatusOr<std::unique_ptr<EtcdLeadership>> Create(Options options);
  ~EtcdLeadership();
  EtcdLeadership(const EtcdLeadership&) = delete;
  EtcdLeadership& operator=(const EtcdLeadership&) = delete;

  absl::StatusOr<std::optional<proto::CoordinatorState>> Campaign(
      const std::function<void(const std::string& leader)>& on_standby);
  bool Holds() const;
  bool Save(const std::string& state_bytes);
  void Resign();

  const std::string& leader_key() const { return leader_key_; }
  const std::string& endpoints() const { return client_->endpoints(); }
  // Why Holds() or Save() turned false, for the log.
  std::string lost_reason() const;

 private:
  EtcdLeadership(Options options, std::unique_ptr<EtcdClient> client);
  void KeepAliveLoop();
  void Lose(std::string reason) const;  // latches lost_ (Holds() may find the lease gone)

  const Options options_;
  std::unique_ptr<EtcdClient> client_;
  const std::string leader_key_, state_key_;
  EtcdLease lease_;

  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool stopping_ = false;
  mutable std::string lost_reason_;         // guarded by mu_
  std::atomic<Nanos> holds_until_{0};
  mutable std::atomic<bool> lost_{false};
  std::thread keepalive_;
};

}  // namespace tessera

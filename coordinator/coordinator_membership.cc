#include "coordinator/coordinator_membership.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/keys.h"

namespace tessera {

void CoordinatorMembership::HandleRegister(const Message& m, Nanos now, std::vector<Outgoing>& out) {
  const auto& req = m.header.register_request();
  Message reply = Reply(m);
  auto send_reply = [&] {
    if (!m.header.sender_address().empty()) out.push_back(Outgoing{m.header.sender_address(), std::move(reply)});
  };
  const std::string& address = m.header.sender_address();
  if (address.empty()) return;  // nowhere to answer
  if (auto it = node_by_address_.find(address); it != node_by_address_.end()) {
    const Node& known = nodes_.at(it->second);
    if (known.info.role() == proto::SERVER && req.role() == proto::SERVER) {
      // A server drained out of the job registering again: it is to stop.
      if (known.done && Removed(known.info.rank())) {
        SendRemoved(known, out);
        return;
      }
      // A server declared lost while it was only cut off or paused (it
      // learned so from the map) rejoins from the same address: a new node
      // for its dead rank, as a restarted process would be.
      if (known.lost && phase_ == Phase::kRunning && TakeOverDeadServer(m, now, out)) return;
    }
  }
  // A repeated registration (a retry whose reply was lost) gets the same answer.
  // (Looked up again: a takeover that failed may have changed the table.)
  if (auto it = node_by_address_.find(address); it != node_by_address_.end()) {
    reply.header.mutable_register_reply()->set_heartbeat_interval_ms(options_.heartbeat_interval / kMillis);
    *reply.header.mutable_register_reply()->mutable_self() = nodes_.at(it->second).info;
    reply.header.mutable_register_reply()->set_joined_running_job(nodes_.at(it->second).joined_running_job);
    send_reply();
    if (phase_ == Phase::kRunning) {
      Message ready;
      ready.header = JobReadyEnvelope();
      out.push_back(Outgoing{address, std::move(ready)});
    }
    return;
  }
  if (phase_ == Phase::kRunning && req.role() == proto::WORKER && TakeOverAwayWorker(m, now, out)) return;
  if (phase_ == Phase::kRunning && req.role() == proto::WORKER && AddWorker(m, now, out)) return;
  if (phase_ == Phase::kRunning && req.role() == proto::SERVER && TakeOverDeadServer(m, now, out)) return;
  if (phase_ == Phase::kRunning && req.role() == proto::SERVER && AddServer(m, now, out)) return;
  if (phase_ == Phase::kRunning && req.role() == proto::WORKER && options_.on_worker_loss == WorkerLossPolicy::kWait &&
      req.rank() >= 0) {
    // A replacement that came before its predecessor's lease ran out (a
    // process restarted at once): not yet, but soon (it retries).
    for (const auto& [id, n] : nodes_) {
      if (n.info.role() != proto::WORKER || n.info.rank() != static_cast<uint32_t>(req.rank()) || n.done) continue;
      SetError(reply, absl::StatusCode::kUnavailable,
               absl::StrCat(NodeName(proto::WORKER, n.info.rank()), " is held by the process at ", n.info.address(),
                            ", heard from ", Seconds(now - n.last_seen), " ago; under on_worker_loss: wait its place "
                            "is free for a replacement once that process has been silent for ",
                            Seconds(options_.lease)));
      send_reply();
      return;
    }
  }
  if (phase_ == Phase::kRunning && req.role() == proto::SERVER) {
    SetError(reply, absl::StatusCode::kFailedPrecondition,
             absl::StrCat("the job has already started with ", shard_map_.servers_size(), " servers (at most ",
                          MaxServers(), ", tessera-coordinator --max-servers): a server may join only for a dead "
                          "rank",
                          static_cast<uint32_t>(shard_map_.servers_size()) < MaxServers()
                              ? absl::StrCat(" or as the next rank, ", shard_map_.servers_size())
                              : std::string()));
    send_reply();
    return;
  }
  if (phase_ != Phase::kAssembling) {
    SetError(reply, absl::StatusCode::kFailedPrecondition,
             phase_ == Phase::kRunning
                 ? (options_.on_worker_loss == WorkerLossPolicy::kWait
                        ? "the job has already started; a process may join only to replace a lost worker, and "
                          "no worker of the requested rank is lost"
                        : "the job has already started; a process may join it only to replace a lost worker, "
                          "with on_worker_loss: wait")
                 : absl::StrCat("the job has ended: ", failure_reason_));
    send_reply();
    return;
  }
  RegisterWhileAssembling(m, now, out);
}

void CoordinatorMembership::RegisterWhileAssembling(const Message& m, Nanos now, std::vector<Outgoing>& out) {
  const auto& req = m.header.register_request();
  Message reply = Reply(m);
  auto send_reply = [&] {
    if (!m.header.sender_address().empty()) out.push_back(Outgoing{m.header.sender_address(), std::move(reply)});
  };
  const std::string& address = m.header.sender_address();
  uint32_t count;
  if (req.role() == proto::SERVER) {
    count = options_.servers;
  } else if (req.role() == proto::WORKER) {
    count = options_.workers;
  } else {
    SetError(reply, absl::StatusCode::kInvalidArgument, "only servers and workers register");
    send_reply();
    return;
  }
  std::vector<bool> taken(count, false);
  for (const auto& [id, n] : nodes_)
    if (n.info.role() == req.role()) taken[n.info.rank()] = true;
  int rank = req.rank();
  if (rank >= 0) {
    if (static_cast<uint32_t>(rank) >= count) {
      SetError(reply, absl::StatusCode::kInvalidArgument,
               absl::StrCat(NodeName(req.role(), rank), " does not exist: the job has ", count, " ",
                            RoleName(req.role()), "s (ranks 0..", count - 1, ")"));
      send_reply();
      return;
    }
    if (taken[rank]) {
      SetError(reply, absl::StatusCode::kAlreadyExists,
               absl::StrCat(NodeName(req.role(), rank), " is already registered by another process"));
      send_reply();
      return;
    }
  } else {
    auto free = std::find(taken.begin(), taken.end(), false);
    if (free == taken.end()) {
      SetError(reply, absl::StatusCode::kResourceExhausted,
               absl::StrCat("all ", count, " ", RoleName(req.role()), " ranks are taken"));
      send_reply();
      return;
    }
    rank = static_cast<int>(free - taken.begin());
  }
  Node node = NewNode(req.role(), static_cast<uint32_t>(rank), address, now);
  reply.header.mutable_register_reply()->set_heartbeat_interval_ms(options_.heartbeat_interval / kMillis);
  *reply.header.mutable_register_reply()->mutable_self() = node.info;
  node_by_address_[address] = node.info.node_id();
  nodes_.emplace(node.info.node_id(), std::move(node));
  send_reply();

  if (nodes_.size() == size_t{options_.servers} + options_.workers) {
    std::vector<proto::NodeInfo> servers(options_.servers);
    for (const auto& [id, n] : nodes_)
      if (n.info.role() == proto::SERVER) servers[n.info.rank()] = n.info;
    absl::StatusOr<proto::ShardMap> first =
        WeightedShardMap(1, options_.vshards, servers, options_.replication, options_.server_weights);
    if (!first.ok()) {
      Fail(absl::StrCat("cannot place the shards: ", first.status().message()), out);
      return;
    }
    shard_map_ = *std::move(first);
    phase_ = Phase::kRunning;
    Broadcast(JobReadyEnvelope(), out);
  }
}

bool CoordinatorMembership::TakeOverAwayWorker(const Message& m, Nanos now, std::vector<Outgoing>& out) {
  if (options_.on_worker_loss != WorkerLossPolicy::kWait) return false;
  const int rank = m.header.register_request().rank();
  Node* place = nullptr;
  for (auto& [id, n] : nodes_) {
    if (n.info.role() != proto::WORKER || !n.away || (rank >= 0 && n.info.rank() != static_cast<uint32_t>(rank)))
      continue;
    if (place == nullptr || n.info.rank() < place->info.rank()) place = &n;
  }
  if (place == nullptr) return false;
  const std::string& address = m.header.sender_address();
  node_by_address_.erase(place->info.address());  // the old process is refused from now on
  node_by_address_[address] = place->info.node_id();
  place->info.set_address(address);
  place->info.set_incarnation(place->info.incarnation() + 1);
  place->away = false;
  place->last_seen = now;
  ++stats_.rejoins;
  events_.push_back(absl::StrCat(NodeName(proto::WORKER, place->info.rank()), " rejoined from ", address,
                                 " (incarnation ", place->info.incarnation(), ") ", Seconds(now - place->away_since),
                                 " after it was lost"));
  Message reply = Reply(m);
  reply.header.mutable_register_reply()->set_heartbeat_interval_ms(options_.heartbeat_interval / kMillis);
  *reply.header.mutable_register_reply()->mutable_self() = place->info;
  out.push_back(Outgoing{address, std::move(reply)});
  Message ready;
  ready.header = JobReadyEnvelope();
  out.push_back(Outgoing{address, std::move(ready)});
  return true;
}

void CoordinatorMembership::LoseServer(Node& server, const std::string& what, Nanos now, std::vector<Outgoing>& out) {
  ++stats_.servers_lost;
  std::vector<uint32_t> orphans;
  absl::StatusOr<proto::ShardMap> next =
      WithoutServer(shard_map_, server.info.rank(), options_.restore_lost_shards ? &orphans : nullptr,
                    [&](uint32_t v, uint32_t b) { return !syncing_.contains({v, b}); });
  if (!next.ok()) {
    Fail(absl::StrCat("lost ", what, "; ", next.status().message(), " (replication ", shard_map_.replication(),
                      "): its acknowledged pushes are gone"),
         out);
    return;
  }
  server.lost = true;
  server.lost_at = now;
  server.lost_reason = what;
  uint32_t recruited = 0;
  absl::erase_if(syncing_, [&](const auto& p) { return p.second == server.info.rank(); });
  const proto::ShardMap previous = *next;
  shard_map_ = WithBackupsFilled(*next, &recruited);
  NoteRecruits(previous, shard_map_);
  events_.push_back(absl::StrCat("lost ", what, "; its shards fail over to their backups (map epoch ",
                                 shard_map_.epoch(), ")",
                                 recruited > 0 ? absl::StrCat("; ", recruited, " lost copies re-made on other servers")
                                               : std::string()));
  std::vector<proto::ShardRestore> restores;
  if (!orphans.empty()) {
    uint64_t last = 0;
    for (uint32_t v : orphans) {
      proto::ShardRestore r;
      r.set_vshard(v);
      r.set_last_applied(last_applied_.contains(v) ? last_applied_.at(v) : 0);
      last += r.last_applied();
      restores.push_back(r);
      pending_restores_[v] = {r, shard_map_.epoch()};
    }
    events_.push_back(absl::StrCat("lost the last copy of ", orphans.size(), " virtual shards (",
                                   absl::StrJoin(orphans, ", "), ") with ", what,
                                   "; they are restored from the last checkpoint (on_shard_loss: restore); their "
                                   "primaries last reported ", last, " applied pushes"));
  }
  PublishMap(absl::StrCat("lost ", what), out, restores);
}

bool CoordinatorMembership::AddServer(const Message& m, Nanos now, std::vector<Outgoing>& out) {
  const uint32_t next_rank = static_cast<uint32_t>(shard_map_.servers_size());
  const int rank = m.header.register_request().rank();
  if (next_rank >= MaxServers() || (rank >= 0 && static_cast<uint32_t>(rank) != next_rank)) return false;
  Node node = NewNode(proto::SERVER, next_rank, m.header.sender_address(), now);
  absl::StatusOr<proto::ShardMap> grown = WithServerAdded(shard_map_, node.info);
  if (!grown.ok()) return false;  // (the rank is the next: not reached)
  shard_map_ = *std::move(grown);
  node_by_address_[node.info.address()] = node.info.node_id();
  const proto::NodeInfo info = node.info;
  nodes_.emplace(info.node_id(), std::move(node));
  ++stats_.servers_added;
  events_.push_back(absl::StrCat(NodeName(proto::SERVER, info.rank()), " joined the running job from ",
                                 info.address(), " (", info.rank() + 1, " of at most ", MaxServers(),
                                 " servers; map epoch ", shard_map_.epoch(), "); it holds no shard until ",
                                 options_.rebalance.threshold > 0 ? "the rebalancer moves some to it"
                                                                  : "shards are moved to it (rebalancing is off)"));
  WelcomeServer(m, info, "joined", out);
  return true;
}

bool CoordinatorMembership::AddWorker(const Message& m, Nanos now, std::vector<Outgoing>& out) {
  uint32_t next_rank = 0;
  absl::flat_hash_set<std::string> passed;
  for (const auto& [id, n] : nodes_) {
    if (n.info.role() != proto::WORKER) continue;
    next_rank = std::max(next_rank, n.info.rank() + 1);
    for (const auto& [name, inc] : n.passed_barriers) passed.insert(name);
  }
  const int rank = m.header.register_request().rank();
  if (next_rank >= MaxWorkers() || (rank >= 0 && static_cast<uint32_t>(rank) != next_rank)) return false;
  Node node = NewNode(proto::WORKER, next_rank, m.header.sender_address(), now);
  node.catch_up_barriers = std::move(passed);
  node.joined_running_job = true;
  node_by_address_[node.info.address()] = node.info.node_id();
  const proto::NodeInfo info = node.info;
  nodes_.emplace(info.node_id(), std::move(node));
  ++stats_.workers_added;
  events_.push_back(absl::StrCat(NodeName(proto::WORKER, info.rank()), " joined the running job from ",
                                 info.address(), " (", info.rank() + 1, " of at most ", MaxWorkers(),
                                 " workers); the job waits for it from now on"));
  Message reply = Reply(m);
  reply.header.mutable_register_reply()->set_heartbeat_interval_ms(options_.heartbeat_interval / kMillis);
  reply.header.mutable_register_reply()->set_joined_running_job(true);
  *reply.header.mutable_register_reply()->mutable_self() = info;
  out.push_back(Outgoing{info.address(), std::move(reply)});
  Message ready;
  ready.header = JobReadyEnvelope();
  out.push_back(Outgoing{info.address(), std::move(ready)});
  return true;
}

bool CoordinatorMembership::TakeOverDeadServer(const Message& m, Nanos now, std::vector<Outgoing>& out) {
  const int rank = m.header.register_request().rank();
  int dead = -1;
  for (uint32_t d : shard_map_.dead_server_ranks())
    if ((rank < 0 || static_cast<uint32_t>(rank) == d) && (dead < 0 || d < static_cast<uint32_t>(dead))) dead = d;
  if (dead < 0) return false;
  // The old process's entry goes; the new one is a new node (a new stream
  // for every primary that sends to it), at the next incarnation.
  uint32_t incarnation = 0;
  Nanos lost_since = now;
  for (auto it = nodes_.begin(); it != nodes_.end(); ++it) {
    if (it->second.info.role() == proto::SERVER && it->second.info.rank() == static_cast<uint32_t>(dead)) {
      incarnation = it->second.info.incarnation() + 1;
      // (A server that was only cut off has been heard again since.)
      lost_since = it->second.lost ? it->second.lost_at : it->second.last_seen;
      node_by_address_.erase(it->second.info.address());
      nodes_.erase(it);
      break;
    }
  }
  Node node = NewNode(proto::SERVER, static_cast<uint32_t>(dead), m.header.sender_address(), now);
  node.info.set_incarnation(incarnation);
  absl::StatusOr<proto::ShardMap> back = WithServerBack(shard_map_, node.info);
  if (!back.ok()) return false;  // (a dead rank is always in the map)
  uint32_t recruited = 0;
  absl::erase_if(syncing_, [&](const auto& p) { return p.second == static_cast<uint32_t>(dead); });
  shard_map_ = WithBackupsFilled(*back, &recruited);
  NoteRecruits(*back, shard_map_);
  shard_map_.set_epoch(shard_map_.epoch() + 1);
  node_by_address_[node.info.address()] = node.info.node_id();
  const proto::NodeInfo info = node.info;
  nodes_.emplace(info.node_id(), std::move(node));
  ++stats_.rejoins;
  events_.push_back(absl::StrCat(NodeName(proto::SERVER, info.rank()), " rejoined from ", info.address(),
                                 " (incarnation ", info.incarnation(), ") ", Seconds(now - lost_since),
                                 " after it was lost; it holds ", recruited, " shard copies (map epoch ",
                                 shard_map_.epoch(), ")"));
  WelcomeServer(m, info, "rejoined", out);
  return true;
}

void CoordinatorMembership::WelcomeServer(const Message& m, const proto::NodeInfo& info, const char* how,
                                          std::vector<Outgoing>& out) {
  Message reply = Reply(m);
  reply.header.mutable_register_reply()->set_heartbeat_interval_ms(options_.heartbeat_interval / kMillis);
  *reply.header.mutable_register_reply()->mutable_self() = info;
  out.push_back(Outgoing{info.address(), std::move(reply)});
  PublishMap(absl::StrCat(NodeName(proto::SERVER, info.rank()), " ", how), out);
  Message ready;
  ready.header = JobReadyEnvelope();
  out.push_back(Outgoing{info.address(), std::move(ready)});
}

}  // namespace tessera

#include "coordinator/coordinator_core.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/keys.h"
#include "common/proto_bytes.h"

namespace tessera {
namespace {

const char* RoleName(proto::Role role) {
  switch (role) {
    case proto::SERVER: return "server";
    case proto::WORKER: return "worker";
    case proto::COORDINATOR: return "coordinator";
    default: return "node";
  }
}

std::string Seconds(Nanos n) { return absl::StrCat(static_cast<double>(n / kMillis) / 1000.0, " s"); }

void SetError(Message& reply, absl::StatusCode code, const std::string& message) {
  auto* e = reply.header.mutable_error();
  e->set_code(static_cast<int>(code));
  e->set_message(message);
}

}  // namespace

std::string CoordinatorCore::NodeName(proto::Role role, uint32_t rank) {
  return absl::StrCat(RoleName(role), " ", rank);
}

CoordinatorCore::CoordinatorCore(CoordinatorOptions options, Nanos start)
    : options_(std::move(options)), start_(start), last_heard_any_(start), load_(options_.load_tau) {}

Message CoordinatorCore::Reply(const Message& request) const {
  Message reply;
  reply.header.set_request_id(request.header.request_id());
  reply.header.set_sender_id(0);
  reply.header.set_epoch(shard_map_.epoch());
  return reply;
}

void CoordinatorCore::Broadcast(const proto::Envelope& header, std::vector<Outgoing>& out) const {
  // Deterministic order (by node id) so simulations replay exactly.
  std::vector<uint32_t> ids;
  for (const auto& [id, node] : nodes_) ids.push_back(id);
  std::sort(ids.begin(), ids.end());
  for (uint32_t id : ids) {
    Message m;
    m.header = header;
    out.push_back(Outgoing{nodes_.at(id).info.address(), std::move(m)});
  }
}

std::vector<Outgoing> CoordinatorCore::Step(const Message& m, Nanos now) {
  std::vector<Outgoing> out;
  const proto::Envelope& h = m.header;
  ++stats_.messages;
  if (h.has_heartbeat()) ++stats_.heartbeats;
  auto reply_to = [&](Message reply) {
    if (h.request_id() != 0 && !h.sender_address().empty())
      out.push_back(Outgoing{h.sender_address(), std::move(reply)});
  };
  if (h.body_case() == proto::Envelope::kRegisterRequest) {
    HandleRegister(m, now, out);
    return out;
  }
  if (h.body_case() == proto::Envelope::kDrainRequest) {  // from anyone (tessera-admin)
    HandleDrainRequest(m, now, out);
    return out;
  }
  auto it = node_by_address_.find(h.sender_address());
  if (it == node_by_address_.end()) {
    Message reply = Reply(m);
    SetError(reply, absl::StatusCode::kFailedPrecondition,
             absl::StrCat("node at '", h.sender_address(), "' is not registered with this job"));
    reply_to(std::move(reply));
    return out;
  }
  Node& node = nodes_.at(it->second);
  node.last_seen = now;
  if (silence_noted_) {
    events_.push_back(absl::StrCat("heard from ", NodeName(node.info.role(), node.info.rank()), " again after ",
                                   Seconds(now - last_heard_any_), " of silence from every node"));
  }
  last_heard_any_ = now;
  silence_noted_ = false;
  if (finished()) {  // it missed the Shutdown (a lost message): again
    Message end;
    end.header.mutable_shutdown()->set_ok(phase_ == Phase::kDone);
    end.header.mutable_shutdown()->set_reason(phase_ == Phase::kDone ? "the job has ended" : failure_reason_);
    out.push_back(Outgoing{node.info.address(), std::move(end)});
    return out;
  }
  if (node.done && node.info.role() == proto::SERVER && Removed(node.info.rank())) {
    SendRemoved(node, out);  // it missed the Shutdown: again
    return out;
  }
  if (node.lost && node.info.role() == proto::WORKER) {
    // The job went on without it (on_worker_loss: continue): it was only
    // silent, but its place is gone. It must stop, not count as done or
    // take part in barriers.
    Message end;
    end.header.mutable_shutdown()->set_ok(false);
    end.header.mutable_shutdown()->set_reason(
        absl::StrCat(NodeName(proto::WORKER, node.info.rank()), " was declared lost (", node.lost_reason,
                     ") and the job goes on without it (on_worker_loss: continue)"));
    out.push_back(Outgoing{node.info.address(), std::move(end)});
    return out;
  }
  if (node.away) {  // it was only silent (paused, or a slow network): it keeps its place
    node.away = false;
    events_.push_back(absl::StrCat(NodeName(node.info.role(), node.info.rank()), " (", node.info.address(),
                                   ") is back after ", Seconds(now - node.away_since), " of silence"));
  }
  switch (h.body_case()) {
    case proto::Envelope::kHeartbeat: {
      const proto::Heartbeat& hb = h.heartbeat();
      // A busy server's heartbeat says it lives and nothing more: what its
      // last full one said stands (proto Heartbeat.busy).
      const bool report = !hb.busy();
      for (int i = 0; report && i < hb.vshards_size() && i < hb.applied_size(); ++i) {
        const uint32_t v = hb.vshards(i);
        if (node.info.role() == proto::SERVER && v < shard_map_.num_vshards() &&
            shard_map_.vshard_server_rank(v) == node.info.rank()) {
          last_applied_[v] = hb.applied(i);  // from its current primary only
        }
      }
      Message reply = Reply(m);
      reply.header.mutable_heartbeat_ack();
      reply_to(std::move(reply));
      if (report && phase_ == Phase::kRunning && node.info.role() == proto::SERVER) {
        ResendWorkersLeft(node, hb, out);
        const uint32_t rank = node.info.rank();
        load_.OnHeartbeat(rank, node.info.node_id(), hb, now, [&](uint32_t v) {
          return v < shard_map_.num_vshards() && shard_map_.vshard_server_rank(static_cast<int>(v)) == rank;
        });
        // Moves whose copy the primary reports in sync (by the same map).
        if (h.epoch() == shard_map_.epoch()) {
          for (uint32_t v : hb.moves_in_sync())
            if (v < shard_map_.num_vshards() && shard_map_.vshard_server_rank(static_cast<int>(v)) == rank)
              FinishMove(v, out);
        }
      }
      // A node behind on the map (it missed an update) gets it again, with
      // the restores it was to make; one that has the map has them.
      if (phase_ == Phase::kRunning && h.epoch() != 0 && h.epoch() < shard_map_.epoch()) {
        Message update;
        update.header.set_epoch(shard_map_.epoch());
        *update.header.mutable_shard_map_update()->mutable_shard_map() = shard_map_;
        update.header.mutable_shard_map_update()->set_reason("a map this node missed");
        std::vector<uint32_t> vs;
        for (const auto& [v, r] : pending_restores_)
          if (node.info.role() == proto::SERVER && shard_map_.vshard_server_rank(v) == node.info.rank()) vs.push_back(v);
        std::sort(vs.begin(), vs.end());
        for (uint32_t v : vs) *update.header.mutable_shard_map_update()->add_restores() = pending_restores_.at(v).first;
        out.push_back(Outgoing{node.info.address(), std::move(update)});
      } else if (node.info.role() == proto::SERVER) {
        absl::erase_if(pending_restores_, [&](const auto& p) {
          return shard_map_.vshard_server_rank(p.first) == node.info.rank() && h.epoch() >= p.second.second;
        });
      }
      break;
    }
    case proto::Envelope::kBarrierRequest:
      HandleBarrier(m, out);
      break;
    case proto::Envelope::kWorkerDone:
      HandleWorkerDone(m, out);
      break;
    case proto::Envelope::kShardsInSync: {
      const proto::ShardsInSync& s = h.shards_in_sync();
      std::vector<uint32_t> done;
      for (uint32_t v : s.vshards()) {
        if (node.info.role() == proto::SERVER && v < shard_map_.num_vshards() &&
            shard_map_.vshard_server_rank(v) == node.info.rank() && syncing_.erase({v, s.backup_rank()}) > 0) {
          done.push_back(v);
        }
      }
      if (!done.empty()) {
        events_.push_back(absl::StrCat(NodeName(proto::SERVER, s.backup_rank()), " is in sync with ",
                                       NodeName(proto::SERVER, node.info.rank()), " on ", done.size(),
                                       " shard copies (map epoch ", shard_map_.epoch(), ")"));
      }

      break;
    }
    default: {
      Message reply = Reply(m);
      SetError(reply, absl::StatusCode::kInvalidArgument,
               absl::StrCat("coordinator does not handle message type ", h.body_case()));
      reply_to(std::move(reply));
    }
  }
  return out;
}

void CoordinatorCore::HandleRegister(const Message& m, Nanos now, std::vector<Outgoing>& out) {
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

bool CoordinatorCore::TakeOverAwayWorker(const Message& m, Nanos now, std::vector<Outgoing>& out) {
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

proto::Envelope CoordinatorCore::JobReadyEnvelope() const {
  proto::Envelope ready;
  ready.set_epoch(shard_map_.epoch());
  auto* jr = ready.mutable_job_ready();
  *jr->mutable_shard_map() = shard_map_;
  for (const auto& [id, n] : nodes_) *jr->add_nodes() = n.info;
  std::sort(jr->mutable_nodes()->begin(), jr->mutable_nodes()->end(),
            [](const auto& a, const auto& b) { return a.node_id() < b.node_id(); });
  return ready;
}

void CoordinatorCore::HandleBarrier(const Message& m, std::vector<Outgoing>& out) {
  const std::string& name = m.header.barrier_request().name();
  Message reply = Reply(m);
  Node& node = nodes_.at(node_by_address_.at(m.header.sender_address()));
  if (phase_ != Phase::kRunning || node.info.role() != proto::WORKER) {
    SetError(reply, absl::StatusCode::kFailedPrecondition,
             phase_ != Phase::kRunning ? "barrier outside a running job" : "only workers take part in barriers");
    out.push_back(Outgoing{m.header.sender_address(), std::move(reply)});
    return;
  }
  // The same request again (a worker repeats it until released): its
  // release was lost; send it again rather than start a new round.
  if (auto r = node.released_requests.find(name);
      m.header.request_id() != 0 && r != node.released_requests.end() &&
      r->second == std::make_pair(node.info.incarnation(), m.header.request_id())) {
    Message release;
    release.header.mutable_barrier_release()->set_name(name);
    out.push_back(Outgoing{node.info.address(), std::move(release)});
    return;
  }
  // A replacement catching up: its predecessor already passed this barrier.
  auto waiting = barriers_.find(name);
  const bool arrived = waiting != barriers_.end() && waiting->second.contains(node.info.node_id());
  if (auto it = node.passed_barriers.find(name);
      it != node.passed_barriers.end() && it->second < node.info.incarnation() && !arrived) {
    it->second = node.info.incarnation();
    Message release;
    release.header.mutable_barrier_release()->set_name(name);
    out.push_back(Outgoing{node.info.address(), std::move(release)});
    return;
  }
  // A worker that joined the running job: a barrier the job passed before
  // it joined is behind it (unless the others are waiting at it again now).
  if (node.catch_up_barriers.erase(name) > 0 && !arrived &&
      (waiting == barriers_.end() || waiting->second.empty())) {
    node.passed_barriers[name] = node.info.incarnation();
    Message release;
    release.header.mutable_barrier_release()->set_name(name);
    out.push_back(Outgoing{node.info.address(), std::move(release)});
    return;
  }
  barriers_[name].insert(node.info.node_id());
  barrier_requests_[name][node.info.node_id()] = m.header.request_id();
  ReleaseBarriers(out);
}

void CoordinatorCore::ReleaseBarriers(std::vector<Outgoing>& out) {
  std::vector<std::string> names;
  for (const auto& [name, arrived] : barriers_) names.push_back(name);
  std::sort(names.begin(), names.end());
  for (const std::string& name : names) {
    const auto& arrived = barriers_.at(name);
    bool complete = true;
    for (const auto& [id, n] : nodes_) {
      if (n.info.role() == proto::WORKER && !n.done && !n.lost && !arrived.contains(id)) complete = false;
    }
    if (!complete) continue;
    std::vector<uint32_t> ids(arrived.begin(), arrived.end());
    std::sort(ids.begin(), ids.end());
    for (uint32_t id : ids) {
      Node& n = nodes_.at(id);
      n.passed_barriers[name] = n.info.incarnation();
      if (auto r = barrier_requests_.find(name); r != barrier_requests_.end()) {
        if (auto req = r->second.find(id); req != r->second.end()) n.released_requests[name] = {n.info.incarnation(), req->second};
      }
      Message release;
      release.header.mutable_barrier_release()->set_name(name);
      out.push_back(Outgoing{nodes_.at(id).info.address(), std::move(release)});
    }
    barriers_.erase(name);
    barrier_requests_.erase(name);
    ++stats_.barriers_released;
  }
}

void CoordinatorCore::HandleWorkerDone(const Message& m, std::vector<Outgoing>& out) {
  Node& node = nodes_.at(node_by_address_.at(m.header.sender_address()));
  Message reply = Reply(m);
  if (node.info.role() != proto::WORKER) {
    SetError(reply, absl::StatusCode::kFailedPrecondition, "only workers report done");
  } else {
    node.done = true;
    node.report = m.header.worker_done();
    reply.header.mutable_ack();
  }
  if (m.header.request_id() != 0) out.push_back(Outgoing{m.header.sender_address(), std::move(reply)});
  if (node.done) AnnounceWorkerLeft(node, "finished", out);
  ReleaseBarriers(out);
  MaybeFinish(out);
}

void CoordinatorCore::AnnounceWorkerLeft(const Node& worker, const std::string& reason,
                                         std::vector<Outgoing>& out) const {
  std::vector<uint32_t> servers;
  for (const auto& [id, n] : nodes_)
    if (n.info.role() == proto::SERVER) servers.push_back(id);
  std::sort(servers.begin(), servers.end());
  for (uint32_t id : servers) {
    Message m;
    m.header.mutable_workers_left()->add_worker_node_ids(worker.info.node_id());
    m.header.mutable_workers_left()->set_reason(
        absl::StrCat(NodeName(proto::WORKER, worker.info.rank()), " ", reason));
    out.push_back(Outgoing{nodes_.at(id).info.address(), std::move(m)});
  }
}

void CoordinatorCore::ResendWorkersLeft(const Node& server, const proto::Heartbeat& hb,
                                         std::vector<Outgoing>& out) const {
  std::vector<uint32_t> left;
  for (const auto& [id, n] : nodes_)
    if (n.info.role() == proto::WORKER && (n.lost || n.done)) left.push_back(id);
  if (hb.workers_left() >= left.size()) return;
  std::sort(left.begin(), left.end());
  Message m;
  for (uint32_t id : left) m.header.mutable_workers_left()->add_worker_node_ids(id);
  m.header.mutable_workers_left()->set_reason(absl::StrCat(
      "sent again: server ", server.info.rank(), " knows of ", hb.workers_left(), " of the ", left.size(),
      " workers that left"));
  out.push_back(Outgoing{server.info.address(), std::move(m)});
}

void CoordinatorCore::MaybeFinish(std::vector<Outgoing>& out) {
  if (phase_ != Phase::kRunning) return;
  size_t done = 0, lost = 0, workers = 0;
  for (const auto& [id, n] : nodes_) {
    if (n.info.role() != proto::WORKER) continue;
    ++workers;  // (with those that joined the running job)
    lost += n.lost;
    done += n.done && !n.lost;  // (a lost worker is never done: its reports are refused)
  }
  if (done + lost < std::max<size_t>(options_.workers, workers)) return;
  if (done == 0) {
    Fail(absl::StrCat("every worker was lost"), out);
    return;
  }
  phase_ = Phase::kDone;
  proto::Envelope shutdown;
  shutdown.mutable_shutdown()->set_ok(true);
  shutdown.mutable_shutdown()->set_reason(lost == 0 ? "all workers finished"
                                                    : absl::StrCat(done, " workers finished, ", lost, " lost"));
  Broadcast(shutdown, out);
}

std::vector<std::string> CoordinatorCore::MissingNodes() const {
  std::vector<std::string> missing;
  for (proto::Role role : {proto::SERVER, proto::WORKER}) {
    uint32_t count = role == proto::SERVER ? options_.servers : options_.workers;
    std::vector<bool> present(count, false);
    for (const auto& [id, n] : nodes_)
      if (n.info.role() == role) present[n.info.rank()] = true;
    for (uint32_t r = 0; r < count; ++r)
      if (!present[r]) missing.push_back(NodeName(role, r));
  }
  return missing;
}

void CoordinatorCore::Fail(const std::string& reason, std::vector<Outgoing>& out) {
  phase_ = Phase::kFailed;
  failure_reason_ = reason;
  proto::Envelope shutdown;
  shutdown.mutable_shutdown()->set_ok(false);
  shutdown.mutable_shutdown()->set_reason(reason);
  Broadcast(shutdown, out);
}

void CoordinatorCore::LoseServer(Node& server, const std::string& what, Nanos now, std::vector<Outgoing>& out) {
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

proto::CoordinatorState CoordinatorCore::SaveState(bool with_counts) const {
  proto::CoordinatorState s;
  s.set_address(options_.address);
  s.set_phase(static_cast<uint32_t>(phase_));
  s.set_failure_reason(failure_reason_);
  s.set_next_node_id(next_node_id_);
  std::vector<uint32_t> ids;
  for (const auto& [id, n] : nodes_) ids.push_back(id);
  std::sort(ids.begin(), ids.end());
  for (uint32_t id : ids) {
    const Node& n = nodes_.at(id);
    proto::CoordinatorNodeState* ns = s.add_nodes();
    *ns->mutable_info() = n.info;
    ns->set_done(n.done);
    ns->set_lost(n.lost);
    ns->set_lost_reason(n.lost_reason);
    ns->set_away(n.away);
    ns->set_away_reason(n.away_reason);
    for (const auto& [name, inc] : n.passed_barriers) (*ns->mutable_passed_barriers())[name] = inc;
    *ns->mutable_report() = n.report;
    std::vector<std::string> catch_up(n.catch_up_barriers.begin(), n.catch_up_barriers.end());
    std::sort(catch_up.begin(), catch_up.end());
    for (std::string& name : catch_up) ns->add_catch_up_barriers(std::move(name));
    ns->set_joined_running_job(n.joined_running_job);
  }
  *s.mutable_shard_map() = shard_map_;
  std::vector<std::string> names;
  for (const auto& [name, arrived] : barriers_) names.push_back(name);
  std::sort(names.begin(), names.end());
  for (const std::string& name : names) {
    proto::CoordinatorBarrierState* b = s.add_barriers();
    b->set_name(name);
    std::vector<uint32_t> arrived(barriers_.at(name).begin(), barriers_.at(name).end());
    std::sort(arrived.begin(), arrived.end());
    for (uint32_t id : arrived) b->add_node_ids(id);
  }
  std::vector<std::pair<uint32_t, uint32_t>> syncing(syncing_.begin(), syncing_.end());
  std::sort(syncing.begin(), syncing.end());
  for (const auto& [v, b] : syncing) {
    s.add_syncing_vshards(v);
    s.add_syncing_ranks(b);
  }
  std::vector<uint32_t> restoring;
  for (const auto& [v, r] : pending_restores_) restoring.push_back(v);
  std::sort(restoring.begin(), restoring.end());
  for (uint32_t v : restoring) {
    *s.add_pending_restores() = pending_restores_.at(v).first;
    s.add_pending_restore_epochs(pending_restores_.at(v).second);
  }
  if (with_counts) {
    std::vector<std::pair<uint32_t, uint64_t>> applied(last_applied_.begin(), last_applied_.end());
    std::sort(applied.begin(), applied.end());
    for (const auto& [v, n] : applied) {
      s.add_applied_vshards(v);
      s.add_applied_counts(n);
    }
  }
  return s;
}

absl::Status CoordinatorCore::RestoreState(const proto::CoordinatorState& s, Nanos now, std::string_view source) {
  if (!nodes_.empty()) return absl::FailedPreconditionError("a coordinator restores its state only when fresh");
  if (s.phase() > static_cast<uint32_t>(Phase::kFailed)) {
    return absl::InvalidArgumentError(absl::StrCat("state file: unknown phase ", s.phase()));
  }
  if (s.phase() != static_cast<uint32_t>(Phase::kAssembling)) {
    if (auto view = ShardMapView::Create(s.shard_map()); !view.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("state file: ", view.status().message()));
    }
    const uint32_t in_map = static_cast<uint32_t>(s.shard_map().servers_size());
    if (in_map < options_.servers || in_map > MaxServers()) {
      return absl::InvalidArgumentError(absl::StrCat("state file: a shard map of ", in_map, " servers for a job of ",
                                                     options_.servers, MaxServers() > options_.servers
                                                         ? absl::StrCat(" to ", MaxServers()) : std::string()));
    }
  }
  absl::flat_hash_map<uint32_t, Node> nodes;
  absl::flat_hash_map<std::string, uint32_t> by_address;
  for (const proto::CoordinatorNodeState& ns : s.nodes()) {
    Node n;
    n.info = ns.info();
    n.last_seen = now;
    n.done = ns.done();
    n.lost = ns.lost();
    n.lost_reason = ns.lost_reason();
    n.away = ns.away();
    n.away_since = now;
    n.away_reason = ns.away_reason();
    for (const auto& [name, inc] : ns.passed_barriers()) n.passed_barriers[name] = inc;
    n.report = ns.report();
    n.catch_up_barriers.insert(ns.catch_up_barriers().begin(), ns.catch_up_barriers().end());
    n.joined_running_job = ns.joined_running_job();
    const uint32_t servers = s.phase() == static_cast<uint32_t>(Phase::kAssembling)
                                 ? options_.servers
                                 : static_cast<uint32_t>(s.shard_map().servers_size());
    const uint32_t count = n.info.role() == proto::SERVER   ? servers
                           : n.info.role() == proto::WORKER ? MaxWorkers()
                                                            : 0;
    if (n.info.rank() >= count) {
      return absl::InvalidArgumentError(absl::StrCat("state file: node ", n.info.node_id(), " has role ",
                                                     n.info.role(), " and rank ", n.info.rank(),
                                                     ", not one of this job's"));
    }
    if (n.info.node_id() == 0 || n.info.node_id() >= s.next_node_id() || !nodes.emplace(n.info.node_id(), n).second) {
      return absl::InvalidArgumentError(absl::StrCat("state file: bad or repeated node id ", n.info.node_id()));
    }
    by_address[n.info.address()] = n.info.node_id();
  }
  if (s.syncing_vshards_size() != s.syncing_ranks_size() ||
      s.pending_restores_size() != s.pending_restore_epochs_size() ||
      s.applied_vshards_size() != s.applied_counts_size()) {
    return absl::InvalidArgumentError("state file: parallel lists do not pair up");
  }
  phase_ = static_cast<Phase>(s.phase());
  failure_reason_ = s.failure_reason();
  next_node_id_ = s.next_node_id();
  nodes_ = std::move(nodes);
  node_by_address_ = std::move(by_address);
  shard_map_ = s.shard_map();
  barriers_.clear();
  for (const proto::CoordinatorBarrierState& b : s.barriers())
    barriers_[b.name()].insert(b.node_ids().begin(), b.node_ids().end());
  syncing_.clear();
  for (int i = 0; i < s.syncing_vshards_size(); ++i) syncing_.insert({s.syncing_vshards(i), s.syncing_ranks(i)});
  pending_restores_.clear();
  for (int i = 0; i < s.pending_restores_size(); ++i) {
    pending_restores_[s.pending_restores(i).vshard()] = {s.pending_restores(i), s.pending_restore_epochs(i)};
  }
  last_applied_.clear();
  for (int i = 0; i < s.applied_vshards_size(); ++i) last_applied_[s.applied_vshards(i)] = s.applied_counts(i);
  events_.push_back(absl::StrCat("took the job over from ", std::string(source), ": ", nodes_.size(), " nodes, shard map epoch ",
                                 shard_map_.epoch()));
  return absl::OkStatus();
}

void CoordinatorCore::NoteRecruits(const proto::ShardMap& previous, const proto::ShardMap& next) {
  const BackupLists before = BackupListsOf(previous);
  const BackupLists after = BackupListsOf(next);
  for (uint32_t v = 0; v < next.num_vshards() && v < after.size(); ++v) {
    for (uint32_t b : after[v]) {
      const bool had = v < before.size() && std::find(before[v].begin(), before[v].end(), b) != before[v].end();
      if (!had) syncing_.insert({v, b});
    }
  }
}

void CoordinatorCore::PublishMap(const std::string& reason, std::vector<Outgoing>& out,
                                 const std::vector<proto::ShardRestore>& restores) {
  ++stats_.maps_published;
  proto::Envelope update;
  update.set_epoch(shard_map_.epoch());
  *update.mutable_shard_map_update()->mutable_shard_map() = shard_map_;
  update.mutable_shard_map_update()->set_reason(reason);
  for (const proto::ShardRestore& r : restores) *update.mutable_shard_map_update()->add_restores() = r;
  Broadcast(update, out);
}

CoordinatorCore::Node CoordinatorCore::NewNode(proto::Role role, uint32_t rank, const std::string& address,
                                               Nanos now) {
  Node node;
  node.info.set_node_id(next_node_id_++);
  node.info.set_role(role);
  node.info.set_rank(rank);
  node.info.set_address(address);
  node.last_seen = now;
  return node;
}

bool CoordinatorCore::AddServer(const Message& m, Nanos now, std::vector<Outgoing>& out) {
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

bool CoordinatorCore::AddWorker(const Message& m, Nanos now, std::vector<Outgoing>& out) {
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

bool CoordinatorCore::TakeOverDeadServer(const Message& m, Nanos now, std::vector<Outgoing>& out) {
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

void CoordinatorCore::WelcomeServer(const Message& m, const proto::NodeInfo& info, const char* how,
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

std::vector<Outgoing> CoordinatorCore::Tick(Nanos now) {
  std::vector<Outgoing> out;
  if (phase_ == Phase::kAssembling && now - start_ >= options_.assemble_timeout) {
    Fail(absl::StrCat("job did not assemble within ", Seconds(options_.assemble_timeout), ": missing ",
                      absl::StrJoin(MissingNodes(), ", ")),
         out);
    return out;
  }
  if (phase_ != Phase::kAssembling && phase_ != Phase::kRunning) return out;
  if (phase_ == Phase::kRunning) {
    const Nanos shortest = options_.server_lease > 0 && shard_map_.replication() > 1
                               ? std::min(options_.server_lease, options_.lease)
                               : options_.lease;
    // Half the shortest lease: nodes heartbeat at different moments, so the
    // first lease would run out before a whole lease of silence from every
    // node; with servers heartbeating every 0.1 s, half a 0.5 s lease with
    // none of them heard is the coordinator's silence. (Taking a silence
    // for its own by mistake only delays a loss by a lease.)
    const Nanos silence = now - last_heard_any_;
    if (silence >= shortest / 2 && silence < options_.isolation_give_up) {
      for (auto& [id, n] : nodes_) n.last_seen = std::max(n.last_seen, now);
      if (!silence_noted_) {
        silence_noted_ = true;
        events_.push_back(absl::StrCat("heard from no node for ", Seconds(silence),
                                       ": taking that for this coordinator's own isolation (a cut network or a "
                                       "pause), not every node's loss; nobody is declared lost for up to ",
                                       Seconds(options_.isolation_give_up), " of it"));
      }
    }
  }
  std::vector<std::string> fatal;
  std::vector<uint32_t> ids;
  for (const auto& [id, n] : nodes_) ids.push_back(id);
  std::sort(ids.begin(), ids.end());
  for (uint32_t id : ids) {
    Node& n = nodes_.at(id);
    if (n.away) {
      if (now - n.away_since >= options_.rejoin_timeout) {
        fatal.push_back(absl::StrCat(n.away_reason, ", and no replacement joined within ",
                                     Seconds(options_.rejoin_timeout), " (on_worker_loss: wait)"));
      }
      continue;
    }
    // Servers are watched on their own (shorter) lease where a loss is survivable.
    const Nanos lease = n.info.role() == proto::SERVER && options_.server_lease > 0 && shard_map_.replication() > 1
                            ? options_.server_lease
                            : options_.lease;
    if (n.done || n.lost || now - n.last_seen < lease) continue;
    if (n.info.role() == proto::WORKER) ++stats_.workers_lost;
    std::string what = absl::StrCat(NodeName(n.info.role(), n.info.rank()), " (", n.info.address(),
                                    "): no heartbeat for ", Seconds(now - n.last_seen));
    if (n.info.role() == proto::WORKER && phase_ == Phase::kRunning &&
        options_.on_worker_loss == WorkerLossPolicy::kContinue) {
      n.lost = true;
      n.lost_reason = what;
      events_.push_back(absl::StrCat("lost ", what, "; the job goes on without it (on_worker_loss: continue)"));
      AnnounceWorkerLeft(n, absl::StrCat("was lost: no heartbeat for ", Seconds(now - n.last_seen)), out);
      continue;
    }
    if (n.info.role() == proto::WORKER && phase_ == Phase::kRunning &&
        options_.on_worker_loss == WorkerLossPolicy::kWait) {
      n.away = true;
      n.away_since = now;
      n.away_reason = what;
      events_.push_back(absl::StrCat("lost ", what, "; its place is kept for a replacement for up to ",
                                     Seconds(options_.rejoin_timeout), " (on_worker_loss: wait)"));
      continue;
    }
    if (n.info.role() == proto::SERVER && phase_ == Phase::kRunning &&
        (shard_map_.replication() > 1 || options_.restore_lost_shards)) {
      LoseServer(n, what, now, out);
      if (phase_ == Phase::kFailed) return out;
      continue;
    }
    fatal.push_back(std::move(what));
  }
  if (!fatal.empty()) {
    Fail(absl::StrCat("lost ", absl::StrJoin(fatal, "; ")), out);
    return out;
  }
  if (phase_ == Phase::kRunning) {
    CheckMoves(now, out);
    MaybeDrain(now, out);
    MaybeRebalance(now, out);
  }
  ReleaseBarriers(out);
  MaybeFinish(out);
  return out;
}

absl::StatusOr<std::vector<Outgoing>> CoordinatorCore::StartMove(uint32_t vshard, uint32_t to, Nanos now,
                                                                 const std::string& why, uint32_t from) {
  if (phase_ != Phase::kRunning) return absl::FailedPreconditionError("a shard moves only while the job runs");
  if (shard_map_.moving_vshards_size() > 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("shard ", shard_map_.moving_vshards(0), " is moving; one move at a time"));
  }
  if (syncing_.contains({vshard, to})) {
    return absl::FailedPreconditionError(absl::StrCat("server ", to, " is a backup of shard ", vshard,
                                                      " that does not have its state yet"));
  }
  absl::StatusOr<proto::ShardMap> next = WithMoveStarted(shard_map_, vshard, to, from);
  if (!next.ok()) return next.status();
  const uint32_t primary = shard_map_.vshard_server_rank(static_cast<int>(vshard));
  if (from == ShardMapView::kNotMoving) from = primary;
  const bool copy = !ShardMapView::Create(shard_map_)->Holds(to, vshard);
  shard_map_ = *std::move(next);
  ++stats_.moves_started;
  if (copy) syncing_.insert({vshard, to});
  move_deadline_[vshard] = now + options_.move_timeout;
  const std::string reason = absl::StrCat("moving shard ", vshard, from == primary ? "" : "'s backup copy", " from ",
                                          NodeName(proto::SERVER, from), " to ", NodeName(proto::SERVER, to),
                                          copy ? "" : " (a backup of it)");
  events_.push_back(
      absl::StrCat(reason, " (map epoch ", shard_map_.epoch(), ")", why.empty() ? "" : ": ", why));
  std::vector<Outgoing> out;
  PublishMap(reason, out);
  if (options_.test_switch_before_sync) FinishMove(vshard, out);
  return out;
}

void CoordinatorCore::FinishMove(uint32_t vshard, std::vector<Outgoing>& out) {
  const uint32_t to = MovingTo(shard_map_, vshard);
  if (to == ShardMapView::kNotMoving) return;
  const uint32_t from = MovingFrom(shard_map_, vshard);
  const bool backup = from != shard_map_.vshard_server_rank(static_cast<int>(vshard));
  absl::StatusOr<proto::ShardMap> next = WithMoveFinished(shard_map_, vshard);
  if (!next.ok()) return;  // (checked above)
  shard_map_ = *std::move(next);
  syncing_.erase({vshard, to});
  move_deadline_.erase(vshard);
  ++stats_.moves_finished;
  const std::string reason = absl::StrCat("moved shard ", vshard, backup ? "'s backup copy" : "", " from ",
                                          NodeName(proto::SERVER, from), " to ", NodeName(proto::SERVER, to));
  events_.push_back(absl::StrCat(reason, " (map epoch ", shard_map_.epoch(), ")"));
  PublishMap(reason, out);
}

void CoordinatorCore::CheckMoves(Nanos now, std::vector<Outgoing>& out) {
  auto moving = [&](uint32_t v) { return MovingTo(shard_map_, v) != ShardMapView::kNotMoving; };
  // A failover may have ended a move (a lost source or destination); a
  // restored coordinator finds moves in the map without deadlines.
  for (auto it = move_deadline_.begin(); it != move_deadline_.end();) {
    if (!moving(it->first)) {
      ++stats_.moves_cancelled;
      events_.push_back(absl::StrCat("the move of shard ", it->first, " ended with a lost server (map epoch ",
                                     shard_map_.epoch(), ")"));
      move_deadline_.erase(it++);
    } else {
      ++it;
    }
  }
  for (uint32_t v : shard_map_.moving_vshards())
    if (!move_deadline_.contains(v)) move_deadline_[v] = now + options_.move_timeout;
  std::vector<uint32_t> late;
  for (const auto& [v, deadline] : move_deadline_)
    if (now >= deadline) late.push_back(v);
  std::sort(late.begin(), late.end());
  for (uint32_t v : late) {
    const uint32_t to = MovingTo(shard_map_, v);
    absl::StatusOr<proto::ShardMap> next = WithMoveCancelled(shard_map_, v);
    if (!next.ok()) continue;
    shard_map_ = *std::move(next);
    if (!ShardMapView::Create(shard_map_)->Holds(to, v)) syncing_.erase({v, to});
    move_deadline_.erase(v);
    ++stats_.moves_cancelled;
    const std::string reason =
        absl::StrCat("gave up moving shard ", v, " to ", NodeName(proto::SERVER, to), ": its copy was not in sync within ",
                     Seconds(options_.move_timeout));
    events_.push_back(absl::StrCat(reason, " (map epoch ", shard_map_.epoch(), ")"));
    PublishMap(reason, out);
  }
}

std::vector<double> CoordinatorCore::ShardCosts() const {
  std::vector<double> cost(shard_map_.num_vshards(), 0.0);
  for (const auto& [v, l] : load_.shards()) {
    if (v < cost.size()) {
      cost[v] = l.bytes_in_per_s + l.bytes_out_per_s + l.requests_per_s * options_.rebalance.request_cost_bytes;
    }
  }
  return cost;
}

void CoordinatorCore::MaybeRebalance(Nanos now, std::vector<Outgoing>& out) {
  const RebalanceOptions& o = options_.rebalance;
  if (o.threshold <= 0 || shard_map_.draining_server_ranks_size() > 0) return;  // a drain goes first
  if (last_rebalance_at_ < 0) last_rebalance_at_ = now;  // the first interval measures
  if (now - last_rebalance_at_ < o.interval || !move_deadline_.empty()) return;
  // Every live server must have reported its load.
  const auto& servers = load_.servers();
  for (uint32_t r = 0; r < static_cast<uint32_t>(shard_map_.servers_size()); ++r) {
    const bool dead = std::find(shard_map_.dead_server_ranks().begin(), shard_map_.dead_server_ranks().end(), r) !=
                      shard_map_.dead_server_ranks().end();
    if (!dead && (r >= servers.size() || !servers[r].have_baseline)) return;
  }
  last_rebalance_at_ = now;
  const MovePlan plan = PlanMove(shard_map_, ShardCosts(), o.threshold);
  if (!plan.move) return;
  absl::StatusOr<std::vector<Outgoing>> moved = StartMove(plan.vshard, plan.to, now, plan.why);
  if (!moved.ok()) {
    events_.push_back(absl::StrCat("rebalancer: ", plan.why, "; not started: ", moved.status().message()));
    return;
  }
  for (Outgoing& o2 : *moved) out.push_back(std::move(o2));
}

absl::StatusOr<std::vector<Outgoing>> CoordinatorCore::Drain(uint32_t rank, Nanos now) {
  if (phase_ != Phase::kRunning) return absl::FailedPreconditionError("a server is drained only while the job runs");
  std::vector<Outgoing> out;
  if (Removed(rank)) return out;
  absl::StatusOr<proto::ShardMap> next = WithServerDraining(shard_map_, rank);
  if (!next.ok()) return next.status();
  if (next->epoch() == shard_map_.epoch()) return out;  // draining already
  shard_map_ = *std::move(next);
  const uint32_t copies = CopiesHeldBy(shard_map_, rank);
  const std::string reason = absl::StrCat("draining ", NodeName(proto::SERVER, rank), " (", copies, " shard cop",
                                          copies == 1 ? "y" : "ies", " to move away)");
  events_.push_back(absl::StrCat(reason, " (map epoch ", shard_map_.epoch(), ")"));
  PublishMap(reason, out);
  MaybeDrain(now, out);
  return out;
}

bool CoordinatorCore::Removed(uint32_t rank) const {
  const auto& dead = shard_map_.dead_server_ranks();
  if (std::find(dead.begin(), dead.end(), rank) == dead.end()) return false;
  for (const auto& [id, n] : nodes_)
    if (n.info.role() == proto::SERVER && n.info.rank() == rank) return n.done;
  return false;
}

void CoordinatorCore::SendRemoved(const Node& server, std::vector<Outgoing>& out) const {
  Message end;
  end.header.mutable_shutdown()->set_ok(true);
  end.header.mutable_shutdown()->set_reason(
      absl::StrCat(NodeName(proto::SERVER, server.info.rank()), " was drained and removed from the job"));
  out.push_back(Outgoing{server.info.address(), std::move(end)});
}

void CoordinatorCore::MaybeDrain(Nanos now, std::vector<Outgoing>& out) {
  if (shard_map_.draining_server_ranks_size() == 0) return;
  const DrainPlan plan = PlanDrain(shard_map_, ShardCosts());
  for (uint32_t d : plan.drained) {
    absl::StatusOr<proto::ShardMap> next = WithoutServer(shard_map_, d);
    if (!next.ok()) continue;  // (it holds nothing: not reached)
    shard_map_ = *std::move(next);
    absl::erase_if(syncing_, [&](const auto& p) { return p.second == d; });
    ++stats_.servers_drained;
    const std::string reason = absl::StrCat(NodeName(proto::SERVER, d), " was drained and removed");
    events_.push_back(absl::StrCat(reason, " (map epoch ", shard_map_.epoch(), ")"));
    PublishMap(reason, out);
    for (auto& [id, n] : nodes_) {
      if (n.info.role() == proto::SERVER && n.info.rank() == d) {
        n.done = true;
        SendRemoved(n, out);
      }
    }
  }
  if (shard_map_.moving_vshards_size() > 0 || !move_deadline_.empty()) return;  // one move at a time
  if (!plan.move) {
    if (!plan.why.empty() && plan.why != last_drain_note_) events_.push_back(absl::StrCat("drain: ", plan.why));
    last_drain_note_ = plan.why;
    return;
  }
  absl::StatusOr<std::vector<Outgoing>> moved = StartMove(plan.vshard, plan.to, now, plan.why, plan.from);
  if (!moved.ok()) {
    const std::string note = absl::StrCat(plan.why, "; not started: ", moved.status().message());
    if (note != last_drain_note_) events_.push_back(absl::StrCat("drain: ", note));
    last_drain_note_ = note;
    return;
  }
  last_drain_note_.clear();
  for (Outgoing& o : *moved) out.push_back(std::move(o));
}

void CoordinatorCore::HandleDrainRequest(const Message& m, Nanos now, std::vector<Outgoing>& out) {
  const uint32_t rank = m.header.drain_request().server_rank();
  Message reply = Reply(m);
  if (Removed(rank)) {
    proto::DrainReply* r = reply.header.mutable_drain_reply();
    r->set_server_rank(rank);
    r->set_removed(true);
    r->set_state(absl::StrCat(NodeName(proto::SERVER, rank), " was drained and removed from the job"));
  } else if (absl::StatusOr<std::vector<Outgoing>> started = Drain(rank, now); !started.ok()) {
    SetError(reply, started.status().code(), std::string(started.status().message()));
  } else {
    for (Outgoing& o : *started) out.push_back(std::move(o));
    proto::DrainReply* r = reply.header.mutable_drain_reply();
    r->set_server_rank(rank);
    r->set_removed(Removed(rank));
    r->set_copies_left(r->removed() ? 0 : CopiesHeldBy(shard_map_, rank));
    std::string state = r->removed() ? absl::StrCat(NodeName(proto::SERVER, rank), " was drained and removed from the job")
                                     : absl::StrCat("draining ", NodeName(proto::SERVER, rank), ": ",
                                                    r->copies_left(), " shard cop",
                                                    r->copies_left() == 1 ? "y" : "ies", " left");
    for (uint32_t v : shard_map_.moving_vshards()) {
      absl::StrAppend(&state, "; moving shard ", v, " from ", NodeName(proto::SERVER, MovingFrom(shard_map_, v)),
                      " to ", NodeName(proto::SERVER, MovingTo(shard_map_, v)));
    }
    if (!r->removed() && !last_drain_note_.empty()) absl::StrAppend(&state, "; ", last_drain_note_);
    r->set_state(std::move(state));
  }
  if (m.header.request_id() != 0 && !m.header.sender_address().empty())
    out.push_back(Outgoing{m.header.sender_address(), std::move(reply)});
}

std::optional<std::string> CoordinatorStateSaver::Due(const CoordinatorCore& core, Nanos now) {
  pending_ = DeterministicBytes(core.SaveState(/*with_counts=*/false));
  const bool counts_due = !written_once_ || now - counts_written_at_ >= counts_every_;
  if (pending_ == saved_ && !counts_due) return std::nullopt;
  return DeterministicBytes(core.SaveState(/*with_counts=*/true));
}

void CoordinatorStateSaver::Written(Nanos now) {
  saved_ = pending_;
  counts_written_at_ = now;
  written_once_ = true;
}

}  // namespace tessera

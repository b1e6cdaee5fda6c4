#include "coordinator/coordinator_core.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/keys.h"
#include "common/proto_bytes.h"

namespace tessera {

CoordinatorCore::CoordinatorCore(CoordinatorOptions options, Nanos start)
    : CoordinatorMembership(std::move(options)), start_(start), last_heard_any_(start) {}

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
    case proto::Envelope::kHeartbeat:
      HandleHeartbeat(m, node, now, out);
      break;
    case proto::Envelope::kBarrierRequest:
      HandleBarrier(m, out);
      break;
    case proto::Envelope::kWorkerDone:
      HandleWorkerDone(m, out);
      break;
    case proto::Envelope::kShardsInSync:
      HandleShardsInSync(m, node);
      break;
    default: {
      Message reply = Reply(m);
      SetError(reply, absl::StatusCode::kInvalidArgument,
               absl::StrCat("coordinator does not handle message type ", h.body_case()));
      reply_to(std::move(reply));
    }
  }
  return out;
}

void CoordinatorCore::HandleHeartbeat(const Message& m, Node& node, Nanos now, std::vector<Outgoing>& out) {
  const proto::Envelope& h = m.header;
  auto reply_to = [&](Message reply) {
    if (h.request_id() != 0 && !h.sender_address().empty())
      out.push_back(Outgoing{h.sender_address(), std::move(reply)});
  };
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
}

void CoordinatorCore::HandleShardsInSync(const Message& m, const Node& node) {
  const proto::Envelope& h = m.header;
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

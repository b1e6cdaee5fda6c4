#include "coordinator/coordinator_moves.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/keys.h"

namespace tessera {

absl::StatusOr<std::vector<Outgoing>> CoordinatorMoves::StartMove(uint32_t vshard, uint32_t to, Nanos now,
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

void CoordinatorMoves::FinishMove(uint32_t vshard, std::vector<Outgoing>& out) {
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

void CoordinatorMoves::CheckMoves(Nanos now, std::vector<Outgoing>& out) {
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

std::vector<double> CoordinatorMoves::ShardCosts() const {
  std::vector<double> cost(shard_map_.num_vshards(), 0.0);
  for (const auto& [v, l] : load_.shards()) {
    if (v < cost.size()) {
      cost[v] = l.bytes_in_per_s + l.bytes_out_per_s + l.requests_per_s * options_.rebalance.request_cost_bytes;
    }
  }
  return cost;
}

void CoordinatorMoves::MaybeRebalance(Nanos now, std::vector<Outgoing>& out) {
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

absl::StatusOr<std::vector<Outgoing>> CoordinatorMoves::Drain(uint32_t rank, Nanos now) {
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

bool CoordinatorMoves::Removed(uint32_t rank) const {
  const auto& dead = shard_map_.dead_server_ranks();
  if (std::find(dead.begin(), dead.end(), rank) == dead.end()) return false;
  for (const auto& [id, n] : nodes_)
    if (n.info.role() == proto::SERVER && n.info.rank() == rank) return n.done;
  return false;
}

void CoordinatorMoves::SendRemoved(const Node& server, std::vector<Outgoing>& out) const {
  Message end;
  end.header.mutable_shutdown()->set_ok(true);
  end.header.mutable_shutdown()->set_reason(
      absl::StrCat(NodeName(proto::SERVER, server.info.rank()), " was drained and removed from the job"));
  out.push_back(Outgoing{server.info.address(), std::move(end)});
}

void CoordinatorMoves::MaybeDrain(Nanos now, std::vector<Outgoing>& out) {
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

void CoordinatorMoves::HandleDrainRequest(const Message& m, Nanos now, std::vector<Outgoing>& out) {
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

}  // namespace tessera

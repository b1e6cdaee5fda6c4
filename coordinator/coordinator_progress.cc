#include "coordinator/coordinator_progress.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace tessera {

void CoordinatorProgress::HandleBarrier(const Message& m, std::vector<Outgoing>& out) {
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

void CoordinatorProgress::ReleaseBarriers(std::vector<Outgoing>& out) {
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

void CoordinatorProgress::HandleWorkerDone(const Message& m, std::vector<Outgoing>& out) {
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

void CoordinatorProgress::AnnounceWorkerLeft(const Node& worker, const std::string& reason,
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

void CoordinatorProgress::ResendWorkersLeft(const Node& server, const proto::Heartbeat& hb,
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

void CoordinatorProgress::MaybeFinish(std::vector<Outgoing>& out) {
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

}  // namespace tessera

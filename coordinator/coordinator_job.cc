#include "coordinator/coordinator_job.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace tessera {

const char* CoordinatorJob::RoleName(proto::Role role) {
  switch (role) {
    case proto::SERVER: return "server";
    case proto::WORKER: return "worker";
    case proto::COORDINATOR: return "coordinator";
    default: return "node";
  }
}

std::string CoordinatorJob::Seconds(Nanos n) { return absl::StrCat(static_cast<double>(n / kMillis) / 1000.0, " s"); }

void CoordinatorJob::SetError(Message& reply, absl::StatusCode code, const std::string& message) {
  auto* e = reply.header.mutable_error();
  e->set_code(static_cast<int>(code));
  e->set_message(message);
}

std::string CoordinatorJob::NodeName(proto::Role role, uint32_t rank) {
  return absl::StrCat(RoleName(role), " ", rank);
}

CoordinatorJob::CoordinatorJob(CoordinatorOptions options)
    : options_(std::move(options)), load_(options_.load_tau) {}

Message CoordinatorJob::Reply(const Message& request) const {
  Message reply;
  reply.header.set_request_id(request.header.request_id());
  reply.header.set_sender_id(0);
  reply.header.set_epoch(shard_map_.epoch());
  return reply;
}

void CoordinatorJob::Broadcast(const proto::Envelope& header, std::vector<Outgoing>& out) const {
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

proto::Envelope CoordinatorJob::JobReadyEnvelope() const {
  proto::Envelope ready;
  ready.set_epoch(shard_map_.epoch());
  auto* jr = ready.mutable_job_ready();
  *jr->mutable_shard_map() = shard_map_;
  for (const auto& [id, n] : nodes_) *jr->add_nodes() = n.info;
  std::sort(jr->mutable_nodes()->begin(), jr->mutable_nodes()->end(),
            [](const auto& a, const auto& b) { return a.node_id() < b.node_id(); });
  return ready;
}

std::vector<std::string> CoordinatorJob::MissingNodes() const {
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

void CoordinatorJob::Fail(const std::string& reason, std::vector<Outgoing>& out) {
  phase_ = Phase::kFailed;
  failure_reason_ = reason;
  proto::Envelope shutdown;
  shutdown.mutable_shutdown()->set_ok(false);
  shutdown.mutable_shutdown()->set_reason(reason);
  Broadcast(shutdown, out);
}

void CoordinatorJob::NoteRecruits(const proto::ShardMap& previous, const proto::ShardMap& next) {
  const BackupLists before = BackupListsOf(previous);
  const BackupLists after = BackupListsOf(next);
  for (uint32_t v = 0; v < next.num_vshards() && v < after.size(); ++v) {
    for (uint32_t b : after[v]) {
      const bool had = v < before.size() && std::find(before[v].begin(), before[v].end(), b) != before[v].end();
      if (!had) syncing_.insert({v, b});
    }
  }
}

void CoordinatorJob::PublishMap(const std::string& reason, std::vector<Outgoing>& out,
                                const std::vector<proto::ShardRestore>& restores) {
  ++stats_.maps_published;
  proto::Envelope update;
  update.set_epoch(shard_map_.epoch());
  *update.mutable_shard_map_update()->mutable_shard_map() = shard_map_;
  update.mutable_shard_map_update()->set_reason(reason);
  for (const proto::ShardRestore& r : restores) *update.mutable_shard_map_update()->add_restores() = r;
  Broadcast(update, out);
}

CoordinatorJob::Node CoordinatorJob::NewNode(proto::Role role, uint32_t rank, const std::string& address,
                                             Nanos now) {
  Node node;
  node.info.set_node_id(next_node_id_++);
  node.info.set_role(role);
  node.info.set_rank(rank);
  node.info.set_address(address);
  node.last_seen = now;
  return node;
}

}  // namespace tessera

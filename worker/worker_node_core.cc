#include "worker/worker_node_core.h"

#include <utility>

#include "common/keys.h"

namespace tessera {

namespace {

// An operation that completes at once with `status`, having sent nothing.
WorkerCore::Effects CompletedAtOnce(WorkerCore::Handle handle, absl::Status status) {
  WorkerCore::Effects effects;
  effects.done.push_back(WorkerCore::Completion{std::move(handle), std::move(status)});
  return effects;
}

}  // namespace

absl::Status WorkerNodeCore::Start(const proto::JobReady& ready, const proto::NodeInfo& self,
                                   bool joined_running_job, std::string address) {
  WorkerCoreOptions options = options_;
  options.node_id = self.node_id();
  options.incarnation = self.incarnation();
  options.address = std::move(address);
  auto core = WorkerCore::Create(std::move(options), ready.shard_map());
  if (!core.ok()) return core.status();
  core_ = std::move(*core);
  rank_ = self.rank();
  kind_ = joined_running_job    ? StartKind::kJoin
          : self.incarnation() > 0 ? StartKind::kReplacement
                                   : StartKind::kFresh;
  num_workers_ = 0;
  for (const proto::NodeInfo& n : ready.nodes())
    if (n.role() == proto::WORKER) ++num_workers_;
  return absl::OkStatus();
}

WorkerCore::Effects WorkerNodeCore::QueryClock(WorkerCore::Handle handle, Nanos now) {
  if (core_ == nullptr || kind_ == StartKind::kFresh) {
    return CompletedAtOnce(std::move(handle),
                           absl::FailedPreconditionError("a worker that starts with the job has no clock to resume"));
  }
  return kind_ == StartKind::kJoin ? core_->JoinClock(std::move(handle), rank_, now)
                                   : core_->ClockQuery(std::move(handle), now);
}

WorkerCore::Effects WorkerNodeCore::AnnounceClock(WorkerCore::Handle handle, Nanos now) {
  const uint64_t clock = resume_clock();
  if (clock == 0) return CompletedAtOnce(std::move(handle), absl::OkStatus());  // nothing to announce
  return core_->ClockAdvance(std::move(handle), clock, now);
}

WorkerNodeCore::MapChange WorkerNodeCore::UpdateMap(const proto::ShardMapUpdate& update, Nanos now) {
  MapChange change;
  if (core_ == nullptr) return change;
  const std::shared_ptr<const ShardMapView> before = core_->map();
  change.effects = core_->OnMapUpdate(update.shard_map(), now, &change.newer);
  change.epoch = core_->map()->epoch();
  if (!change.newer) {  // older, or invalid
    if (auto view = ShardMapView::Create(update.shard_map()); !view.ok()) change.error = view.status();
    return change;
  }
  const ShardMapView& after = *core_->map();
  for (uint32_t rank : before->LiveServers()) {
    const proto::NodeInfo& was = before->server(rank);
    const bool same = rank < after.num_servers() && !after.IsDead(rank) &&
                      after.server(rank).address() == was.address() &&
                      after.server(rank).incarnation() == was.incarnation() &&
                      after.server(rank).node_id() == was.node_id();
    if (!same) change.gone_servers.push_back(was.address());
  }
  return change;
}

}  // namespace tessera

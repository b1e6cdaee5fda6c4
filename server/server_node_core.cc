#include "server/server_node_core.h"

#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/keys.h"

namespace tessera {

void ServerNodeCore::TakeNotices(Output& out) {
  for (proto::ShardsInSync& s : core_->TakeShardsInSync()) out.in_sync.push_back(std::move(s));
}

ServerNodeCore::Output ServerNodeCore::Receive(Message m, Nanos now) {
  Output out;
  if (core_ == nullptr) {
    // Not serving yet (a worker can learn the map before this server does):
    // kept and answered once serving, in arrival order.
    if (early_.size() < options_.max_early) {
      early_.push_back(std::move(m));
    } else if (m.header.request_id() != 0) {
      Message reply;
      reply.header.set_request_id(m.header.request_id());
      reply.header.mutable_error()->set_code(static_cast<int>(absl::StatusCode::kUnavailable));
      reply.header.mutable_error()->set_message("server has not joined the job yet and its queue is full");
      out.sends.push_back(Outgoing{m.header.sender_address(), std::move(reply)});
    }
    return out;
  }
  out.sends = core_->Step(std::move(m), now);
  TakeNotices(out);
  return out;
}

absl::StatusOr<ServerNodeCore::Output> ServerNodeCore::Start(const proto::JobReady& ready, uint32_t node_id,
                                                            uint32_t rank, Nanos now, std::string* restore_line) {
  ServerCoreOptions core_options = options_.core;
  core_options.node_id = node_id;
  auto core = std::make_unique<ServerCore>(core_options);
  if (auto s = core->InstallShardMap(ready.shard_map(), rank); !s.ok()) {
    return absl::Status(s.code(), "bad shard map from the coordinator: " + std::string(s.message()));
  }
  absl::flat_hash_map<uint32_t, uint32_t> workers;
  for (const auto& n : ready.nodes())
    if (n.role() == proto::WORKER) workers[n.node_id()] = n.rank();
  core->SetWorkers(workers);
  if (options_.restore_held) {
    std::vector<uint32_t> held;
    auto view = ShardMapView::Create(ready.shard_map());
    for (uint32_t v = 0; view.ok() && v < view->num_vshards(); ++v)
      if (view->Holds(rank, v)) held.push_back(v);
    std::string line = options_.restore_held(*core, held, /*with_windows=*/false, {});
    if (restore_line) *restore_line = std::move(line);
  }
  core_ = std::move(core);
  Output out;
  for (Message& m : early_)
    for (Outgoing& o : core_->Step(std::move(m), now)) out.sends.push_back(std::move(o));
  early_.clear();
  if (early_update_) {
    const proto::ShardMapUpdate update = std::move(*early_update_);
    early_update_.reset();
    if (update.shard_map().epoch() > ready.shard_map().epoch()) {
      MapChange change = UpdateMap(update, rank, now);
      for (Outgoing& o : change.out.sends) out.sends.push_back(std::move(o));
      for (proto::ShardsInSync& s : change.out.in_sync) out.in_sync.push_back(std::move(s));
      out.refused_map = change.error;
      out.restore_line = std::move(change.restore_line);
    }
  }
  TakeNotices(out);
  return out;
}

ServerNodeCore::MapChange ServerNodeCore::UpdateMap(const proto::ShardMapUpdate& update, uint32_t rank, Nanos now) {
  MapChange change;
  const proto::ShardMap& map = update.shard_map();
  if (core_ == nullptr) {  // installed once the core exists
    if (!early_update_ || early_update_->shard_map().epoch() < map.epoch()) early_update_ = update;
    change.kept = true;
    return change;
  }
  const bool was_deposed = core_->deposed();
  const uint64_t old_epoch = core_->epoch();
  const ServerStats before = core_->stats();
  auto out = core_->UpdateShardMap(map, now);
  if (!out.ok()) {
    change.error = out.status();
    return change;
  }
  change.out.sends = std::move(*out);
  change.epoch = core_->epoch();
  change.newer = change.epoch != old_epoch;
  change.deposed = core_->deposed();
  change.newly_deposed = change.deposed && !was_deposed;
  if (change.newer && update.restores_size() > 0) {
    // Shards that lost every copy: restore the ones this server now leads
    // from the last checkpoint, then give their backups the restored state.
    std::vector<uint32_t> mine;
    std::map<uint32_t, uint64_t> last;
    for (const proto::ShardRestore& r : update.restores()) {
      if (r.vshard() < map.num_vshards() && map.vshard_server_rank(r.vshard()) == rank) {
        mine.push_back(r.vshard());
        last[r.vshard()] = r.last_applied();
      }
    }
    if (!mine.empty()) {
      change.restore_line =
          options_.restore_lost ? options_.restore_lost(*core_, mine, /*with_windows=*/true, last)
                           : absl::StrCat("shards ", absl::StrJoin(mine, ","),
                                          " lost every copy and this server has no --checkpoint-dir: they start from "
                                          "their initial values; every push applied to them is lost");
      for (Outgoing& o : core_->TransferShards(mine, now)) change.out.sends.push_back(std::move(o));
    }
  }
  const ServerStats after = core_->stats();
  change.transfers_sent = after.transfers_sent - before.transfers_sent;
  change.rows_transferred = after.rows_transferred - before.rows_transferred;
  TakeNotices(change.out);
  return change;
}

ServerNodeCore::Output ServerNodeCore::Tick(Nanos now) {
  Output out;
  if (core_ == nullptr) return out;
  out.sends = core_->Tick(now);
  TakeNotices(out);
  return out;
}

}  // namespace tessera

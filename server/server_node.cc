#include "server/server_node.h"

#include <bit>
#include <limits>

#include "common/metrics.h"

#include <sys/resource.h>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

#include <thread>

#include "common/logging.h"
#include "server/checkpoint_restore.h"
#include "transport/transport_metrics.h"

namespace tessera {

ServerNode::ServerNode(CoordinatorSession::Options session, std::unique_ptr<Transport> transport,
                       ServerCoreOptions core_options)
    : transport_(std::move(transport)),
      session_([&] {
        session.role = proto::SERVER;
        return session;
      }(), transport_.get()),
      core_options_([&] {
        // Replies the transport would lend go out whole (ServerCoreOptions).
        core_options.reads_in_place = [t = transport_.get()](const std::string& to, size_t bytes) {
          return t->LendsTo(to, bytes);
        };
        // Answers to a peer still queued here bound what it may ask for.
        core_options.backlog_of = [t = transport_.get()](const std::string& to) { return t->Backlog(to); };
        core_options.pool = &pool_;
        core_options.apply_after_ack = true;  // acks leave before the update work (see ServerCore)
        return core_options;
      }()),
      node_(ServerNodeCore::Options{.core = core_options_}) {}

ServerNode::~ServerNode() { transport_->Stop(); }

void ServerNode::OnMessage(Message m) {
  if (m.header.has_shard_map_update()) {
    OnMapUpdate(m.header.shard_map_update());
    return;
  }
  if (session_.Handle(m)) return;
  std::unique_lock lock(mu_);
  ServerCore* core = node_.core();
  if (core == nullptr) {
    ServerNodeCore::Output out = node_.Receive(std::move(m), MonotonicNow());  // kept, or refused
    lock.unlock();
    Send(out);
    return;
  }
  const uint64_t transfers_before = core->stats().transfers_applied;
  const uint64_t busy_before = core->stats().busy_refused;
  const bool is_transfer = m.header.has_replicate() && m.header.replicate().has_transfer();
  const Nanos stepped = MonotonicNow();
  ServerNodeCore::Output out = node_.Receive(std::move(m), stepped);
  // Forwards this made may come due for a resend before the tick thread's
  // next wake (it sleeps up to 100 ms when nothing is due).
  if (tick_at_ > stepped + core->ShortestForwardTimer() && core->unacked_forwards() > 0) tick_cv_.notify_one();
  const bool pending = core->pending_pushes() > 0;
  const bool took_transfer = is_transfer && core->stats().transfers_applied > transfers_before;
  const uint64_t epoch = core->epoch();
  const uint64_t busy = core->stats().busy_refused;
  // The 1st, 2nd, 4th, ... refusal is logged.
  const std::string busy_peer = busy > busy_before && std::has_single_bit(busy) ? core->last_busy_peer() : "";
  lock.unlock();
  if (!busy_peer.empty()) {
    const PeerBacklog backlog = transport_->Backlog(busy_peer);
    TLOG_WARN("busy: refused a request of {} (refusal {} in all): {} answers ({} bytes) to it are not written out "
              "yet (--max-requests-in-flight-per-peer, --max-mb-in-flight-per-peer)",
              busy_peer, busy, backlog.messages, backlog.bytes);
  }
  if (took_transfer) TLOG_INFO("took over shard copies by state transfer (map epoch {}); now a backup of them", epoch);
  Send(out);
  if (pending) {
    // The acks are on their way; now make the updates (the core would make
    // them before the next request anyway, this keeps them off its path).
    lock.lock();
    node_.ApplyPending();
  }
}

void ServerNode::Send(ServerNodeCore::Output& out) {
  for (proto::ShardsInSync& s : out.in_sync) {
    proto::Envelope notice;
    *notice.mutable_shards_in_sync() = std::move(s);
    session_.Notify(std::move(notice));
  }
  for (Outgoing& o : out.sends) (void)transport_->Send(o.to, std::move(o.message));
}

void ServerNode::OnMapUpdate(const proto::ShardMapUpdate& update) {
  std::unique_lock lock(mu_);
  ServerNodeCore::MapChange change = node_.UpdateMap(update, session_.self().rank(), MonotonicNow());
  lock.unlock();
  if (!change.error.ok()) {
    TLOG_ERROR("ignoring a bad shard map update from the coordinator: {}", change.error.message());
    return;
  }
  if (!change.newer) return;  // kept for the start, or not newer: nothing changed
  session_.set_map_epoch(change.epoch);
  if (change.newly_deposed) {
    TLOG_WARN("this server was removed from the job at map epoch {} ({}); it serves nothing and registers again "
              "to rejoin the job",
              change.epoch, update.reason());
    lock.lock();
    rejoin_wanted_ = true;
    lock.unlock();
    state_cv_.notify_all();
  } else if (!change.deposed) {
    TLOG_INFO("shard map epoch {} (map {}): {}", change.epoch, ShardMapDigest(update.shard_map()), update.reason());
  }
  if (!change.restore_line.empty()) TLOG_WARN("{}", change.restore_line);
  if (change.transfers_sent > 0) {
    TLOG_INFO("sending the state of its shards to {} new backups ({} rows)", change.transfers_sent,
              change.rows_transferred);
  }
  Send(change.out);
}

void ServerNode::OnLink(const std::string& address, bool up) {
  if (!up) return;  // forwards to a link that is down wait for it (or for the backup's loss)
  std::vector<Outgoing> out;
  {
    std::lock_guard lock(mu_);
    if (stopping_ || core() == nullptr) return;
    out = core()->OnLinkRestored(address, MonotonicNow());
  }
  if (!out.empty()) TLOG_INFO("connection to {} made again: {} forwards sent again", address, out.size());
  for (Outgoing& o : out) (void)transport_->Send(o.to, std::move(o.message));
}

void ServerNode::TickLoop() {
  std::unique_lock lock(mu_);
  while (!stopping_) {
    // Every 100 ms, or sooner when a forward to a backup comes due again.
    const Nanos due = core() != nullptr ? core()->NextForwardDue() : std::numeric_limits<Nanos>::max();
    tick_at_ = std::min(MonotonicNow() + 100 * kMillis, due);
    tick_cv_.wait_for(lock, std::chrono::nanoseconds(std::max<Nanos>(tick_at_ - MonotonicNow(), 0)));
    if (stopping_ || core() == nullptr) continue;
    ServerNodeCore::Output out = node_.Tick(MonotonicNow());
    lock.unlock();
    Send(out);
    const Nanos now = MonotonicNow();
    if (!checkpoints_.dir.empty() &&
        (checkpoint_requested_.exchange(false) || (checkpoints_.every > 0 && now >= next_checkpoint_))) {
      if (checkpoints_.every > 0) next_checkpoint_ = now + checkpoints_.every;
      WriteCheckpointNow();
    }
    if (now >= next_budget_check_) {
      next_budget_check_ = now + 5 * kSeconds;
      WarnOfStoresThatTakeTheBudget();
    }
    lock.lock();
  }
}

void ServerNode::WarnOfStoresThatTakeTheBudget() {
  std::vector<ServerCore::TableSummary> tables;
  {
    std::lock_guard lock(mu_);
    if (core()) tables = core()->table_summaries();
  }
  for (const ServerCore::TableSummary& t : tables) {
    if (!StoreTakesBudget(t) || !budget_warned_.insert(t.id).second) continue;
    TLOG_WARN("table {}: its disk tier's own memory ({:.1f} MiB for {} rows on disk) leaves no room for rows in "
              "memory within its budget ({:.1f} MiB): it keeps one row in memory and this server passes the budget "
              "by what the store grows; give the table a larger memory_budget_bytes, or use a store without memory "
              "per row on disk (--disk-store bucket)",
              t.id, t.store_memory_bytes / 1048576.0, t.rows_on_disk, t.memory_budget_bytes / 1048576.0);
  }
}

void ServerNode::WriteCheckpointNow() {
  const Nanos start = MonotonicNow();
  ShardSnapshot snapshot;
  {
    std::lock_guard lock(mu_);
    if (core() == nullptr || core()->deposed()) return;
    core()->ApplyPending();
    snapshot = core()->SnapshotPrimaryShards();  // consistent: taken between two requests
  }
  if (snapshot.vshards.empty()) return;  // primary of nothing (a fresh backup)
  uint64_t rows = 0;
  for (const TableSnapshot& t : snapshot.tables) rows += t.keys.size();
  auto written = WriteCheckpoint(checkpoints_.dir, snapshot, CheckpointWriteOptions{.keep_last = checkpoints_.keep});
  if (!written.ok()) {
    TLOG_ERROR("checkpoint failed: {}", written.status().message());
    return;
  }
  TLOG_INFO("checkpoint {} written: {} shards, {} rows, map epoch {}, in {:.1f} ms", written->path,
            snapshot.vshards.size(), rows, snapshot.epoch, static_cast<double>(MonotonicNow() - start) / kMillis);
}

std::string ServerNode::RestoreFromCheckpoints(ServerCore& core, const std::string& dir,
                                               const std::vector<uint32_t>& vshards, bool with_windows,
                                               const std::map<uint32_t, uint64_t>& last_applied) {
  auto listed = ListCheckpoints(dir);
  if (!listed.ok()) return absl::StrCat("cannot list checkpoints in ", dir, ": ", listed.status().message());
  // Read every checkpoint; the choice, the restore and the line are pure
  // (server/checkpoint_restore.h).
  std::vector<ShardSnapshot> snapshots;
  std::vector<const CheckpointInfo*> read;
  std::vector<std::string> problems;
  for (const CheckpointInfo& info : *listed) {
    auto snap = ReadCheckpoint(info.path);
    if (!snap.ok()) {
      problems.push_back(std::string(snap.status().message()));
      continue;
    }
    snapshots.push_back(std::move(*snap));
    read.push_back(&info);
  }
  std::vector<CheckpointCopy> copies;
  for (size_t i = 0; i < snapshots.size(); ++i) {
    copies.push_back(CheckpointCopy{.snapshot = &snapshots[i], .sequence = read[i]->sequence, .name = read[i]->path});
  }
  return RestoreNewestCopies(core, copies, vshards, with_windows, last_applied, std::move(problems)).line;
}

absl::Status ServerNode::Serve(const proto::JobReady& ready, bool first) {
  std::string restored;
  absl::StatusOr<ServerNodeCore::Output> out;
  {
    std::lock_guard lock(mu_);
    // A new job from a checkpoint: every shard this server holds (primary
    // or backup) starts from its newest checkpoint, at the first start only.
    ServerNodeCore::RestoreFn held;
    if (first && !checkpoints_.restore_from.empty()) {
      held = [dir = checkpoints_.restore_from](ServerCore& core, const std::vector<uint32_t>& vs, bool with_windows,
                                               const std::map<uint32_t, uint64_t>& last) {
        return RestoreFromCheckpoints(core, dir, vs, with_windows, last);
      };
    }
    ServerNodeCore::RestoreFn lost;
    if (!checkpoints_.dir.empty()) {
      lost = [dir = checkpoints_.dir](ServerCore& core, const std::vector<uint32_t>& vs, bool with_windows,
                                      const std::map<uint32_t, uint64_t>& last) {
        return RestoreFromCheckpoints(core, dir, vs, with_windows, last);
      };
    }
    node_.SetRestore(std::move(held), std::move(lost));
    out = node_.Start(ready, session_.self().node_id(), session_.self().rank(), MonotonicNow(), &restored);
  }
  if (!out.ok()) return out.status();
  if (!restored.empty()) TLOG_INFO("{}", restored);
  if (!out->refused_map.ok()) {
    TLOG_ERROR("ignoring a bad shard map update from the coordinator: {}", out->refused_map.message());
  }
  if (!out->restore_line.empty()) TLOG_WARN("{}", out->restore_line);
  session_.set_map_epoch(ready.shard_map().epoch());
  Send(*out);
  std::lock_guard lock(mu_);
  node_.ApplyPending();
  return absl::OkStatus();
}

absl::Status ServerNode::Rejoin() {
  const uint32_t old_node = session_.self().node_id();
  // The deposed core answers meanwhile (Aborted: not its shards), and stays
  // if the coordinator says stop instead (a drained server): its audit dump
  // then says it was deposed. Its state is dropped once the new core serves.
  auto ready = session_.Rejoin();
  if (!ready.ok()) {
    if (session_.ended()) return absl::OkStatus();  // the job ended meanwhile: Run reports how
    return absl::Status(ready.status().code(),
                        absl::StrCat("could not rejoin the job after being declared lost: ", ready.status().message()));
  }
  if (absl::Status s = Serve(*ready, /*first=*/false); !s.ok()) return s;
  uint32_t copies = 0;
  auto view = ShardMapView::Create(ready->shard_map());
  for (uint32_t v = 0; view.ok() && v < view->num_vshards(); ++v) copies += view->Holds(session_.self().rank(), v);
  TLOG_INFO("rejoined the job as server {} (node {} was {}, incarnation {}): shard map epoch {}, {} shard copies "
            "to take over by state transfer",
            session_.self().rank(), session_.self().node_id(), old_node, session_.self().incarnation(),
            ready->shard_map().epoch(), copies);
  return absl::OkStatus();
}

absl::Status ServerNode::Run() {
  transport_->SetLinkHandler([this](const std::string& address, bool up) { OnLink(address, up); });
  if (auto s = transport_->Start([this](Message m) { OnMessage(std::move(m)); }); !s.ok()) return s;
  TLOG_INFO("listening on {}; joining the job", transport_->address());
  session_.set_heartbeat_filler([this](proto::Heartbeat* hb) {
    // Never wait for the core: one busy with a long push (rows from a slow
    // disk) would hold the heartbeat past the lease, and the coordinator
    // would take a busy server for a lost one (proto Heartbeat.busy).
    {
      std::unique_lock lock(mu_, std::try_to_lock);
      if (!lock.owns_lock()) {
        hb->set_busy(true);
      } else if (core() != nullptr) {
        core()->FillHeartbeat(hb);
      }
    }
    // The process's own use, for the coordinator's load view.
    struct rusage usage {};
    if (getrusage(RUSAGE_SELF, &usage) == 0) {
      hb->set_cpu_seconds(static_cast<double>(usage.ru_utime.tv_sec + usage.ru_stime.tv_sec) +
                          static_cast<double>(usage.ru_utime.tv_usec + usage.ru_stime.tv_usec) / 1e6);
    }
    const TransportStats net = transport_->stats();
    hb->set_net_bytes_in(net.bytes_received);
    hb->set_net_bytes_out(net.bytes_sent);
  });
  session_.set_on_end([this](const absl::Status&) {
    std::lock_guard lock(mu_);
    session_ended_ = true;
    state_cv_.notify_all();
  });
  auto ready = session_.Join();
  if (!ready.ok()) {
    transport_->Stop();
    return ready.status();
  }
  if (absl::Status s = Serve(*ready, /*first=*/true); !s.ok()) {
    transport_->Stop();
    return s;
  }
  std::thread ticker([this] { TickLoop(); });
  TLOG_INFO("server {} (node {}) serving; shard map epoch {} (map {}), {} virtual shards over {} servers",
            session_.self().rank(), session_.self().node_id(), ready->shard_map().epoch(),
            ShardMapDigest(ready->shard_map()), ready->shard_map().num_vshards(), ready->shard_map().servers_size());
  absl::Status rejoined;
  while (rejoined.ok()) {
    {
      std::unique_lock lock(mu_);
      state_cv_.wait(lock, [&] { return rejoin_wanted_ || session_ended_; });
      if (session_ended_) break;
      rejoin_wanted_ = false;
    }
    rejoined = Rejoin();
  }
  absl::Status end = rejoined.ok() ? session_.WaitForEnd() : rejoined;
  {
    std::lock_guard lock(mu_);
    stopping_ = true;
  }
  tick_cv_.notify_all();
  ticker.join();
  transport_->Stop();
  ServerStats st = stats();
  TLOG_INFO("served {} pushes and {} pulls ({} bytes in, {} bytes out, {} bad requests)", st.push_requests,
            st.pull_requests, st.bytes_in, st.bytes_out, st.bad_requests);
  if (st.busy_refused > 0) {
    TLOG_WARN("refused {} worker requests as busy ({} of them dropped unanswered): a peer read its answers slower "
              "than it asked (--max-mb-in-flight-per-peer, --max-requests-in-flight-per-peer)",
              st.busy_refused, st.busy_dropped);
  }
  if (const std::string forwards = DescribeForwards(st); !forwards.empty()) TLOG_INFO("{}", forwards);
  std::vector<ServerCore::TableSummary> tables;
  {
    std::lock_guard lock(mu_);
    if (core()) tables = core()->table_summaries();
  }
  for (const ServerCore::TableSummary& t : tables) {
    if (!t.disk_tier) continue;
    TLOG_INFO("table {}: {} rows, {} of them on disk ({} bytes of files); {} rows moved to disk, {} brought back, "
              "{} lookups of new ids",
              t.id, t.rows, t.rows_on_disk, t.disk.bytes_on_disk, t.counters.moved_to_disk,
              t.counters.loaded_from_disk, t.disk.lookups_absent);
  }
  return end;
}

std::string ServerNode::DescribeForwards(const ServerStats& st) const {
  std::lock_guard lock(mu_);
  if (st.forwards_sent == 0 && st.forward_gaps_reported == 0) return "";
  std::string text = absl::StrCat("forwards: ", st.forwards_sent, " sent, ", st.forwards_resent, " sent again (",
                                  st.forwards_gap_resent, " on a backup's gap notice, ", st.forwards_link_resent,
                                  " on a link made again), ", st.forward_gaps_reported,
                                  " gap notices sent as a backup");
  if (core() == nullptr) return text;
  for (const auto& [rank, t] : core()->ForwardTimers()) {
    absl::StrAppend(&text, "; backup ", rank, " timer ",
                    DescribeTimer(t.rto(), t.smoothed(), t.variation(), t.samples()), ")");
  }
  return text;
}

std::string ServerNode::MetricsText() const {
  std::lock_guard lock(mu_);
  const ServerStats s = core() ? core()->stats() : ServerStats{};
  metrics::TextWriter w;
  w.Counter("tessera_server_push_requests_total", "Push requests received", s.push_requests)
      .Counter("tessera_server_pull_requests_total", "Pull requests received", s.pull_requests)
      .Counter("tessera_server_bad_requests_total", "Requests answered with an error", s.bad_requests)
      .Counter("tessera_server_held_requests_total", "Pulls and clock advances held for slower workers",
               s.held_requests)
      .Counter("tessera_server_busy_refused_total",
               "Worker requests refused (Unavailable) while that peer's answers in flight were at a limit "
               "(--max-mb-in-flight-per-peer, --max-requests-in-flight-per-peer)",
               s.busy_refused)
      .Counter("tessera_server_busy_dropped_total",
               "Of those, dropped unanswered: too many answers to that peer waiting even for a refusal",
               s.busy_dropped)
      .Counter("tessera_server_push_clocks_bounded_total",
               "Pushes stamped further ahead than one past the highest clock any worker announced here: their "
               "table's clock moved only that far",
               s.push_clocks_bounded)
      .Counter("tessera_server_compressed_pushes_total", "Pushes whose values arrived encoded", s.compressed_pushes)
      .Counter("tessera_server_received_bytes_total", "Data frame bytes received, as on the wire", s.bytes_in)
      .Counter("tessera_server_sent_bytes_total", "Data frame bytes sent, as on the wire", s.bytes_out)
      .Gauge("tessera_server_held_requests", "Requests waiting for slower workers now", core() ? core()->held_now() : 0)
      .Gauge("tessera_server_queued_requests", "Requests queued before the shard map arrived", node_.early_requests())
      .Gauge("tessera_server_rows", "Rows held, over every table", core() ? core()->rows() : 0)
      .Counter("tessera_server_duplicate_pushes_total", "Sequenced pushes (or shards of them) already applied",
               s.duplicate_pushes)
      .Counter("tessera_server_forwards_sent_total", "Replicate messages sent to backups, resends included",
               s.forwards_sent)
      .Counter("tessera_server_forwards_resent_total",
               "Replicate messages sent again: unacknowledged past the backup's timer, a gap notice, or a new map",
               s.forwards_resent)
      .Counter("tessera_server_forwards_gap_resent_total",
               "Replicate messages sent again at once because the backup said it missed them (gap notice)",
               s.forwards_gap_resent)
      .Counter("tessera_server_forward_gaps_reported_total",
               "Gap notices sent as a backup (a later forward arrived while an earlier one was missing)",
               s.forward_gaps_reported)
      .Counter("tessera_server_forwards_applied_total", "Replicate messages applied as a backup", s.forwards_applied)
      .Counter("tessera_server_forwards_rejected_total", "Replicate messages refused (older epoch, not a backup)",
               s.forwards_rejected)
      .Counter("tessera_server_shards_released_total", "Shards this server let go when a move took them elsewhere",
               s.shards_released)
      .Counter("tessera_server_replies_held_for_moves_total",
               "Pull replies of a moving shard that waited for its destination to have what they read",
               s.replies_held_for_moves)
      .Gauge("tessera_server_map_epoch", "Shard map epoch this server acts on", core() ? core()->epoch() : 0)
      .Gauge("tessera_server_waiting_acks", "Pushes applied here and waiting for backups",
             core() ? core()->waiting_acks() : 0);
  if (core() && core()->min_clock() != ClockTable::kNoWorkers) {
    w.Gauge("tessera_server_min_clock", "Clock of the slowest live worker", core()->min_clock());
  }
  if (core()) {
    metrics::TextWriter::Series rows, bytes, admitted, dropped, evicted;
    metrics::TextWriter::Series on_disk, disk_bytes, moved, loaded, absent, disk_reads, disk_writes, store_memory;
    for (const ServerCore::TableSummary& t : core()->table_summaries()) {
      const metrics::Labels table = {{"table", std::to_string(t.id)}};
      if (t.disk_tier) {
        on_disk.emplace_back(table, t.rows_on_disk);
        disk_bytes.emplace_back(table, t.disk.bytes_on_disk);
        moved.emplace_back(table, t.counters.moved_to_disk);
        loaded.emplace_back(table, t.counters.loaded_from_disk);
        absent.emplace_back(table, t.disk.lookups_absent);
        disk_reads.emplace_back(table, t.disk.rows_read);
        disk_writes.emplace_back(table, t.disk.rows_written);
        store_memory.emplace_back(table, t.store_memory_bytes);
      }
      rows.emplace_back(table, t.rows);
      bytes.emplace_back(table, t.bytes);
      admitted.emplace_back(table, t.counters.admitted);
      dropped.emplace_back(table, t.counters.admission_dropped);
      evicted.emplace_back(metrics::Labels{{"reason", "age"}, {"table", std::to_string(t.id)}},
                           t.counters.evicted_by_age);
      evicted.emplace_back(metrics::Labels{{"reason", "budget"}, {"table", std::to_string(t.id)}},
                           t.counters.evicted_by_budget);
    }
    w.Gauges("tessera_server_table_rows", "Rows held, per table", rows)
        .Gauges("tessera_server_table_bytes", "Bytes the rows take as the memory budget counts them, per table", bytes)
        .Counters("tessera_server_admitted_rows_total", "Rows created by feature admission, per table", admitted)
        .Counters("tessera_server_admission_dropped_total",
                  "Pushed rows dropped because their id was not admitted yet, per table", dropped)
        .Counters("tessera_server_evicted_rows_total", "Rows evicted, per table and reason (age, budget)", evicted);
    if (!on_disk.empty()) {  // tables with a disk tier (docs/embeddings.md)
      w.Gauges("tessera_server_table_rows_on_disk", "Rows in the disk tier, per table (the rest are in memory)",
               on_disk)
          .Gauges("tessera_server_table_disk_bytes", "Bytes the disk tier's files take, per table", disk_bytes)
          .Counters("tessera_server_disk_rows_moved_total",
                    "Rows the memory budget moved to disk, per table (disk misses that made room)", moved)
          .Counters("tessera_server_disk_rows_loaded_total",
                    "Rows a push, pull or restore brought back from disk, per table (hits on disk)", loaded)
          .Counters("tessera_server_disk_lookups_absent_total",
                    "Keys looked up on disk and not found there (new ids), per table", absent)
          .Gauges("tessera_server_disk_store_memory_bytes",
                  "Memory the disk tier's store holds itself (its index, buffers), counted in the table's budget, "
                  "per table",
                  store_memory)
          .Counters("tessera_server_disk_reads_total", "Rows read from the disk tier's store, per table", disk_reads)
          .Counters("tessera_server_disk_writes_total", "Rows written to the disk tier's store, per table",
                    disk_writes);
    }
  }
  WriteTransportMetrics(w, transport_->stats());
  return w.text();
}

std::string ServerNode::AuditDump() const {
  std::lock_guard lock(mu_);
  return core() ? core()->AuditDump() : std::string();
}

ServerStats ServerNode::stats() const {
  std::lock_guard lock(mu_);
  return core() ? core()->stats() : ServerStats{};
}

}  // namespace tessera

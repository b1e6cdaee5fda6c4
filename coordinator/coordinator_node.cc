#include "coordinator/coordinator_node.h"

#include <algorithm>
#include <cstdio>
#include <thread>

#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "common/metrics.h"
#include "transport/transport_metrics.h"

namespace tessera {
namespace {
// How often the per-shard applied counts reach the saved state when nothing
// else changed.
constexpr Nanos kCountsEvery = 5 * kSeconds;
}  // namespace

std::string JsonString(const std::string& s) {
  std::string out = "\"";
  for (unsigned char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\t': out += "\\t"; break;
      default:
        if (c < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\u%04x", c);
          out += buf;
        } else {
          out += static_cast<char>(c);
        }
    }
  }
  return out + "\"";
}

std::string JsonObjectOrString(const std::string& s) {
  if (s.size() < 2 || s.front() != '{' || s.back() != '}') return JsonString(s);
  int depth = 0;
  bool in_string = false, escaped = false;
  for (char c : s) {
    if (in_string) {
      if (escaped) escaped = false;
      else if (c == '\\') escaped = true;
      else if (c == '"') in_string = false;
      continue;
    }
    if (static_cast<unsigned char>(c) < 0x20 && c != '\n' && c != '\t' && c != '\r') return JsonString(s);
    if (c == '"') in_string = true;
    else if (c == '{' || c == '[') ++depth;
    else if (c == '}' || c == ']') --depth;
    if (depth < 0) return JsonString(s);
  }
  return depth == 0 && !in_string ? s : JsonString(s);
}

CoordinatorNode::CoordinatorNode(CoordinatorOptions options, std::unique_ptr<Transport> transport)
    : options_(std::move(options)), transport_(std::move(transport)) {}

CoordinatorNode::~CoordinatorNode() { transport_->Stop(); }

absl::Status CoordinatorNode::Start() {
  return transport_->Start([this](Message m) {
    std::lock_guard lock(mu_);
    inbox_.push_back(std::move(m));
    cv_.notify_one();
  });
}

absl::Status CoordinatorNode::Run() {
  options_.address = transport_->address();
  core_.emplace(options_, MonotonicNow());
  CoordinatorCore& core = *core_;
  if (restored_) {
    if (absl::Status s = core.RestoreState(*restored_, MonotonicNow(), state_source_); !s.ok()) {
      transport_->Stop();
      return s;
    }
  }
  CoordinatorStateSaver saver(kCountsEvery);
  uint64_t state_saves = 0;
  // Saves a changed state (and, every few seconds, the applied counts that
  // change with each heartbeat); false when this coordinator may no longer act.
  auto save = [&] {
    if (!save_state_) return true;
    const Nanos now = MonotonicNow();
    std::optional<std::string> due = saver.Due(core, now);
    if (!due) return true;
    if (!save_state_(*due)) return false;
    ++state_saves;
    saver.Written(now);
    return true;
  };
  auto leads = [&] { return !holds_ || holds_(); };
  auto deposed = [&] {
    transport_->Stop();
    return absl::FailedPreconditionError("this coordinator no longer leads the job; it stops without sending");
  };
  if (restored_) {
    TLOG_INFO("listening on {}; the job goes on (map epoch {})", transport_->address(), core.shard_map().epoch());
  } else {
    TLOG_INFO("listening on {}; waiting for {} servers and {} workers", transport_->address(), options_.servers,
              options_.workers);
  }
  if (!save()) return deposed();
  TakeFigures(core, state_saves);
  CoordinatorCore::Phase last_phase = core.phase();
  std::vector<Outgoing> outbox;
  while (!core.finished()) {
    std::deque<Message> batch;
    {
      std::unique_lock lock(mu_);
      cv_.wait_for(lock, std::chrono::milliseconds(50), [&] { return !inbox_.empty(); });
      batch.swap(inbox_);
    }
    if (!leads()) return deposed();
    outbox.clear();
    auto take = [&](std::vector<Outgoing> out) {
      for (Outgoing& o : out) outbox.push_back(std::move(o));
    };
    for (Message& m : batch) take(core.Step(m, MonotonicNow()));
    take(core.Tick(MonotonicNow()));
    // Write-ahead: the state that these messages follow from is saved first.
    if (!save() || !leads()) return deposed();
    for (Outgoing& o : outbox) (void)transport_->Send(o.to, std::move(o.message));
    for (const std::string& e : core.TakeEvents()) TLOG_WARN("{}", e);
    if (core.phase() != last_phase && core.phase() == CoordinatorCore::Phase::kRunning) {
      TLOG_INFO("job assembled: {} servers, {} workers, {} virtual shards; shard map epoch {}", options_.servers,
                options_.workers, options_.vshards, core.shard_map().epoch());
    }
    last_phase = core.phase();
    TakeFigures(core, state_saves);
  }
  // Give the shutdown messages time to leave before anything closes.
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  if (core.phase() == CoordinatorCore::Phase::kDone) return absl::OkStatus();
  return absl::AbortedError(core.failure_reason());
}

void CoordinatorNode::Linger(Nanos duration) {
  CoordinatorCore& core = *core_;
  const Nanos until = MonotonicNow() + duration;
  while (MonotonicNow() < until) {
    std::deque<Message> batch;
    {
      std::unique_lock lock(mu_);
      cv_.wait_for(lock, std::chrono::milliseconds(50), [&] { return !inbox_.empty(); });
      batch.swap(inbox_);
    }
    if (holds_ && !holds_()) break;
    for (Message& m : batch)
      for (Outgoing& o : core.Step(m, MonotonicNow())) (void)transport_->Send(o.to, std::move(o.message));
  }
  transport_->Stop();
}

void CoordinatorNode::TakeFigures(const CoordinatorCore& core, uint64_t state_saves) {
  Figures f;
  f.stats = core.stats();
  f.epoch = core.shard_map().epoch();
  f.phase = static_cast<uint32_t>(core.phase());
  f.syncing = core.syncing_copies();
  f.moving = core.moves_in_progress();
  f.draining = static_cast<size_t>(core.shard_map().draining_server_ranks_size());
  f.state_saves = state_saves;
  f.load = core.load().servers();
  for (const auto& [id, n] : core.nodes()) {
    const int role = n.info.role() == proto::WORKER ? 1 : 0;
    const int state = n.done ? 3 : n.lost ? 1 : n.away ? 2 : 0;
    ++f.nodes[role][state];
  }
  std::lock_guard lock(figures_mu_);
  figures_ = f;
}

std::string CoordinatorNode::MetricsText() const {
  Figures f;
  {
    std::lock_guard lock(figures_mu_);
    f = figures_;
  }
  metrics::TextWriter w;
  w.Gauge("tessera_coordinator_map_epoch", "Epoch of the shard map the coordinator publishes", f.epoch);
  w.Gauge("tessera_coordinator_phase", "0 assembling, 1 running, 2 done, 3 failed", f.phase);
  static const char* kRoles[] = {"server", "worker"};
  static const char* kStates[] = {"alive", "lost", "away", "done"};
  for (int r = 0; r < 2; ++r) {
    for (int s = 0; s < 4; ++s) {
      w.Gauge("tessera_coordinator_nodes", "Registered nodes by role and state", f.nodes[r][s],
              {{"role", kRoles[r]}, {"state", kStates[s]}});
    }
  }
  w.Gauge("tessera_coordinator_syncing_copies", "Shard copies recruited and not yet in sync (replication lag)",
          static_cast<double>(f.syncing));
  w.Counter("tessera_coordinator_messages_total", "Messages handled", f.stats.messages);
  w.Counter("tessera_coordinator_heartbeats_total", "Heartbeats handled", f.stats.heartbeats);
  w.Counter("tessera_coordinator_servers_lost_total", "Servers declared lost (failed over, or the job failed)",
            f.stats.servers_lost);
  w.Counter("tessera_coordinator_workers_lost_total", "Workers declared lost", f.stats.workers_lost);
  w.Counter("tessera_coordinator_rejoins_total", "Processes that took a lost node's place", f.stats.rejoins);
  w.Counter("tessera_coordinator_map_updates_total", "Shard map updates published", f.stats.maps_published);
  w.Counter("tessera_coordinator_barriers_released_total", "Barriers released", f.stats.barriers_released);
  w.Counter("tessera_coordinator_servers_added_total", "Servers that joined the running job (--max-servers)",
            f.stats.servers_added);
  w.Counter("tessera_coordinator_shard_moves_total", "Shard moves (live migration) by how they ended",
            f.stats.moves_finished, {{"outcome", "finished"}});
  w.Counter("tessera_coordinator_shard_moves_total", "Shard moves (live migration) by how they ended",
            f.stats.moves_cancelled, {{"outcome", "cancelled"}});
  w.Gauge("tessera_coordinator_shard_moves_in_progress", "Shard moves under way",
          static_cast<double>(f.moving));
  w.Gauge("tessera_coordinator_servers_draining", "Servers being drained (tessera-admin drain)",
          static_cast<double>(f.draining));
  w.Counter("tessera_coordinator_servers_drained_total", "Servers drained and removed from the job",
            f.stats.servers_drained);
  w.Counter("tessera_coordinator_state_saves_total", "Coordinator state saves (file or etcd)", f.state_saves);
  for (size_t r = 0; r < f.load.size(); ++r) {
    const LoadTracker::ServerLoad& l = f.load[r];
    if (l.last_at == 0) continue;
    const metrics::Labels server = {{"server", std::to_string(r)}};
    w.Gauge("tessera_coordinator_server_cpu_cores", "A server's CPU use, smoothed (heartbeats)", l.cpu_cores, server);
    w.Gauge("tessera_coordinator_server_net_bytes_per_second", "A server's network traffic, smoothed (heartbeats)",
            l.net_in_bytes_per_s, {{"server", std::to_string(r)}, {"direction", "in"}});
    w.Gauge("tessera_coordinator_server_net_bytes_per_second", "A server's network traffic, smoothed (heartbeats)",
            l.net_out_bytes_per_s, {{"server", std::to_string(r)}, {"direction", "out"}});
    w.Gauge("tessera_coordinator_server_requests_per_second",
            "Pushes and pulls a server serves as primary, counted once per shard they touch, smoothed (heartbeats)",
            l.requests_per_s, server);
    w.Gauge("tessera_coordinator_server_rows", "Rows in a server's tables", static_cast<double>(l.rows), server);
    w.Gauge("tessera_coordinator_server_memory_bytes", "Memory of a server's tables",
            static_cast<double>(l.memory_bytes), server);
  }
  WriteTransportMetrics(w, transport_->stats());
  return w.text();
}

std::string CoordinatorNode::SummaryJson() const {
  if (!core_) return "{}";
  const CoordinatorCore& core = *core_;
  std::vector<const CoordinatorCore::Node*> workers, servers;
  for (const auto& [id, n] : core.nodes()) (n.info.role() == proto::WORKER ? workers : servers).push_back(&n);
  auto by_rank = [](const auto* a, const auto* b) { return a->info.rank() < b->info.rank(); };
  std::sort(workers.begin(), workers.end(), by_rank);
  std::sort(servers.begin(), servers.end(), by_rank);
  std::string j = absl::StrCat("{\"status\": ", core.phase() == CoordinatorCore::Phase::kDone ? "\"ok\"" : "\"failed\"",
                               ", \"reason\": ", JsonString(core.failure_reason()), ", \"workers\": [");
  for (size_t i = 0; i < workers.size(); ++i) {
    const auto& r = workers[i]->report;
    absl::StrAppend(&j, i ? ", " : "", "{\"rank\": ", workers[i]->info.rank(),
                    ", \"done\": ", workers[i]->done ? "true" : "false",
                    ", \"lost\": ", workers[i]->lost ? JsonString(workers[i]->lost_reason) : "null",
                    ", \"incarnation\": ", workers[i]->info.incarnation(),
                    ", \"steps\": ", r.steps(),
                    ", \"final_loss\": ", r.final_loss(), ", \"bytes_pushed\": ", r.bytes_pushed(),
                    ", \"bytes_pulled\": ", r.bytes_pulled(), ", \"report\": ",
                    r.report_json().empty() ? "{}" : JsonObjectOrString(r.report_json()), "}");
  }
  absl::StrAppend(&j, "], \"servers\": [");
  for (size_t i = 0; i < servers.size(); ++i) {
    absl::StrAppend(&j, i ? ", " : "", "{\"rank\": ", servers[i]->info.rank(),
                    ", \"address\": ", JsonString(servers[i]->info.address()), "}");
  }
  absl::StrAppend(&j, "]}\n");
  return j;
}

}  // namespace tessera

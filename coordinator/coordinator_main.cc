// tessera-coordinator: parses flags and runs a CoordinatorNode. Writes the
// bound address to --address-file once listening (with --etcd: once it
// leads the job) and the job summary to --summary-file at the end. Exits 0
// when every worker finished, 1 when the job failed (the reason is the last
// log line), 2 on bad flags, 3 when it lost the leadership of the job to a
// standby (--etcd).
#include <csignal>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <optional>

#include "CLI/CLI.hpp"
#include "absl/strings/str_cat.h"
#include "common/env.h"
#include "common/keys.h"
#include "common/logging.h"
#include "common/metrics.h"
#include "coordinator/coordinator_node.h"
#include "coordinator/coordinator_options.h"
#include "coordinator/etcd_leadership.h"
#include "node/timing_defaults.h"
#include "transport/transport_factory.h"
#include "transport/transport_flags.h"

namespace {

using tessera::DefaultSeconds;

// tessera-coordinator's flags. Every default is the option's
// (coordinator/coordinator_options.h: CoordinatorOptions{}), so that
// --help shows what a job started without the flag gets.
struct CoordinatorFlags {
  tessera::CoordinatorOptions options;
  std::string bind = "tcp://127.0.0.1:0", address_file, summary_file, name = "coordinator";
  double assemble_timeout = DefaultSeconds(options.assemble_timeout);
  double rejoin_timeout = DefaultSeconds(options.rejoin_timeout);
  double heartbeat_interval = DefaultSeconds(options.heartbeat_interval);
  double lease = DefaultSeconds(options.lease);
  double server_lease = DefaultSeconds(options.server_lease);
  double silence_give_up = DefaultSeconds(options.isolation_give_up);
  bool debug = false;
  std::string on_worker_loss = "stop";
  double rebalance_interval = DefaultSeconds(options.rebalance.interval);
  double move_timeout = DefaultSeconds(options.move_timeout);
  std::string on_shard_loss = "stop";
  std::string state_file;
  std::string etcd, job = "tessera";
  double etcd_lease = DefaultSeconds(tessera::EtcdLeadership::Options{}.lease_ttl);
  int metrics_port = -1;
  std::string metrics_host = "127.0.0.1";
  tessera::TransportFlags transport_flags;  // --transport, --shm*, --coalesce*, --job_keys, --faults, ...

  // The job's shape and membership: --servers ... --max-workers.
  void AddJobFlags(CLI::App& app);
  // Moves, losses, state, etcd, metrics, logs and the transport.
  void AddOperationFlags(CLI::App& app);
  // Checks the flags together and turns them into `options`; false (the
  // reason logged) when they do not fit.
  bool Finish();
};

void CoordinatorFlags::AddJobFlags(CLI::App& app) {
  app.add_option("--bind", bind, "Endpoint to listen on (tcp://HOST:PORT, port 0 = any; or ipc://PATH)");
  app.add_option("--address-file", address_file, "Write the bound address to this file once listening");
  app.add_option("--summary-file", summary_file, "Write the job summary (JSON) here at the end");
  app.add_option("--servers", options.servers, "Number of servers in the job")->required()->check(CLI::PositiveNumber);
  app.add_option("--workers", options.workers, "Number of workers in the job")->required()->check(CLI::PositiveNumber);
  app.add_option("--vshards", options.vshards, "Virtual shards the key space is hashed onto")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--assemble-timeout", assemble_timeout, "Seconds for every process to register")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--heartbeat-interval", heartbeat_interval,
                 "Seconds between node heartbeats: nodes whose own interval is longer adopt it when they register")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--lease", lease, "Seconds of silence after which a node is declared lost")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--on-worker-loss", on_worker_loss,
                 "stop: a lost worker fails the job; continue: drop it from the clock tables and go on; "
                 "wait: keep its place (others wait for its clock) until a process registers for its rank, "
                 "for up to --rejoin-timeout, then fail the job")
      ->capture_default_str()
      ->check(CLI::IsMember({"stop", "continue", "wait"}));
  app.add_option("--rejoin-timeout", rejoin_timeout,
                 "With --on-worker-loss wait: seconds a lost worker's place is kept for a replacement")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--replication", options.replication,
                 "Copies of each virtual shard (a primary and replication-1 backups on other servers; capped at "
                 "--servers). With 2 or more, a lost server fails over to its backups instead of failing the job")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--server-weights", options.server_weights,
                 "Capacity of each server rank, comma-separated (e.g. 1,1,2; one positive number per server; "
                 "default: all equal): the first shard map gives each server primaries and copies in proportion, "
                 "and copies re-made after a loss go where copies per unit of weight are fewest")
      ->delimiter(',');
  app.add_option("--max-servers", options.max_servers,
                 "Servers the job may grow to while it runs (default: --servers): a tessera-server started for the "
                 "next rank (--rank N, N = the servers so far) joins the running job, empty, and the rebalancer "
                 "(--rebalance-threshold) moves shards to it");
  app.add_option("--max-workers", options.max_workers,
                 "Workers the job may grow to while it runs (default: --workers): a worker started for the next rank "
                 "(--rank N, N = the workers so far) joins the running job at the fastest worker's clock, and the job "
                 "waits for it from then on");
}

void CoordinatorFlags::AddOperationFlags(CLI::App& app) {
  app.add_option("--rebalance-threshold", options.rebalance.threshold,
                 "Move virtual shards off a server whose load per unit of weight passes this multiple of the mean "
                 "(e.g. 1.25; 0 = never). Load: each shard's bytes in and out per second plus "
                 "--rebalance-request-cost bytes per request, smoothed over 10 s; one shard at a time, off the "
                 "busiest server onto the lightest, only if that lowers the larger of the two loads")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  app.add_option("--rebalance-interval", rebalance_interval,
                 "With --rebalance-threshold: seconds between rebalancing decisions (at most one move each)")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--rebalance-request-cost", options.rebalance.request_cost_bytes,
                 "With --rebalance-threshold: what one request costs a server, in bytes of data")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  app.add_option("--move-timeout", move_timeout,
                 "Seconds a shard move may take (copying the shard to its new server and catching up) before it "
                 "is given up; the shard stays where it was")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--silence-give-up", silence_give_up,
                 "Seconds of silence from every node at once that the coordinator takes for its own isolation "
                 "(its host cut off, or it was paused) and waits out, declaring nobody lost; past it, every node "
                 "is lost as usual")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--server-lease", server_lease,
                 absl::StrCat("With replication: seconds of silence after which a server is lost and its shards "
                              "fail over (servers heartbeat every ",
                              DefaultSeconds(tessera::kDefaultServerHeartbeatInterval),
                              " s by default); without replication servers get --lease"))
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--on-shard-loss", on_shard_loss,
                 "When a shard loses every copy: stop (fail the job naming it) or restore (a live server restores it "
                 "from the last checkpoint in the servers' --checkpoint-dir and reports how many pushes it misses)")
      ->capture_default_str()
      ->check(CLI::IsMember({"stop", "restore"}));
  app.add_option("--state-file", state_file,
                 absl::StrCat("Keep the coordinator's own state (membership, shard map and epoch, barriers) in this "
                              "file; a coordinator started again with the same file takes the job over where it "
                              "was, at the address it had (--bind is then ignored), as long as the nodes' "
                              "coordinator lease (",
                              DefaultSeconds(tessera::kDefaultLease), " s) has not run out"));
  app.add_option("--etcd", etcd,
                 "Keep the coordinator's state in etcd at these client URLs (http://HOST:PORT, comma-separated) "
                 "instead of a file, and run for the job's leadership there: any number of coordinators may "
                 "be started for one job; one leads, the others stand by and take over when its lease runs out. "
                 "Nodes then find the leader with --coordinator etcd://HOST:PORT/JOB");
  app.add_option("--job", job, "With --etcd: the job's name, its keys' prefix /tessera/JOB/ (unique per job run)");
  app.add_option("--etcd-lease", etcd_lease,
                 "With --etcd: seconds the leader's etcd lease lasts without a keep-alive; a standby takes over "
                 "this long after the leader dies (etcd's minimum is 2 s by default)")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--metrics-port", metrics_port,
                 "Serve Prometheus metrics at http://HOST:PORT/metrics (0: any free port; -1: none); with "
                 "--etcd, from when this coordinator leads")
      ->check(CLI::Range(-1, 65535));
  app.add_option("--metrics-host", metrics_host, "Address the metrics endpoint listens on");
  app.add_option("--name", name, "Name in log lines");
  app.add_flag("--debug", debug, "Log debug lines");
  transport_flags.AddTo(app);
}

bool CoordinatorFlags::Finish() {
  if (options.vshards < options.servers) {
    TLOG_ERROR("--vshards ({}) must be at least --servers ({})", options.vshards, options.servers);
    return false;
  }
  if (options.max_servers != 0 && options.max_servers < options.servers) {
    TLOG_ERROR("--max-servers ({}) must be at least --servers ({})", options.max_servers, options.servers);
    return false;
  }
  if (options.max_workers != 0 && options.max_workers < options.workers) {
    TLOG_ERROR("--max-workers ({}) must be at least --workers ({})", options.max_workers, options.workers);
    return false;
  }
  if (options.rebalance.threshold != 0 && !(options.rebalance.threshold > 1)) {
    TLOG_ERROR("--rebalance-threshold {} must be 0 (off) or above 1 (a multiple of the mean load, e.g. 1.25)",
               options.rebalance.threshold);
    return false;
  }
  if (absl::Status weights = tessera::ValidateServerWeights(options.server_weights, options.servers); !weights.ok()) {
    TLOG_ERROR("--server-weights: {}", weights.message());
    return false;
  }
  options.assemble_timeout = static_cast<tessera::Nanos>(assemble_timeout * 1e9);
  options.lease = static_cast<tessera::Nanos>(lease * 1e9);
  options.on_worker_loss = on_worker_loss == "continue" ? tessera::WorkerLossPolicy::kContinue
                           : on_worker_loss == "wait"   ? tessera::WorkerLossPolicy::kWait
                                                        : tessera::WorkerLossPolicy::kStopJob;
  options.rejoin_timeout = static_cast<tessera::Nanos>(rejoin_timeout * 1e9);
  options.heartbeat_interval = static_cast<tessera::Nanos>(heartbeat_interval * 1e9);
  options.server_lease = static_cast<tessera::Nanos>(server_lease * 1e9);
  options.isolation_give_up = static_cast<tessera::Nanos>(silence_give_up * 1e9);
  options.restore_lost_shards = on_shard_loss == "restore";
  options.rebalance.interval = static_cast<tessera::Nanos>(rebalance_interval * 1e9);
  options.move_timeout = static_cast<tessera::Nanos>(move_timeout * 1e9);

  if (!etcd.empty() && !state_file.empty()) {
    TLOG_ERROR("--etcd and --state-file both keep the coordinator's state: give one");
    return false;
  }
  return true;
}

// A --state-file that exists (with --state-file): the state to take over, and its address to
// listen at again. False (the reason logged) when it cannot be read.
bool LoadStateFile(const std::string& state_file, std::string& bind,
                   std::optional<tessera::proto::CoordinatorState>& restored) {
  if (!state_file.empty() && std::filesystem::exists(state_file)) {
    std::ifstream in(state_file, std::ios::binary);
    std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    tessera::proto::CoordinatorState state;
    if (!in.good() && !in.eof()) {
      TLOG_ERROR("cannot read the state file {}", state_file);
      return false;
    }
    if (!state.ParseFromString(bytes) || state.address().empty()) {
      TLOG_ERROR("the state file {} is not a coordinator state (remove it to start a new job)", state_file);
      return false;
    }
    TLOG_INFO("taking the job over from {}: listening at {} again", state_file, state.address());
    bind = state.address();
    restored = std::move(state);
  }
  return true;
}

// With --etcd: runs for the job's leadership (standing by until it leads)
// and hands the node the state to take over and where to save it. An exit
// code when the coordinator is to stop instead.
std::optional<int> LeadThroughEtcd(const CoordinatorFlags& flags, tessera::CoordinatorNode& node,
                                   std::optional<tessera::proto::CoordinatorState>& restored,
                                   std::unique_ptr<tessera::EtcdLeadership>& leadership) {
  const std::string& etcd = flags.etcd;
  const std::string& job = flags.job;
  const double etcd_lease = flags.etcd_lease;
  auto created = tessera::EtcdLeadership::Create({.endpoints = etcd,
                                                  .job = job,
                                                  .address = node.address(),
                                                  .lease_ttl = static_cast<tessera::Nanos>(etcd_lease * 1e9)});
  if (!created.ok()) {
    TLOG_ERROR("{}", created.status().message());
    return 2;
  }
  leadership = std::move(*created);
  TLOG_INFO("listening on {}; running for the leadership of job {} in etcd at {}", node.address(), job, etcd);
  auto state = leadership->Campaign([&](const std::string& leader) {
    TLOG_INFO("standing by: job {} is led by the coordinator at {}; taking over if its etcd lease ({} s) runs out",
              job, leader, etcd_lease);
  });
  if (!state.ok()) {
    TLOG_ERROR("cannot run for the leadership of job {}: {}", job, state.status().message());
    return 1;
  }
  if (*state && ((*state)->phase() == static_cast<uint32_t>(tessera::CoordinatorCore::Phase::kDone) ||
                 (*state)->phase() == static_cast<uint32_t>(tessera::CoordinatorCore::Phase::kFailed))) {
    const bool ok = (*state)->phase() == static_cast<uint32_t>(tessera::CoordinatorCore::Phase::kDone);
    TLOG_INFO("job {} has ended under an earlier coordinator ({}{}); nothing to take over (a new job needs a "
              "new --job name)",
              job, ok ? "ok" : "failed: ", (*state)->failure_reason());
    leadership->Resign();
    return ok ? 0 : 1;
  }
  if (*state) {
    TLOG_INFO("taking job {} over from etcd: shard map epoch {}, {} nodes", job, (*state)->shard_map().epoch(),
              (*state)->nodes_size());
    restored = std::move(**state);
  }
  tessera::EtcdLeadership* lead = leadership.get();
  node.set_state(
      std::move(restored), [lead](const std::string& bytes) { return lead->Save(bytes); }, "etcd");
  node.set_leadership([lead] { return lead->Holds(); });
  return std::nullopt;
}

}  // namespace

int main(int argc, char** argv) {
  CoordinatorFlags flags;
  CLI::App app{"tessera-coordinator: membership, shard map, heartbeats, barriers and job end.\n"
               "Started by tessera-launch; servers and workers register with it."};
  flags.AddJobFlags(app);
  flags.AddOperationFlags(app);
  CLI11_PARSE(app, argc, argv);
  const std::string& name = flags.name;
  const bool debug = flags.debug;
  tessera::InitLogging(name, debug);
  tessera::WarnAboutOldTransportVariables();
  std::signal(SIGPIPE, SIG_IGN);
  if (!flags.Finish()) return 2;
  const tessera::CoordinatorOptions& options = flags.options;
  std::string& bind = flags.bind;
  const std::string& state_file = flags.state_file;
  const std::string& job = flags.job;
  std::optional<tessera::proto::CoordinatorState> restored;
  if (!LoadStateFile(state_file, bind, restored)) return 1;
  auto transport =
      tessera::MakeTransport(tessera::ZmqTransport::Options{.bind = bind}, flags.transport_flags.choice());
  if (!transport.ok()) {
    TLOG_ERROR("cannot create transport: {}", transport.status().message());
    return 1;
  }
  tessera::CoordinatorNode node(options, std::move(*transport));
  if (auto s = node.Start(); !s.ok()) {
    TLOG_ERROR("cannot listen on {}: {}", bind, s.message());
    return 1;
  }
  std::unique_ptr<tessera::EtcdLeadership> leadership;
  if (!flags.etcd.empty()) {
    if (std::optional<int> exit_code = LeadThroughEtcd(flags, node, restored, leadership)) return *exit_code;
  } else {
    node.set_state(std::move(restored), [&state_file](const std::string& bytes) {
      if (state_file.empty()) return true;
      if (absl::Status s = tessera::WriteFileAtomically(state_file, bytes); !s.ok()) {
        TLOG_ERROR("cannot save the state to its file: {}", s.message());
      }
      return true;
    });
  }
  std::unique_ptr<tessera::metrics::MetricsHttpServer> metrics;
  if (!tessera::metrics::ServeIfAsked(flags.metrics_host, flags.metrics_port, [&node] { return node.MetricsText(); },
                                      &metrics)) {
    return 1;
  }
  if (!flags.address_file.empty()) {
    if (absl::Status s = tessera::WriteFileAtomically(flags.address_file, node.address() + "\n"); !s.ok()) {
      TLOG_ERROR("cannot write the address file: {}", s.message());
      return 1;
    }
  }
  absl::Status result = node.Run();
  if (metrics) metrics->Stop();
  if (absl::IsFailedPrecondition(result)) {
    TLOG_ERROR("stopping: lost the leadership of job {}: {}", job, leadership ? leadership->lost_reason() : "");
    return 3;
  }
  if (!flags.summary_file.empty()) {
    if (absl::Status s = tessera::WriteFileAtomically(flags.summary_file, node.SummaryJson()); !s.ok()) {
      TLOG_ERROR("cannot write the summary file: {}", s.message());
    }
  }
  // A successful job stays a moment for nodes that missed the Shutdown; a
  // failed one goes now (its nodes end on the failure or the lost coordinator).
  node.Linger(result.ok() ? 1500 * tessera::kMillis : 0);
  // Standbys take the leader key now, find the job ended, and exit.
  if (leadership) leadership->Resign();
  if (!result.ok()) {
    TLOG_ERROR("job failed: {}", result.message());
    return 1;
  }
  TLOG_INFO("job finished: all {} workers done", options.workers);
  return 0;
}
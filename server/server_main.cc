// tessera-server: parses flags and runs a ServerNode. Exits 0 when the
// coordinator ends the job in order, 1 on any failure with one line saying why.
#include <algorithm>
#include <atomic>
#include <charconv>
#include <chrono>
#include <csignal>
#include <thread>
#include <cstdlib>
#include <optional>
#include <string>

#include "CLI/CLI.hpp"
#include "absl/strings/str_cat.h"
#include "common/env.h"
#include "common/logging.h"
#include "common/memory.h"
#include "common/metrics.h"
#include "node/timing_defaults.h"
#include "server/disk_tier.h"
#include "server/server_node.h"
#include "transport/transport_factory.h"
#include "transport/transport_flags.h"

namespace {

// --max-table-mb: "auto" (three quarters of the memory this process may
// use), 0 (no limit) or MiB up to 2^40, as bytes; nullopt for anything else.
std::optional<uint64_t> TableLimitBytes(const std::string& v) {
  if (v == "auto") return tessera::UsableMemoryBytes() / 4 * 3;
  uint64_t mb = 0;
  auto [end, ec] = std::from_chars(v.data(), v.data() + v.size(), mb);
  if (v.empty() || ec != std::errc() || end != v.data() + v.size() || mb > (uint64_t{1} << 40)) return std::nullopt;
  return mb << 20;
}

}  // namespace

int main(int argc, char** argv) {
  std::string bind = "tcp://127.0.0.1:0", name;
  // Frequent heartbeats: with replication the coordinator declares a server
  // lost after --server-lease (0.5 s) of silence and fails its shards over.
  double connect_timeout = 60;
  double heartbeat_interval = tessera::DefaultSeconds(tessera::kDefaultServerHeartbeatInterval);
  double lease = tessera::DefaultSeconds(tessera::kDefaultLease);
  double give_up = static_cast<double>(tessera::CoordinatorSession::Options{}.give_up) / 1e9;
  bool debug = false;
  tessera::CoordinatorSession::Options so;
  tessera::ServerCoreOptions core;
  core.pull_reply_piece_bytes = 1 << 20;
  CLI::App app{"tessera-server: holds virtual shards of the job's tables and answers pushes and pulls.\n"
               "Started by tessera-launch; it joins the job through the coordinator."};
  app.add_option("--coordinator", so.coordinator, "Coordinator address, e.g. tcp://127.0.0.1:5000")->required();
  app.add_option("--rank", so.rank, "Server rank to take (0-based); -1 lets the coordinator choose");
  app.add_option("--bind", bind, "Endpoint to listen on (tcp://HOST:PORT, port 0 = any; or ipc://PATH)");
  app.add_option("--name", name, "Name in log lines (default server-RANK)");
  app.add_option("--connect-timeout", connect_timeout, "Seconds to wait for the job to assemble")
      ->check(CLI::PositiveNumber);
  app.add_option("--heartbeat-interval", heartbeat_interval, "Seconds between heartbeats")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--lease", lease,
                 "Seconds of coordinator silence after which the server says so in its log (again every LEASE "
                 "seconds while it lasts); it goes on serving by its shard map and heartbeating")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--coordinator-give-up", give_up,
                 "Seconds of coordinator silence after which the server gives up and exits (at least --lease). "
                 "Shorter silences (a partition, a coordinator restart or standby takeover) are waited out: a "
                 "server the coordinator declared lost meanwhile rejoins the job, empty, once it hears of it")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--pull-reply-piece-bytes", core.pull_reply_piece_bytes,
                 "Send pull replies larger than this in pieces of this size, so that the worker places each "
                 "piece while the next is on the wire (0 = one message per reply)")
      ->capture_default_str();
  int metrics_port = -1;
  std::string metrics_host = "127.0.0.1";
  app.add_option("--metrics-port", metrics_port,
                 "Serve Prometheus metrics at http://METRICS_HOST:PORT/metrics (0 = any free port; -1 = off)")
      ->check(CLI::Range(-1, 65535));
  app.add_option("--metrics-host", metrics_host, "IPv4 address the metrics endpoint listens on");
  std::string audit_dir;
  app.add_option("--audit-dir,--audit_dir", audit_dir,
                 "Audit mode (fault experiments): keep the pushes applied to every row and write them, with the rows, "
                 "to DIR/server-RANK-node-ID.audit at the end of the job");
  tessera::CheckpointOptions checkpoints;
  double checkpoint_every = 0;
  app.add_option("--checkpoint-dir", checkpoints.dir,
                 "Write checkpoints of the shards this server is primary of here (atomic, checksummed; "
                 "docs/checkpoints.md), every --checkpoint-every seconds and on SIGUSR1; a shard that loses every "
                 "copy is restored from here (coordinator --on-shard-loss restore). Every server of a job should "
                 "get the same directory (shared storage across machines)");
  app.add_option("--checkpoint-every", checkpoint_every, "Seconds between checkpoints (0: only on SIGUSR1)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--keep-checkpoints", checkpoints.keep, "Checkpoints kept per server rank")->check(CLI::PositiveNumber);
  app.add_option("--restore-from", checkpoints.restore_from,
                 "Start from checkpoints: each shard this server holds is loaded from its newest checkpoint in DIR");
  std::string disk_dir, disk_store = "bucket";
  app.add_option("--disk-dir,--disk_dir", disk_dir,
                 "Disk tier (tables made with disk_tier; docs/embeddings.md): rows over a table's memory budget go "
                 "to a local disk under DIR (in DIR/tessera-HOST-PID/, removed at exit) instead of being dropped. "
                 "Without it, tables that ask for a disk tier are refused");
  app.add_option("--disk-store,--disk_store", disk_store,
                 "What holds the rows on disk: bucket (a hash table in files, no memory per row), log (a log "
                 "of records, its index in memory: 11-22 bytes a row on disk, sequential writes) or rocks "
                 "(RocksDB: about 3 bytes of memory a row, sequential writes, background compactions)")
      ->check(CLI::IsMember({"bucket", "log", "rocks"}))
      ->capture_default_str();
  std::string max_table_mb = "auto";
  uint64_t max_message_mb = tessera::kDefaultMaxMessageBytes >> 20;
  uint64_t max_hold_ms = static_cast<uint64_t>(core.max_hold / tessera::kMillis);
  app.add_option("--max-keys-per-request", core.max_keys_per_request,
                 "Refuse a push or pull of more keys than this (ResourceExhausted)")
      ->capture_default_str()->check(CLI::PositiveNumber);
  app.add_option("--max-table-mb", max_table_mb,
                 "Refuse a push or pull that would grow a table past this many MiB of rows on this server "
                 "(rows x bytes per row as docs/embeddings.md counts them: weights, optimizer state, index); "
                 "auto: three quarters of the memory this process may use (the host's, or its cgroup's limit "
                 "where lower); 0: no limit")
      ->capture_default_str()
      ->check([](const std::string& v) -> std::string {
        return TableLimitBytes(v) ? "" : "must be auto, 0 (no limit) or a number of MiB up to 2^40";
      });
  app.add_option("--max-held-per-peer", core.max_held_per_peer,
                 "Requests of one sender held at once, waiting for slower workers; more are refused")
      ->capture_default_str()->check(CLI::PositiveNumber);
  uint64_t max_mb_in_flight_per_peer = core.max_bytes_in_flight_per_peer >> 20;
  app.add_option("--max-mb-in-flight-per-peer", max_mb_in_flight_per_peer,
                 "MiB of answers to one peer this server keeps waiting to be written out (the peer reads them "
                 "slower than it asks); past this its requests are answered Unavailable (busy) and it asks "
                 "again later")
      ->capture_default_str()->check(CLI::Range(uint64_t{1}, uint64_t{1} << 30));
  app.add_option("--max-requests-in-flight-per-peer", core.max_requests_in_flight_per_peer,
                 "Answers (pull reply pieces count one each) to one peer this server keeps waiting to be written "
                 "out; past this its requests are answered Unavailable (busy), and past this + 1024 dropped")
      ->capture_default_str()->check(CLI::Range(uint64_t{1}, uint64_t{1} << 30));
  app.add_option("--max-hold-ms", max_hold_ms,
                 "Longest a pull or clock advance may ask to be held for slower workers (its hold timeout); "
                 "a request asking for more is refused")
      ->capture_default_str()->check(CLI::Range(uint64_t{1}, uint64_t{1} << 40));
  app.add_option("--max-message-mb", max_message_mb,
                 "Largest message accepted (header and frames); a larger one is dropped by the transport. "
                 "Pull replies asked for whole (Worker::PullView) go in pieces past half of it. Workers split "
                 "their requests to fit it: give them the same value (--transfer_max_message_mb)")
      ->capture_default_str()->check(CLI::Range(uint64_t{1}, uint64_t{1} << 20));
  app.add_flag("--debug", debug, "Log debug lines");
  tessera::TransportFlags transport_flags;  // --transport, --shm*, --coalesce*, --job_keys, --faults, ...
  transport_flags.AddTo(app);
  CLI11_PARSE(app, argc, argv);
  core.max_table_bytes = *TableLimitBytes(max_table_mb);  // checked by the parser
  core.max_hold = static_cast<tessera::Nanos>(max_hold_ms) * tessera::kMillis;
  core.max_bytes_in_flight_per_peer = max_mb_in_flight_per_peer << 20;
  checkpoints.every = static_cast<tessera::Nanos>(checkpoint_every * 1e9);
  core.audit = !audit_dir.empty();
  if (name.empty()) name = so.rank >= 0 ? "server-" + std::to_string(so.rank) : "server";
  tessera::InitLogging(name, debug);
  tessera::WarnAboutOldTransportVariables({{"TESSERA_AUDIT_DIR", "--audit-dir"}});
  std::signal(SIGPIPE, SIG_IGN);
  tessera::KeepLargeAllocationsMapped();  // large receives come back warm (common/memory.h)
  if (core.max_table_bytes > 0) {
    TLOG_INFO("tables are limited to {} MiB of rows each on this server (--max-table-mb {})",
              core.max_table_bytes >> 20, max_table_mb);
  }
  so.connect_timeout = static_cast<tessera::Nanos>(connect_timeout * 1e9);
  so.heartbeat_interval = static_cast<tessera::Nanos>(heartbeat_interval * 1e9);
  so.lease = static_cast<tessera::Nanos>(lease * 1e9);
  so.give_up = static_cast<tessera::Nanos>(give_up * 1e9);

  tessera::ZmqTransport::Options transport_options;
  transport_options.bind = bind;
  transport_options.count_backlog = true;  // answers waiting for each peer bound what it may ask (--max-*-in-flight-*)
  transport_options.max_message_bytes = max_message_mb << 20;
  // Whole pull replies (Worker::PullView) must fit one message, headers included.
  core.max_whole_reply_bytes = std::min<size_t>(core.max_whole_reply_bytes, (max_message_mb << 20) / 2);
  // So must the pieces of the others (a 1 MiB limit would drop 1 MiB pieces and their headers).
  core.pull_reply_piece_bytes = std::min<size_t>(core.pull_reply_piece_bytes, (max_message_mb << 20) / 2);
  core.max_message_bytes = max_message_mb << 20;  // state transfers to backups go in messages that fit
  auto transport = tessera::MakeTransport(std::move(transport_options), transport_flags.choice());
  if (!transport.ok()) {
    TLOG_ERROR("cannot create transport: {}", transport.status().message());
    return 1;
  }
  if (!disk_dir.empty()) {
    auto factory = tessera::MakeDiskTierFactory(disk_dir, *tessera::ParseDiskStore(disk_store));
    if (!factory.ok()) {
      TLOG_ERROR("{}", factory.status().message());
      return 1;
    }
    core.disk_tiers = std::move(*factory);
  }
  tessera::ServerNode node(so, std::move(*transport), core);
  node.set_checkpoints(checkpoints);
  static std::atomic<bool> checkpoint_signal{false};
  std::signal(SIGUSR1, [](int) { checkpoint_signal.store(true); });
  std::unique_ptr<tessera::metrics::MetricsHttpServer> metrics;
  if (!tessera::metrics::ServeIfAsked(metrics_host, metrics_port, [&node] { return node.MetricsText(); }, &metrics)) {
    return 1;
  }
  std::atomic<bool> serving{true};
  std::thread signal_watch([&node, &serving] {
    // A signal handler may only set a flag; this thread passes it on while
    // the node lives.
    while (serving.load()) {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
      if (checkpoint_signal.exchange(false)) node.RequestCheckpoint();
    }
  });
  absl::Status s = node.Run();
  serving.store(false);
  signal_watch.join();
  if (metrics) metrics->Stop();
  if (!audit_dir.empty() && node.node_id() != 0) {
    const std::string path = absl::StrCat(audit_dir, "/server-", node.rank(), "-node-", node.node_id(), ".audit");
    if (absl::Status w = tessera::WriteFileAtomically(path, node.AuditDump()); !w.ok()) {
      TLOG_ERROR("cannot write the audit: {}", w.message());
      return 1;
    }
    TLOG_INFO("audit written to {}", path);
  }
  if (!s.ok()) {
    TLOG_ERROR("{}", s.message());
    return 1;
  }
  TLOG_INFO("job ended in order; exiting");
  return 0;
}

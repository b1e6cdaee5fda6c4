// tessera-server: parses flags (server/server_flags.h) and runs a ServerNode. Exits 0 when the
// coordinator ends the job in order, 1 on any failure with one line saying why.
#include <algorithm>
#include <atomic>
#include <charconv>
#include <chrono>
#include <csignal>
#include <thread>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
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
#include "server/server_flags.h"
#include "server/server_node.h"
#include "transport/transport_factory.h"
#include "transport/transport_flags.h"

int main(int argc, char** argv) {
  tessera::ServerFlags flags;
  CLI::App app{"tessera-server: holds virtual shards of the job's tables and answers pushes and pulls.\n"
               "Started by tessera-launch; it joins the job through the coordinator."};
  flags.AddTo(app);
  CLI11_PARSE(app, argc, argv);
  flags.Finish();
  if (!flags.checkpoints.restore_from.empty() && !flags.checkpoints.dir.empty()) {
    auto place = [](std::string dir) {  // the same directory however it is written
      while (dir.size() > 1 && dir.back() == '/') dir.pop_back();
      std::error_code e;
      return std::filesystem::weakly_canonical(dir, e);
    };
    if (place(flags.checkpoints.restore_from) == place(flags.checkpoints.dir)) {
      std::fprintf(stderr,
                   "tessera-server: --checkpoint-dir is --restore-from (%s): give the new job a directory of its own "
                   "(a new job numbers its shard map epochs from 1 again, so a restore would take the old job's "
                   "checkpoints for newer than the new job's)\n",
                   flags.checkpoints.dir.c_str());
      return 2;
    }
  }
  tessera::ServerCoreOptions core = flags.core;
  tessera::InitLogging(flags.name, flags.debug);
  tessera::WarnAboutOldTransportVariables({{"TESSERA_AUDIT_DIR", "--audit-dir"}});
  std::signal(SIGPIPE, SIG_IGN);
  tessera::KeepLargeAllocationsMapped();  // large receives come back warm (common/memory.h)
  if (core.max_table_bytes > 0) {
    TLOG_INFO("tables are limited to {} MiB of rows each on this server (--max-table-mb {})",
              core.max_table_bytes >> 20, flags.max_table_mb);
  }
  auto transport = tessera::MakeTransport(flags.TransportOptions(), flags.transport_flags.choice());
  if (!transport.ok()) {
    TLOG_ERROR("cannot create transport: {}", transport.status().message());
    return 1;
  }
  if (!flags.disk_dir.empty()) {
    auto factory = tessera::MakeDiskTierFactory(flags.disk_dir, *tessera::ParseDiskStore(flags.disk_store));
    if (!factory.ok()) {
      TLOG_ERROR("{}", factory.status().message());
      return 1;
    }
    core.disk_tiers = std::move(*factory);
  }
  tessera::ServerNode node(flags.session, std::move(*transport), core);
  node.set_checkpoints(flags.checkpoints);
  static std::atomic<bool> checkpoint_signal{false};
  std::signal(SIGUSR1, [](int) { checkpoint_signal.store(true); });
  std::unique_ptr<tessera::metrics::MetricsHttpServer> metrics;
  if (!tessera::metrics::ServeIfAsked(flags.metrics_host, flags.metrics_port, [&node] { return node.MetricsText(); }, &metrics)) {
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
  if (!flags.audit_dir.empty() && node.node_id() != 0) {
    const std::string path = absl::StrCat(flags.audit_dir, "/server-", node.rank(), "-node-", node.node_id(), ".audit");
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

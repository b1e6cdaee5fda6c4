#pragma once
// tessera-server's flags (the process contract in docs/launcher.md) in one
// place: each setting's default is defined here once (or by the option
// struct it fills, e.g. ServerCoreOptions), shown by --help, and turned into
// the options of the session, the core, checkpoints and the transport.
// server/server_main.cc only parses and runs.
#include <cstdint>
#include <optional>
#include <string>

#include "CLI/CLI.hpp"
#include "absl/status/statusor.h"
#include "common/message.h"
#include "node/coordinator_session.h"
#include "node/timing_defaults.h"
#include "server/server_core.h"
#include "server/server_node.h"
#include "transport/transport_flags.h"
#include "transport/zmq_transport.h"

namespace tessera {

struct ServerFlags {
  CoordinatorSession::Options session;  // --coordinator, --rank (times below)
  std::string bind = "tcp://127.0.0.1:0";
  std::string name;  // default server-RANK
  // Frequent heartbeats: with replication the coordinator declares a server
  // lost after --server-lease (0.5 s) of silence and fails its shards over.
  double connect_timeout = 60;
  double heartbeat_interval = DefaultSeconds(kDefaultServerHeartbeatInterval);
  double lease = DefaultSeconds(kDefaultLease);
  double give_up = static_cast<double>(CoordinatorSession::Options{}.give_up) / 1e9;
  bool debug = false;
  ServerCoreOptions core = [] {
    ServerCoreOptions o;
    o.pull_reply_piece_bytes = 1 << 20;
    return o;
  }();
  int metrics_port = -1;
  std::string metrics_host = "127.0.0.1";
  std::string audit_dir;
  CheckpointOptions checkpoints;
  double checkpoint_every = 0;
  std::string disk_dir;
  std::string disk_store = "bucket";
  std::string max_table_mb = "auto";
  uint64_t max_message_mb = kDefaultMaxMessageBytes >> 20;
  uint64_t max_hold_ms = static_cast<uint64_t>(ServerCoreOptions{}.max_hold / kMillis);
  uint64_t max_mb_in_flight_per_peer = ServerCoreOptions{}.max_bytes_in_flight_per_peer >> 20;
  TransportFlags transport_flags;  // --transport, --shm*, --coalesce*, --job_keys, --faults, ...

  // Adds every flag to `app` (and TransportFlags' final callback).
  void AddTo(CLI::App& app);
  // After parsing: the values the flags' own units and limits leave to be
  // derived (bytes, nanoseconds, the limits that follow from the largest
  // message), into session, core and checkpoints; the name when unset.
  void Finish();
  // The transport's options for this server.
  ZmqTransport::Options TransportOptions() const;
};

// --max-table-mb: "auto" (three quarters of the memory this process may
// use), 0 (no limit) or MiB up to 2^40, as bytes; nullopt for anything else.
std::optional<uint64_t> TableLimitBytes(const std::string& v);

}  // namespace tessera

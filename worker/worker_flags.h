#pragma once
// The flags every worker program takes from the launcher (the process
// contract in docs/launcher.md), in one place: add them to a CLI11 app, then
// turn them into WorkerOptions. Header-only; programs link CLI11 themselves.
#include <algorithm>
#include <functional>
#include <string>

#include "CLI/CLI.hpp"
#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "transport/transport_flags.h"
#include "worker/worker.h"

namespace tessera {

// The resend timer's flags (WorkerOptions::resend_*), for every worker
// program: the launcher passes them from the job's `timeouts:`.
struct ResendFlags {
  double initial_ms = static_cast<double>(WorkerOptions{}.resend_after) / kMillis;
  double floor_ms = static_cast<double>(WorkerOptions{}.resend_floor) / kMillis;
  double ceiling_ms = static_cast<double>(WorkerOptions{}.resend_ceiling) / kMillis;

  void AddTo(CLI::App& app) {
    app.add_option("--resend_initial_ms,--resend-initial-ms,--resend-after-ms", initial_ms,
                   "send an unanswered request again after this many ms, until round trips to its server were "
                   "timed (0: never send again)")
        ->capture_default_str()
        ->check(CLI::NonNegativeNumber);
    app.add_option("--resend_floor_ms,--resend-floor-ms", floor_ms,
                   "the resend timer, learned from round trips, is never shorter than this")
        ->capture_default_str()
        ->check(CLI::PositiveNumber);
    app.add_option("--resend_ceiling_ms,--resend-ceiling-ms", ceiling_ms,
                   "... and never longer than this, backoff included: a link that comes back is used again "
                   "within it")
        ->capture_default_str()
        ->check(CLI::PositiveNumber);
  }
  void ApplyTo(WorkerOptions& o) const {
    o.resend_after = static_cast<Nanos>(initial_ms * kMillis);
    o.resend_floor = static_cast<Nanos>(floor_ms * kMillis);
    o.resend_ceiling = static_cast<Nanos>(std::max(ceiling_ms, floor_ms) * kMillis);
  }
};

struct WorkerProcessFlags {
  std::string coordinator;                 // coordinator address
  int rank = -1;                           // requested worker rank, -1 = assigned
  std::string name;                        // for logs; default worker-RANK
  std::string bind = "tcp://127.0.0.1:0";  // where replies arrive
  bool debug = false;                      // debug log lines
  double connect_timeout_seconds = 30;     // registration and job assembly
  double request_timeout_seconds = 60;     // every push, pull, table creation
  double hold_timeout_seconds = 120;       // a server's hold of a pull or clock for slower workers
  double coordinator_give_up_seconds =     // coordinator silence after which the worker gives up
      static_cast<double>(WorkerOptions{}.coordinator_give_up) / kSeconds;
  int metrics_port = -1;                   // Prometheus metrics (0: any free port; -1: off)
  std::string metrics_host = "127.0.0.1";
  int64_t transfer_part_bytes = 0;                      // parts of at most this many value bytes (0: no split)
  int64_t transfer_row_piece_bytes = static_cast<int64_t>(kDefaultRowPieceBytes);  // pushed rows wider go in pieces
  int64_t transfer_max_bytes_in_flight_per_server = 0;  // value bytes in flight to one server (0: unbounded)
  int64_t transfer_max_message_mb = static_cast<int64_t>(kDefaultMaxMessageBytes >> 20);  // the servers' largest message
  ResendFlags resend;
  TransportFlags transport;                // --transport, --shm*, --coalesce*, --job_keys, --faults, ...

  // Adds every flag; uses the app's final callback (TransportFlags::AddTo).
  void AddTo(CLI::App& app) {
    app.add_option("--coordinator", coordinator, "coordinator address, e.g. tcp://127.0.0.1:5000")->required();
    app.add_option("--rank", rank, "requested worker rank (-1: assigned by the coordinator)");
    app.add_option("--name", name, "name for logs, e.g. worker-0");
    app.add_option("--bind", bind, "endpoint this worker receives replies on");
    app.add_flag("--debug", debug, "log debug lines");
    app.add_option("--connect_timeout_seconds,--connect-timeout-seconds", connect_timeout_seconds,
                   "seconds to wait for the coordinator and the job to assemble")
        ->check(CLI::PositiveNumber);
    app.add_option("--request_timeout_seconds,--request-timeout-seconds", request_timeout_seconds,
                   "seconds before a push or pull fails (a pull or clock of a BSP or SSP table: plus "
                   "--hold_timeout_seconds)")
        ->check(CLI::PositiveNumber);
    app.add_option("--hold_timeout_seconds,--hold-timeout-seconds", hold_timeout_seconds,
                   "seconds a server may hold a pull or a clock for slower workers (BSP, SSP)")
        ->check(CLI::PositiveNumber);
    app.add_option("--coordinator_give_up_seconds,--coordinator-give-up-seconds", coordinator_give_up_seconds,
                   "seconds of coordinator silence the worker waits out (a partition, a coordinator failover) "
                   "before it gives up")
        ->capture_default_str()
        ->check(CLI::PositiveNumber);
    app.add_option("--metrics_port,--metrics-port", metrics_port,
                   "serve Prometheus metrics at http://METRICS_HOST:PORT/metrics (0: any free port; -1: off)")
        ->check(CLI::Range(-1, 65535));
    app.add_option("--metrics_host,--metrics-host", metrics_host, "IPv4 address the metrics endpoint listens on");
    app.add_option("--transfer_part_bytes,--transfer-part-bytes", transfer_part_bytes,
                   "split each server's share of a push or pull into parts of at most this many value bytes "
                   "(0: one part per server); a pushed row wider than this goes in pieces of columns that the "
                   "server updates as they arrive (not for compressed pushes or ADAM tables)")
        ->check(ByteCountOrZero());
    app.add_option("--transfer_row_piece_bytes,--transfer-row-piece-bytes", transfer_row_piece_bytes,
                   "with --transfer_part_bytes 0: a pushed row wider than this many bytes goes in pieces of this "
                   "many bytes that the server updates as they arrive (not for compressed pushes or ADAM "
                   "tables); 0: whole rows")
        ->capture_default_str()
        ->check(ByteCountOrZero());
    app.add_option("--transfer_max_bytes_in_flight_per_server,--transfer-max-bytes-in-flight-per-server",
                   transfer_max_bytes_in_flight_per_server,
                   "value bytes sent to one server and not yet answered; more parts wait, by priority "
                   "(0: unbounded)")
        ->check(ByteCountOrZero());
    app.add_option("--transfer_max_message_mb,--transfer-max-message-mb", transfer_max_message_mb,
                   "the servers' largest message in MiB (tessera-server --max-message-mb): each server's share of "
                   "a push or pull goes in parts that fit it")
        ->capture_default_str()
        ->check(CLI::Range(int64_t{1}, int64_t{1} << 20));
    resend.AddTo(app);
    transport.AddTo(app);
  }

  // A count of bytes: digits only, 0 or more, at most 2^63 - 1.
  static CLI::Validator ByteCountOrZero() {
    return CLI::Validator(
        [](std::string& value) -> std::string {
          const bool digits = !value.empty() && value.size() <= 19 &&
                              value.find_first_not_of("0123456789") == std::string::npos;
          if (digits && (value.size() < 19 || value <= "9223372036854775807")) return "";
          return "must be an integer, 0 or more (bytes; 0: off), got " + value;
        },
        "BYTES");
  }

  // Names the process (worker-RANK unless --name) and starts logging;
  // warns about old transport environment variables (transport_flags.h).
  void InitLogs() {
    if (name.empty()) name = rank >= 0 ? absl::StrCat("worker-", rank) : "worker";
    InitLogging(name, debug);
    WarnAboutOldTransportVariables();
  }

  WorkerOptions ToOptions() const {
    WorkerOptions o;
    o.coordinator = coordinator;
    o.rank = rank;
    o.bind = bind;
    o.name = name;
    o.connect_timeout = static_cast<Nanos>(connect_timeout_seconds * kSeconds);
    o.request_timeout = static_cast<Nanos>(request_timeout_seconds * kSeconds);
    o.hold_timeout = static_cast<Nanos>(hold_timeout_seconds * kSeconds);
    o.coordinator_give_up = static_cast<Nanos>(coordinator_give_up_seconds * kSeconds);
    o.metrics_port = metrics_port;
    o.metrics_host = metrics_host;
    o.part_bytes = static_cast<uint64_t>(transfer_part_bytes);
    o.row_piece_bytes = static_cast<uint64_t>(transfer_row_piece_bytes);
    o.max_bytes_in_flight_per_server = static_cast<uint64_t>(transfer_max_bytes_in_flight_per_server);
    o.max_message_bytes = static_cast<size_t>(transfer_max_message_mb) << 20;
    resend.ApplyTo(o);
    o.transport = transport.choice();
    return o;
  }

  // Starts logging, joins the job and runs `run` on the worker: a worker
  // program's exit status (0; or 1 after one line that says whether joining
  // or `what` failed, and why).
  int Run(const char* what, const std::function<absl::Status(Worker&)>& run) {
    InitLogs();
    absl::StatusOr<std::unique_ptr<Worker>> worker = Worker::Connect(ToOptions());
    if (!worker.ok()) {
      TLOG_ERROR("could not join the job: {}", worker.status().ToString());
      return 1;
    }
    if (absl::Status s = run(**worker); !s.ok()) {
      TLOG_ERROR("{} failed: {}", what, s.ToString());
      return 1;
    }
    return 0;
  }
};

}  // namespace tessera

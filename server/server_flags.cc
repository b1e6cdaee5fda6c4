#include "server/server_flags.h"

#include <algorithm>
#include <charconv>

#include "common/memory.h"

namespace tessera {

std::optional<uint64_t> TableLimitBytes(const std::string& v) {
  if (v == "auto") return UsableMemoryBytes() / 4 * 3;
  uint64_t mb = 0;
  auto [end, ec] = std::from_chars(v.data(), v.data() + v.size(), mb);
  if (v.empty() || ec != std::errc() || end != v.data() + v.size() || mb > (uint64_t{1} << 40)) return std::nullopt;
  return mb << 20;
}

void ServerFlags::AddTo(CLI::App& app) {
  app.add_option("--coordinator", session.coordinator, "Coordinator address, e.g. tcp://127.0.0.1:5000")->required();
  app.add_option("--rank", session.rank, "Server rank to take (0-based); -1 lets the coordinator choose");
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
  app.add_option("--metrics-port", metrics_port,
                 "Serve Prometheus metrics at http://METRICS_HOST:PORT/metrics (0 = any free port; -1 = off)")
      ->check(CLI::Range(-1, 65535));
  app.add_option("--metrics-host", metrics_host, "IPv4 address the metrics endpoint listens on");
  app.add_option("--audit-dir,--audit_dir", audit_dir,
                 "Audit mode (fault experiments): keep the pushes applied to every row and write them, with the rows, "
                 "to DIR/server-RANK-node-ID.audit at the end of the job");
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
  transport_flags.AddTo(app);
}

void ServerFlags::Finish() {
  core.max_table_bytes = *TableLimitBytes(max_table_mb);  // checked by the parser
  core.max_hold = static_cast<Nanos>(max_hold_ms) * kMillis;
  core.max_bytes_in_flight_per_peer = max_mb_in_flight_per_peer << 20;
  checkpoints.every = static_cast<Nanos>(checkpoint_every * 1e9);
  core.audit = !audit_dir.empty();
  if (name.empty()) name = session.rank >= 0 ? "server-" + std::to_string(session.rank) : "server";
  session.connect_timeout = static_cast<Nanos>(connect_timeout * 1e9);
  session.heartbeat_interval = static_cast<Nanos>(heartbeat_interval * 1e9);
  session.lease = static_cast<Nanos>(lease * 1e9);
  session.give_up = static_cast<Nanos>(give_up * 1e9);
  // Whole pull replies (Worker::PullView) must fit one message, headers included.
  core.max_whole_reply_bytes = std::min<size_t>(core.max_whole_reply_bytes, (max_message_mb << 20) / 2);
  // So must the pieces of the others (a 1 MiB limit would drop 1 MiB pieces and their headers).
  core.pull_reply_piece_bytes = std::min<size_t>(core.pull_reply_piece_bytes, (max_message_mb << 20) / 2);
  core.max_message_bytes = max_message_mb << 20;  // state transfers to backups go in messages that fit
}

ZmqTransport::Options ServerFlags::TransportOptions() const {
  ZmqTransport::Options o;
  o.bind = bind;
  o.count_backlog = true;  // answers waiting for each peer bound what it may ask (--max-*-in-flight-*)
  o.max_message_bytes = max_message_mb << 20;
  return o;
}

}  // namespace tessera

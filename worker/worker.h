#pragma once
// tessera::Worker: the client library a training process links against.
//
// A Worker joins a job through the coordinator, learns the shard map, and then
// pushes gradients and pulls weights. Requests are sliced across servers by
// the shard map and merged back; many may be in flight at once.
//
// Contract:
// - Connect() registers with the coordinator and returns once the whole job
//   has assembled (every server and worker registered). It fails with an error
//   that names the coordinator if it does not answer within
//   options.connect_timeout, or with the coordinator's own reason (for
//   example "job did not assemble: missing server 1").
// - Push(table, keys, values): values holds keys.size() * width floats, row i
//   for keys[i]. Pull(table, keys, out): out receives keys.size() * width
//   floats, row i for keys[i], written straight into `out`.
//   ZERO-COPY: the caller keeps keys, values and out valid and unchanged (out:
//   untouched) until the returned Future is ready. Duplicate keys are allowed:
//   a push applies each occurrence; a pull returns the row for each.
// - PullView(table, keys, rows): a pull whose rows stay in the buffers they
//   arrived in (no copy on the worker; worker/pulled_rows.h): once the
//   Future is ready with OK, rows->row(i) is key i's row. The caller keeps
//   keys unchanged and *rows alive and unused until then. Everything else
//   (clocks, failover, read-my-writes, timeouts) is as for Pull.
// - PullDeduplicated(table, keys, out): Pull's result (out row i is keys[i]'s
//   row), but each distinct key is sent and received once (common/
//   sparse_batch.h deduplicates the keys, in order of first occurrence) and
//   its row copied to every position of that key once the rows are in.
//   The caller keeps keys unchanged and out untouched until the Future is
//   ready (the copy to `out` happens in the first Wait() or ready() that
//   finds the pull done, on that thread); the worker owns the distinct keys
//   and their rows. Errors as for Pull, and InvalidArgument (nothing sent)
//   when out is not keys.size() rows of the table's width.
// - PushAggregated(table, keys, values): one push of one row per distinct
//   key (in order of first occurrence), that row the sum of the rows of its
//   positions, added in position order (deterministic). The sums are made
//   before it returns, into memory the request owns: the caller may change
//   or free keys and values at once. For SGD and ACCUMULATE tables this is
//   Push's result up to rounding; a stateful optimizer (momentum, Adagrad,
//   Adam, FTRL) steps once on the sum, which is what a server does with a
//   key listed twice in one push anyway. Errors as for Push, and
//   InvalidArgument (nothing sent) when values is not keys.size() rows of
//   the table's width. Both order with other requests as Pull and Push do
//   (a PullDeduplicated after a PushAggregated reflects it).
// - A pull issued after a push from the same Worker object reflects that push
//   (requests to one server are handled in issue order).
// - Clocks (../shared/DESIGN.md section 5): clock() starts at 0; every push
//   and pull is stamped with it; Clock() advances it. For a table with
//   staleness s (BSP 0, SSP its bound, ASP unbounded), a pull at clock c
//   reflects every push stamped <= c - s - 1 from every live worker, and
//   Clock() to c returns only once every live worker has reached c - s for
//   the strictest table. A wait that exceeds options.hold_timeout fails with
//   DeadlineExceeded naming the workers still behind. A worker whose open
//   tables are all ASP has nothing to wait for: its Clock() only tells the
//   servers (no round trip), so that workers of synchronous tables elsewhere
//   in the job still see it advance.
// - Failover (replication > 1, ../shared/DESIGN.md section 6): a push is
//   acknowledged only once every live replica of its shards has it. Every
//   push carries this process's sequence number; when the coordinator
//   publishes a new map (a server was lost), the parts that went to the
//   lost server, and those a server refused as not its own, are sent again
//   to the new primaries: pushes with the same number (servers apply each
//   once per shard), pulls split by the new map. The application sees no
//   error for a loss the replicas cover; a loss they do not cover ends the
//   job with the coordinator's reason. Clock() first waits for the pushes
//   issued before it, so that no server counts a clock before it has them.
// - Lost messages: a request to a server unanswered for that server's
//   resend timer is sent again under a new request id (pushes keep their
//   sequence number, so a server applies each once; a server holding the
//   first send for slower workers keeps holding that one), then after twice
//   that, four times, ... up to options.resend_ceiling. The timer is
//   learned from the round trips of the server's answers (worker/
//   worker_core.h, Tick; options.resend_after before the first). When the
//   transport says the connection to a server was made again, what that
//   server owes goes again at once. A request still fails after
//   options.request_timeout (plus any hold) in all.
// - Transfer scheduling (docs/design.md, "Transfer scheduling"): with
//   options.part_bytes, each server's share of a push or a pull goes in
//   parts of at most that many value bytes (at least one row a part; but
//   a row wider than part_bytes in an uncompressed push to a table that is
//   not ADAM goes in pieces of part_bytes, which the server applies one by
//   one as they arrive); with
//   options.max_bytes_in_flight_per_server, parts wait in a queue per
//   server and leave by priority (the `priority` argument of Push and Pull:
//   lower numbers first, then issue order) as answers free room. A pull
//   never overtakes a push issued before it to the same server, so the
//   read-my-writes promise above holds whatever the priorities; a push may
//   overtake an earlier pull of lower priority. With a bound, Clock() first
//   waits for the pushes issued before it (as with replication). Both
//   options 0 (the default): one request per server, sent at once, and the
//   priority has no effect.
// - Futures complete with OK, or with an error that says what failed and which
//   server did not answer (DeadlineExceeded after options.request_timeout;
//   for a pull or a Clock() of a BSP or SSP table, after request_timeout +
//   hold_timeout, since a server may hold it that long for slower workers;
//   a pull of an ASP table is never held, so request_timeout alone).
// - Waiting: while a server owes an answer to an operation older than
//   options.wait_report_interval, the worker logs one line per such server
//   every wait_report_interval, naming the server, its oldest request (what
//   it is, its request id, how long it has waited, how often it was sent
//   again, when it fails) and how many requests it owes: a stalled worker
//   is never silent.
// - The coordinator: silent for options.lease, the worker says so and waits
//   for it (its pushes and pulls go on); it gives up after
//   options.coordinator_give_up (node/coordinator_session.h).
// - Thread safety: all methods may be called from any thread concurrently,
//   except Finish() and the destructor.
// - The destructor fails any pending request with Cancelled and leaves the
//   job without waiting (prefer Finish()).
#include <array>
#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/clock.h"
#include "transport/transport.h"
#include "transport/transport_factory.h"
#include "common/keys.h"
#include "proto/tessera.pb.h"
#include "worker/pulled_rows.h"

namespace tessera {

class Transport;

struct WorkerOptions {
  std::string coordinator;                   // coordinator address, e.g. tcp://127.0.0.1:5000
  int rank = -1;                             // requested worker rank, -1 = assigned by the coordinator
  std::string bind = "tcp://127.0.0.1:0";   // where this worker receives replies
  Nanos connect_timeout = 30 * kSeconds;     // for registration and job assembly
  Nanos request_timeout = 60 * kSeconds;     // for every push, pull and table creation (on top of any hold)
  // Resends of lost messages (worker/worker_core.h, Tick): a request goes
  // again when unanswered for its server's resend timer, learned from the
  // round trips of that server's answers within [resend_floor,
  // resend_ceiling]; resend_after before the first answer (0: never resend).
  Nanos resend_after = 200 * kMillis;
  Nanos resend_floor = 2 * kMillis;
  Nanos resend_ceiling = 1 * kSeconds;
  double resend_bytes_per_second = 100e6;    // a request's bytes, and those ahead of it, add their time at this rate
  Nanos hold_timeout = 120 * kSeconds;       // longest wait for slower workers in Clock() or a pull
  Nanos barrier_timeout = 300 * kSeconds;    // for Barrier()
  Nanos heartbeat_interval = 1 * kSeconds;   // heartbeats to the coordinator
  Nanos lease = 5 * kSeconds;                // coordinator silent this long: said in the log
  Nanos coordinator_give_up = 60 * kSeconds;  // coordinator silent this long: the worker gives up
  Nanos wait_report_interval = 5 * kSeconds;  // a line per server that owes an answer this old (0: none)
  std::string name;                          // for logs, e.g. "worker-0"
  bool keep_allocations_mapped = true;       // process-wide malloc tuning for large receives (common/memory.h)
  int metrics_port = -1;                     // serve Prometheus metrics on this port (0: any free port; -1: off)
  std::string metrics_host = "127.0.0.1";    // IPv4 address the metrics endpoint listens on
  uint64_t part_bytes = 0;                   // split each server's share of a push or pull into parts of at most
                                             // this many value bytes (0: one part per server); wider push rows go
                                             // in pieces of columns (see Transfer scheduling above)
  uint64_t row_piece_bytes = kDefaultRowPieceBytes;  // with part_bytes 0: a pushed row wider than this goes in
                                                     // pieces of this many bytes (0: whole rows)
  uint64_t max_bytes_in_flight_per_server = 0;  // value bytes sent to one server and unanswered; parts wait by
                                                // priority beyond it (0: unbounded, everything sent at once)
  size_t max_message_bytes = kDefaultMaxMessageBytes;  // the servers' largest message (--max-message-mb): each
                                                       // server's share of a push or pull goes in parts that fit
                                                       // it; also this worker's transport's limit (Connect)
  // The transport Connect makes (transport/transport_factory.h; a program's
  // --transport, --shm*, --coalesce*, --job_keys, --faults, ... flags:
  // worker/worker_flags.h). Connect sets coalesce.hold_requests itself.
  TransportChoice transport;
};

// Options of one table. Workers that create the same table must pass equal
// options; different options for an existing id are an error.
struct TableOptions {
  uint32_t id = 0;                                     // unique per job
  std::string name;                                    // for logs and metrics
  uint32_t width = 1;                                  // floats per key, >= 1
  proto::TableKind kind = proto::SPARSE;               // DENSE: keys 0..dense_rows-1
  uint64_t dense_rows = 0;                             // DENSE only, >= 1
  proto::OptimizerKind optimizer = proto::SGD;         // applied on the server (rules: server/optimizer.h)
  float learning_rate = 0.01f;                         // step size (FTRL: alpha)
  float momentum = 0.9f;                               // MOMENTUM, in [0, 1)
  float beta1 = 0.9f;                                  // ADAM, in [0, 1)
  float beta2 = 0.999f;                                // ADAM, in [0, 1)
  float epsilon = 1e-8f;                               // ADAGRAD and ADAM, > 0
  float initial_accumulator = 0.1f;                    // ADAGRAD: a new row's accumulator, >= 0
  float ftrl_beta = 1.0f;                              // FTRL beta, > 0
  float l1 = 0.0f;                                     // FTRL L1 strength, >= 0
  float l2 = 0.0f;                                     // FTRL L2 strength, >= 0
  // SPARSE tables only (docs/embeddings.md):
  uint32_t admit_after = 0;              // an id gets a row on its N-th push (0, 1: at once)
  uint64_t admission_sketch_width = 0;   // counters per row of the admission sketch (0: 1 << 20)
  uint64_t evict_after_clocks = 0;       // drop rows no push touched for this many clocks (0: never)
  uint64_t memory_budget_bytes = 0;      // per server: drop least recently pushed rows past it (0: none)
  bool disk_tier = false;                // with memory_budget_bytes: rows past it go to the servers' disks
                                         // instead of being dropped (tessera-server --disk_dir)
  proto::InitKind init = proto::ZEROS;                 // initial rows
  float init_scale = 0.0f;                             // UNIFORM half-width / NORMAL stddev
  uint64_t init_seed = 0;                              // initializer seed
  proto::ConsistencyKind consistency = proto::BSP;     // BSP, SSP or ASP
  uint32_t staleness = 0;                              // SSP only: the bound s
  std::string compression;       // pushed values: a codec spec (compress/codec.h), e.g. "topk:ratio=0.01"; "" = none
  std::string pull_compression;  // pulled values: an elementwise codec spec without error feedback; "" = none
};

// The completion of one request. Copyable handle to shared state.
class Future {
 public:
  Future() = default;
  // Blocks until the request completes; returns its status. Idempotent.
  // While it blocks, and while the worker has at most 2 requests in flight,
  // it may handle incoming replies on the calling thread (its own and
  // others'), saving a thread hand-off per reply (docs/design.md, "Caller
  // delivery"); nothing else changes for the caller.
  // A default-constructed Future belongs to no request: Wait() returns
  // FailedPrecondition at once.
  // A Future may end with a finishing step that runs once its request is
  // done (PullDeduplicated's copy to every position): the first Wait() or
  // ready() that finds the request done runs it, on its own thread, and
  // the Future is ready (with that step's status) when it returns.
  absl::Status Wait() const;
  bool ready() const;

  struct State;
  explicit Future(std::shared_ptr<State> state) : state_(std::move(state)) {}
  static Future Ready(absl::Status status);  // an already-completed future
  // Keeps `memory` alive at least until the request is done with it (for
  // helpers that issue a request on buffers they own). No-op when empty.
  void Own(std::shared_ptr<const void> memory) const;

 private:
  std::shared_ptr<State> state_;
};

struct WorkerStats {
  static constexpr size_t kStalenessBuckets = 17;  // 0..15, and 16 = "16 or more"
  uint64_t pushes = 0;
  uint64_t pulls = 0;
  uint64_t bytes_pushed = 0;  // key + value bytes sent in pushes
  uint64_t bytes_pulled = 0;  // key bytes sent + value bytes received in pulls
  uint64_t clocks = 0;               // Clock() calls completed
  Nanos clock_wait = 0;              // total time blocked in Clock()
  Nanos pull_held = 0;               // total time servers held this worker's pulls (sum over parts)
  std::array<uint64_t, kStalenessBuckets> staleness{};  // pulls (parts) by observed staleness
  // Bytes of the messages to and from servers, as the transport counts them
  // (TransportStats::bytes_sent / bytes_received, tessera_transport_bytes_total):
  // every message's serialized header as it goes out or comes in (with the
  // fields the transport itself stamps, such as the shared-memory ones), plus
  // its frames (keys, values or encoded parts with their headers, indices and
  // scales; shared-memory frames included). With the coordinator's messages
  // they add up to the transport's bytes. Not counted: ZeroMQ framing and
  // handshakes, CURVE encryption, TCP/IP headers (tests/launcher_e2e/
  // test_wire_bytes.py checks these counts against the kernel's socket
  // counters: about 2 to 9 bytes more per frame, 35 to 42 with CURVE).
  uint64_t wire_bytes_pushed = 0;  // push requests sent
  uint64_t wire_bytes_pulled = 0;  // pull requests sent and pull replies received
  uint64_t wire_bytes_other = 0;   // everything else to and from servers (acks, clocks, tables)
  uint64_t resends = 0;            // parts sent again: after a failover, unanswered, or a connection made again
  // Pull replies the transport wrote straight into the caller's `out`
  // (Transport::PostDestination: same-host lent or ring frames, RDMA
  // rendezvous), so that Pull copied nothing itself.
  uint64_t pull_replies_in_place = 0;
};

// The stats as a JSON object, for a worker program's report:
// {"pushes":..,"pulls":..,"bytes_pushed":..,"bytes_pulled":..,"clocks":..,
//  "clock_wait_seconds":..,"pull_held_seconds":..,"staleness_histogram":[..17 counts..],
//  "wire_bytes_pushed":..,"wire_bytes_pulled":..,"wire_bytes_other":..,"resends":..}
std::string StatsJson(const WorkerStats& stats);

// The report a worker program passes to Finish(): its steps, final loss,
// byte counts from `stats`, and its own metrics as a JSON object.
proto::WorkerDone MakeWorkerDone(const WorkerStats& stats, uint64_t steps, double final_loss,
                                 const std::string& report_json);

class Worker {
 public:
  static absl::StatusOr<std::unique_ptr<Worker>> Connect(const WorkerOptions& options);
  // The same over a transport made by the caller (not started yet; for
  // in-process clusters). options.bind is ignored.
  static absl::StatusOr<std::unique_ptr<Worker>> Connect(const WorkerOptions& options,
                                                         std::unique_ptr<Transport> transport);
  virtual ~Worker() = default;

  virtual uint32_t rank() const = 0;
  // 0, or n > 0 for the n-th process that replaced a lost worker of this
  // rank (on_worker_loss: wait). A replacement starts at the clock its
  // predecessor announced (clock() tells where to resume); its predecessor's
  // pushes that servers acknowledged are applied, later ones are lost.
  virtual uint32_t incarnation() const = 0;
  virtual uint32_t num_workers() const = 0;
  virtual uint32_t num_servers() const = 0;
  // This process's node id in the job (servers name pushes by it).
  virtual uint32_t node_id() const = 0;
  // The sequence number the next Push() of this process will carry (pushes
  // are numbered 1, 2, ... per incarnation). For audit records; exact only
  // when no other thread pushes meanwhile. With options.part_bytes, a push
  // split into n parts carries n consecutive numbers from this one (one per
  // part), and the next push starts after them.
  virtual uint64_t next_push_seq() const = 0;

  // Creates the table on every server, or checks that it exists with equal
  // options. Blocks until every server answered.
  virtual absl::Status CreateTable(const TableOptions& options) = 0;

  // Transfer priority of a push or a pull: lower numbers go first (a
  // layer's index, say); it matters only with
  // options.max_bytes_in_flight_per_server. The overloads without one use
  // kDefaultPriority.
  static constexpr int32_t kDefaultPriority = 0;
  Future Push(uint32_t table, std::span<const Key> keys, std::span<const float> values) {
    return Push(table, keys, values, kDefaultPriority);
  }
  Future Pull(uint32_t table, std::span<const Key> keys, std::span<float> out) {
    return Pull(table, keys, out, kDefaultPriority);
  }
  virtual Future Push(uint32_t table, std::span<const Key> keys, std::span<const float> values,
                      int32_t priority) = 0;
  virtual Future Pull(uint32_t table, std::span<const Key> keys, std::span<float> out, int32_t priority) = 0;
  Future PullView(uint32_t table, std::span<const Key> keys, PulledRows* rows) {
    return PullView(table, keys, rows, kDefaultPriority);
  }
  virtual Future PullView(uint32_t table, std::span<const Key> keys, PulledRows* rows, int32_t priority) = 0;

  // Deduplicated forms of Pull and Push (contract above; what a sparse
  // embedding lookup of a minibatch, with its repeated hot ids, needs).
  Future PullDeduplicated(uint32_t table, std::span<const Key> keys, std::span<float> out) {
    return PullDeduplicated(table, keys, out, kDefaultPriority);
  }
  Future PushAggregated(uint32_t table, std::span<const Key> keys, std::span<const float> values) {
    return PushAggregated(table, keys, values, kDefaultPriority);
  }
  virtual Future PullDeduplicated(uint32_t table, std::span<const Key> keys, std::span<float> out,
                                  int32_t priority) = 0;
  virtual Future PushAggregated(uint32_t table, std::span<const Key> keys, std::span<const float> values,
                                int32_t priority) = 0;

  // Announces that this worker finished its current clock, and blocks while
  // it is more than the strictest staleness ahead of the slowest live worker.
  virtual absl::Status Clock() = 0;
  virtual uint64_t clock() const = 0;

  // Blocks until every worker reached the barrier of this name.
  virtual absl::Status Barrier(const std::string& name) = 0;

  // Reports this worker's final numbers to the coordinator, then waits until
  // the coordinator ends the job (every worker finished) or fails it.
  virtual absl::Status Finish(const proto::WorkerDone& report) = 0;

  virtual WorkerStats stats() const = 0;
  // What this worker's transport counted (every message, coordinator
  // traffic included): the ground truth for the wire counts in stats().
  virtual TransportStats transport_stats() const = 0;
};

}  // namespace tessera

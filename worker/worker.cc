// The Worker shell: transport, coordinator session, futures, stats and the
// tick thread around the WorkerCore (worker/worker_core.h: request slicing,
// push numbering, the RequestTracker) under one mutex.
#include "worker/worker.h"

#include <atomic>
#include <condition_variable>
#include <cstring>
#include <functional>
#include <mutex>
#include <optional>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/logging.h"
#include "common/keys.h"
#include "common/memory.h"
#include "common/metrics.h"
#include "common/sparse_batch.h"
#include "compress/row_compressor.h"
#include "node/coordinator_session.h"
#include "transport/transport_factory.h"
#include "worker/worker_core.h"
#include "transport/transport_metrics.h"

namespace tessera {

struct Future::State {
  std::mutex mu;
  std::condition_variable cv;
  std::optional<absl::Status> status;
  std::atomic<bool> done{false};           // status is set (readable without mu)
  Nanos started = 0;                       // when the request was issued
  metrics::Histogram* latency = nullptr;   // observes issue-to-completion seconds (owned by the worker)
  // The worker's transport, for caller delivery: a waiter reads its reply
  // itself instead of being woken by the delivery thread (Transport::
  // DeliverUntil). Weak: a Future may outlive its worker.
  std::weak_ptr<Transport> transport;
  // The worker's count of operations issued and not completed (this one
  // included until Set); shared with the worker.
  std::shared_ptr<std::atomic<int>> in_flight;
  // Memory the request reads or writes that the request itself owns
  // (PushAggregated's sums, PullDeduplicated's distinct keys and rows):
  // released with the last reference to this state, so never before the
  // worker is done with the request (it holds the state until then).
  std::vector<std::shared_ptr<const void>> owned ABSL_GUARDED_BY(mu);
  // A Future with a finishing step (Worker::PullDeduplicated): `after` is
  // the request it waits for (set at creation, never changed), `finish`
  // the step, run under mu by the first Wait() or ready() that finds
  // `after` done with OK, and dropped once run.
  std::optional<Future> after;
  std::function<absl::Status()> finish ABSL_GUARDED_BY(mu);

  void Set(absl::Status s) {
    {
      std::lock_guard lock(mu);
      if (status) return;
      status = std::move(s);
      done.store(true, std::memory_order_release);
    }
    if (in_flight) in_flight->fetch_sub(1, std::memory_order_relaxed);
    if (latency != nullptr) latency->Observe(static_cast<double>(MonotonicNow() - started) / kSeconds);
    cv.notify_all();
    if (std::shared_ptr<Transport> t = transport.lock()) t->WakeCallerDelivery();
  }
};

// How long a caller delivering its own reply sleeps at most before it looks
// at its Future again (completions from other threads wake it at once).
constexpr std::chrono::milliseconds kCallerDeliveryMaxWait{50};
// Caller delivery only while the worker has at most this many operations
// in flight: it saves a thread hand-off per reply, which is what a caller
// waiting on one or two requests pays for; with more in flight the
// replies keep the delivery thread busy, and handing the socket back and
// forth would cost more CPU than it saves (measured: 1 MiB pulls 8 in
// flight were 10% slower with it, docs/benchmarks.md).
constexpr int kCallerDeliveryMaxInFlight = 2;

namespace {

// A Future that completes once `after` did and `finish` ran (only if `after`
// ended with OK; its status is then the Future's).
Future Finally(Future after, std::function<absl::Status()> finish) {
  auto state = std::make_shared<Future::State>();
  state->after = std::move(after);
  std::lock_guard lock(state->mu);
  state->finish = std::move(finish);
  return Future(std::move(state));
}

// Runs the finishing step of `state` once its `after` is done: `after_status`.
absl::Status FinishOnce(Future::State& state, const absl::Status& after_status) {
  std::lock_guard lock(state.mu);
  if (!state.status) {
    absl::Status s = after_status;
    if (s.ok() && state.finish) s = state.finish();
    state.finish = nullptr;  // what it held goes now
    state.status = std::move(s);
    state.done.store(true, std::memory_order_release);
  }
  return *state.status;
}

}  // namespace

absl::Status Future::Wait() const {
  if (!state_) return absl::FailedPreconditionError("waiting on an empty Future");
  if (state_->after) return FinishOnce(*state_, state_->after->Wait());
  if (!state_->done.load(std::memory_order_acquire)) {
    if (std::shared_ptr<Transport> t = state_->transport.lock()) {
      // Requests held to go together with later ones (transport/
      // coalescing_transport.h) go now: nothing more comes while we wait.
      t->Flush();
      if (state_->in_flight && state_->in_flight->load(std::memory_order_relaxed) <= kCallerDeliveryMaxInFlight) {
        State* s = state_.get();
        t->DeliverUntil([s] { return s->done.load(std::memory_order_acquire); }, kCallerDeliveryMaxWait);
      }
    }
  }
  std::unique_lock lock(state_->mu);
  state_->cv.wait(lock, [&] { return state_->status.has_value(); });
  return *state_->status;
}

bool Future::ready() const {
  if (!state_) return false;
  if (state_->after) {
    if (state_->done.load(std::memory_order_acquire)) return true;
    if (!state_->after->ready()) return false;
    FinishOnce(*state_, state_->after->Wait()).IgnoreError();  // ready: no wait
    return true;
  }
  std::lock_guard lock(state_->mu);
  return state_->status.has_value();
}

void Future::Own(std::shared_ptr<const void> memory) const {
  if (!state_) return;
  std::lock_guard lock(state_->mu);
  state_->owned.push_back(std::move(memory));
}

Future Future::Ready(absl::Status status) {
  auto state = std::make_shared<State>();
  state->status = std::move(status);
  state->done.store(true, std::memory_order_release);
  return Future(std::move(state));
}

namespace {

proto::TableConfig ToConfig(const TableOptions& o) {
  proto::TableConfig c;
  c.set_table_id(o.id);
  c.set_name(o.name);
  c.set_width(o.width);
  c.set_kind(o.kind);
  c.set_dense_rows(o.dense_rows);
  c.set_optimizer(o.optimizer);
  c.set_learning_rate(o.learning_rate);
  c.set_init(o.init);
  c.set_init_scale(o.init_scale);
  c.set_init_seed(o.init_seed);
  c.set_consistency(o.consistency);
  c.set_staleness(o.consistency == proto::SSP ? o.staleness : 0);
  c.set_compression(o.compression);
  c.set_pull_compression(o.pull_compression);
  // Only the hyper-parameters the optimizer uses, so that tables differing
  // in unused ones are the same table.
  proto::OptimizerParams& p = *c.mutable_optimizer_params();
  switch (o.optimizer) {
    case proto::MOMENTUM:
      p.set_momentum(o.momentum);
      break;
    case proto::ADAGRAD:
      p.set_epsilon(o.epsilon);
      p.set_initial_accumulator(o.initial_accumulator);
      break;
    case proto::ADAM:
      p.set_beta1(o.beta1);
      p.set_beta2(o.beta2);
      p.set_epsilon(o.epsilon);
      break;
    case proto::FTRL:
      p.set_ftrl_beta(o.ftrl_beta);
      p.set_l1(o.l1);
      p.set_l2(o.l2);
      break;
    default:
      c.clear_optimizer_params();
      break;
  }
  c.set_admit_after(o.admit_after);
  c.set_admission_sketch_width(o.admission_sketch_width);
  c.set_evict_after_clocks(o.evict_after_clocks);
  c.set_memory_budget_bytes(o.memory_budget_bytes);
  c.set_disk_tier(o.disk_tier);
  return c;
}

class WorkerImpl final : public Worker {
 public:
  WorkerImpl(const WorkerOptions& options, std::unique_ptr<Transport> transport)
      : options_(options), transport_(std::move(transport)) {}

  ~WorkerImpl() override { Close(absl::CancelledError("worker closed")); }

  absl::Status Start() {
    CoordinatorSession::Options so;
    so.coordinator = options_.coordinator;
    so.role = proto::WORKER;
    so.rank = options_.rank;
    so.connect_timeout = options_.connect_timeout;
    so.heartbeat_interval = options_.heartbeat_interval;
    so.lease = options_.lease;
    so.give_up = options_.coordinator_give_up;
    session_ = std::make_unique<CoordinatorSession>(so, transport_.get());
    session_->set_on_end([this](const absl::Status& s) {
      WorkerCore::Effects effects;
      std::vector<PostedPull> cancels;
      {
        std::lock_guard lock(mu_);
        if (!core_) return;
        effects = core_->FailAll(s.ok() ? absl::CancelledError("the job has ended") : s);
        EndPullTargets(effects.done, &cancels);
      }
      CancelPulls(cancels);  // before the callers get their memory back
      Complete(std::move(effects.done));
    });
    transport_->SetLinkHandler([this](const std::string& address, bool up) { OnLink(address, up); });
    if (auto s = transport_->Start([this](Message m) { OnMessage(std::move(m)); }); !s.ok()) return s;
    auto ready = session_->Join();
    if (!ready.ok()) return ready.status();
    WorkerCoreOptions co;
    co.node_id = session_->self().node_id();
    co.incarnation = session_->self().incarnation();
    co.address = transport_->address();
    co.request_timeout = options_.request_timeout;
    co.hold_timeout = options_.hold_timeout;
    co.resend_after = options_.resend_after;
    co.resend_floor = options_.resend_floor;
    co.resend_ceiling = options_.resend_ceiling;
    co.resend_bytes_per_second = options_.resend_bytes_per_second;
    co.part_bytes = options_.part_bytes;
    co.row_piece_bytes = options_.row_piece_bytes;
    // Wide rows go whole over the same-host path (pieces measured slower
    // there), in pieces over the network.
    co.whole_rows_to = [t = std::weak_ptr<Transport>(transport_)](const std::string& address) {
      std::shared_ptr<Transport> transport = t.lock();
      return transport != nullptr && transport->SameHostPath(address);
    };
    co.max_bytes_in_flight_per_server = options_.max_bytes_in_flight_per_server;
    co.max_message_bytes = options_.max_message_bytes;
    auto core = WorkerCore::Create(std::move(co), ready->shard_map());
    if (!core.ok()) return core.status();
    const std::string joined_map = absl::StrCat("shard map epoch ", ready->shard_map().epoch(), " (map ",
                                                ShardMapDigest(ready->shard_map()), ")");
    num_workers_ = 0;
    for (const auto& n : ready->nodes())
      if (n.role() == proto::WORKER) ++num_workers_;
    {
      std::lock_guard lock(mu_);
      core_ = std::move(*core);
    }
    ticker_ = std::thread([this] { TickLoop(); });
    if (options_.metrics_port >= 0) {
      auto m = metrics::MetricsHttpServer::Start(options_.metrics_host, static_cast<uint16_t>(options_.metrics_port),
                                                 [this] { return MetricsText(); });
      if (!m.ok()) return m.status();
      metrics_ = std::move(*m);
      TLOG_INFO("metrics at http://{}:{}/metrics", options_.metrics_host, metrics_->port());
    }
    if (session_->joined_running_job()) {
      if (absl::Status s = ResumeClock(/*join=*/true); !s.ok()) return s;
      TLOG_INFO("worker {} joined the running job from {} at clock {}: {} servers, {} workers; {}", rank(),
                transport_->address(), clock(), num_servers(), num_workers_, joined_map);
      return absl::OkStatus();
    }
    if (incarnation() > 0) {
      if (absl::Status s = ResumeClock(); !s.ok()) return s;
      TLOG_INFO("worker {} rejoined from {} as incarnation {} at clock {}: {} servers, {} workers; {}", rank(),
                transport_->address(), incarnation(), clock(), num_servers(), num_workers_, joined_map);
      return absl::OkStatus();
    }
    TLOG_INFO("worker {} joined from {}: {} servers, {} workers; {}", rank(), transport_->address(), num_servers(),
              num_workers_, joined_map);
    return absl::OkStatus();
  }

  // A replacement continues at the clock its predecessor announced: the
  // highest any server knows. A predecessor that died inside Clock() may
  // have reached only some servers, and the others would wait for it
  // forever, so that clock is announced again to every server (found by
  // the cluster simulator).
  // A worker that joined the running job (`join`) starts the same way: at
  // the highest clock the servers start it at (their fastest worker's),
  // announced to every server.
  absl::Status ResumeClock(bool join = false) {
    const char* who = join ? "a worker that joined the running job" : "a replaced worker";
    absl::Status s = Issue(nullptr, [&](const WorkerCore::Handle& h, Nanos now) {
                       return join ? core_->JoinClock(h, rank(), now) : core_->ClockQuery(h, now);
                     }).Wait();
    if (!s.ok()) {
      return absl::Status(s.code(), absl::StrCat("resuming the clock of ", who, ": ", s.message()));
    }
    uint64_t known = 0;
    {
      std::lock_guard lock(mu_);
      known = core_->known_clock();
      clock_.store(known);
    }
    if (known == 0) return absl::OkStatus();
    s = Issue(nullptr, [&](const WorkerCore::Handle& h, Nanos now) { return core_->ClockAdvance(h, known, now); })
            .Wait();
    if (!s.ok()) {
      return absl::Status(s.code(), absl::StrCat("announcing clock ", known, " for ", who, ": ", s.message()));
    }
    return absl::OkStatus();
  }

  uint32_t incarnation() const override { return session_->self().incarnation(); }

  TransportStats transport_stats() const override { return transport_->stats(); }

  std::string MetricsText() const {
    const WorkerStats s = stats();
    std::vector<double> bounds;
    for (size_t i = 0; i + 1 < WorkerStats::kStalenessBuckets; ++i) bounds.push_back(static_cast<double>(i));
    std::vector<uint64_t> counts(s.staleness.begin(), s.staleness.end());
    double staleness_sum = 0;
    for (size_t i = 0; i < counts.size(); ++i) staleness_sum += static_cast<double>(i) * static_cast<double>(counts[i]);
    metrics::TextWriter w;
    w.Counter("tessera_worker_pushes_total", "Push calls", s.pushes)
        .Counter("tessera_worker_pulls_total", "Pull calls", s.pulls)
        .Counter("tessera_worker_clocks_total", "Clock() calls completed", s.clocks)
        .Counter("tessera_worker_pushed_bytes_total", "Key and value bytes of pushes, uncompressed", s.bytes_pushed)
        .Counter("tessera_worker_pulled_bytes_total", "Key and value bytes of pulls, uncompressed", s.bytes_pulled)
        .Counter("tessera_worker_wire_bytes_total", "Bytes to and from servers as on the wire", s.wire_bytes_pushed,
                 {{"kind", "push"}})
        .Counter("tessera_worker_wire_bytes_total", "Bytes to and from servers as on the wire", s.wire_bytes_pulled,
                 {{"kind", "pull"}})
        .Counter("tessera_worker_wire_bytes_total", "Bytes to and from servers as on the wire", s.wire_bytes_other,
                 {{"kind", "other"}})
        .Counter("tessera_worker_clock_wait_seconds_total", "Time blocked in Clock()",
                 static_cast<double>(s.clock_wait) / kSeconds)
        .Counter("tessera_worker_pull_held_seconds_total", "Time servers held this worker's pulls",
                 static_cast<double>(s.pull_held) / kSeconds)
        .Histogram("tessera_worker_pull_staleness", "Observed staleness of pulls (clocks; the last bucket is 16+)",
                   bounds, counts, staleness_sum)
        .Histogram("tessera_worker_push_latency_seconds", "Push issue to completion", push_latency_.bounds(),
                   push_latency_.counts(), push_latency_.sum())
        .Histogram("tessera_worker_pull_latency_seconds", "Pull issue to completion (holds included)",
                   pull_latency_.bounds(), pull_latency_.counts(), pull_latency_.sum())
        .Counter("tessera_worker_resends_total", "Parts sent again: after a failover, unanswered past their timer, or a connection made again", s.resends)
        .Gauge("tessera_worker_clock", "This worker's clock", static_cast<double>(clock()))
        .Gauge("tessera_worker_incarnation", "Replacements of this rank before this process", incarnation());
    {
      std::lock_guard lock(mu_);
      if (core_) {
        for (const RequestTracker::ServerTimer& t : core_->tracker().Timers()) {
          const std::string server = absl::StrCat(t.rank);
          const std::string lane = LaneName(t.lane);
          w.Gauge("tessera_worker_resend_timer_seconds",
                  "Each server's resend timer per lane (pushes, other requests), learned from its answers' round trips",
                  t.rto / 1e9, {{"server", server}, {"lane", lane}})
              .Gauge("tessera_worker_round_trip_seconds",
                     "Each server's smoothed round trip per lane (holds left out)", t.smoothed / 1e9,
                     {{"server", server}, {"lane", lane}})
              .Counter("tessera_worker_server_resends_total",
                       "Requests sent again to each server per lane: unanswered past its timer, or its connection made again",
                       t.resends, {{"server", server}, {"lane", lane}});
        }
      }
      if (last_restore_to_answer_ >= 0) {
        w.Gauge("tessera_worker_restore_to_answer_seconds",
                "From the last connection to a server made again to that server's first answer",
                last_restore_to_answer_ / 1e9);
      }
    }
    WriteTransportMetrics(w, transport_->stats());
    return w.text();
  }

  uint32_t rank() const override { return session_->self().rank(); }
  uint32_t node_id() const override { return session_->self().node_id(); }
  uint64_t next_push_seq() const override {
    std::lock_guard lock(mu_);
    return (core_ ? core_->last_push_seq() : 0) + 1;
  }
  uint32_t num_workers() const override { return num_workers_; }
  uint32_t num_servers() const override { return static_cast<uint32_t>(Map()->num_servers()); }

  // A snapshot of the core's map (replaced by failovers).
  std::shared_ptr<const ShardMapView> Map() const {
    std::lock_guard lock(mu_);
    return core_->map();
  }

  absl::Status CreateTable(const TableOptions& options) override {
    proto::TableConfig config = ToConfig(options);
    std::unique_ptr<compress::RowCompressor> compressor;
    if (!options.compression.empty()) {
      absl::StatusOr<compress::CodecSpec> spec = compress::ParseCodecSpec(options.compression);
      if (!spec.ok()) {
        return absl::InvalidArgumentError(
            absl::StrCat("table ", options.id, ": compression \"", options.compression, "\": ", spec.status().message()));
      }
      auto rc = compress::RowCompressor::Create(*spec, options.width, Mix64((uint64_t{options.id} << 32) | rank()));
      if (!rc.ok()) return rc.status();
      compressor = std::move(*rc);
    }
    absl::Status s =
        Issue(nullptr, [&](const WorkerCore::Handle& h, Nanos now) { return core_->CreateTable(h, config, now); })
            .Wait();
    if (s.ok()) {
      std::lock_guard lock(mu_);
      widths_[options.id] = options.width;
      if (options.optimizer == proto::ADAM) whole_row_tables_.insert(options.id);  // one step count per row and push
      if (options.consistency != proto::ASP) synchronous_tables_++;
      if (compressor) compressors_.try_emplace(options.id, std::move(compressor));  // keep residuals on a repeat
    }
    return s;
  }

  using Worker::Pull;
  using Worker::Push;

  Future Push(uint32_t table, std::span<const Key> keys, std::span<const float> values,
              int32_t priority) override {
    auto width = TableWidth(table);
    if (!width.ok()) return Future::Ready(width.status());
    if (values.size() != keys.size() * *width) {
      return Future::Ready(absl::InvalidArgumentError(absl::StrCat(
          "push to table ", table, ": ", keys.size(), " keys of width ", *width, " need ", keys.size() * *width,
          " values, got ", values.size())));
    }
    if (keys.empty()) return Future::Ready(absl::OkStatus());
    const uint64_t clock = clock_.load();
    // The core slices the push by the map (all keys on one server: no copy),
    // numbers it, and encodes each part with the table's compressor.
    return Issue(&push_latency_, [&](const WorkerCore::Handle& h, Nanos now) {
      auto effects = core_->Push(h, table, keys, values, *width, clock, CompressorLocked(table), now, {}, priority,
                                 /*row_pieces=*/!whole_row_tables_.contains(table));
      if (effects.ok()) {  // a push that failed to encode is not counted
        pushes_++;
        bytes_pushed_ += keys.size_bytes() + values.size_bytes();
      }
      return effects;
    });
  }

  Future Pull(uint32_t table, std::span<const Key> keys, std::span<float> out, int32_t priority) override {
    auto width = TableWidth(table);
    if (!width.ok()) return Future::Ready(width.status());
    if (out.size() != keys.size() * *width) {
      return Future::Ready(absl::InvalidArgumentError(absl::StrCat(
          "pull from table ", table, ": ", keys.size(), " keys of width ", *width, " need room for ",
          keys.size() * *width, " values, got ", out.size())));
    }
    if (keys.empty()) return Future::Ready(absl::OkStatus());
    return IssuePull(table, keys, out, *width, priority);
  }

  Future PullView(uint32_t table, std::span<const Key> keys, PulledRows* rows, int32_t priority) override {
    auto width = TableWidth(table);
    if (!width.ok()) return Future::Ready(width.status());
    if (rows == nullptr) return Future::Ready(absl::InvalidArgumentError("PullView needs a PulledRows to fill"));
    if (keys.empty()) {
      rows->Clear();
      return Future::Ready(absl::OkStatus());
    }
    return IssuePull(table, keys, rows, *width, priority);
  }

  Future PullDeduplicated(uint32_t table, std::span<const Key> keys, std::span<float> out,
                          int32_t priority) override {
    auto width = TableWidth(table);
    if (!width.ok()) return Future::Ready(width.status());
    if (out.size() != keys.size() * *width) {
      return Future::Ready(absl::InvalidArgumentError(absl::StrCat(
          "deduplicated pull from table ", table, ": ", keys.size(), " keys of width ", *width,
          " need room for ", keys.size() * *width, " values, got ", out.size())));
    }
    if (keys.empty()) return Future::Ready(absl::OkStatus());
    struct Lookup {
      SparseBatch batch;
      std::vector<float> rows;  // one per distinct key
    };
    auto lookup = std::make_shared<Lookup>();
    if (absl::Status s = lookup->batch.Reset(keys); !s.ok()) return Future::Ready(s);
    lookup->rows.resize(lookup->batch.unique().size() * size_t{*width});
    Future pull = Pull(table, lookup->batch.unique(), lookup->rows, priority);
    pull.Own(lookup);
    const uint32_t w = *width;
    return Finally(std::move(pull), [lookup, w, out] { return lookup->batch.Gather(lookup->rows, w, out); });
  }

  Future PushAggregated(uint32_t table, std::span<const Key> keys, std::span<const float> values,
                        int32_t priority) override {
    auto width = TableWidth(table);
    if (!width.ok()) return Future::Ready(width.status());
    if (values.size() != keys.size() * *width) {
      return Future::Ready(absl::InvalidArgumentError(absl::StrCat(
          "aggregated push to table ", table, ": ", keys.size(), " keys of width ", *width, " need ",
          keys.size() * *width, " values, got ", values.size())));
    }
    if (keys.empty()) return Future::Ready(absl::OkStatus());
    struct Sums {
      SparseBatch batch;
      std::vector<float> rows;  // one per distinct key
    };
    auto sums = std::make_shared<Sums>();
    if (absl::Status s = sums->batch.Reset(keys); !s.ok()) return Future::Ready(s);
    sums->rows.resize(sums->batch.unique().size() * size_t{*width});
    if (absl::Status s = sums->batch.ScatterAdd(values, *width, sums->rows); !s.ok()) return Future::Ready(s);
    Future push = Push(table, sums->batch.unique(), sums->rows, priority);
    push.Own(std::move(sums));
    return push;
  }

  // A checked, non-empty pull of rows of `width` floats into `dest`.
  Future IssuePull(uint32_t table, std::span<const Key> keys, PullDestination dest, uint32_t width,
                   int32_t priority) {
    const uint64_t clock = clock_.load();
    pulls_++;
    bytes_pulled_ += keys.size_bytes() + keys.size() * uint64_t{width} * sizeof(float);
    return Issue(&pull_latency_, [&](const WorkerCore::Handle& h, Nanos now) {
      // Before the core's sends: Deliver posts destinations for them.
      if (dest.view == nullptr) pull_targets_[h.get()] = PullTarget{keys, dest.out, width, {}};
      absl::StatusOr<WorkerCore::Effects> effects = core_->Pull(h, table, keys, dest, width, clock, now, {}, priority);
      if (!effects.ok()) pull_targets_.erase(h.get());  // refused: nothing was sent, nothing posted
      return effects;
    });
  }

  // --- Pull replies in place (Transport::PostDestination) ---
  // Known debt: which range of `out` a request's reply fills is the core's
  // knowledge (the rule below is implied by worker_core.cc, not stated), so
  // this matching belongs in the core, which should name the range per
  // request; the shell would only post and cancel. posted_pulls_ repeats
  // what the targets' `posted` lists hold (kept in step by hand).

  // A Pull into `out` whose request for a server borrows a run of the
  // caller's keys (the core's requests for keys all on one server, or
  // parts of them: worker/worker_core.h) gets its rows back as the same
  // run of `out`: keys[first, first + n) -> out[first * width, (first + n)
  // * width). For such a request the range of `out` is posted as the
  // destination of the reply's values frame, so that a transport that can
  // writes them there; the reply is then handed to the core as a frame
  // whose reads into that very memory copy nothing. Requests with keys of
  // their own (scattered rows) get nothing posted. A destination is
  // cancelled before its operation completes (answered, failed, timed
  // out, closed) and when a resend asks for the same rows again, so that
  // no write reaches `out` once the caller has it back.
  struct PostedPull {
    std::string to;
    uint64_t request_id = 0;
    size_t first_row = 0;
    size_t rows = 0;
  };
  struct PullTarget {
    std::span<const Key> keys;
    std::span<float> out;
    uint32_t width = 0;
    std::vector<PostedPull> posted;
  };
  // Replies smaller than this are not posted for (the transports place only
  // frames they do not send inline, and the copy is cheap).
  static constexpr size_t kMinPlacedBytes = 64 * 1024;

  // Posts destinations for the pull requests in `sends` whose rows are one
  // run of a live target's `out`; what they replace goes to *cancels.
  // Requires mu_.
  void PostPullDestinations(const std::vector<Outgoing>& sends, std::vector<PostedPull>* cancels) {
    if (pull_targets_.empty()) return;
    for (const Outgoing& o : sends) {
      const proto::Envelope& h = o.message.header;
      if (!h.has_pull() || o.message.frames.empty() || !transport_->PlacesInto(o.to)) continue;
      const Buffer& keys = o.message.frames[0];
      PullTarget* target = nullptr;
      size_t first = 0;
      for (auto& [handle, t] : pull_targets_) {
        const auto* base = reinterpret_cast<const std::byte*>(t.keys.data());
        if (keys.data() < base || keys.data() >= base + t.keys.size_bytes()) continue;
        if (target != nullptr) {  // the same keys in two pulls in flight: whose rows is ambiguous
          target = nullptr;
          break;
        }
        target = &t;
        first = static_cast<size_t>(keys.data() - base);
      }
      if (target == nullptr || first % sizeof(Key) != 0 || keys.size() % sizeof(Key) != 0) continue;
      first /= sizeof(Key);
      const size_t rows = keys.size() / sizeof(Key);
      if (rows != h.pull().num_keys() || first + rows > target->keys.size()) continue;
      const size_t bytes = rows * target->width * sizeof(float);
      if (bytes < kMinPlacedBytes) continue;
      // Rows asked again (a resend): the earlier request's reply must not land any more.
      auto& posted = target->posted;
      for (auto it = posted.begin(); it != posted.end();) {
        if (it->first_row < first + rows && first < it->first_row + it->rows) {
          posted_pulls_.erase(it->request_id);
          cancels->push_back(std::move(*it));
          it = posted.erase(it);
        } else {
          ++it;
        }
      }
      Buffer destination = Buffer::Borrow(target->out.data() + first * target->width, bytes);
      if (!transport_->PostDestination(o.to, h.request_id(), 0, std::move(destination)).ok()) continue;
      posted.push_back(PostedPull{o.to, h.request_id(), first, rows});
      posted_pulls_[h.request_id()] = target->out.data() + first * target->width;
    }
  }

  // Forgets the targets of completed operations; their destinations still
  // posted go to *cancels. Requires mu_.
  void EndPullTargets(const std::vector<RequestTracker::Completion>& done, std::vector<PostedPull>* cancels) {
    if (pull_targets_.empty()) return;
    for (const RequestTracker::Completion& c : done) {
      auto it = pull_targets_.find(c.handle.get());
      if (it == pull_targets_.end()) continue;
      for (PostedPull& p : it->second.posted) {
        posted_pulls_.erase(p.request_id);
        cancels->push_back(std::move(p));
      }
      pull_targets_.erase(it);
    }
  }

  // Without mu_ (a cancel may wait for a copy into the destination).
  void CancelPulls(const std::vector<PostedPull>& cancels) {
    for (const PostedPull& p : cancels) (void)transport_->CancelDestination(p.to, p.request_id, 0);
  }

  // A pull reply whose values the transport wrote into the destination
  // posted for it: handed on as a frame that reads into its own memory
  // without copying. Requires mu_.
  void TakePlacedReply(Message& m) {
    if (posted_pulls_.empty() || m.frames.size() != 1 || m.header.pull_reply().value_parts() > 0) return;
    auto it = posted_pulls_.find(m.header.request_id());
    if (it == posted_pulls_.end() || m.frames[0].data() != reinterpret_cast<const std::byte*>(it->second)) return;
    posted_pulls_.erase(it);  // used: nothing left to cancel
    for (auto& [handle, t] : pull_targets_) {
      std::erase_if(t.posted, [&](const PostedPull& p) { return p.request_id == m.header.request_id(); });
    }
    const size_t size = m.frames[0].size();
    m.frames[0] = Buffer::Remote(std::make_shared<PlacedBytes>(std::move(m.frames[0])), size);
    stats_.pull_replies_in_place++;
  }

  // Bytes already where they are read to: a read into their own place is
  // done; any other read copies.
  class PlacedBytes final : public RemoteBytes {
   public:
    explicit PlacedBytes(Buffer bytes) : bytes_(std::move(bytes)) {}
    absl::Status Read(std::span<const CopyRange> ranges) const override {
      for (const CopyRange& r : ranges) {
        const std::byte* from = bytes_.data() + r.offset;
        if (r.dst != from) std::memcpy(r.dst, from, r.length);
      }
      return absl::OkStatus();
    }

   private:
    Buffer bytes_;
  };

  absl::Status Clock() override {
    const Nanos start = MonotonicNow();
    // With replication, a push may have to go again to another server after
    // a failover; the clock is announced only once the pushes made before it
    // are in (acknowledged or failed), so that no server counts this clock
    // before it has the pushes stamped earlier. With a bound on the bytes in
    // flight, pushes may still wait in the core's queues, behind which the
    // announcement would otherwise overtake them: the same wait.
    if (Map()->replication() > 1 || options_.max_bytes_in_flight_per_server > 0) {
      if (absl::Status s = WaitForPushes(); !s.ok()) return s;
    }
    // From here on, pushes are stamped with the new clock; everything sent
    // before reaches each server ahead of the announcement.
    const uint64_t clock = clock_.fetch_add(1) + 1;
    if (!HasSynchronousTables()) return NotifyClock(clock, start);
    absl::Status s =
        Issue(nullptr, [&](const WorkerCore::Handle& h, Nanos now) { return core_->ClockAdvance(h, clock, now); })
            .Wait();
    std::lock_guard lock(mu_);
    stats_.clock_wait += MonotonicNow() - start;
    if (s.ok()) stats_.clocks++;
    return s;
  }

  uint64_t clock() const override { return clock_.load(); }

  bool HasSynchronousTables() const {
    std::lock_guard lock(mu_);
    return synchronous_tables_ > 0;
  }

  // Clock() when every open table is ASP: a notice to each server, no wait.
  absl::Status NotifyClock(uint64_t clock, Nanos start) {
    std::vector<Outgoing> sends;
    {
      std::lock_guard lock(mu_);
      if (closed_) return absl::CancelledError("worker is closed");
      sends = core_->ClockNotice(clock);
    }
    for (Outgoing& o : sends) {
      CountWire(o.message);
      if (auto s = transport_->Send(o.to, std::move(o.message)); !s.ok()) return s;
    }
    std::lock_guard lock(mu_);
    stats_.clock_wait += MonotonicNow() - start;
    stats_.clocks++;
    return absl::OkStatus();
  }

  absl::Status Barrier(const std::string& name) override {
    return session_->Barrier(name, options_.barrier_timeout);
  }

  absl::Status Finish(const proto::WorkerDone& report) override {
    if (auto s = session_->ReportDone(report, options_.request_timeout); !s.ok()) return s;
    absl::Status end = session_->WaitForEnd();
    Close(absl::CancelledError("worker finished"));
    return end;
  }

  WorkerStats stats() const override {
    std::lock_guard lock(mu_);
    WorkerStats s = stats_;
    s.pushes = pushes_.load();
    s.pulls = pulls_.load();
    s.bytes_pushed = bytes_pushed_.load();
    s.bytes_pulled = bytes_pulled_.load();
    s.wire_bytes_pushed = wire_pushed_->load();
    s.wire_bytes_pulled = wire_pulled_->load();
    s.wire_bytes_other = wire_other_->load();
    return s;
  }

 private:
  // Registers one operation with the core and sends its requests. `call(handle,
  // now)` runs under mu_ and returns the core's Effects (or an error: nothing
  // was registered). `latency` observes issue-to-completion seconds.
  template <typename Call>
  Future Issue(metrics::Histogram* latency, Call&& call) {
    auto state = std::make_shared<Future::State>();
    state->started = MonotonicNow();
    state->latency = latency;
    state->transport = transport_;
    state->in_flight = in_flight_;
    std::unique_lock lock(mu_);
    if (closed_) return Future::Ready(absl::CancelledError("worker is closed"));
    const Nanos now = MonotonicNow();
    absl::StatusOr<WorkerCore::Effects> effects = call(WorkerCore::Handle(state), now);
    if (!effects.ok()) return Future::Ready(effects.status());
    in_flight_->fetch_add(1, std::memory_order_relaxed);  // before anything can complete it
    // The tick thread sleeps until the next resend is due; this operation's
    // parts may come due sooner (after an idle spell, it sleeps 100 ms).
    // One wake per sleep of the tick thread at most (a sequential caller
    // would otherwise wake it at every operation after an idle spell).
    if (!tick_woken_ && tick_at_ > now + core_->ShortestResendTimer()) {
      tick_woken_ = true;
      tick_cv_.notify_one();
    }
    Deliver(lock, std::move(*effects));
    return Future(std::move(state));
  }

  // Hands what the core produced to the transport (counting the wire bytes),
  // then completes the operations it finished. Called with mu_ held by
  // `lock`, which it releases: send_mu_ is taken before mu_ is let go, so
  // that the transport gets the messages in the order the core made them,
  // whichever thread made them (a queued push part released by a reply on
  // the receive thread goes out ahead of a pull the caller issues next).
  void Deliver(std::unique_lock<std::mutex>& lock, WorkerCore::Effects effects) {
    std::vector<PostedPull> cancels;
    EndPullTargets(effects.done, &cancels);
    PostPullDestinations(effects.sends, &cancels);
    std::unique_lock send_lock(send_mu_);
    lock.unlock();
    for (Outgoing& o : effects.sends) {
      CountWire(o.message);
      (void)transport_->Send(o.to, std::move(o.message));
    }
    send_lock.unlock();
    CancelPulls(cancels);  // before the callers get their memory back
    Complete(std::move(effects.done));
  }

  void Complete(std::vector<RequestTracker::Completion> done) {
    if (done.empty()) return;
    for (auto& c : done) static_cast<Future::State*>(c.handle.get())->Set(std::move(c.status));
    push_cv_.notify_all();  // the core forgot the numbers of completed pushes
  }

  // Blocks until every push issued so far has completed.
  absl::Status WaitForPushes() {
    transport_->Flush();  // pushes held to go together with later requests
    std::unique_lock lock(mu_);
    const uint64_t last = core_->last_push_seq();
    const Nanos deadline = MonotonicNow() + options_.request_timeout;
    while (!core_->PushesCompleteThrough(last) && !closed_) {
      if (MonotonicNow() >= deadline) {
        return absl::DeadlineExceededError(absl::StrCat(
            "clock ", clock_.load() + 1, ": ", core_->pushes_in_flight(), " pushes still unacknowledged after ",
            options_.request_timeout / kSeconds, " s (the push futures name the servers)"));
      }
      push_cv_.wait_for(lock, std::chrono::milliseconds(50));
    }
    if (closed_) return absl::CancelledError("worker is closed");
    return absl::OkStatus();
  }

  // The table's compressor, or null. Requires mu_.
  compress::RowCompressor* CompressorLocked(uint32_t table) {
    auto it = compressors_.find(table);
    return it == compressors_.end() ? nullptr : it->second.get();
  }

  absl::StatusOr<uint32_t> TableWidth(uint32_t table) {
    std::lock_guard lock(mu_);
    if (closed_) return absl::CancelledError("worker is closed");
    auto it = widths_.find(table);
    if (it == widths_.end()) {
      return absl::FailedPreconditionError(
          absl::StrCat("table ", table, " is not open in this worker; call CreateTable first"));
    }
    return it->second;
  }

  // The wire byte counter of a message to or from a server.
  const std::shared_ptr<std::atomic<uint64_t>>& WireCounter(const Message& m) const {
    return m.header.has_push()                                   ? wire_pushed_
           : m.header.has_pull() || m.header.has_pull_reply() ? wire_pulled_
                                                                : wire_other_;
  }
  // A message to a server: the transport adds the bytes it counts for it
  // (its header as sent, with the transport's own fields, and its frames)
  // to the wire counts, so that they are the transport's bytes, split by kind.
  void CountWire(Message& m) { m.sent_bytes = WireCounter(m); }
  // A message from a server: what the transport counted receiving it.
  void CountReceived(const Message& m) {
    uint64_t bytes = m.received_bytes;
    if (bytes == 0) {  // a transport that does not say
      bytes = m.header.ByteSizeLong() + m.FrameBytes();
    }
    WireCounter(m)->fetch_add(bytes, std::memory_order_relaxed);
  }

  void OnMessage(Message m) {
    if (m.header.has_shard_map_update()) {
      OnMapUpdate(m.header.shard_map_update());
      return;
    }
    if (session_->Handle(m)) return;
    CountReceived(m);  // as received (a compressed pull reply counts its encoded parts)
    if (m.header.has_ack()) NoteFirstAckAfterFailover(m.header.epoch());
    std::unique_lock lock(mu_);
    if (!core_) return;
    if (!restored_at_.empty()) NoteAnswerAfterRestore(m.header.sender_address());
    if (m.header.has_pull_reply()) {
      const auto& pr = m.header.pull_reply();
      stats_.pull_held += static_cast<Nanos>(pr.held_us()) * 1000;
      stats_.staleness[std::min<uint64_t>(pr.staleness(), WorkerStats::kStalenessBuckets - 1)]++;
      TakePlacedReply(m);
    }
    // The core decodes a compressed pull reply and notes a ClockAck's clock;
    // the answer may let queued parts go.
    WorkerCore::Effects effects = core_->OnReply(std::move(m), MonotonicNow());
    Deliver(lock, std::move(effects));
  }

  void TickLoop() {
    std::unique_lock lock(mu_);
    while (!closed_) {
      // Every 100 ms, or sooner when a resend comes due.
      tick_at_ = std::min(MonotonicNow() + kTickInterval, core_->NextResendDue());
      tick_woken_ = false;
      tick_cv_.wait_for(lock, std::chrono::nanoseconds(std::max<Nanos>(tick_at_ - MonotonicNow(), 0)));
      if (closed_) break;
      // Operations past their deadline fail; parts a lagging server refused
      // go again with our map, and parts nobody answered for their server's
      // resend timer go again (a lost message).
      const Nanos now = MonotonicNow();
      WorkerCore::Effects effects = core_->Tick(now);
      stats_.resends += effects.resent_parts;
      std::vector<RequestTracker::Owed> owed;
      if (options_.wait_report_interval > 0 && now >= next_wait_report_) {
        next_wait_report_ = now + options_.wait_report_interval;
        owed = core_->tracker().OwedBy(now, options_.wait_report_interval);
      }
      if (effects.sends.empty() && effects.done.empty()) {
        lock.unlock();  // the usual wake: nothing was due (no send lock to take)
      } else {
        Deliver(lock, std::move(effects));
      }
      for (const RequestTracker::Owed& o : owed) ReportWait(o);
      lock.lock();
    }
  }

  // One line about a server that owes an answer (worker.h, "Waiting").
  static void ReportWait(const RequestTracker::Owed& o) {
    const char* state = o.parked ? " (it answered from a newer shard map; waiting for that map)"
                        : o.queued ? " (queued: waiting for room in flight to it)"
                                   : "";
    TLOG_WARN("waiting for {}: {} (request {}) for {:.1f} s{}, sent again {} times, fails in {:.1f} s; {} request{} "
              "owed by it",
              o.server, o.what, o.request_id, static_cast<double>(o.waited) / kSeconds, state, o.resends,
              static_cast<double>(std::max<Nanos>(o.left, 0)) / kSeconds, o.parts, o.parts == 1 ? "" : "s");
  }

  // Logs the first acknowledgement from a server on the map of the last
  // failover (the fault reports measure failover time by this line).
  void NoteFirstAckAfterFailover(uint64_t epoch) {
    Nanos waited = 0;
    {
      std::lock_guard lock(mu_);
      if (failover_epoch_ == 0 || epoch < failover_epoch_) return;
      waited = MonotonicNow() - failover_seen_at_;
      epoch = failover_epoch_;
      failover_epoch_ = 0;
    }
    TLOG_INFO("first push acknowledged on shard map epoch {}, {:.1f} ms after the map arrived", epoch,
              static_cast<double>(waited) / kMillis);
  }

  // The transport's word on a connection to a server: made again (what
  // was on the old one may be lost: the core resends what that server
  // owes at once), or down (resends wait for it).
  void OnLink(const std::string& address, bool up) {
    std::unique_lock lock(mu_);
    if (closed_ || !core_) return;
    if (!up) {
      core_->OnLinkDown(address);
      return;
    }
    WorkerCore::Effects effects = core_->OnLinkRestored(address, MonotonicNow());
    stats_.resends += effects.resent_parts;
    restored_at_[address] = MonotonicNow();
    if (effects.resent_parts > 0) {
      TLOG_INFO("connection to {} made again: {} request{} to it sent again", address, effects.resent_parts,
                effects.resent_parts == 1 ? "" : "s");
    }
    Deliver(lock, std::move(effects));
  }

  // The first answer from a server whose connection was made again: how
  // long after (a metric, and a line). Requires mu_.
  void NoteAnswerAfterRestore(const std::string& from) {
    auto it = restored_at_.find(from);
    if (it == restored_at_.end()) return;
    last_restore_to_answer_ = MonotonicNow() - it->second;
    restored_at_.erase(it);
    TLOG_INFO("{} answered {:.1f} ms after its connection was made again", from,
              static_cast<double>(last_restore_to_answer_) / kMillis);
  }

  // One line with each server's resend timer (at the end, and on request).
  std::string DescribeTimers() const {
    std::string text;
    if (!core_) return text;
    for (const RequestTracker::ServerTimer& t : core_->tracker().Timers()) {
      absl::StrAppend(&text, text.empty() ? "" : "; ", "server ", t.rank, " ", LaneName(t.lane), " ",
                      DescribeTimer(t.rto, t.smoothed, t.variation, t.samples), ", ", t.resends, " resent)");
    }
    return text;
  }

  // A newer shard map from the coordinator (a server was lost): the core
  // resends what went to it, and what waited for this map.
  void OnMapUpdate(const proto::ShardMapUpdate& update) {
    bool changed = false;
    std::unique_lock lock(mu_);
    if (closed_ || !core_) return;
    WorkerCore::Effects effects = core_->OnMapUpdate(update.shard_map(), MonotonicNow(), &changed);
    if (!changed) {  // older, or bad
      lock.unlock();
      if (auto view = ShardMapView::Create(update.shard_map()); !view.ok()) {
        TLOG_ERROR("ignoring a bad shard map update from the coordinator: {}", view.status().message());
      }
      return;
    }
    failover_epoch_ = core_->map()->epoch();
    failover_seen_at_ = MonotonicNow();
    stats_.resends += effects.resent_parts;
    Deliver(lock, std::move(effects));  // releases mu_
    session_->set_map_epoch(update.shard_map().epoch());
    TLOG_INFO("shard map epoch {} (map {}): {}", update.shard_map().epoch(), ShardMapDigest(update.shard_map()),
              update.reason());
  }

  void Close(const absl::Status& why) {
    std::vector<RequestTracker::Completion> done;
    std::vector<PostedPull> cancels;
    {
      std::lock_guard lock(mu_);
      if (closed_) return;
      closed_ = true;
      if (const std::string timers = DescribeTimers(); !timers.empty()) TLOG_INFO("resend timers: {}", timers);
      if (core_) done = core_->FailAll(why).done;
      EndPullTargets(done, &cancels);
    }
    tick_cv_.notify_all();
    CancelPulls(cancels);
    Complete(std::move(done));
    if (metrics_) metrics_->Stop();  // its render reads the session
    if (ticker_.joinable()) ticker_.join();
    transport_->Stop();
    session_.reset();
  }

  const WorkerOptions options_;
  std::shared_ptr<Transport> transport_;  // shared only so that Futures can hold it weakly
  // Operations issued and not completed (Future::State::in_flight).
  std::shared_ptr<std::atomic<int>> in_flight_ = std::make_shared<std::atomic<int>>(0);
  std::unique_ptr<CoordinatorSession> session_;
  uint32_t num_workers_ = 0;
  std::atomic<uint64_t> clock_{0};
  std::atomic<uint64_t> pushes_{0}, pulls_{0}, bytes_pushed_{0}, bytes_pulled_{0};
  // Shared with the messages in flight (Message::sent_bytes): a transport
  // that holds a message back (FaultTransport's delays) counts it later.
  const std::shared_ptr<std::atomic<uint64_t>> wire_pushed_ = std::make_shared<std::atomic<uint64_t>>(0),
                                               wire_pulled_ = std::make_shared<std::atomic<uint64_t>>(0),
                                               wire_other_ = std::make_shared<std::atomic<uint64_t>>(0);
  std::unique_ptr<metrics::MetricsHttpServer> metrics_;
  // 50 us .. about 3.4 s, doubling.
  metrics::Histogram push_latency_{metrics::ExponentialBuckets(50e-6, 2, 17)};
  metrics::Histogram pull_latency_{metrics::ExponentialBuckets(50e-6, 2, 17)};

  mutable std::mutex mu_;
  // Held while handing messages to the transport; taken with mu_ held, so
  // sends keep the core's order (Deliver). Never take mu_ while holding it.
  std::mutex send_mu_;
  std::condition_variable tick_cv_;
  WorkerStats stats_;                                  // guarded by mu_: clock and pull-hold figures
  // guarded by mu_: the protocol (slicing, numbering, the tracker, the map;
  // map() takes a snapshot); set once in Start()
  std::unique_ptr<WorkerCore> core_;
  absl::flat_hash_map<uint32_t, uint32_t> widths_;     // guarded by mu_: table -> width
  absl::flat_hash_set<uint32_t> whole_row_tables_;     // guarded by mu_: tables that refuse pieces of rows (ADAM)
  uint32_t synchronous_tables_ = 0;                     // guarded by mu_: open BSP or SSP tables
  // guarded by mu_ (the map; a compressor serializes its own calls): tables with compressed pushes
  absl::flat_hash_map<uint32_t, std::unique_ptr<compress::RowCompressor>> compressors_;
  std::condition_variable push_cv_;                     // operations completed (pushes among them)
  uint64_t failover_epoch_ = 0;                         // guarded by mu_: map of the last failover, until its first ack
  Nanos failover_seen_at_ = 0;                          // guarded by mu_: when that map arrived
  Nanos next_wait_report_ = 0;                          // guarded by mu_: when waits are reported next
  static constexpr Nanos kTickInterval = 100 * kMillis;  // the tick thread's longest sleep
  absl::flat_hash_map<std::string, Nanos> restored_at_;  // guarded by mu_: connections made again, not yet answered
  Nanos last_restore_to_answer_ = -1;                   // guarded by mu_: the last such wait (-1: none yet)
  Nanos tick_at_ = 0;                                   // guarded by mu_: when the tick thread wakes next
  bool tick_woken_ = false;                             // guarded by mu_: woken early during this sleep already
  bool closed_ = false;                                // guarded by mu_
  // guarded by mu_: Pulls into `out` in flight, by operation handle, and
  // each posted destination's request id -> where it starts in `out`.
  // Invariant: posted_pulls_ holds exactly the request ids in the targets'
  // `posted` lists.
  absl::flat_hash_map<const void*, PullTarget> pull_targets_;
  absl::flat_hash_map<uint64_t, const float*> posted_pulls_;
  std::thread ticker_;
};

}  // namespace

std::string StatsJson(const WorkerStats& s) {
  std::string hist;
  for (size_t i = 0; i < s.staleness.size(); ++i) absl::StrAppend(&hist, i ? "," : "", s.staleness[i]);
  return absl::StrCat("{\"pushes\":", s.pushes, ",\"pulls\":", s.pulls, ",\"bytes_pushed\":", s.bytes_pushed,
                      ",\"bytes_pulled\":", s.bytes_pulled, ",\"clocks\":", s.clocks,
                      ",\"clock_wait_seconds\":", static_cast<double>(s.clock_wait) / kSeconds,
                      ",\"pull_held_seconds\":", static_cast<double>(s.pull_held) / kSeconds,
                      ",\"staleness_histogram\":[", hist, "],\"wire_bytes_pushed\":", s.wire_bytes_pushed,
                      ",\"wire_bytes_pulled\":", s.wire_bytes_pulled, ",\"wire_bytes_other\":", s.wire_bytes_other,
                      ",\"resends\":", s.resends, "}");
}

proto::WorkerDone MakeWorkerDone(const WorkerStats& stats, uint64_t steps, double final_loss,
                                 const std::string& report_json) {
  proto::WorkerDone done;
  done.set_steps(steps);
  done.set_final_loss(final_loss);
  done.set_bytes_pushed(stats.bytes_pushed);
  done.set_bytes_pulled(stats.bytes_pulled);
  done.set_report_json(report_json);
  return done;
}

absl::StatusOr<std::unique_ptr<Worker>> Worker::Connect(const WorkerOptions& options) {
  if (options.coordinator.empty()) return absl::InvalidArgumentError("WorkerOptions.coordinator is empty");
  // Before the transport makes any thread (common/memory.h).
  if (options.keep_allocations_mapped) KeepLargeAllocationsMapped();
  ZmqTransport::Options transport_options;
  transport_options.bind = options.bind;
  transport_options.max_message_bytes = options.max_message_bytes;
  TransportChoice choice = options.transport;
  // A worker's messages are requests: one to a server that still owes an
  // answer waits for it (or for the caller to wait), to go with the next
  // ones (transport/coalescing_transport.h).
  choice.coalesce.hold_requests = true;
  auto transport = MakeTransport(std::move(transport_options), choice);
  if (!transport.ok()) return transport.status();
  return Connect(options, std::move(*transport));
}

absl::StatusOr<std::unique_ptr<Worker>> Worker::Connect(const WorkerOptions& options,
                                                        std::unique_ptr<Transport> transport) {
  if (options.coordinator.empty()) return absl::InvalidArgumentError("WorkerOptions.coordinator is empty");
  if (options.keep_allocations_mapped) KeepLargeAllocationsMapped();
  auto worker = std::make_unique<WorkerImpl>(options, std::move(transport));
  if (auto s = worker->Start(); !s.ok()) return s;
  return std::unique_ptr<Worker>(std::move(worker));
}

}  // namespace tessera

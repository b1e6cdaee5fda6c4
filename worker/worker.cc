// The Worker shell: transport, coordinator session, request slicing, and the
// RequestTracker core under one mutex.
#include "worker/worker.h"

#include <atomic>
#include <condition_variable>
#include <mutex>
#include <optional>
#include <set>
#include <thread>

#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "common/keys.h"
#include "common/memory.h"
#include "common/metrics.h"
#include "compress/row_compressor.h"
#include "node/coordinator_session.h"
#include "transport/transport_factory.h"
#include "worker/request_tracker.h"
#include "transport/transport_metrics.h"

namespace tessera {

struct Future::State {
  std::mutex mu;
  std::condition_variable cv;
  std::optional<absl::Status> status;
  Nanos started = 0;                       // when the request was issued
  metrics::Histogram* latency = nullptr;   // observes issue-to-completion seconds (owned by the worker)
  uint64_t push_seq = 0;                   // pushes: the sequence number (the worker forgets it on completion)

  void Set(absl::Status s) {
    {
      std::lock_guard lock(mu);
      if (status) return;
      status = std::move(s);
    }
    if (latency != nullptr) latency->Observe(static_cast<double>(MonotonicNow() - started) / kSeconds);
    cv.notify_all();
  }
};

absl::Status Future::Wait() const {
  if (!state_) return absl::FailedPreconditionError("waiting on an empty Future");
  std::unique_lock lock(state_->mu);
  state_->cv.wait(lock, [&] { return state_->status.has_value(); });
  return *state_->status;
}

bool Future::ready() const {
  if (!state_) return false;
  std::lock_guard lock(state_->mu);
  return state_->status.has_value();
}

Future Future::Ready(absl::Status status) {
  auto state = std::make_shared<State>();
  state->status = std::move(status);
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
    session_ = std::make_unique<CoordinatorSession>(so, transport_.get());
    session_->set_on_end([this](const absl::Status& s) {
      Complete(WithTracker([&](RequestTracker& t) {
        return t.FailAll(s.ok() ? absl::CancelledError("the job has ended") : s);
      }));
    });
    if (auto s = transport_->Start([this](Message m) { OnMessage(std::move(m)); }); !s.ok()) return s;
    auto ready = session_->Join();
    if (!ready.ok()) return ready.status();
    auto map = ShardMapView::Create(ready->shard_map());
    if (!map.ok()) return map.status();
    const std::string joined_map = absl::StrCat("shard map epoch ", ready->shard_map().epoch(), " (map ",
                                                ShardMapDigest(ready->shard_map()), ")");
    std::vector<std::string> names;
    for (size_t r = 0; r < map->num_servers(); ++r) names.push_back(map->server(r).address());
    num_workers_ = 0;
    for (const auto& n : ready->nodes())
      if (n.role() == proto::WORKER) ++num_workers_;
    {
      std::lock_guard lock(mu_);
      map_ = std::make_shared<const ShardMapView>(std::move(*map));
      tracker_.emplace(std::move(names));
    }
    ticker_ = std::thread([this] { TickLoop(); });
    if (options_.metrics_port >= 0) {
      auto m = metrics::MetricsHttpServer::Start(options_.metrics_host, static_cast<uint16_t>(options_.metrics_port),
                                                 [this] { return MetricsText(); });
      if (!m.ok()) return m.status();
      metrics_ = std::move(*m);
      TLOG_INFO("metrics at http://{}:{}/metrics", options_.metrics_host, metrics_->port());
    }
    if (incarnation() > 0) {
      if (absl::Status s = ResumeClock(); !s.ok()) return s;
      TLOG_INFO("worker {} rejoined as incarnation {} at clock {}: {} servers, {} workers; {}", rank(),
                incarnation(), clock(), num_servers(), num_workers_, joined_map);
      return absl::OkStatus();
    }
    TLOG_INFO("worker {} joined: {} servers, {} workers; {}", rank(), num_servers(), num_workers_, joined_map);
    return absl::OkStatus();
  }

  // A replacement continues at the clock its predecessor announced: the
  // highest any server knows (a predecessor that died inside Clock() may
  // have reached only some servers).
  absl::Status ResumeClock() {
    std::vector<RequestTracker::PartSpec> parts;
    std::vector<Outgoing> sends;
    const auto map = Map();
    for (uint32_t r : map->LiveServers()) {
      Message m = NewRequest(*map);
      m.header.mutable_clock_query();
      parts.push_back({m.header.request_id(), r, {}, m});
      sends.push_back({map->server(r).address(), std::move(m)});
    }
    if (absl::Status s = Issue("clock query", std::move(parts), std::move(sends)).Wait(); !s.ok()) {
      return absl::Status(s.code(), absl::StrCat("resuming the clock of a replaced worker: ", s.message()));
    }
    std::lock_guard lock(mu_);
    clock_.store(known_clock_);
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
        .Counter("tessera_worker_resends_total", "Push and pull parts sent again after a failover", s.resends)
        .Gauge("tessera_worker_clock", "This worker's clock", static_cast<double>(clock()))
        .Gauge("tessera_worker_incarnation", "Replacements of this rank before this process", incarnation());
    WriteTransportMetrics(w, transport_->stats());
    return w.text();
  }

  uint32_t rank() const override { return session_->self().rank(); }
  uint32_t node_id() const override { return session_->self().node_id(); }
  uint64_t next_push_seq() const override {
    std::lock_guard lock(mu_);
    return last_push_seq_ + 1;
  }
  uint32_t num_workers() const override { return num_workers_; }
  uint32_t num_servers() const override { return static_cast<uint32_t>(Map()->num_servers()); }

  std::shared_ptr<const ShardMapView> Map() const {
    std::lock_guard lock(mu_);
    return map_;
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
    std::vector<RequestTracker::PartSpec> parts;
    std::vector<Outgoing> sends;
    const auto map = Map();
    for (uint32_t r : map->LiveServers()) {
      Message m = NewRequest(*map);
      *m.header.mutable_create_table()->mutable_config() = config;
      parts.push_back({m.header.request_id(), r, {}, m});
      sends.push_back({map->server(r).address(), std::move(m)});
    }
    absl::Status s = Issue(absl::StrCat("create table ", options.id), std::move(parts), std::move(sends)).Wait();
    if (s.ok()) {
      std::lock_guard lock(mu_);
      widths_[options.id] = options.width;
      if (options.consistency != proto::ASP) synchronous_tables_++;
      if (compressor) compressors_.try_emplace(options.id, std::move(compressor));  // keep residuals on a repeat
    }
    return s;
  }

  Future Push(uint32_t table, std::span<const Key> keys, std::span<const float> values) override {
    auto width = TableWidth(table);
    if (!width.ok()) return Future::Ready(width.status());
    if (values.size() != keys.size() * *width) {
      return Future::Ready(absl::InvalidArgumentError(absl::StrCat(
          "push to table ", table, ": ", keys.size(), " keys of width ", *width, " need ", keys.size() * *width,
          " values, got ", values.size())));
    }
    if (keys.empty()) return Future::Ready(absl::OkStatus());
    const uint64_t clock = clock_.load();
    const size_t row_bytes = size_t{*width} * sizeof(float);
    compress::RowCompressor* compressor = Compressor(table);
    std::vector<RequestTracker::PartSpec> parts;
    std::vector<Outgoing> sends;
    absl::Status encode_error;
    const auto map = Map();
    // Every part of this push carries its number: servers apply it once per
    // shard, however often a failover makes us send it.
    const auto [seq, acked_below] = NextPushSeq();
    auto add_part = [&](uint32_t server, Buffer k, Buffer v, uint64_t n) {
      Message m = NewRequest(*map);
      auto* p = m.header.mutable_push();
      p->set_table_id(table);
      p->set_num_keys(n);
      p->set_clock(clock);
      p->set_seq(seq);
      p->set_acked_below(acked_below);
      p->set_incarnation(incarnation());
      std::optional<compress::EncodedRows> encoded;
      if (compressor != nullptr) {
        auto e = compressor->Encode(k.As<Key>(), v.As<float>());
        if (!e.ok()) {
          encode_error.Update(e.status());
          return;
        }
        if (!e->raw) encoded = std::move(*e);
      }
      m.frames.push_back(std::move(k));
      if (encoded) {
        p->set_value_parts(static_cast<uint32_t>(encoded->parts.size()));
        for (Buffer& b : encoded->parts) m.frames.push_back(std::move(b));
      } else {
        m.frames.push_back(std::move(v));
      }
      parts.push_back({m.header.request_id(), server, {}, m});
      sends.push_back({map->server(server).address(), std::move(m)});
    };
    Slice(*map, table, keys, [&](uint32_t server) {  // all keys on one server: no copy
      add_part(server, Buffer::Borrow(keys.data(), keys.size_bytes()), Buffer::Borrow(values.data(), values.size_bytes()),
               keys.size());
    }, [&](uint32_t server, const std::vector<uint32_t>& rows) {
      Buffer k = Buffer::Allocate(rows.size() * sizeof(Key));
      Buffer v = Buffer::Allocate(rows.size() * row_bytes);
      auto kd = k.AsMutable<Key>();
      auto* vd = v.mutable_data();
      const auto* src = reinterpret_cast<const std::byte*>(values.data());
      for (size_t i = 0; i < rows.size(); ++i) {
        kd[i] = keys[rows[i]];
        std::memcpy(vd + i * row_bytes, src + size_t{rows[i]} * row_bytes, row_bytes);
      }
      add_part(server, std::move(k), std::move(v), rows.size());
    });
    if (!encode_error.ok()) {
      ForgetPushSeq(seq);
      return Future::Ready(absl::Status(encode_error.code(), absl::StrCat("push to table ", table,
                                                                          ": compressing: ", encode_error.message())));
    }
    pushes_++;
    bytes_pushed_ += keys.size_bytes() + values.size_bytes();
    return Issue(absl::StrCat("push to table ", table), std::move(parts), std::move(sends), {}, 0, 0,
                 &push_latency_, seq);
  }

  Future Pull(uint32_t table, std::span<const Key> keys, std::span<float> out) override {
    auto width = TableWidth(table);
    if (!width.ok()) return Future::Ready(width.status());
    if (out.size() != keys.size() * *width) {
      return Future::Ready(absl::InvalidArgumentError(absl::StrCat(
          "pull from table ", table, ": ", keys.size(), " keys of width ", *width, " need room for ",
          keys.size() * *width, " values, got ", out.size())));
    }
    if (keys.empty()) return Future::Ready(absl::OkStatus());
    const uint64_t clock = clock_.load();
    std::vector<RequestTracker::PartSpec> parts;
    std::vector<Outgoing> sends;
    const auto map = Map();
    auto add_part = [&](uint32_t server, Buffer k, RequestTracker::Scatter scatter) {
      Message m = NewRequest(*map);
      auto* p = m.header.mutable_pull();
      p->set_table_id(table);
      p->set_num_keys(scatter.num_keys);
      p->set_clock(clock);
      p->set_hold_timeout_ms(options_.hold_timeout / kMillis);
      m.frames.push_back(std::move(k));
      parts.push_back({m.header.request_id(), server, std::move(scatter), m});
      sends.push_back({map->server(server).address(), std::move(m)});
    };
    Slice(*map, table, keys, [&](uint32_t server) {
      add_part(server, Buffer::Borrow(keys.data(), keys.size_bytes()), {0, {}, keys.size()});
    }, [&](uint32_t server, const std::vector<uint32_t>& rows) {
      Buffer k = Buffer::Allocate(rows.size() * sizeof(Key));
      auto kd = k.AsMutable<Key>();
      for (size_t i = 0; i < rows.size(); ++i) kd[i] = keys[rows[i]];
      add_part(server, std::move(k), {0, rows, rows.size()});
    });
    pulls_++;
    bytes_pulled_ += keys.size_bytes() + out.size_bytes();
    return Issue(absl::StrCat("pull from table ", table, " at clock ", clock), std::move(parts), std::move(sends),
                 out, *width, options_.hold_timeout, &pull_latency_);
  }

  absl::Status Clock() override {
    const Nanos start = MonotonicNow();
    // With replication, a push may have to go again to another server after
    // a failover; the clock is announced only once the pushes made before it
    // are in (acknowledged or failed), so that no server counts this clock
    // before it has the pushes stamped earlier.
    if (Map()->replication() > 1) {
      if (absl::Status s = WaitForPushes(); !s.ok()) return s;
    }
    // From here on, pushes are stamped with the new clock; everything sent
    // before reaches each server ahead of the announcement.
    const uint64_t clock = clock_.fetch_add(1) + 1;
    if (!HasSynchronousTables()) return NotifyClock(clock, start);
    std::vector<RequestTracker::PartSpec> parts;
    std::vector<Outgoing> sends;
    const auto map = Map();
    for (uint32_t r : map->LiveServers()) {
      Message m = NewRequest(*map);
      m.header.mutable_clock_advance()->set_clock(clock);
      m.header.mutable_clock_advance()->set_hold_timeout_ms(options_.hold_timeout / kMillis);
      parts.push_back({m.header.request_id(), r, {}, m});
      sends.push_back({map->server(r).address(), std::move(m)});
    }
    absl::Status s = Issue(absl::StrCat("clock ", clock), std::move(parts), std::move(sends), {}, 0,
                           options_.hold_timeout)
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
    {
      std::lock_guard lock(mu_);
      if (closed_) return absl::CancelledError("worker is closed");
    }
    const auto map = Map();
    for (uint32_t r : map->LiveServers()) {
      Message m = NewRequest(*map);
      m.header.set_request_id(0);  // a notice: servers record it and answer nothing
      m.header.mutable_clock_advance()->set_clock(clock);
      CountWire(m);
      if (auto s = transport_->Send(map->server(r).address(), std::move(m)); !s.ok()) return s;
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
    s.wire_bytes_pushed = wire_pushed_.load();
    s.wire_bytes_pulled = wire_pulled_.load();
    s.wire_bytes_other = wire_other_.load();
    return s;
  }

 private:
  template <typename F>
  std::vector<RequestTracker::Completion> WithTracker(F&& f) {
    std::lock_guard lock(mu_);
    if (!tracker_) return std::vector<RequestTracker::Completion>{};
    return f(*tracker_);
  }

  void Complete(std::vector<RequestTracker::Completion> done) {
    for (auto& c : done) {
      auto* state = static_cast<Future::State*>(c.handle.get());
      if (state->push_seq != 0) ForgetPushSeq(state->push_seq);
      state->Set(std::move(c.status));
    }
  }

  // The next push's sequence number, and the lowest one still in flight
  // (every push numbered below it is complete).
  std::pair<uint64_t, uint64_t> NextPushSeq() {
    std::lock_guard lock(mu_);
    const uint64_t seq = ++last_push_seq_;
    pushes_in_flight_.insert(seq);
    return {seq, *pushes_in_flight_.begin()};
  }
  void ForgetPushSeq(uint64_t seq) {
    {
      std::lock_guard lock(mu_);
      pushes_in_flight_.erase(seq);
    }
    push_cv_.notify_all();
  }
  // Blocks until every push issued so far has completed.
  absl::Status WaitForPushes() {
    std::unique_lock lock(mu_);
    const uint64_t last = last_push_seq_;
    const Nanos deadline = MonotonicNow() + options_.request_timeout;
    while (!pushes_in_flight_.empty() && *pushes_in_flight_.begin() <= last && !closed_) {
      if (MonotonicNow() >= deadline) {
        return absl::DeadlineExceededError(absl::StrCat(
            "clock ", clock_.load() + 1, ": ", pushes_in_flight_.size(), " pushes still unacknowledged after ",
            options_.request_timeout / kSeconds, " s (the push futures name the servers)"));
      }
      push_cv_.wait_for(lock, std::chrono::milliseconds(50));
    }
    if (closed_) return absl::CancelledError("worker is closed");
    return absl::OkStatus();
  }

  Message NewRequest(const ShardMapView& map) {
    Message m;
    m.header.set_request_id(next_request_.fetch_add(1) + 1);
    m.header.set_sender_id(session_->self().node_id());
    m.header.set_epoch(map.epoch());
    // The transport stamps this too; set here, the header the wire counts
    // measure is the one that is sent.
    m.header.set_sender_address(transport_->address());
    return m;
  }

  compress::RowCompressor* Compressor(uint32_t table) {
    std::lock_guard lock(mu_);
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

  // Calls single(server) if every key lives on one server, else multi(server,
  // rows of that server) for each server that holds some keys.
  template <typename Single, typename Multi>
  static void Slice(const ShardMapView& map, uint32_t table, std::span<const Key> keys, Single&& single,
                    Multi&& multi) {
    const uint32_t first = map.ServerRankOfKey(table, keys[0]);
    std::vector<uint32_t> owner(keys.size());
    bool all_same = true;
    for (size_t i = 0; i < keys.size(); ++i) {
      owner[i] = map.ServerRankOfKey(table, keys[i]);
      all_same &= owner[i] == first;
    }
    if (all_same) {
      single(first);
      return;
    }
    std::vector<std::vector<uint32_t>> rows(map.num_servers());
    for (size_t i = 0; i < keys.size(); ++i) rows[owner[i]].push_back(static_cast<uint32_t>(i));
    for (uint32_t s = 0; s < rows.size(); ++s)
      if (!rows[s].empty()) multi(s, rows[s]);
  }

  // `hold` is how long servers may hold the request for slower workers, on
  // top of the request timeout.
  Future Issue(std::string what, std::vector<RequestTracker::PartSpec> parts, std::vector<Outgoing> sends,
               std::span<float> out = {}, uint32_t width = 0, Nanos hold = 0,
               metrics::Histogram* latency = nullptr, uint64_t push_seq = 0) {
    auto state = std::make_shared<Future::State>();
    state->started = MonotonicNow();
    state->latency = latency;
    state->push_seq = push_seq;
    {
      std::lock_guard lock(mu_);
      if (closed_) {
        if (push_seq != 0) pushes_in_flight_.erase(push_seq);
        return Future::Ready(absl::CancelledError("worker is closed"));
      }
      const Nanos now = MonotonicNow();
      tracker_->Begin(state, std::move(what), std::move(parts), now + options_.request_timeout + hold, out, width,
                      now);
    }
    for (Outgoing& o : sends) {
      CountWire(o.message);
      (void)transport_->Send(o.to, std::move(o.message));
    }
    return Future(std::move(state));
  }

  // A compressed pull reply becomes a plain one (one fp32 values frame), so
  // the tracker scatters it as usual; bad parts turn it into an Error reply.
  // `expected`: the values the pull asked for (0: no such pull in flight, and
  // the tracker will ignore the reply). Nothing is allocated before the
  // reply's size and its parts' headers agree with it.
  static void DecodePullReply(Message& m, uint64_t expected) {
    const auto& pr = m.header.pull_reply();
    const uint64_t n = pr.num_keys() * uint64_t{pr.width()};
    absl::Status s;
    if (m.frames.size() != pr.value_parts()) {
      s = absl::InvalidArgumentError(absl::StrCat("pull reply announces ", pr.value_parts(), " parts, has ",
                                                  m.frames.size(), " frames"));
    } else if (n != expected) {
      s = absl::InvalidArgumentError(absl::StrCat("pull reply of ", n, " values to a pull of ", expected));
    } else {
      s = compress::CheckRowParts(m.frames, n);
    }
    if (s.ok()) {
      Buffer decoded = Buffer::Allocate(n * sizeof(float));
      s = compress::DecodeRowParts(m.frames, decoded.AsMutable<float>());
      if (s.ok()) {
        m.frames.clear();
        m.frames.push_back(std::move(decoded));
        m.header.mutable_pull_reply()->set_value_parts(0);
        return;
      }
    }
    m.frames.clear();
    auto* e = m.header.mutable_error();
    e->set_code(static_cast<int>(absl::StatusCode::kDataLoss));
    e->set_message(absl::StrCat("compressed pull reply: ", s.message()));
  }

  // Adds a message to or from a server to the wire byte counts.
  void CountWire(const Message& m) {
    uint64_t bytes = m.header.ByteSizeLong();
    for (const Buffer& f : m.frames) bytes += f.size();
    std::atomic<uint64_t>& counter = m.header.has_push()                                   ? wire_pushed_
                                     : m.header.has_pull() || m.header.has_pull_reply() ? wire_pulled_
                                                                                          : wire_other_;
    counter.fetch_add(bytes, std::memory_order_relaxed);
  }

  void OnMessage(Message m) {
    if (m.header.has_shard_map_update()) {
      OnMapUpdate(m.header.shard_map_update());
      return;
    }
    if (session_->Handle(m)) return;
    CountWire(m);
    if (m.header.has_ack()) NoteFirstAckAfterFailover(m.header.epoch());
    if (m.header.has_pull_reply() && m.header.pull_reply().value_parts() > 0) {
      uint64_t expected = 0;
      {
        std::lock_guard lock(mu_);
        if (tracker_) expected = tracker_->ExpectedValues(m.header.request_id());
      }
      DecodePullReply(m, expected);
    }
    Complete(WithTracker([&](RequestTracker& t) {
      if (m.header.has_pull_reply()) {  // mu_ is held here
        const auto& pr = m.header.pull_reply();
        stats_.pull_held += static_cast<Nanos>(pr.held_us()) * 1000;
        stats_.staleness[std::min<uint64_t>(pr.staleness(), WorkerStats::kStalenessBuckets - 1)]++;
      } else if (m.header.has_clock_ack()) {
        known_clock_ = std::max(known_clock_, m.header.clock_ack().worker_clock());
      }
      return t.OnReply(m);
    }));
  }

  void TickLoop() {
    std::unique_lock lock(mu_);
    while (!closed_) {
      tick_cv_.wait_for(lock, std::chrono::milliseconds(100));
      if (closed_) break;
      auto done = tracker_->Tick(MonotonicNow());
      lock.unlock();
      Complete(std::move(done));
      // Parts a lagging server refused go again with our map, and parts
      // nobody answered for resend_after go again (a lost message).
      SendAgain(options_.resend_after);
      lock.lock();
    }
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

  // A newer shard map from the coordinator (a server was lost): resend what
  // went to it, and what waited for this map.
  void OnMapUpdate(const proto::ShardMapUpdate& update) {
    auto view = ShardMapView::Create(update.shard_map());
    if (!view.ok()) {
      TLOG_ERROR("ignoring a bad shard map update from the coordinator: {}", view.status().message());
      return;
    }
    {
      std::lock_guard lock(mu_);
      if (closed_ || !map_ || view->epoch() <= map_->epoch()) return;
      map_ = std::make_shared<const ShardMapView>(std::move(*view));
      failover_epoch_ = map_->epoch();
      failover_seen_at_ = MonotonicNow();
    }
    session_->set_map_epoch(update.shard_map().epoch());
    TLOG_INFO("shard map epoch {} (map {}): {}", update.shard_map().epoch(), ShardMapDigest(update.shard_map()),
              update.reason());
    SendAgain();
  }

  // Sends again, by the current map, the parts the tracker hands back
  // (and, with resend_after, those unanswered that long: see the tracker).
  void SendAgain(Nanos resend_after = 0) {
    std::vector<RequestTracker::Completion> done;
    std::vector<Outgoing> sends;
    {
      std::lock_guard lock(mu_);
      if (closed_ || !tracker_) return;
      const ShardMapView& map = *map_;
      const Nanos now = MonotonicNow();
      for (RequestTracker::Resend& r : tracker_->TakeResends(
               map.epoch(), [&](uint32_t rank) { return map.IsDead(rank); }, &done, now, resend_after)) {
        for (auto& c : tracker_->Reissue(r, Redirect(map, r, sends), now)) done.push_back(std::move(c));
        stats_.resends++;
      }
    }
    for (Outgoing& o : sends) {
      CountWire(o.message);
      (void)transport_->Send(o.to, std::move(o.message));
    }
    Complete(std::move(done));
  }

  // The requests that replace part `r` under `map` (appended to `sends`).
  // A push goes whole, marked as a resend, to every server that is now the
  // primary of some of its keys (each takes its own; the same bytes, so a
  // compressed push is not encoded twice). A pull is split by primary.
  std::vector<RequestTracker::PartSpec> Redirect(const ShardMapView& map, const RequestTracker::Resend& r,
                                                 std::vector<Outgoing>& sends) {
    std::vector<RequestTracker::PartSpec> parts;
    const proto::Envelope& h = r.request.header;
    if (!h.has_push() && !h.has_pull()) {  // a clock, a table, a query: again, to the same server
      Message m = r.request;
      m.header.set_request_id(next_request_.fetch_add(1) + 1);
      m.header.set_epoch(map.epoch());
      parts.push_back({m.header.request_id(), r.server_rank, {}, m});
      sends.push_back({map.server(r.server_rank).address(), std::move(m)});
      return parts;
    }
    const uint32_t table = h.has_push() ? h.push().table_id() : h.pull().table_id();
    const auto keys = r.request.frames[0].As<Key>();
    std::vector<std::vector<uint32_t>> rows(map.num_servers());
    for (size_t i = 0; i < keys.size(); ++i) rows[map.ServerRankOfKey(table, keys[i])].push_back(static_cast<uint32_t>(i));
    for (uint32_t s = 0; s < rows.size(); ++s) {
      if (rows[s].empty()) continue;
      Message m;
      m.header = h;
      m.header.set_request_id(next_request_.fetch_add(1) + 1);
      m.header.set_epoch(map.epoch());
      RequestTracker::Scatter scatter;
      if (h.has_push()) {
        m.header.mutable_push()->set_resend(true);
        m.frames = r.request.frames;
      } else if (rows[s].size() == keys.size()) {
        m.frames = r.request.frames;
        scatter = r.scatter;
      } else {
        Buffer k = Buffer::Allocate(rows[s].size() * sizeof(Key));
        auto kd = k.AsMutable<Key>();
        for (size_t i = 0; i < rows[s].size(); ++i) {
          const uint32_t row = rows[s][i];
          kd[i] = keys[row];
          scatter.rows.push_back(r.scatter.rows.empty() ? static_cast<uint32_t>(r.scatter.first_row + row)
                                                        : r.scatter.rows[row]);
        }
        scatter.num_keys = rows[s].size();
        m.header.mutable_pull()->set_num_keys(rows[s].size());
        m.frames.push_back(std::move(k));
      }
      parts.push_back({m.header.request_id(), s, std::move(scatter), m});
      sends.push_back({map.server(s).address(), std::move(m)});
    }
    return parts;
  }

  void Close(const absl::Status& why) {
    std::vector<RequestTracker::Completion> done;
    {
      std::lock_guard lock(mu_);
      if (closed_) return;
      closed_ = true;
      if (tracker_) done = tracker_->FailAll(why);
    }
    tick_cv_.notify_all();
    Complete(std::move(done));
    if (metrics_) metrics_->Stop();  // its render reads the session
    if (ticker_.joinable()) ticker_.join();
    transport_->Stop();
    session_.reset();
  }

  const WorkerOptions options_;
  std::unique_ptr<Transport> transport_;
  std::unique_ptr<CoordinatorSession> session_;
  std::shared_ptr<const ShardMapView> map_;  // guarded by mu_: replaced by failovers (Map() takes a snapshot)
  uint32_t num_workers_ = 0;
  std::atomic<uint64_t> next_request_{0};
  std::atomic<uint64_t> clock_{0};
  std::atomic<uint64_t> pushes_{0}, pulls_{0}, bytes_pushed_{0}, bytes_pulled_{0};
  std::atomic<uint64_t> wire_pushed_{0}, wire_pulled_{0}, wire_other_{0};
  std::unique_ptr<metrics::MetricsHttpServer> metrics_;
  // 50 us .. about 3.4 s, doubling.
  metrics::Histogram push_latency_{metrics::ExponentialBuckets(50e-6, 2, 17)};
  metrics::Histogram pull_latency_{metrics::ExponentialBuckets(50e-6, 2, 17)};

  mutable std::mutex mu_;
  std::condition_variable tick_cv_;
  WorkerStats stats_;                                  // guarded by mu_: clock and pull-hold figures
  std::optional<RequestTracker> tracker_;              // guarded by mu_
  absl::flat_hash_map<uint32_t, uint32_t> widths_;     // guarded by mu_: table -> width
  uint32_t synchronous_tables_ = 0;                     // guarded by mu_: open BSP or SSP tables
  // guarded by mu_ (the map; a compressor serializes its own calls): tables with compressed pushes
  absl::flat_hash_map<uint32_t, std::unique_ptr<compress::RowCompressor>> compressors_;
  uint64_t known_clock_ = 0;                            // guarded by mu_: highest clock servers reported for us
  uint64_t last_push_seq_ = 0;                          // guarded by mu_: the last push's sequence number
  std::set<uint64_t> pushes_in_flight_;                 // guarded by mu_: sequence numbers of pushes not complete
  std::condition_variable push_cv_;                     // a push completed
  uint64_t failover_epoch_ = 0;                         // guarded by mu_: map of the last failover, until its first ack
  Nanos failover_seen_at_ = 0;                          // guarded by mu_: when that map arrived
  bool closed_ = false;                                // guarded by mu_
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
  auto transport = MakeTransport(options.bind);
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

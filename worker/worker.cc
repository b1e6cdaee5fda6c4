// The Worker shell: transport, coordinator session, futures, stats and the
// tick thread around the WorkerCore (worker/worker_core.h: request slicing,
// push numbering, the RequestTracker) under one mutex. Its parts: the
// futures' shared state (worker/future_state.h), the book of pull
// destinations posted with the transport (worker/posted_pulls.h), table
// configs (worker/table_config.h) and the metrics text (worker/
// worker_metrics.h).
#include "worker/worker.h"

#include <atomic>
#include <chrono>
#include <condition_variable>
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
#include "worker/future_state.h"
#include "worker/posted_pulls.h"
#include "worker/table_config.h"
#include "worker/worker_metrics.h"
#include "worker/worker_core.h"
#include "worker/worker_node_core.h"

namespace tessera {

namespace {

// The core's options from the worker's (WorkerNodeCore::Start adds the
// node id, incarnation and address).
WorkerCoreOptions CoreOptions(const WorkerOptions& options, std::weak_ptr<Transport> transport) {
  WorkerCoreOptions co;
  co.request_timeout = options.request_timeout;
  co.hold_timeout = options.hold_timeout;
  co.resend_after = options.resend_after;
  co.resend_floor = options.resend_floor;
  co.resend_ceiling = options.resend_ceiling;
  co.resend_bytes_per_second = options.resend_bytes_per_second;
  co.part_bytes = options.part_bytes;
  co.row_piece_bytes = options.row_piece_bytes;
  // Wide rows go whole over the same-host path (pieces measured slower
  // there), in pieces over the network.
  co.whole_rows_to = [t = std::move(transport)](const std::string& address) {
    std::shared_ptr<Transport> transport = t.lock();
    return transport != nullptr && transport->SameHostPath(address);
  };
  co.max_bytes_in_flight_per_server = options.max_bytes_in_flight_per_server;
  co.max_message_bytes = options.max_message_bytes;
  return co;
}

class WorkerImpl final : public Worker {
 public:
  WorkerImpl(const WorkerOptions& options, std::unique_ptr<Transport> transport)
      : options_(options), transport_(std::move(transport)), node_(CoreOptions(options_, transport_)) {}

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
      std::vector<PostedPulls::Posting> cancels;
      {
        std::lock_guard lock(mu_);
        if (!core_) return;
        effects = core_->FailAll(s.ok() ? absl::CancelledError("the job has ended") : s);
        cancels = posted_pulls_.Withdraw(effects.done, effects.resent_parts, *core_);
      }
      CancelPulls(cancels);  // before the callers get their memory back
      Complete(std::move(effects.done));
    });
    transport_->SetLinkHandler([this](const std::string& address, bool up) { OnLink(address, up); });
    if (auto s = transport_->Start([this](Message m) { OnMessage(std::move(m)); }); !s.ok()) return s;
    auto ready = session_->Join();
    if (!ready.ok()) return ready.status();
    WorkerNodeCore::StartKind kind;
    {
      std::lock_guard lock(mu_);
      absl::Status s = node_.Start(*ready, session_->self(), session_->joined_running_job(), transport_->address());
      if (!s.ok()) return s;
      core_ = node_.core();
      num_workers_ = node_.num_workers();
      kind = node_.start_kind();
    }
    const std::string joined_map = absl::StrCat("shard map epoch ", ready->shard_map().epoch(), " (map ",
                                                ShardMapDigest(ready->shard_map()), ")");
    ticker_ = std::thread([this] { TickLoop(); });
    if (options_.metrics_port >= 0) {
      auto m = metrics::MetricsHttpServer::Start(options_.metrics_host, static_cast<uint16_t>(options_.metrics_port),
                                                 [this] { return MetricsText(); });
      if (!m.ok()) return m.status();
      metrics_ = std::move(*m);
      TLOG_INFO("metrics at http://{}:{}/metrics", options_.metrics_host, metrics_->port());
    }
    if (kind != WorkerNodeCore::StartKind::kFresh) {
      if (absl::Status s = ResumeClock(kind); !s.ok()) return s;
    }
    const std::string from = transport_->address();
    std::string how = absl::StrCat("joined from ", from);
    if (kind == WorkerNodeCore::StartKind::kJoin) {
      how = absl::StrCat("joined the running job from ", from, " at clock ", clock());
    } else if (kind == WorkerNodeCore::StartKind::kReplacement) {
      how = absl::StrCat("rejoined from ", from, " as incarnation ", incarnation(), " at clock ", clock());
    }
    TLOG_INFO("worker {} {}: {} servers, {} workers; {}", rank(), how, num_servers(), num_workers_, joined_map);
    return absl::OkStatus();
  }

  // A replacement, or a worker that joined the running job, continues at
  // the clock the servers know for it, announced again to every server
  // (worker/worker_node_core.h, "The clock resume").
  absl::Status ResumeClock(WorkerNodeCore::StartKind kind) {
    const char* who =
        kind == WorkerNodeCore::StartKind::kJoin ? "a worker that joined the running job" : "a replaced worker";
    absl::Status s =
        Issue(nullptr, [&](const WorkerCore::Handle& h, Nanos now) { return node_.QueryClock(h, now); }).Wait();
    if (!s.ok()) {
      return absl::Status(s.code(), absl::StrCat("resuming the clock of ", who, ": ", s.message()));
    }
    uint64_t known = 0;
    {
      std::lock_guard lock(mu_);
      known = node_.resume_clock();
      clock_.store(known);
    }
    s = Issue(nullptr, [&](const WorkerCore::Handle& h, Nanos now) { return node_.AnnounceClock(h, now); }).Wait();
    if (!s.ok()) {
      return absl::Status(s.code(), absl::StrCat("announcing clock ", known, " for ", who, ": ", s.message()));
    }
    return absl::OkStatus();
  }

  uint32_t incarnation() const override { return session_->self().incarnation(); }

  TransportStats transport_stats() const override { return transport_->stats(); }

  std::string MetricsText() const {
    WorkerMetrics m{.stats = stats(), .clock = clock(), .incarnation = incarnation(), .push_latency = push_latency_,
                    .pull_latency = pull_latency_};
    {
      std::lock_guard lock(mu_);
      if (core_) m.timers = core_->tracker().Timers();
      m.last_restore_to_answer = last_restore_to_answer_;
    }
    m.transport = transport_->stats();
    return WorkerMetricsText(m);
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
    proto::TableConfig config = ToTableConfig(options);
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
      node_.TableCreated(options.consistency);
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
      return core_->Pull(h, table, keys, dest, width, clock, now, {}, priority);
    });
  }

  // --- Pull replies in place (Transport::PostDestination; the book and
  // its rules: worker/posted_pulls.h) ---

  // Posts, as the destination of its reply's values, the run of `out` that
  // each pull request in `sends` fills (where the core names one and the
  // transport may place frames from its server). Requires mu_.
  void PostPullDestinations(const std::vector<Outgoing>& sends) {
    for (const Outgoing& o : sends) {
      if (!o.message.header.has_pull() || !transport_->PlacesInto(o.to)) continue;
      const std::optional<RequestTracker::OutRange> range = PostedPulls::Placeable(o.message, *core_);
      if (!range) continue;
      const uint64_t id = o.message.header.request_id();
      Buffer destination = Buffer::Borrow(range->values.data(), range->values.size_bytes());
      if (transport_->PostDestination(o.to, id, 0, std::move(destination)).ok()) posted_pulls_.Posted(*range, o.to, id);
    }
  }

  // Without mu_ (a cancel may wait for a copy into the destination).
  void CancelPulls(const std::vector<PostedPulls::Posting>& cancels) {
    for (const PostedPulls::Posting& p : cancels) (void)transport_->CancelDestination(p.to, p.request_id, 0);
  }

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
    return node_.ClockWaits();
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
  // `forget`: servers gone from the shard map, whose queued messages the
  // transport drops before the effects (resends of what went to them) leave.
  void Deliver(std::unique_lock<std::mutex>& lock, WorkerCore::Effects effects,
               const std::vector<std::string>& forget = {}) {
    // Postings of what completed or went again are withdrawn; new pull
    // requests get theirs before they are sent.
    std::vector<PostedPulls::Posting> cancels = posted_pulls_.Withdraw(effects.done, effects.resent_parts, *core_);
    PostPullDestinations(effects.sends);
    std::unique_lock send_lock(send_mu_);
    lock.unlock();
    for (const std::string& address : forget) ForgetServer(address);
    for (Outgoing& o : effects.sends) {
      CountWire(o.message);
      (void)transport_->Send(o.to, std::move(o.message));
    }
    send_lock.unlock();
    CancelPulls(cancels);  // before the callers get their memory back
    Complete(std::move(effects.done));
  }

  // A message queued for a server that went away must not reach a later
  // process at its address: it may view the caller's memory, which the
  // caller gets back once the resent operation completes
  // (Transport::Forget). Called before the resends leave, so before any of
  // them can complete.
  void ForgetServer(const std::string& address) {
    const ForgetResult r = transport_->Forget(address, std::chrono::seconds(1));
    if (r.frames_still_held > 0) {
      TLOG_ERROR("{} frames of messages to the lost server at {} are still held by the transport after 1 s; a "
                 "later process at that address may receive them, viewing memory their operations gave back",
                 r.frames_still_held, address);
    } else if (r.frames_pending > 0 || r.messages_dropped > 0) {
      TLOG_INFO("dropped what was queued for the lost server at {} ({} frames, {} messages held back)", address,
                r.frames_pending, r.messages_dropped);
    }
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
      // Values the transport wrote into the destination posted for them.
      if (posted_pulls_.TakePlaced(m, *core_)) stats_.pull_replies_in_place++;
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
    std::unique_lock lock(mu_);
    if (closed_) return;
    WorkerNodeCore::MapChange change = node_.UpdateMap(update, MonotonicNow());
    if (!change.newer) {  // older, bad, or before the start
      lock.unlock();
      if (!change.error.ok()) {
        TLOG_ERROR("ignoring a bad shard map update from the coordinator: {}", change.error.message());
      }
      return;
    }
    failover_epoch_ = change.epoch;
    failover_seen_at_ = MonotonicNow();
    stats_.resends += change.effects.resent_parts;
    Deliver(lock, std::move(change.effects), change.gone_servers);  // releases mu_
    session_->set_map_epoch(change.epoch);
    TLOG_INFO("shard map epoch {} (map {}): {}", update.shard_map().epoch(), ShardMapDigest(update.shard_map()),
              update.reason());
  }

  void Close(const absl::Status& why) {
    std::vector<RequestTracker::Completion> done;
    std::vector<PostedPulls::Posting> cancels;
    {
      std::lock_guard lock(mu_);
      if (closed_) return;
      closed_ = true;
      if (const std::string timers = DescribeTimers(); !timers.empty()) TLOG_INFO("resend timers: {}", timers);
      if (core_) {
        done = core_->FailAll(why).done;
        cancels = posted_pulls_.Withdraw(done, 0, *core_);
      }
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
  // guarded by mu_: the process's start, clock resume and map updates
  // around the core (worker/worker_node_core.h)
  WorkerNodeCore node_;
  // guarded by mu_: node_'s core, the protocol (slicing, numbering, the
  // tracker, the map; map() takes a snapshot); set once in Start()
  WorkerCore* core_ = nullptr;
  absl::flat_hash_map<uint32_t, uint32_t> widths_;     // guarded by mu_: table -> width
  absl::flat_hash_set<uint32_t> whole_row_tables_;     // guarded by mu_: tables that refuse pieces of rows (ADAM)
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
  // guarded by mu_: the pull destinations posted with the transport (replies in place)
  PostedPulls posted_pulls_;
  std::thread ticker_;
};

}  // namespace

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

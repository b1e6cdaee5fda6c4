// The cluster simulator (see sim.h). One thread, one event queue ordered by
// (simulated time, insertion number); every random draw comes from one
// SplitMix64 stream seeded by the run's seed.
#include "tests/sim/sim.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <cstdio>
#include <deque>
#include <fstream>
#include <map>
#include <memory>
#include <optional>
#include <queue>
#include <set>
#include <tuple>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/keys.h"
#include "coordinator/coordinator_core.h"
#include "node/session_core.h"
#include "server/server_core.h"
#include "server/server_node_core.h"
#include "tests/consistency/consistency_checker.h"
#include "tests/sim/sim_checkpoints.h"
#include "worker/worker_core.h"
#include "worker/worker_node_core.h"

namespace tessera::sim {

const char* BreakageName(Breakage b) {
  switch (b) {
    case Breakage::kNone: return "none";
    case Breakage::kApplyDuplicates: return "apply-duplicates";
    case Breakage::kAckBeforeReplication: return "ack-before-replication";
    case Breakage::kAnswerEarly: return "answer-early";
    case Breakage::kAcceptOldEpoch: return "accept-old-epoch";
    case Breakage::kSwitchBeforeSync: return "switch-before-sync";
    case Breakage::kReadDuringMove: return "read-during-move";
    case Breakage::kJoinAtZero: return "join-at-zero";
    case Breakage::kRestoreOldest: return "restore-oldest";
    case Breakage::kRestoreHeldOldest: return "restore-held-oldest";
  }
  return "?";
}

bool ParseBreakage(const std::string& name, Breakage* out) {
  for (Breakage b : {Breakage::kNone, Breakage::kApplyDuplicates, Breakage::kAckBeforeReplication,
                     Breakage::kAnswerEarly, Breakage::kAcceptOldEpoch, Breakage::kSwitchBeforeSync,
                     Breakage::kReadDuringMove, Breakage::kJoinAtZero, Breakage::kRestoreOldest,
                     Breakage::kRestoreHeldOldest}) {
    if (name == BreakageName(b)) {
      *out = b;
      return true;
    }
  }
  return false;
}

namespace {

// SplitMix64: small, fast, and the same on every platform.
class Rng {
 public:
  explicit Rng(uint64_t seed) : s_(seed) {}
  uint64_t Next() {
    uint64_t z = (s_ += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
  }
  uint64_t Below(uint64_t n) { return n == 0 ? 0 : Next() % n; }
  int64_t Between(int64_t lo, int64_t hi) { return lo + static_cast<int64_t>(Below(static_cast<uint64_t>(hi - lo) + 1)); }
  bool Chance(double p) { return p > 0 && static_cast<double>(Next() >> 11) * 0x1.0p-53 < p; }

 private:
  uint64_t s_;
};

uint64_t Fnv(absl::string_view s, uint64_t h = 0xcbf29ce484222325ULL) {
  for (unsigned char c : s) h = (h ^ c) * 0x100000001b3ULL;
  return h;
}

constexpr Nanos kMs = kMillis;
constexpr Nanos kTickEvery = 20 * kMs;        // every node's timer
constexpr Nanos kRegisterRetry = 100 * kMs;
constexpr Nanos kResendAfter = 300 * kMs;     // worker: a silent part goes again
constexpr Nanos kDrain = 3 * kSeconds;        // after the job: servers settle their streams
constexpr Nanos kLateReordered = 50 * kMs;    // a reordered message comes up to this much later
constexpr Nanos kLateDuplicate = 2000 * kMs;  // a duplicated message's copy comes up to this much later
constexpr uint32_t kTable = 77;
const std::string kCoordinator = "sim://coordinator";

const char* BodyName(const proto::Envelope& h) {
  const auto* field = proto::Envelope::descriptor()->FindFieldByNumber(h.body_case());
  return field ? field->name().c_str() : "empty";
}

// What a trace line says of a message beyond its kind.
std::string Detail(const Message& m) {
  const proto::Envelope& h = m.header;
  switch (h.body_case()) {
    case proto::Envelope::kPush:
      return absl::StrCat(" seq ", h.push().seq(), " clock ", h.push().clock(), " keys ", h.push().num_keys(),
                          h.push().resend() ? " resend" : "");
    case proto::Envelope::kPull:
      return absl::StrCat(" clock ", h.pull().clock(), " keys ", h.pull().num_keys());
    case proto::Envelope::kReplicate:
      return absl::StrCat(" position ", h.replicate().position(),
                          h.replicate().has_transfer()
                              ? absl::StrCat(" transfer of shards ", absl::StrJoin(h.replicate().transfer().vshards(), ","))
                              : absl::StrCat(" push ", h.replicate().worker_id(), ":", h.replicate().incarnation(), ":",
                                             h.replicate().seq(), " keys ", h.replicate().num_keys()));
    case proto::Envelope::kReplicateAck:
      return absl::StrCat(" position ", h.replicate_ack().position(),
                          h.replicate_ack().rejected() ? " rejected: " + h.replicate_ack().reason() : "");
    case proto::Envelope::kClockAdvance:
      return absl::StrCat(" clock ", h.clock_advance().clock());
    case proto::Envelope::kError:
      return absl::StrCat(": ", h.error().message());
    case proto::Envelope::kShardsInSync:
      return absl::StrCat(" shards ", absl::StrJoin(h.shards_in_sync().vshards(), ","), " at server ",
                          h.shards_in_sync().backup_rank());
    default:
      return "";
  }
}

class World;

// A process: a node of the cluster with its core and its shell glue.
class Proc {
 public:
  virtual ~Proc() = default;
  virtual void Deliver(Message m, Nanos now) = 0;
  virtual void Tick(Nanos now) = 0;
  std::string address;
  // After the job ended, servers still tick (and take each other's
  // messages) for a while: their streams to backups settle, as they would
  // if the job went on.
  virtual bool TicksAfterExit() const { return false; }
  bool crashed = false;   // killed: its state is gone
  bool exited = false;    // left after the job ended
  bool removed = false;   // a server drained and removed while the job ran: gone (nothing reaches it)
  Nanos paused_until = 0;
};

// The node side of the coordinator protocol is node/session_core.h, the
// core CoordinatorSession wraps: registration, heartbeats, the lease, the
// done report. The simulator makes one per process.
SessionCore MakeSession(proto::Role role, uint32_t rank, const Scenario& sc, Nanos now) {
  SessionCoreOptions o;
  o.role = role;
  o.rank = static_cast<int>(rank);
  o.heartbeat_interval = role == proto::SERVER && sc.server_heartbeat_ns > 0 ? sc.server_heartbeat_ns : sc.heartbeat_ns;
  o.lease = sc.node_lease_ns > 0 ? sc.node_lease_ns : 4 * sc.lease_ns;  // a node's lease on the coordinator
  o.register_retry = 100 * kMs;
  o.coordinator = kCoordinator;
  SessionCore core(o);
  core.StartJoin(now, now + o.connect_timeout);
  return core;
}

// Sends what the session has for the coordinator now.
void SendSession(World* world, const std::string& from, std::vector<proto::Envelope> out, Nanos now);

// An issued push, for the audit checks.
struct IssuedPush {
  uint32_t worker_node = 0;
  uint32_t worker_rank = 0;
  uint32_t incarnation = 0;
  uint64_t seq = 0;
  uint64_t seq_last = 0;  // with transfer parts, each part has its own number: seq..seq_last
  uint64_t clock = 0;
  Nanos issued = 0;
  std::vector<Key> keys;
  bool acked = false;
};

class World {
 public:
  World(uint64_t seed, const Scenario& sc, const RunOptions& options);
  RunResult Run();

  // --- for the processes ---
  void Send(const std::string& from, Outgoing o, Nanos now);
  void SendAll(const std::string& from, std::vector<Outgoing>& out, Nanos now) {
    for (Outgoing& o : out) Send(from, std::move(o), now);
    out.clear();
  }
  void Violation(std::string what) {
    if (violations_.size() < 20) violations_.push_back(std::move(what));
  }
  void NoteMap(const proto::ShardMap& map, Nanos now);
  bool JobRunning() const;
  // The table's width: a column per worker, those that may join included.
  uint32_t Width() const { return sc_.workers + sc_.workers_added; }
  // The coordinator told the servers these workers left: nobody waits for
  // them from now on (for the I1 check).
  void NoteWorkersLeft(const proto::WorkersLeft& left, Nanos now);
  void Trace(Nanos now, const std::string& line) {
    digest_ = Fnv(line, digest_ ^ static_cast<uint64_t>(now));
    if (trace_) *trace_ << absl::StrFormat("%10.3f ms  ", static_cast<double>(now) / kMs) << line << '\n';
  }
  Rng& rng() { return rng_; }
  const Scenario& scenario() const { return sc_; }
  consistency::Recorder& recorder() { return recorder_; }
  std::vector<IssuedPush>& pushes() { return pushes_; }
  // The servers' checkpoints (Scenario::checkpoint_every_ns): one store, as
  // a shared directory is, that outlives every server process.
  CheckpointStore& checkpoints() { return checkpoints_; }
  ScaleResult Scale();  // a scale-mode run
  // The new job from the checkpoints runs (Scenario::restart_from_checkpoints).
  bool second_job() const { return second_job_; }
  // A server of the new job started: what its start restore did (`restore`:
  // null when restore_held was not called) against the store (sim.h).
  void CheckHeldRestore(const std::string& address, uint32_t rank, const proto::ShardMap& map, const ServerCore& core,
                        const std::vector<uint32_t>* asked, const CheckpointRestore* restore);

  // What scale mode measures.
  struct ScaleCounters {
    Nanos published_at = 0;        // the epoch-2 map
    Nanos last_job_ready_at = 0;
    Nanos last_new_map_at = 0;
    std::set<std::string> have_new_map;
    uint64_t map_bytes = 0;
    uint64_t coordinator_msgs = 0, steady_msgs = 0;
    double coordinator_cpu_s = 0, failover_cpu_s = 0, steady_cpu_s = 0;
  } scale_;

 private:
  struct Event {
    Nanos at;
    uint64_t seq;
    std::string from, to;  // deliveries; to = "" for an action
    Message message;
    std::function<void(Nanos)> action;
  };
  struct Later {
    bool operator()(const Event* a, const Event* b) const { return a->at != b->at ? a->at > b->at : a->seq > b->seq; }
  };
  void Push(Nanos at, Event e) {
    e.at = at;
    e.seq = next_seq_++;
    queue_.push(new Event(std::move(e)));
  }
  void At(Nanos at, std::function<void(Nanos)> action) { Push(at, Event{0, 0, "", "", {}, std::move(action)}); }
  void ScheduleTick(Proc* p, Nanos at);
  void ScheduleFaults();
  Proc* Find(const std::string& address) {
    auto it = procs_.find(address);
    return it == procs_.end() ? nullptr : it->second.get();
  }
  bool Cut(const std::string& a, const std::string& b, Nanos now) const;
  void CheckEnd(RunResult& r);
  void CheckAudit(RunResult& r);
  // Whether a checkpoint restore may have lost push `p` to key `k`
  // (CheckpointStore::MayHaveLost): the only acknowledged pushes allowed
  // to be missing.
  bool LostToRestore(const IssuedPush& p, Key k) const {
    return checkpoints_.MayHaveLost(VirtualShardOf(kTable, k, sc_.vshards), k,
                                    {.worker = p.worker_node, .incarnation = p.incarnation, .first = p.seq,
                                     .last = p.seq_last});
  }
  // Pulls never go backwards: a pull issued after another completed sees
  // at least what it saw, per key and column (only in runs without
  // failovers: there an unacknowledged push a pull saw may be lost).
  void CheckMonotonicReads();
  // A server that takes a shard over by a move has at least every value a
  // completed pull of it saw (in runs without failovers, as above).
 public:
  void CheckTakeovers(uint32_t rank, uint64_t old_epoch, const proto::ShardMap& map, const ServerCore& core,
                      Nanos now);
 private:
  bool NoFailovers() const;
  // Server `rank` crashes now; a new process takes the rank at `restart`
  // (if the scenario restarts crashed servers).
  void CrashServer(uint32_t rank, Nanos restart, Nanos now);
  // Scenario::crash_together: that many distinct servers crash within 100 ms of `at`.
  void ScheduleCrashTogether(Nanos at);
  void StartServer(uint32_t rank, Nanos now);
  void StartWorker(uint32_t rank, Nanos now);
  // Delivers events from `now` until the job has ended and drained, the
  // queue is empty or `limit` passes; empties the queue; returns the time.
  Nanos RunEvents(Nanos now, Nanos limit);
  // Scenario::restart_from_checkpoints: the new job, its checks, into `r`.
  void RunSecondJob(RunResult& r, Nanos now);

  const uint64_t seed_;
  const Scenario sc_;
  const RunOptions options_;
  Rng rng_;
  std::unique_ptr<std::ofstream> trace_;
  uint64_t digest_ = 0;
  std::priority_queue<Event*, std::vector<Event*>, Later> queue_;
  uint64_t next_seq_ = 0;
  std::map<std::string, std::unique_ptr<Proc>> procs_;
  std::map<std::pair<std::string, std::string>, Nanos> link_last_;  // in-order delivery per link
  class CoordProc* coordinator_ = nullptr;
  std::vector<class ServerProc*> servers_;   // current process of each rank
  std::vector<uint32_t> server_incarnations_;
  std::vector<class WorkerProc*> workers_;    // current process of each rank
  std::vector<uint32_t> worker_incarnations_;
  // Partitions: between `from` and `until`, no message crosses between
  // the nodes in `side` and the others (peer ""), or between the nodes in
  // `side` and `peer` only.
  struct Partition {
    std::set<std::string> side;
    std::string peer;
    Nanos from, until;
  };
  std::vector<Partition> partitions_;
  std::map<uint64_t, proto::ShardMap> maps_;  // epoch -> the map, as first seen
  std::vector<std::string> violations_;
  consistency::Recorder recorder_;
  std::vector<IssuedPush> pushes_;
  CheckpointStore checkpoints_;
  uint64_t delivered_ = 0, dropped_ = 0;
  Nanos job_end_at_ = 0;
  uint64_t moves_started_ = 0, moves_finished_ = 0;  // by the maps published
  uint64_t servers_drained_ = 0;                     // by the maps published
  bool crashed_mid_move_ = false;
  bool worker_crashed_assembling_ = false;
  bool second_job_ = false;
  std::set<uint32_t> second_job_started_;  // server ranks of the new job that started
  CoordinatorOptions coordinator_options_;
  std::vector<std::unique_ptr<Proc>> graveyard_;  // replaced processes (timers may still point at them)

 public:
  std::string coordinator_state_;  // the coordinator's saved state (its state file)
};

class CoordProc final : public Proc {
 public:
  CoordProc(World* world, const CoordinatorOptions& o, Nanos now = 0)
      : world_(world), core_(o, now), saver_(5 * kSeconds) {
    address = kCoordinator;
  }
  void Deliver(Message m, Nanos now) override { Timed([&] { return core_.Step(m, now); }, now, true); }
  void Tick(Nanos now) override { Timed([&] { return core_.Tick(now); }, now, false); }
  // Drains a server, as tessera-admin drain asks; false if refused.
  bool Drain(uint32_t rank, Nanos now) {
    bool started = false;
    Timed(
        [&] {
          absl::StatusOr<std::vector<Outgoing>> out = core_.Drain(rank, now);
          started = out.ok();
          return out.ok() ? *std::move(out) : std::vector<Outgoing>{};
        },
        now, false);
    return started;
  }
  // Starts moving a shard, as the rebalancer would; false if refused.
  bool Move(uint32_t vshard, uint32_t to, Nanos now) {
    bool started = false;
    Timed(
        [&] {
          absl::StatusOr<std::vector<Outgoing>> out = core_.StartMove(vshard, to, now, "the simulator");
          started = out.ok();
          return out.ok() ? *std::move(out) : std::vector<Outgoing>{};
        },
        now, false);
    return started;
  }
  const CoordinatorCore& core() const { return core_; }
  CoordinatorCore& mutable_core() { return core_; }

 private:
  // Runs a step of the core and, for scale mode, counts it and its CPU time
  // (read only into the results: nothing in the run depends on it).
  template <typename F>
  void Timed(F&& step, Nanos now, bool message) {
    const uint64_t maps_before = core_.stats().maps_published;
    const auto start = std::chrono::steady_clock::now();
    std::vector<Outgoing> out = step();
    const double cpu = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    auto& sc = world_->scale_;
    sc.coordinator_cpu_s += cpu;
    const Scenario& scenario = world_->scenario();
    if (scenario.scale_crash_at_ns > 0 && now >= scenario.scale_crash_at_ns / 3 && now < scenario.scale_crash_at_ns) {
      sc.steady_cpu_s += cpu;
      if (message) ++sc.steady_msgs;
    }
    if (message) ++sc.coordinator_msgs;
    if (core_.stats().maps_published > maps_before) sc.failover_cpu_s = std::max(sc.failover_cpu_s, cpu);
    // Write-ahead, as the shell does: the state these messages follow from
    // is saved before they leave (only where the coordinator may crash).
    if (scenario.coordinator_crashes > 0) {
      if (std::optional<std::string> due = saver_.Due(core_, now)) {
        world_->coordinator_state_ = std::move(*due);
        saver_.Written(now);
      }
    }
    Emit(std::move(out), now);
  }
  void Emit(std::vector<Outgoing> out, Nanos now) {
    for (const Outgoing& o : out) {
      if (o.message.header.has_job_ready()) world_->NoteMap(o.message.header.job_ready().shard_map(), now);
      if (o.message.header.has_shard_map_update()) world_->NoteMap(o.message.header.shard_map_update().shard_map(), now);
      if (o.message.header.has_workers_left()) world_->NoteWorkersLeft(o.message.header.workers_left(), now);
    }
    world_->SendAll(address, out, now);
  }
  World* world_;
  CoordinatorCore core_;
  CoordinatorStateSaver saver_;
};

bool World::JobRunning() const { return !coordinator_->core().finished(); }

class ServerProc final : public Proc {
 public:
  ServerProc(World* world, uint32_t rank, uint32_t incarnation, Nanos now)
      : world_(world),
        rank_(rank),
        session_(MakeSession(proto::SERVER, rank, world->scenario(), now)),
        node_(ServerNodeCore::Options{.core = CoreOptions(world->scenario()),
                                      .restore_held = world->second_job() ? RestoreHeld() : nullptr,
                                      .restore_lost = RestoreLost()}) {
    address = absl::StrCat("sim://server-", rank, ".", incarnation);
    session_.set_heartbeat_filler([this](proto::Heartbeat* hb) {
      if (node_.core()) node_.core()->FillHeartbeat(hb);
    });
  }

  void Deliver(Message m, Nanos now) override {
    now_ = now;
    if (m.header.has_shard_map_update()) {
      const proto::ShardMap& map = m.header.shard_map_update().shard_map();
      const uint64_t before = node_.core() ? node_.core()->epoch() : 0;
      ServerNodeCore::MapChange change = node_.UpdateMap(m.header.shard_map_update(), rank_, now);
      if (change.kept) return;
      if (!change.error.ok()) {
        world_->Violation(absl::StrCat(address, " refused a map from the coordinator: ", change.error.message()));
        return;
      }
      if (change.newer) world_->CheckTakeovers(rank_, before, map, *node_.core(), now);
      session_.set_map_epoch(node_.core()->epoch());
      After(change.out, now);
      return;
    }
    if (session_.Handle(m, now)) {
      if (session_.registered() && session_.ready() && !node_.core()) Start(now);
      if (session_.ended()) Exit();
      return;
    }
    ServerNodeCore::Output out = node_.Receive(std::move(m), now);
    if (node_.core()) {
      After(out, now);
    } else {
      world_->SendAll(address, out.sends, now);  // refused: the queue before the start is full
    }
  }

  void Tick(Nanos now) override {
    if (!exited) SendSession(world_, address, session_.Tick(now), now);
    if (session_.register_error()) exited = true;
    if (session_.ended()) Exit();
    if (node_.core()) {
      ServerNodeCore::Output out = node_.Tick(now);
      After(out, now);
    }
    const Nanos every = world_->scenario().checkpoint_every_ns;
    if (every > 0 && !exited && node_.core() && now >= next_checkpoint_ && !world_->second_job()) {
      next_checkpoint_ = now + every;
      WriteCheckpoint(now);
    }
  }

  const ServerCore* core() const { return node_.core(); }
  uint32_t rank() const { return rank_; }
  bool TicksAfterExit() const override { return true; }
  // The coordinator told it to stop: the job ended, or it was drained and
  // removed while the job runs (then it is gone at once, as the process is).
  void Exit() {
    if (!exited && world_->JobRunning()) removed = true;
    exited = true;
  }

 private:
  static ServerCoreOptions CoreOptions(const Scenario& sc) {
    ServerCoreOptions o;
    o.apply_after_ack = sc.apply_after_ack;
    o.audit = true;
    o.testing.answer_early = sc.breakage == Breakage::kAnswerEarly;
    o.testing.apply_duplicates = sc.breakage == Breakage::kApplyDuplicates;
    o.testing.ack_before_replication = sc.breakage == Breakage::kAckBeforeReplication;
    o.testing.accept_old_epoch = sc.breakage == Breakage::kAcceptOldEpoch;
    o.testing.read_during_move = sc.breakage == Breakage::kReadDuringMove;
    o.testing.join_at_zero = sc.breakage == Breakage::kJoinAtZero;
    if (sc.disk_tier_rows > 0) {
      o.disk_tiers = [](uint32_t, uint32_t row_floats) -> absl::StatusOr<std::unique_ptr<ColdRows>> {
        return std::make_unique<MemoryColdRows>(row_floats);
      };
    }
    return o;
  }

  // As ServerNode::WriteCheckpointNow: the pending updates made, then the
  // shards it leads (none when deposed or a fresh backup: nothing written).
  void WriteCheckpoint(Nanos now) {
    ServerCore* core = node_.core();
    if (core->deposed()) return;
    node_.ApplyPending();
    ShardSnapshot snapshot = core->SnapshotPrimaryShards();
    if (snapshot.vshards.empty()) return;
    const std::string shards = absl::StrJoin(snapshot.vshards, ",");
    const uint64_t epoch = snapshot.epoch;
    const std::string name = world_->checkpoints().Write(std::move(snapshot), now);
    world_->Trace(now, absl::StrCat(address, " wrote ", name, ": shards ", shards, ", map epoch ", epoch));
  }

  // ServerNodeCore's restore_lost with checkpoints: the newest copies in the
  // World's store, as the shell reads them from its directory.
  ServerNodeCore::RestoreFn RestoreLost() {
    if (world_->scenario().checkpoint_every_ns == 0) return nullptr;
    return [this](ServerCore& core, const std::vector<uint32_t>& vshards, bool with_windows,
                  const std::map<uint32_t, uint64_t>& last) {
      const bool oldest = world_->scenario().breakage == Breakage::kRestoreOldest;
      CheckpointRestore r = world_->checkpoints().Restore(core, vshards, with_windows, last, now_, oldest);
      world_->Trace(now_, absl::StrCat(address, " ", r.line));
      return r.line;
    };
  }

  // A new job's restore_held with checkpoints, as ServerNode::Serve sets it
  // for --restore-from at the first start: the newest copies in the World's
  // store (the results kept for CheckHeldRestore).
  ServerNodeCore::RestoreFn RestoreHeld() {
    return [this](ServerCore& core, const std::vector<uint32_t>& vshards, bool with_windows,
                  const std::map<uint32_t, uint64_t>&) {
      if (with_windows) world_->Violation(address + ": the start restore asked for de-duplication windows");
      const bool oldest = world_->scenario().breakage == Breakage::kRestoreHeldOldest;
      held_asked_ = vshards;
      held_ = world_->checkpoints().RestoreHeld(core, vshards, oldest);
      world_->Trace(now_, absl::StrCat(address, " ", held_->line));
      return held_->line;
    };
  }

  void Start(Nanos now) {
    now_ = now;
    std::string line;
    auto out = node_.Start(*session_.ready(), session_.self().node_id(), session_.self().rank(), now, &line);
    if (!out.ok()) {
      world_->Violation(absl::StrCat(address, " refused its first map: ", out.status().message()));
      return;
    }
    if (world_->second_job()) {
      world_->CheckHeldRestore(address, rank_, session_.ready()->shard_map(), *node_.core(),
                               held_ ? &held_asked_ : nullptr, held_ ? &*held_ : nullptr);
      if (held_ && line != held_->line) world_->Violation(address + ": Start reported another restore line");
    }
    if (!out->refused_map.ok()) {
      world_->Violation(absl::StrCat(address, " refused a map from the coordinator: ", out->refused_map.message()));
    }
    After(*out, now);
  }

  // Sends `out`, tells the coordinator of finished state transfers, makes
  // pending updates, and checks that the epoch never went back.
  void After(ServerNodeCore::Output& out, Nanos now) {
    world_->SendAll(address, out.sends, now);
    for (proto::ShardsInSync& s : out.in_sync) {
      Message m;
      m.header.set_sender_id(session_.self().node_id());
      *m.header.mutable_shards_in_sync() = std::move(s);
      world_->Send(address, Outgoing{kCoordinator, std::move(m)}, now);
    }
    node_.ApplyPending();
    const uint64_t epoch = node_.core()->epoch();
    if (epoch < last_epoch_) {
      world_->Violation(absl::StrCat(address, ": map epoch went back from ", last_epoch_, " to ", epoch));
    }
    last_epoch_ = epoch;
  }

  World* world_;
  const uint32_t rank_;
  SessionCore session_;
  ServerNodeCore node_;
  uint64_t last_epoch_ = 0;
  Nanos now_ = 0;              // of the step being delivered (for restore_lost)
  std::vector<uint32_t> held_asked_;        // the start restore: the shards asked for
  std::optional<CheckpointRestore> held_;   // and what it did
  Nanos next_checkpoint_ = 0;  // as the shell's tick thread: the first tick after the start writes one
};

class WorkerProc final : public Proc {
 public:
  WorkerProc(World* world, uint32_t rank, uint32_t process, Nanos now)
      : world_(world),
        rank_(rank),
        session_(MakeSession(proto::WORKER, rank, world->scenario(), now)),
        node_(WorkerCoreOptions{.request_timeout = 60 * kSeconds, .hold_timeout = 120 * kSeconds,
                                .resend_after = kResendAfter, .part_bytes = world->scenario().part_bytes,
                                .max_bytes_in_flight_per_server = world->scenario().max_bytes_in_flight}) {
    address = process == 0 ? absl::StrCat("sim://worker-", rank) : absl::StrCat("sim://worker-", rank, ".", process);
  }

  void Deliver(Message m, Nanos now) override {
    if (m.header.has_shard_map_update()) {
      if (!core_) return;
      const uint64_t before = core_->map()->epoch();
      WorkerNodeCore::MapChange change = node_.UpdateMap(m.header.shard_map_update(), now);
      Apply(std::move(change.effects), now);
      if (core_->map()->epoch() < before) world_->Violation(address + ": map epoch went back");
      if (change.newer) session_.set_map_epoch(change.epoch);
      return;
    }
    if (session_.Handle(m, now)) {
      if (session_.registered() && session_.ready() && !core_) Start(now);
      if (session_.ended()) End(now);
      return;
    }
    if (core_) Apply(core_->OnReply(std::move(m), now), now);
  }

  void Tick(Nanos now) override {
    SendSession(world_, address, session_.Tick(now), now);
    if (session_.ended() || session_.register_error()) End(now);
    if (exited) return;
    if (core_) Apply(core_->Tick(now), now);
    if (done_at_ != 0 && now >= done_at_) {
      done_at_ = 0;
      finished_ = true;
      SendSession(world_, address, {session_.ReportDone(proto::WorkerDone{}, now, now + 60 * kSeconds)}, now);
    }
    if (think_until_ != 0 && now >= think_until_) {
      think_until_ = 0;
      IssueClock(now);
    }
  }

  // Operations not completed (for the hang check).
  std::vector<std::string> Outstanding() const {
    std::vector<std::string> v;
    for (const auto& [serial, op] : ops_) v.push_back(absl::StrCat(op->what, " (issued at ", op->issued / kMs, " ms)"));
    return v;
  }
  bool finished() const { return finished_; }
  // A worker that joined the running job has its start clock everywhere.
  void Joined(Nanos now) {
    if (!joining_) return;
    joining_ = false;
    world_->recorder().Add(consistency::JoinEvent{rank_, clock_, now});
    world_->Trace(now, absl::StrCat(address, " joined the running job at clock ", clock_));
  }
  // A clock announced whose call never returned still counts for the others.
  void RecordUnreturnedClock() {
    if (clock_pending_) world_->recorder().Add(consistency::ClockEvent{rank_, clock_ + 1, clock_called_, consistency::kNotReturned});
    clock_pending_ = false;
  }
  const std::string& failure() const { return failure_; }
  uint32_t node_id() const { return session_.self().node_id(); }
  uint32_t rank() const { return rank_; }

 private:
  enum class Kind { kClockQuery, kReannounce, kCreate, kPush, kPull, kClock };
  struct Op {
    uint64_t serial;
    Kind kind;
    std::string what;
    Nanos issued;
    uint64_t clock;
    std::vector<Key> keys;
    std::vector<float> values;  // pushes
    std::vector<float> out;     // pulls
    size_t push_index = 0;      // into world.pushes()
  };

  void Start(Nanos now) {
    const absl::Status started =
        node_.Start(*session_.ready(), session_.self(), session_.joined_running_job(), address);
    if (!started.ok()) {
      world_->Violation(absl::StrCat(address, ": bad first map: ", started.message()));
      return;
    }
    core_ = node_.core();
    if (world_->scenario().scale_crash_at_ns > 0) return;  // scale mode: membership only
    if (world_->second_job()) {  // the new job from checkpoints: done a second later (every server started)
      done_at_ = now + kSeconds;
      return;
    }
    if (node_.start_kind() != WorkerNodeCore::StartKind::kFresh) {
      // A worker that joined the running job (the servers start it at their
      // fastest worker's clock) or a replacement (the clock the servers know
      // for this rank) resumes there, as the Worker shell does.
      joining_ = node_.start_kind() == WorkerNodeCore::StartKind::kJoin;
      auto op = NewOp(Kind::kClockQuery, joining_ ? "clock query (joining)" : "clock query", now);
      Apply(node_.QueryClock(op, now), now);
      return;
    }
    CreateTable(now);
  }

  void CreateTable(Nanos now) {
    const Scenario& sc = world_->scenario();
    proto::TableConfig c;
    c.set_table_id(kTable);
    c.set_name("sim");
    c.set_width(sc.workers + sc.workers_added);  // a column for a worker that joins, too
    c.set_kind(proto::SPARSE);
    c.set_optimizer(proto::ACCUMULATE);
    c.set_consistency(sc.consistency);
    c.set_staleness(sc.consistency == proto::SSP ? sc.staleness : 0);
    if (sc.disk_tier_rows > 0) {
      c.set_disk_tier(true);
      c.set_memory_budget_bytes(1);  // (a budget's recency records count in RowBytes)
      const uint64_t row_bytes = Table::RowBytes(c);
      c.set_memory_budget_bytes(sc.disk_tier_rows * row_bytes + row_bytes / 2);
    }
    auto op = NewOp(Kind::kCreate, "create table", now);
    Apply(core_->CreateTable(op, c, now), now);
  }

  std::shared_ptr<Op> NewOp(Kind kind, std::string what, Nanos now) {
    auto op = std::make_shared<Op>();
    op->serial = next_serial_++;
    op->kind = kind;
    op->what = std::move(what);
    op->issued = now;
    op->clock = clock_;
    ops_[op->serial] = op;
    return op;
  }

  std::vector<Key> RandomKeys() {
    std::vector<Key> keys;
    const uint32_t n = world_->scenario().keys;
    if (const double s = world_->scenario().zipf; s > 0) {
      double total = 0;
      for (uint32_t k = 0; k < n; ++k) total += std::pow(k + 1.0, -s);
      for (int draw = 0; draw < 8; ++draw) {
        double u = static_cast<double>(world_->rng().Below(uint64_t{1} << 53)) / static_cast<double>(uint64_t{1} << 53) * total;
        Key k = 0;
        for (; k + 1 < n; ++k) {
          u -= std::pow(k + 1.0, -s);
          if (u < 0) break;
        }
        if (std::find(keys.begin(), keys.end(), k) == keys.end()) keys.push_back(k);
      }
      std::sort(keys.begin(), keys.end());
      return keys;
    }
    for (uint32_t k = 0; k < n; ++k)
      if (world_->rng().Below(3) == 0) keys.push_back(k);
    if (keys.empty()) keys.push_back(world_->rng().Below(n));
    return keys;
  }

  // One clock's pushes and pull, all in flight together.
  void IssueStep(Nanos now) {
    const uint32_t W = world_->scenario().workers + world_->scenario().workers_added;
    const int pushes = 1 + static_cast<int>(world_->rng().Below(3));
    for (int p = 0; p < pushes; ++p) {
      auto op = NewOp(Kind::kPush, absl::StrCat("push at clock ", clock_), now);
      op->keys = RandomKeys();
      op->values.assign(op->keys.size() * W, 0.0f);
      for (size_t i = 0; i < op->keys.size(); ++i) op->values[i * W + rank_] = 1.0f;
      const uint64_t seq_before = core_->last_push_seq();
      const int32_t priority =  // (only with a bound: other runs keep their random stream)
          world_->scenario().max_bytes_in_flight > 0 ? static_cast<int32_t>(world_->rng().Below(3)) : 0;
      auto effects = core_->Push(op, kTable, op->keys, op->values, W, clock_, nullptr, now, op->what, priority,
                                 /*row_pieces=*/true);  // ACCUMULATE: rows wider than part_bytes go in pieces
      if (!effects.ok()) {
        world_->Violation(absl::StrCat(address, ": push refused: ", effects.status().message()));
        continue;
      }
      op->push_index = world_->pushes().size();
      world_->pushes().push_back(IssuedPush{.worker_node = node_id(),
                                            .worker_rank = rank_,
                                            .incarnation = session_.self().incarnation(),
                                            .seq = seq_before + 1,
                                            .seq_last = core_->last_push_seq(),
                                            .clock = clock_,
                                            .issued = now,
                                            .keys = op->keys});
      Apply(std::move(*effects), now);
    }
    auto op = NewOp(Kind::kPull, absl::StrCat("pull at clock ", clock_), now);
    op->keys = RandomKeys();
    op->out.assign(op->keys.size() * W, -1.0f);
    Apply(core_->Pull(op, kTable, op->keys, op->out, W, clock_, now, op->what), now);
  }

  void IssueClock(Nanos now) {
    if (!node_.ClockWaits()) {  // every table ASP: a notice, no answer
      clock_called_ = now;
      std::vector<Outgoing> out = core_->ClockNotice(clock_ + 1);
      world_->SendAll(address, out, now);
      ClockReturned(now);
      return;
    }
    clock_called_ = now;
    clock_pending_ = true;
    auto op = NewOp(Kind::kClock, absl::StrCat("clock ", clock_ + 1), now);
    Apply(core_->ClockAdvance(op, clock_ + 1, now), now);
  }

  void ClockReturned(Nanos now) {
    clock_pending_ = false;
    ++clock_;
    world_->recorder().Add(consistency::ClockEvent{rank_, clock_, clock_called_, now});
    if (clock_ >= world_->scenario().clocks) {
      finished_ = true;
      world_->recorder().Add(consistency::FinishEvent{rank_, now});
      proto::WorkerDone done;
      done.set_steps(clock_);
      SendSession(world_, address, {session_.ReportDone(done, now, now + 60 * kSeconds)}, now);
      return;
    }
    IssueStep(now);
  }

  void Apply(WorkerCore::Effects effects, Nanos now) {
    world_->SendAll(address, effects.sends, now);
    // Completions in the order the operations were issued: the same in
    // every process whatever order the core found them in.
    std::vector<std::pair<uint64_t, absl::Status>> done;
    for (auto& c : effects.done) done.emplace_back(static_cast<Op*>(c.handle.get())->serial, std::move(c.status));
    std::sort(done.begin(), done.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
    for (auto& [serial, status] : done) Complete(serial, status, now);
  }

  void Complete(uint64_t serial, const absl::Status& status, Nanos now) {
    auto it = ops_.find(serial);
    if (it == ops_.end()) {
      world_->Violation(absl::StrCat(address, ": operation ", serial, " completed twice"));
      return;
    }
    std::shared_ptr<Op> op = it->second;
    ops_.erase(it);
    if (!status.ok()) {
      if (failure_.empty()) failure_ = absl::StrCat(op->what, ": ", status.message());
      if (!exited) End(now);
      return;
    }
    if (exited) return;
    switch (op->kind) {
      case Kind::kClockQuery: {
        // Resume at the servers' clock, announced again everywhere (at 0
        // there is nothing to announce: the announcement completes at once).
        clock_ = node_.resume_clock();
        auto again = NewOp(Kind::kReannounce, absl::StrCat("clock ", clock_, " again"), now);
        Apply(node_.AnnounceClock(again, now), now);
        return;
      }
      case Kind::kReannounce:
        Joined(now);
        CreateTable(now);
        return;
      case Kind::kCreate:
        node_.TableCreated(world_->scenario().consistency);
        IssueStep(now);
        return;
      case Kind::kPush:
        world_->pushes()[op->push_index].acked = true;
        break;
      case Kind::kPull: {
        std::vector<uint32_t> keys32(op->keys.begin(), op->keys.end());
        world_->recorder().Add(consistency::PullEvent{rank_, op->clock, keys32, op->out, op->issued, now});
        break;
      }
      case Kind::kClock:
        ClockReturned(now);
        return;
    }
    // The step's pushes and pull are all in: think, then Clock.
    bool step_open = false;
    for (const auto& [s, o] : ops_) step_open |= o->kind == Kind::kPush || o->kind == Kind::kPull;
    if (!step_open && !finished_) {
      const Nanos think = static_cast<Nanos>(world_->rng().Below(10 * kMs)) * (rank_ == 0 ? 3 : 1);
      think_until_ = std::max<Nanos>(now + think, 1);
    }
  }

  // The process leaves: its operations fail (the job ended, or one failed).
  void End(Nanos now) {
    if (exited) return;
    exited = true;
    if (core_) {
      const absl::Status why = session_.ended() && !session_.ended()->ok() ? *session_.ended()
                                                                           : absl::CancelledError("worker left");
      Apply(core_->FailAll(why), now);
    }
  }

  World* world_;
  const uint32_t rank_;
  SessionCore session_;
  WorkerNodeCore node_;         // start, clock resume, map updates (worker/worker_node_core.h)
  WorkerCore* core_ = nullptr;  // node_'s core, once started
  std::map<uint64_t, std::shared_ptr<Op>> ops_;
  uint64_t next_serial_ = 1;
  uint64_t clock_ = 0;
  Nanos clock_called_ = 0;
  Nanos think_until_ = 0;
  Nanos done_at_ = 0;  // the new job from checkpoints: report done then
  bool clock_pending_ = false;
  bool finished_ = false;
  bool joining_ = false;  // joined the running job; its start clock not yet announced
  std::string failure_;
};

World::World(uint64_t seed, const Scenario& sc, const RunOptions& options)
    : seed_(seed), sc_(sc), options_(options), rng_(seed ^ 0x5eed5eed5eedULL) {
  if (!options.trace_path.empty()) {
    trace_ = std::make_unique<std::ofstream>(options.trace_path);
    *trace_ << "# tessera-sim seed " << seed << ": " << sc.Describe() << '\n';
  }
}

void SendSession(World* world, const std::string& from, std::vector<proto::Envelope> out, Nanos now) {
  for (proto::Envelope& h : out) {
    Message m;
    m.header = std::move(h);
    world->Send(from, Outgoing{kCoordinator, std::move(m)}, now);
  }
}

// Primaries, dead ranks and backups of a map, for traces and comparisons.
std::string Placement(const proto::ShardMap& map) {
  std::string placement = absl::StrCat(absl::StrJoin(map.vshard_server_rank(), ","), " dead ",
                                       absl::StrJoin(map.dead_server_ranks(), ","));
  for (const auto& b : BackupListsOf(map)) absl::StrAppend(&placement, " [", absl::StrJoin(b, ","), "]");
  for (int i = 0; i < map.moving_vshards_size() && i < map.moving_to_size(); ++i)
    absl::StrAppend(&placement, " moving ", map.moving_vshards(i), "->", map.moving_to(i));
  return placement;
}

void World::NoteWorkersLeft(const proto::WorkersLeft& left, Nanos now) {
  // (By the coordinator's records: a worker may die before it learns its id.)
  const auto& nodes = coordinator_->core().nodes();
  for (uint32_t id : left.worker_node_ids()) {
    auto it = nodes.find(id);
    if (it != nodes.end() && it->second.info.role() == proto::WORKER) {
      recorder_.Add(consistency::FinishEvent{it->second.info.rank(), now});
    }
  }
}

void World::NoteMap(const proto::ShardMap& map, Nanos now) {
  auto [it, inserted] = maps_.emplace(map.epoch(), map);
  if (inserted) {
    Trace(now, absl::StrCat("map epoch ", map.epoch(), ": primaries ", Placement(map)));
    if (map.epoch() == 2 && scale_.published_at == 0) scale_.published_at = now;
    scale_.map_bytes = std::max<uint64_t>(scale_.map_bytes, map.ByteSizeLong());
    if (auto prev = maps_.find(map.epoch() - 1); prev != maps_.end()) {
      for (uint32_t v : map.moving_vshards())
        if (MovingTo(prev->second, v) == ShardMapView::kNotMoving) ++moves_started_;
      auto view = ShardMapView::Create(map);
      for (int i = 0; view.ok() && i < prev->second.moving_vshards_size(); ++i) {
        const uint32_t v = prev->second.moving_vshards(i), to = prev->second.moving_to(i);
        const uint32_t from = MovingFrom(prev->second, v);
        if (MovingTo(map, v) != ShardMapView::kNotMoving) continue;
        const bool switched = map.vshard_server_rank(static_cast<int>(v)) == to;
        const bool handed_over = from != prev->second.vshard_server_rank(static_cast<int>(v)) &&
                                 view->Holds(to, v) && !view->Holds(from, v);  // a backup's copy
        if (switched || handed_over) ++moves_finished_;
      }
      // A drained server is removed only once it holds nothing.
      for (uint32_t r : prev->second.draining_server_ranks()) {
        if (IsDraining(map, r) || std::find(map.dead_server_ranks().begin(), map.dead_server_ranks().end(), r) ==
                                      map.dead_server_ranks().end())
          continue;
        ++servers_drained_;
        if (CopiesHeldBy(prev->second, r) > 0 && NoFailovers()) {
          Violation(absl::StrCat("server ", r, " was removed at map epoch ", map.epoch(), " holding ",
                                 CopiesHeldBy(prev->second, r), " shard copies"));
        }
      }
    }
  } else if (Placement(it->second) != Placement(map)) {
    Violation(absl::StrCat("two different shard maps for epoch ", map.epoch(), ": ", Placement(it->second), " and ",
                           Placement(map)));
  }
  if (inserted && std::prev(maps_.end())->first != map.epoch()) {
    Violation(absl::StrCat("map epoch ", map.epoch(), " published after epoch ", std::prev(maps_.end())->first));
  }
}

bool World::Cut(const std::string& a, const std::string& b, Nanos now) const {
  for (const Partition& p : partitions_) {
    if (now < p.from || now >= p.until) continue;
    if (p.peer.empty() ? p.side.contains(a) != p.side.contains(b)
                       : (p.side.contains(a) && b == p.peer) || (a == p.peer && p.side.contains(b))) {
      return true;
    }
  }
  return false;
}

void World::Send(const std::string& from, Outgoing o, Nanos now) {
  o.message.header.set_sender_address(from);
  if (sc_.checkpoint_every_ns > 0) checkpoints_.NoteSend(from, o.to, o.message, now);  // pushes and their acks
  // A wire copy: the receiver never sees the sender's memory.
  for (Buffer& f : o.message.frames) {
    Buffer copy = Buffer::Allocate(f.size());
    if (f.size() > 0) std::memcpy(copy.mutable_data(), f.data(), f.size());
    f = std::move(copy);
  }
  const int copies = rng_.Chance(sc_.duplicate) ? 2 : 1;
  for (int i = 0; i < copies; ++i) {
    if (rng_.Chance(sc_.drop) || Cut(from, o.to, now)) {
      ++dropped_;
      Trace(now, absl::StrCat("drop ", from, " -> ", o.to, " ", BodyName(o.message.header), " req ",
                              o.message.header.request_id()));
      continue;
    }
    Nanos at = now + rng_.Between(sc_.min_delay_ns, sc_.max_delay_ns);
    Nanos& last = link_last_[{from, o.to}];
    if (i == 1) {
      at += rng_.Between(0, kLateDuplicate);  // a duplicate comes late, out of order
    } else {
      if (rng_.Chance(sc_.reorder)) {
        at += rng_.Between(0, kLateReordered);  // held up: later messages on its link overtake it
      } else {
        at = std::max(at, last);  // in order on its link
      }
      last = std::max(last, at);
    }
    Event e{0, 0, from, o.to, i + 1 < copies ? o.message : std::move(o.message), nullptr};
    Push(at, std::move(e));
  }
}

void World::ScheduleTick(Proc* p, Nanos at) {
  At(at, [this, p](Nanos now) {
    if (p->crashed || p->removed || (p->exited && !p->TicksAfterExit())) return;
    if (now < p->paused_until) {
      ScheduleTick(p, p->paused_until);
      return;
    }
    p->Tick(now);
    ScheduleTick(p, now + kTickEvery);
  });
}

void World::StartServer(uint32_t rank, Nanos now) {
  const uint32_t incarnation = server_incarnations_[rank]++;
  auto proc = std::make_unique<ServerProc>(this, rank, incarnation, now);
  ServerProc* p = proc.get();
  servers_[rank] = p;
  Trace(now, absl::StrCat("start ", p->address));
  procs_[p->address] = std::move(proc);
  ScheduleTick(p, now + rng_.Below(kTickEvery));
}

void World::StartWorker(uint32_t rank, Nanos now) {
  const uint32_t process = worker_incarnations_[rank]++;
  auto proc = std::make_unique<WorkerProc>(this, rank, process, now);
  WorkerProc* p = proc.get();
  if (rank == workers_.size()) workers_.push_back(nullptr);  // a worker that joins the running job
  workers_[rank] = p;
  if (process > 0) Trace(now, absl::StrCat("start ", p->address));
  procs_[p->address] = std::move(proc);
  ScheduleTick(p, now + rng_.Below(kTickEvery));
}

void World::ScheduleFaults() {
  if (sc_.scale_crash_at_ns > 0) {
    At(sc_.scale_crash_at_ns, [this](Nanos now) {
      servers_[0]->crashed = true;
      Trace(now, "crash " + servers_[0]->address);
    });
    return;
  }
  // Faults land while the workers work: between 30 ms and about the time
  // the job takes without faults.
  const Nanos span = static_cast<Nanos>(sc_.clocks) * 15 * kMs;
  auto when = [&] { return 30 * kMs + static_cast<Nanos>(rng_.Below(static_cast<uint64_t>(span))); };
  for (uint32_t i = 0; i < sc_.server_crashes; ++i) {
    const Nanos at = when();
    const uint32_t rank = static_cast<uint32_t>(rng_.Below(sc_.servers));
    const Nanos restart = at + sc_.lease_ns + 100 * kMs + static_cast<Nanos>(rng_.Below(2 * sc_.lease_ns));
    At(at, [this, rank, restart](Nanos now) { CrashServer(rank, restart, now); });
  }
  for (uint32_t i = 0; i < sc_.pauses; ++i) {
    const Nanos at = when();
    const Nanos length = static_cast<Nanos>(rng_.Below(2 * sc_.lease_ns));
    const uint64_t pick = rng_.Below(sc_.servers + sc_.workers);
    At(at, [this, pick, length](Nanos now) {
      Proc* p = pick < sc_.servers ? static_cast<Proc*>(servers_[pick]) : workers_[pick - sc_.servers];
      p->paused_until = std::max(p->paused_until, now + length);
      Trace(now, absl::StrCat("pause ", p->address, " for ", length / kMs, " ms"));
    });
  }
  for (uint32_t i = 0; i < sc_.partitions; ++i) {
    const Nanos at = when();
    const uint64_t pick = rng_.Below(sc_.servers + sc_.workers);
    const bool from_coordinator_only = rng_.Chance(0.5);  // it still reaches its peers
    // Servers for up to two leases (long enough to fail over); workers cut
    // from the coordinator only for less than a lease (they miss maps and
    // stay in the job).
    const Nanos length = static_cast<Nanos>(
        rng_.Below(pick >= sc_.servers && from_coordinator_only ? sc_.lease_ns * 4 / 5 : 2 * sc_.lease_ns));
    // Or two sets of nodes, the coordinator on either side: a non-empty
    // proper subset of the servers, the workers and the coordinator (bit
    // i: node i in that order) cannot reach the rest.
    const uint32_t nodes = sc_.servers + sc_.workers + 1;
    const uint64_t split = !from_coordinator_only && rng_.Chance(0.5) ? 1 + rng_.Below((uint64_t{1} << nodes) - 2) : 0;
    At(at, [this, pick, length, from_coordinator_only, split, nodes](Nanos now) {
      auto node = [&](uint64_t i) -> Proc* {
        return i < sc_.servers                ? static_cast<Proc*>(servers_[i])
               : i < sc_.servers + sc_.workers ? static_cast<Proc*>(workers_[i - sc_.servers])
                                               : static_cast<Proc*>(coordinator_);
      };
      if (split != 0) {
        Partition cut{{}, "", now, now + length};
        for (uint32_t i = 0; i < nodes; ++i)
          if (split >> i & 1) cut.side.insert(node(i)->address);
        Trace(now, absl::StrCat("partition {", absl::StrJoin(cut.side, " "), "} from the rest for ", length / kMs,
                                " ms"));
        partitions_.push_back(std::move(cut));
        return;
      }
      Proc* p = node(pick);
      partitions_.push_back({{p->address}, from_coordinator_only ? kCoordinator : "", now, now + length});
      Trace(now, absl::StrCat("partition ", p->address, " from ", from_coordinator_only ? "the coordinator" : "everyone",
                              " for ", length / kMs, " ms"));
    });
  }
  for (uint32_t i = 0; i < sc_.coordinator_crashes; ++i) {
    const Nanos at = when();
    const Nanos restart = at + rng_.Between(100 * kMs, 1500 * kMs);
    At(at, [this, restart](Nanos now) {
      if (coordinator_->crashed || coordinator_->core().finished()) return;
      coordinator_->crashed = true;
      Trace(now, "crash " + coordinator_->address);
      At(restart, [this](Nanos t) {
        auto next = std::make_unique<CoordProc>(this, coordinator_options_, t);
        proto::CoordinatorState state;
        if (!state.ParseFromString(coordinator_state_)) {
          Violation("the coordinator's saved state does not parse");
        } else if (absl::Status s = next->mutable_core().RestoreState(state, t, "the saved state"); !s.ok()) {
          Violation(absl::StrCat("a new coordinator cannot take the job over: ", s.message()));
        }
        Trace(t, absl::StrCat("restart the coordinator from its saved state (map epoch ",
                              next->core().shard_map().epoch(), ")"));
        graveyard_.push_back(std::move(procs_[kCoordinator]));
        coordinator_ = next.get();
        procs_[kCoordinator] = std::move(next);
        ScheduleTick(coordinator_, t + kTickEvery);
      });
    });
  }
  for (uint32_t i = 0; i < sc_.servers_added; ++i) {
    const uint32_t rank = sc_.servers + i;
    At(when(), [this, rank](Nanos now) {
      if (coordinator_->core().phase() == CoordinatorCore::Phase::kRunning) StartServer(rank, now);
    });
  }
  for (uint32_t i = 0; i < sc_.workers_added; ++i) {
    const uint32_t rank = sc_.workers + i;
    At(when(), [this, rank](Nanos now) {
      if (coordinator_->core().phase() == CoordinatorCore::Phase::kRunning && workers_.size() == rank) {
        Trace(now, absl::StrCat("start worker ", rank, " (joins the running job)"));
        StartWorker(rank, now);
      }
    });
  }
  for (uint32_t i = 0; i < sc_.drains; ++i) {
    const uint32_t rank = static_cast<uint32_t>(rng_.Below(sc_.servers + sc_.servers_added));
    At(when(), [this, rank](Nanos now) {
      if (coordinator_->crashed || coordinator_->core().phase() != CoordinatorCore::Phase::kRunning) return;
      if (coordinator_->Drain(rank, now)) Trace(now, absl::StrCat("drain server ", rank));
    });
  }
  for (uint32_t i = 0; i < sc_.moves; ++i) {
    const Nanos at = when();
    const uint32_t vshard = static_cast<uint32_t>(rng_.Below(sc_.vshards));
    const uint32_t to = static_cast<uint32_t>(rng_.Below(sc_.servers + sc_.servers_added));
    At(at, [this, vshard, to](Nanos now) {
      if (coordinator_->crashed || coordinator_->core().phase() != CoordinatorCore::Phase::kRunning) return;
      const uint32_t from = coordinator_->core().shard_map().vshard_server_rank(static_cast<int>(vshard));
      if (coordinator_->Move(vshard, to, now)) {
        Trace(now, absl::StrCat("move shard ", vshard, " to server ", to));
        if (sc_.crash_mid_move && !crashed_mid_move_) {
          crashed_mid_move_ = true;
          const uint32_t victim = rng_.Chance(0.5) ? from : to;
          const Nanos at = now + static_cast<Nanos>(rng_.Below(30 * kMs));
          const Nanos restart = at + sc_.lease_ns + 100 * kMs + static_cast<Nanos>(rng_.Below(2 * sc_.lease_ns));
          At(at, [this, victim, restart](Nanos t) { CrashServer(victim, restart, t); });
        }
      }
    });
  }
  for (uint32_t i = 0; i < sc_.worker_crashes; ++i) {
    const Nanos at = when();
    const uint32_t rank = static_cast<uint32_t>(rng_.Below(sc_.workers));
    const Nanos restart = at + sc_.lease_ns + 100 * kMs + static_cast<Nanos>(rng_.Below(sc_.lease_ns));
    At(at, [this, rank, restart](Nanos now) {
      WorkerProc* p = workers_[rank];
      if (p->crashed || p->exited) return;
      p->crashed = true;
      // Before the job assembled, any policy fails it: it never starts.
      if (coordinator_->core().phase() == CoordinatorCore::Phase::kAssembling) worker_crashed_assembling_ = true;
      p->RecordUnreturnedClock();  // what it announced still counts
      Trace(now, "crash " + p->address);
      if (sc_.worker_loss == WorkerLossPolicy::kWait) {
        At(restart, [this, rank](Nanos t) {
          if (!coordinator_->core().finished()) StartWorker(rank, t);
        });
      }
    });
  }
  // (Last: the draws above stay those of runs without it.)
  if (sc_.crash_together > 0) ScheduleCrashTogether(when());
}

void World::ScheduleCrashTogether(Nanos at) {
  // A random set of crash_together servers, each crashing within 100 ms of
  // `at`: all of them are down before the coordinator's lease notices the
  // first, so a shard whose every copy was on them has none left.
  std::vector<uint32_t> ranks(sc_.servers);
  for (uint32_t i = 0; i < sc_.servers; ++i) ranks[i] = i;
  for (uint32_t i = 0; i < sc_.crash_together && i < sc_.servers; ++i) {
    std::swap(ranks[i], ranks[i + rng_.Below(sc_.servers - i)]);
    const Nanos when = at + static_cast<Nanos>(rng_.Below(100 * kMs));
    const Nanos restart = when + sc_.lease_ns + 100 * kMs + static_cast<Nanos>(rng_.Below(2 * sc_.lease_ns));
    At(when, [this, rank = ranks[i], restart](Nanos now) { CrashServer(rank, restart, now); });
  }
}

void World::CrashServer(uint32_t rank, Nanos restart, Nanos now) {
  ServerProc* p = servers_[rank];
  if (p->crashed) return;
  p->crashed = true;
  Trace(now, "crash " + p->address);
  if (sc_.restart_crashed) {
    At(restart, [this, rank](Nanos t) {
      if (!coordinator_->core().finished()) StartServer(rank, t);
    });
  }
}

bool World::NoFailovers() const {
  return sc_.server_crashes == 0 && sc_.crash_together == 0 && !sc_.crash_mid_move && sc_.pauses == 0 &&
         sc_.partitions == 0 && sc_.coordinator_crashes == 0;
}

void World::CheckTakeovers(uint32_t rank, uint64_t old_epoch, const proto::ShardMap& map, const ServerCore& core,
                           Nanos now) {
  if (!NoFailovers()) return;
  auto old = maps_.find(old_epoch);
  if (old == maps_.end()) return;
  std::vector<uint32_t> taken;
  for (int i = 0; i < old->second.moving_vshards_size(); ++i) {
    const uint32_t v = old->second.moving_vshards(i);
    if (old->second.moving_to(i) == rank && map.vshard_server_rank(static_cast<int>(v)) == rank) taken.push_back(v);
  }
  if (taken.empty()) return;
  const Table* table = core.table(kTable);
  absl::flat_hash_map<Key, std::vector<float>> rows;
  if (table != nullptr) {
    table->ForEachRow([&](Key k, std::span<const float> row) {
      rows[k].assign(row.begin(), row.begin() + std::min<size_t>(row.size(), Width()));
    });
  }
  for (const consistency::PullEvent& p : recorder_.pulls()) {
    if (p.completed_ns > now) continue;
    for (size_t i = 0; i < p.keys.size(); ++i) {
      const uint32_t v = VirtualShardOf(kTable, p.keys[i], sc_.vshards);
      if (std::find(taken.begin(), taken.end(), v) == taken.end()) continue;
      auto row = rows.find(p.keys[i]);
      for (uint32_t c = 0; c < Width(); ++c) {
        const float have = row == rows.end() || c >= row->second.size() ? 0.0f : row->second[c];
        if (have < p.values[i * Width() + c]) {
          Violation(absl::StrCat("server ", rank, " took shard ", v, " over (a move) with key ", p.keys[i], " column ",
                                 c, " at ", have, ", below the ", p.values[i * Width() + c],
                                 " a pull of worker ", p.worker, " had seen"));
          return;
        }
      }
    }
  }
}

void World::CheckMonotonicReads() {
  // Only where no server was deposed: a failover may lose a push that a
  // pull saw but that was never acknowledged (the contract allows it).
  if (!NoFailovers()) return;
  std::vector<consistency::PullEvent> pulls = recorder_.pulls();
  std::sort(pulls.begin(), pulls.end(), [](const auto& a, const auto& b) { return a.completed_ns < b.completed_ns; });
  // Per (key, column): the most a completed pull has seen, and when.
  std::map<std::pair<uint32_t, uint32_t>, std::pair<float, int64_t>> seen;
  std::vector<const consistency::PullEvent*> by_issue;
  for (const auto& p : pulls) by_issue.push_back(&p);
  std::sort(by_issue.begin(), by_issue.end(), [](auto* a, auto* b) { return a->issued_ns < b->issued_ns; });
  size_t next_done = 0;
  for (const consistency::PullEvent* p : by_issue) {
    // Every pull completed before this one was issued has been seen.
    for (; next_done < pulls.size() && pulls[next_done].completed_ns < p->issued_ns; ++next_done) {
      const auto& q = pulls[next_done];
      for (size_t i = 0; i < q.keys.size(); ++i)
        for (uint32_t c = 0; c < Width(); ++c) {
          auto& s = seen[{q.keys[i], c}];
          s.first = std::max(s.first, q.values[i * Width() + c]);
        }
    }
    for (size_t i = 0; i < p->keys.size(); ++i)
      for (uint32_t c = 0; c < Width(); ++c) {
        auto it = seen.find({p->keys[i], c});
        if (it != seen.end() && p->values[i * Width() + c] < it->second.first) {
          Violation(absl::StrCat("a pull by worker ", p->worker, " at clock ", p->clock, " saw key ", p->keys[i],
                                 " column ", c, " at ", p->values[i * Width() + c], ", below the ",
                                 it->second.first, " an earlier completed pull saw"));
          return;
        }
      }
  }
}

Nanos World::RunEvents(Nanos now, Nanos limit) {
  while (!queue_.empty()) {
    std::unique_ptr<Event> e(queue_.top());
    queue_.pop();
    now = e->at;
    if (now > limit) break;
    if (job_end_at_ == 0 && coordinator_->core().finished()) {
      bool all_out = true;
      for (WorkerProc* w : workers_) all_out &= w->exited || w->crashed;
      if (all_out) job_end_at_ = now;
    }
    if (job_end_at_ != 0 && now > job_end_at_ + kDrain) break;
    if (e->to.empty()) {
      e->action(now);
      continue;
    }
    Proc* p = Find(e->to);
    if (p == nullptr || p->crashed) {
      ++dropped_;
      continue;
    }
    if (now < p->paused_until) {  // delivered when it resumes, in arrival order
      Push(p->paused_until, std::move(*e));
      continue;
    }
    if (Cut(e->from, e->to, now)) {
      ++dropped_;
      Trace(now, absl::StrCat("cut ", e->from, " -> ", e->to, " ", BodyName(e->message.header)));
      continue;
    }
    ++delivered_;
    const proto::Envelope& h = e->message.header;
    Trace(now, absl::StrCat(e->from, " -> ", e->to, " ", BodyName(h), " req ", h.request_id(), " epoch ", h.epoch(),
                            Detail(e->message)));
    // A process that left still takes server-to-server traffic (its streams
    // settle); everything else to it is lost.
    if (p->exited &&
        (p->removed || !(absl::StartsWith(e->from, "sim://server-") && absl::StartsWith(e->to, "sim://server-"))))
      continue;
    if (h.has_job_ready()) scale_.last_job_ready_at = now;
    const bool new_map = h.has_shard_map_update() && h.shard_map_update().shard_map().epoch() == 2;
    if (new_map && scale_.have_new_map.insert(e->to).second) scale_.last_new_map_at = now;
    p->Deliver(std::move(e->message), now);
    if (sc_.scale_crash_at_ns > 0 && scale_.have_new_map.size() == sc_.servers - 1 + sc_.workers) break;
  }
  while (!queue_.empty()) {
    delete queue_.top();
    queue_.pop();
  }
  return now;
}

RunResult World::Run() {
  RunResult r;
  r.seed = seed_;
  r.scenario = sc_;
  CoordinatorOptions co;
  co.servers = sc_.servers;
  co.max_servers = sc_.servers + sc_.servers_added;
  co.workers = sc_.workers;
  co.max_workers = sc_.workers + sc_.workers_added;
  co.vshards = sc_.vshards;
  co.assemble_timeout = 30 * kSeconds;
  co.lease = sc_.lease_ns;
  co.server_lease = sc_.server_lease_ns;
  co.address = kCoordinator;
  co.replication = sc_.replication;
  co.heartbeat_interval = sc_.heartbeat_ns;
  co.on_worker_loss = sc_.worker_loss;
  co.rejoin_timeout = 10 * kSeconds;
  co.move_timeout = 3 * kSeconds;
  co.test_switch_before_sync = sc_.breakage == Breakage::kSwitchBeforeSync;
  co.restore_lost_shards = sc_.checkpoint_every_ns > 0;  // on_shard_loss: restore (from the servers' checkpoints)
  if (sc_.rebalance_threshold > 0) {
    co.rebalance.threshold = sc_.rebalance_threshold;
    co.rebalance.interval = 200 * kMs;
    co.load_tau = 500 * kMs;
  }
  coordinator_options_ = co;
  auto coordinator = std::make_unique<CoordProc>(this, co);
  coordinator_ = coordinator.get();
  procs_[kCoordinator] = std::move(coordinator);
  ScheduleTick(coordinator_, kTickEvery);
  servers_.resize(sc_.servers + sc_.servers_added);
  server_incarnations_.assign(sc_.servers + sc_.servers_added, 0);
  for (uint32_t s = 0; s < sc_.servers; ++s) StartServer(s, 0);
  workers_.resize(sc_.workers);
  worker_incarnations_.assign(sc_.workers + sc_.workers_added, 0);
  for (uint32_t w = 0; w < sc_.workers; ++w) StartWorker(w, 0);
  ScheduleFaults();

  const Nanos now = RunEvents(0, options_.time_limit_ns);
  r.sim_time_ns = now;
  r.messages = delivered_;
  r.dropped = dropped_;
  const CoordinatorCore& cc = coordinator_->core();
  r.job_ok = cc.phase() == CoordinatorCore::Phase::kDone;
  r.job_end = cc.phase() == CoordinatorCore::Phase::kDone     ? "done"
              : cc.phase() == CoordinatorCore::Phase::kFailed ? "failed: " + cc.failure_reason()
                                                              : "still running";
  r.failovers = maps_.empty() ? 0 : maps_.size() - 1;
  r.moves_started = moves_started_;
  r.moves_finished = moves_finished_;
  r.servers_drained = servers_drained_;
  r.workers_joined = recorder_.joins().size();
  for (const ServerProc* p : servers_) {
    if (p == nullptr || p->core() == nullptr) continue;
    for (const ServerCore::TableSummary& t : p->core()->table_summaries()) r.rows_to_disk += t.counters.moved_to_disk;
  }
  if (!maps_.empty()) {
    const std::vector<double> costs = cc.ShardCosts();
    r.imbalance_first_map = Imbalance(maps_.begin()->second, costs);
    r.imbalance_last_map = Imbalance(cc.shard_map(), costs);
  }
  if (sc_.scale_crash_at_ns == 0) {  // (scale mode has no workload to check)
    for (WorkerProc* w : workers_) w->RecordUnreturnedClock();
    for (const IssuedPush& p : pushes_) {
      // The keys a checkpoint restore may have lost it from count as never
      // acknowledged: no pull must reflect it there (sim.h).
      std::vector<uint32_t> keys32, lost32;
      for (Key k : p.keys) (p.acked && LostToRestore(p, k) ? lost32 : keys32).push_back(static_cast<uint32_t>(k));
      if (!keys32.empty() || lost32.empty()) {
        recorder_.Add(consistency::PushEvent{p.worker_rank, p.clock, std::move(keys32), p.issued, !p.acked});
      }
      if (!lost32.empty()) {
        recorder_.Add(consistency::PushEvent{p.worker_rank, p.clock, std::move(lost32), p.issued, true});
      }
    }
    CheckEnd(r);
    CheckAudit(r);
    CheckMonotonicReads();
    auto checked = consistency::Check(recorder_, Width(),
                                      sc_.consistency == proto::ASP   ? consistency::kUnbounded
                                      : sc_.consistency == proto::SSP ? sc_.staleness
                                                                      : 0,
                                      sc_.workers);
    r.pulls_checked = checked.pulls_checked;
    for (std::string& v : checked.violations) Violation(std::move(v));
  }
  for (const IssuedPush& p : pushes_) r.pushes_acked += p.acked;
  r.checkpoints_written = checkpoints_.written();
  r.shards_lost = checkpoints_.shards_lost();
  r.shards_restored = checkpoints_.shards_restored();
  r.missed_reported = checkpoints_.missed_reported();
  if (sc_.restart_from_checkpoints && sc_.checkpoint_every_ns > 0 && sc_.scale_crash_at_ns == 0) RunSecondJob(r, now);
  r.violations = violations_;
  r.digest = digest_;
  return r;
}

void World::RunSecondJob(RunResult& r, Nanos now) {
  // The first job's processes are gone (the queue is empty: nothing of
  // theirs runs again); the store, as a checkpoint directory, stays.
  second_job_ = true;
  r.second_job = true;
  for (auto& [address, p] : procs_) p->crashed = true;
  graveyard_.push_back(std::move(procs_[kCoordinator]));
  procs_.erase(kCoordinator);
  maps_.clear();  // a new job: its map epochs start again
  job_end_at_ = 0;
  now += kSeconds;
  Trace(now, "a new job from the checkpoints");
  auto coordinator = std::make_unique<CoordProc>(this, coordinator_options_, now);
  coordinator_ = coordinator.get();
  procs_[kCoordinator] = std::move(coordinator);
  ScheduleTick(coordinator_, now + kTickEvery);
  for (uint32_t s = 0; s < sc_.servers; ++s) StartServer(s, now);
  for (uint32_t s = sc_.servers; s < servers_.size(); ++s) servers_[s] = nullptr;
  workers_.assign(sc_.workers, nullptr);
  for (uint32_t w = 0; w < sc_.workers; ++w) StartWorker(w, now);
  const Nanos end = RunEvents(now, now + 120 * kSeconds);
  const CoordinatorCore& cc = coordinator_->core();
  r.second_job_end = cc.phase() == CoordinatorCore::Phase::kDone     ? "done"
                     : cc.phase() == CoordinatorCore::Phase::kFailed ? "failed: " + cc.failure_reason()
                                                                     : "still running";
  if (cc.phase() != CoordinatorCore::Phase::kDone) {
    Violation(absl::StrCat("the new job from the checkpoints ended ", r.second_job_end, " at ", end / kMs, " ms"));
  }
  for (uint32_t s = 0; s < sc_.servers; ++s) {
    if (!second_job_started_.contains(s)) Violation(absl::StrCat("server ", s, " of the new job never started"));
  }
  r.held_shards = checkpoints_.held_asked();
  r.held_restored = checkpoints_.held_restored();
}

void World::CheckHeldRestore(const std::string& address, uint32_t rank, const proto::ShardMap& map,
                             const ServerCore& core, const std::vector<uint32_t>* asked,
                             const CheckpointRestore* restore) {
  second_job_started_.insert(rank);
  auto view = ShardMapView::Create(map);
  if (!view.ok()) return;  // (refused at Start: reported there)
  std::vector<uint32_t> held;
  for (uint32_t v = 0; v < view->num_vshards(); ++v)
    if (view->Holds(rank, v)) held.push_back(v);
  if (restore == nullptr) {
    Violation(absl::StrCat(address, " started the new job without restoring the shards it holds"));
    return;
  }
  if (*asked != held) {
    Violation(absl::StrCat(address, " restored shards ", absl::StrJoin(*asked, ","), " at its start but holds ",
                           absl::StrJoin(held, ",")));
  }
  // What the line says: shard -> the checkpoint it came from ("" for none).
  std::map<uint32_t, std::string> said;
  size_t said_restored = 0;
  const std::string& line = restore->line;
  std::vector<absl::string_view> parts = absl::StrSplit(line, "; ");
  for (size_t i = 0; i < parts.size(); ++i) {
    absl::string_view part = parts[i];
    if (i == 0) {
      const size_t at = part.find(" from checkpoints: ");
      if (!absl::StartsWith(part, "restored ") || at == absl::string_view::npos) break;
      std::vector<absl::string_view> head = absl::StrSplit(part.substr(9), ' ');
      if (head.empty() || !absl::SimpleAtoi(head[0], &said_restored)) break;
      part = part.substr(at + 19);
    }
    uint32_t v = 0;
    if (absl::ConsumePrefix(&part, "shards ")) {
      const size_t from = part.find(" from ");
      if (from == absl::string_view::npos) continue;
      for (absl::string_view n : absl::StrSplit(part.substr(0, from), ','))
        if (absl::SimpleAtoi(n, &v)) said[v] = std::string(part.substr(from + 6));
    } else if (absl::ConsumePrefix(&part, "no checkpoint holds shards ")) {
      for (absl::string_view n : absl::StrSplit(part.substr(0, part.find(':')), ','))
        if (absl::SimpleAtoi(n, &v)) said[v] = "";
    }
  }
  size_t restorable = 0;
  const Table* table = core.table(kTable);
  for (uint32_t v : held) {
    std::string name;
    const ShardSnapshot* newest = checkpoints_.NewestHolding(v, &name);
    restorable += newest != nullptr;
    auto it = said.find(v);
    if (it == said.end() || it->second != name) {
      Violation(absl::StrCat(address, "'s start restore line says shard ", v, " came from ",
                             it == said.end() ? "nowhere" : it->second.empty() ? "no checkpoint" : it->second,
                             " but the newest checkpoint holding it is ", name.empty() ? "none" : name, ": ", line));
    }
    // The rows, bit for bit.
    const std::vector<uint32_t> one{v};
    TableSnapshot want, got;
    if (newest != nullptr) {
      for (const TableSnapshot& t : newest->tables) {
        if (t.config.table_id() != kTable) continue;
        const size_t w = t.keys.empty() ? 0 : t.values.size() / t.keys.size();
        for (size_t i = 0; i < t.keys.size(); ++i) {
          if (VirtualShardOf(kTable, t.keys[i], sc_.vshards) != v) continue;
          want.keys.push_back(t.keys[i]);
          want.values.insert(want.values.end(), t.values.begin() + static_cast<ptrdiff_t>(i * w),
                             t.values.begin() + static_cast<ptrdiff_t>((i + 1) * w));
        }
      }
    }
    if (table != nullptr) got = SnapshotTable(*table, KeysOfVShards(kTable, sc_.vshards, one));
    const bool same = want.keys == got.keys && want.values.size() == got.values.size() &&
                      (want.values.empty() ||
                       std::memcmp(want.values.data(), got.values.data(), want.values.size() * sizeof(float)) == 0);
    if (!same) {
      Violation(absl::StrCat(address, " started the new job with shard ", v, " holding ", got.keys.size(),
                             " rows (keys ", absl::StrJoin(got.keys, ","), "; values ", absl::StrJoin(got.values, ","),
                             ") but the newest checkpoint holding it, ", name.empty() ? "none" : name, ", has ",
                             want.keys.size(), " (keys ", absl::StrJoin(want.keys, ","), "; values ",
                             absl::StrJoin(want.values, ","), ")"));
    }
  }
  if (said_restored != restorable || restore->restored.size() != restorable) {
    Violation(absl::StrCat(address, "'s start restore restored ", restore->restored.size(), " shards (its line says ",
                           said_restored, ") but checkpoints hold ", restorable, " of the ", held.size(),
                           " it holds: ", line));
  }
}

ScaleResult World::Scale() {
  ScaleResult s;
  s.servers = sc_.servers;
  s.workers = sc_.workers;
  s.vshards = sc_.vshards;
  const double ms = static_cast<double>(kMs);
  s.assemble_ms = static_cast<double>(scale_.last_job_ready_at) / ms;
  const double steady_s = static_cast<double>(sc_.scale_crash_at_ns - sc_.scale_crash_at_ns / 3) / kSeconds;
  s.coordinator_msgs_per_s = static_cast<double>(scale_.steady_msgs) / steady_s;
  s.coordinator_cpu_us_per_msg =
      scale_.steady_msgs ? scale_.steady_cpu_s * 1e6 / static_cast<double>(scale_.steady_msgs) : 0;
  s.detect_ms = static_cast<double>(scale_.published_at - sc_.scale_crash_at_ns) / ms;
  s.publish_ms = static_cast<double>(scale_.last_new_map_at - scale_.published_at) / ms;
  s.failover_cpu_ms = scale_.failover_cpu_s * 1e3;
  s.map_bytes = scale_.map_bytes;
  const size_t want = sc_.servers - 1 + sc_.workers;
  if (scale_.published_at == 0) {
    s.problem = "no new map was published after the crash";
  } else if (scale_.have_new_map.size() != want) {
    s.problem = absl::StrCat(scale_.have_new_map.size(), " of ", want, " live nodes got the new map");
  }
  if (!violations_.empty()) absl::StrAppend(&s.problem, s.problem.empty() ? "" : "; ", violations_[0]);
  return s;
}

// The job ended, and nobody waits for anything.
void World::CheckEnd(RunResult& r) {
  const CoordinatorCore& cc = coordinator_->core();
  if (!cc.finished()) {
    std::string waits;
    for (WorkerProc* w : workers_) {
      if (w->crashed) continue;
      for (const std::string& op : w->Outstanding()) absl::StrAppend(&waits, "; ", w->address, " waits on ", op);
    }
    Violation(absl::StrCat("hang: the job is still running at ", r.sim_time_ns / kMs, " ms (simulated)", waits));
    return;
  }
  for (WorkerProc* w : workers_) {
    if (w->crashed) continue;  // (its operations died with it)
    for (const std::string& op : w->Outstanding()) {
      Violation(absl::StrCat("hang: ", w->address, " never completed ", op));
    }
  }
  // A run with no fault that may end a job must end it well. A crashed
  // worker ends it only under the stop policy, and then the reason names it.
  const bool stop_on_worker_loss = sc_.worker_loss == WorkerLossPolicy::kStopJob;
  const bool may_fail = sc_.server_crashes > 0 || sc_.crash_together > 0 || sc_.pauses > 0 || sc_.partitions > 0 ||
                        (sc_.worker_crashes > 0 && stop_on_worker_loss) || worker_crashed_assembling_;
  if (!r.job_ok && !may_fail) Violation("the job failed without a fault that could fail it: " + r.job_end);
  const bool only_worker_crashes =
      sc_.server_crashes == 0 && sc_.crash_together == 0 && sc_.pauses == 0 && sc_.partitions == 0;
  for (WorkerProc* w : workers_) {
    if (only_worker_crashes && w->crashed && stop_on_worker_loss && !worker_crashed_assembling_) {
      const std::string name = CoordinatorCore::NodeName(proto::WORKER, w->rank());
      if (r.job_ok || !absl::StrContains(r.job_end, name)) {
        Violation(absl::StrCat(name, " crashed under on_worker_loss: stop, but the job ended with: ", r.job_end));
      }
    }
    // Workers the job went on without (on_worker_loss: continue) need not finish.
    auto node = cc.nodes().find(w->node_id());
    const bool left = w->crashed || (node != cc.nodes().end() && node->second.lost) ||
                      (w->rank() >= sc_.workers && node == cc.nodes().end());  // a joiner the job ended before
    if (r.job_ok && !left && !w->finished()) {
      Violation(absl::StrCat("the job ended well but ", w->address, " did not finish"));
    }
  }
}

// The rows every server holds, against the pushes the workers issued.
void World::CheckAudit(RunResult& r) {
  // Worker node id -> rank, and issued pushes by (node, seq).
  // (By the coordinator's records: a worker may die before it learns its id.)
  std::map<uint32_t, uint32_t> rank_of;
  for (const auto& [id, n] : coordinator_->core().nodes())
    if (n.info.role() == proto::WORKER) rank_of[id] = n.info.rank();
  std::map<std::tuple<uint32_t, uint32_t, uint64_t>, const IssuedPush*> issued;  // (node, incarnation, seq)
  for (const IssuedPush& p : pushes_)
    for (uint64_t seq = p.seq; seq <= p.seq_last; ++seq) issued[{p.worker_node, p.incarnation, seq}] = &p;

  struct Row {
    bool primary;
    std::vector<float> values;
    std::multiset<std::string> entries;
    std::set<std::string> pushes;  // NODE:INC:SEQ of each entry (without a piece's columns)
  };
  // Rank -> key -> row, from each rank's current live process.
  std::vector<std::map<Key, Row>> rows(servers_.size());
  std::vector<bool> readable(servers_.size(), false);
  std::vector<uint64_t> epoch_of(servers_.size(), 0);
  for (ServerProc* s : servers_) {
    if (s == nullptr || s->crashed || s->core() == nullptr || s->core()->deposed()) continue;
    readable[s->rank()] = true;
    epoch_of[s->rank()] = s->core()->epoch();
    const std::string dump = s->core()->AuditDump();
    if (trace_) *trace_ << "# final rows of " << s->address << ":\n" << dump;
    for (absl::string_view line : absl::StrSplit(dump, '\n', absl::SkipEmpty())) {
      // (A "restored" line: the windows of a checkpoint this server restored; the store knows them.)
      if (absl::StartsWith(line, "#") || absl::StartsWith(line, "restored ")) continue;
      std::vector<absl::string_view> f = absl::StrSplit(line, ' ');
      uint64_t key = 0;
      if (f.size() < 5 || f[0] != "row" || !absl::SimpleAtoi(f[2], &key)) {
        Violation(absl::StrCat(s->address, ": unreadable audit line: ", line));
        continue;
      }
      Row row;
      row.primary = f[3] == "primary";
      for (absl::string_view v : absl::StrSplit(f[4], ',')) {
        float x = 0;
        (void)absl::SimpleAtof(v, &x);
        row.values.push_back(x);
      }
      for (size_t i = 5; i < f.size(); ++i) {
        // NODE:INC:SEQ, then :FIRST:COUNT for a push of a piece of the row.
        std::vector<absl::string_view> parts = absl::StrSplit(f[i], ':');
        uint32_t node = 0, incarnation = 0;
        uint64_t seq = 0;
        if ((parts.size() != 3 && parts.size() != 5) || !absl::SimpleAtoi(parts[0], &node) ||
            !absl::SimpleAtoi(parts[1], &incarnation) || !absl::SimpleAtoi(parts[2], &seq)) {
          continue;
        }
        const std::string where = absl::StrCat(s->address, " key ", key);
        if (row.entries.count(std::string(f[i])) > 0) Violation(absl::StrCat("push ", f[i], " applied twice to ", where));
        row.entries.insert(std::string(f[i]));
        row.pushes.insert(absl::StrCat(node, ":", incarnation, ":", seq));
        auto it = issued.find({node, incarnation, seq});
        if (it == issued.end() || std::find(it->second->keys.begin(), it->second->keys.end(), key) == it->second->keys.end()) {
          Violation(absl::StrCat("push ", f[i], " applied to ", where, " was never issued for that key"));
        }
      }
      // Each column counts its worker's applied pushes exactly (a piece
      // counts for the columns it carried).
      std::vector<float> expect(row.values.size(), 0.0f);
      for (const std::string& e : row.entries) {
        std::vector<absl::string_view> parts = absl::StrSplit(e, ':');
        uint32_t node = 0, first = 0, count = 0;
        if (!absl::SimpleAtoi(parts[0], &node)) continue;
        if (parts.size() == 5 && (!absl::SimpleAtoi(parts[3], &first) || !absl::SimpleAtoi(parts[4], &count))) continue;
        auto rk = rank_of.find(node);
        if (rk == rank_of.end() || rk->second >= expect.size()) continue;
        if (parts.size() == 5 && (rk->second < first || rk->second >= uint64_t{first} + count)) continue;
        expect[rk->second] += 1.0f;
      }
      if (expect != row.values) {
        Violation(absl::StrCat(s->address, " key ", key, ": values ", absl::StrJoin(row.values, ","),
                               " but the pushes applied give ", absl::StrJoin(expect, ",")));
      }
      rows[s->rank()][key] = std::move(row);
    }
  }
  if (!r.job_ok || maps_.empty()) return;
  // The final map: every acknowledged push is at the primary of each of its
  // keys, and every backup equals its primary.
  ServerProc* any = nullptr;
  for (ServerProc* s : servers_)
    if (s != nullptr && !s->crashed && s->core() != nullptr && (any == nullptr || s->core()->epoch() > any->core()->epoch())) any = s;
  if (any == nullptr) return;
  const uint64_t final_epoch = maps_.rbegin()->first;
  if (any->core()->epoch() != final_epoch) return;  // nobody holds the last map: nothing to compare
  auto final_map = ShardMapView::Create(maps_.rbegin()->second);
  if (!final_map.ok()) {
    Violation(absl::StrCat("the coordinator's last map is invalid: ", final_map.status().message()));
    return;
  }
  std::set<const IssuedPush*> lost;  // acknowledged pushes lost to restores
  for (const IssuedPush& p : pushes_) {
    if (!p.acked) continue;
    for (Key k : p.keys) {
      const uint32_t primary = final_map->ServerRankOfKey(kTable, k);
      if (!readable[primary]) continue;
      // (With transfer parts, the key went in one of the push's parts.)
      const std::string entry = absl::StrCat(p.worker_node, ":", p.incarnation, ":", p.seq,
                                             p.seq_last > p.seq ? absl::StrCat("..", p.seq_last) : "");
      auto it = rows[primary].find(k);
      bool found = false;
      for (uint64_t seq = p.seq; it != rows[primary].end() && seq <= p.seq_last && !found; ++seq)
        found = it->second.pushes.count(absl::StrCat(p.worker_node, ":", p.incarnation, ":", seq)) > 0;
      if (!found && LostToRestore(p, k)) {
        ++r.push_keys_lost;  // a loss a checkpoint restore allows (sim_checkpoints.h)
        lost.insert(&p);
      } else if (!found) {
        Violation(absl::StrCat("acknowledged push ", entry, " (worker ", p.worker_rank, ") is missing from key ", k,
                               " at its primary, server ", primary,
                               checkpoints_.WasRestored(VirtualShardOf(kTable, k, sc_.vshards))
                                   ? " (its shard was restored from a checkpoint, but no restore may have lost it)"
                                   : ""));
      }
    }
  }
  r.pushes_lost = lost.size();
  // (Copies compared only where both sides have the final map: a map
  // published as the job ended may not have reached them.)
  for (uint32_t v = 0; v < final_map->num_vshards(); ++v) {
    const uint32_t primary = final_map->ServerRankOf(v);
    if (!readable[primary] || epoch_of[primary] != final_epoch) continue;
    for (uint32_t b : final_map->BackupsOf(v)) {
      if (!readable[b] || epoch_of[b] != final_epoch) continue;
      for (uint32_t k = 0; k < sc_.keys; ++k) {
        if (VirtualShardOf(kTable, k, sc_.vshards) != v) continue;
        auto p = rows[primary].find(k);
        auto q = rows[b].find(k);
        const bool hp = p != rows[primary].end(), hq = q != rows[b].end();
        // A row a pull created holds its initial values (zeros here) and no
        // push: the same as no row (pulls are not forwarded).
        auto blank = [](const Row& row) {
          return row.entries.empty() && std::all_of(row.values.begin(), row.values.end(), [](float x) { return x == 0; });
        };
        if (hp != hq && (hp ? blank(p->second) : blank(q->second))) continue;
        if (hp != hq || (hp && (p->second.values != q->second.values || p->second.entries != q->second.entries))) {
          std::vector<std::string> only_primary, only_backup;
          if (hp && hq) {
            std::set_difference(p->second.entries.begin(), p->second.entries.end(), q->second.entries.begin(),
                                q->second.entries.end(), std::back_inserter(only_primary));
            std::set_difference(q->second.entries.begin(), q->second.entries.end(), p->second.entries.begin(),
                                p->second.entries.end(), std::back_inserter(only_backup));
          }
          Violation(absl::StrCat("key ", k, " (shard ", v, "): backup server ", b, " differs from primary server ",
                                 primary, ": ", hq ? absl::StrJoin(q->second.values, ",") : "no row", " vs ",
                                 hp ? absl::StrJoin(p->second.values, ",") : "no row", "; pushes only at the primary: ",
                                 absl::StrJoin(only_primary, " "), "; only at the backup: ", absl::StrJoin(only_backup, " ")));
        }
      }
    }
  }
}

}  // namespace

Scenario Scenario::FromSeed(uint64_t seed) {
  Rng rng(seed);
  Scenario s;
  s.servers = static_cast<uint32_t>(rng.Between(2, 4));
  s.workers = static_cast<uint32_t>(rng.Between(2, 3));
  s.vshards = rng.Chance(0.5) ? 8 : 16;
  const uint64_t r = rng.Below(4);
  s.replication = std::min<uint32_t>(s.servers, r == 0 ? 1 : r == 3 ? 3 : 2);
  const uint64_t c = rng.Below(3);
  s.consistency = c == 0 ? proto::BSP : c == 1 ? proto::SSP : proto::ASP;
  s.staleness = s.consistency == proto::SSP ? static_cast<uint32_t>(rng.Between(1, 2)) : 0;
  s.clocks = static_cast<uint32_t>(rng.Between(8, 30));
  s.keys = static_cast<uint32_t>(rng.Between(12, 24));
  s.apply_after_ack = rng.Chance(0.5);
  s.min_delay_ns = rng.Between(10'000, 200'000);
  s.max_delay_ns = s.min_delay_ns + rng.Between(0, 3'000'000);
  if (rng.Chance(0.6)) s.drop = 0.001 * static_cast<double>(rng.Between(1, 20));
  if (rng.Chance(0.4)) s.duplicate = 0.001 * static_cast<double>(rng.Between(1, 50));
  if (rng.Chance(0.4)) s.reorder = 0.01 * static_cast<double>(rng.Between(1, 10));
  // Crashes the replicas can cover, and now and then one they cannot.
  if (s.replication > 1) {
    s.server_crashes = static_cast<uint32_t>(rng.Below(s.replication));
  } else if (rng.Chance(0.1)) {
    s.server_crashes = 1;
  }
  s.restart_crashed = rng.Chance(0.7);
  if (rng.Chance(0.2)) s.pauses = 1;
  s.partitions = static_cast<uint32_t>(rng.Chance(0.25)) + static_cast<uint32_t>(rng.Chance(0.25));
  // (Drawn last: the draws above give the same scenarios as before workers crashed.)
  const uint64_t policy = rng.Below(3);
  s.worker_loss = policy == 0 ? WorkerLossPolicy::kStopJob
                  : policy == 1 ? WorkerLossPolicy::kContinue
                                : WorkerLossPolicy::kWait;
  if (rng.Chance(0.2)) s.worker_crashes = 1;
  if (rng.Chance(0.15)) s.coordinator_crashes = 1;
  if (rng.Chance(0.6)) s.moves = static_cast<uint32_t>(rng.Between(2, 6));
  s.crash_mid_move = s.moves > 0 && s.replication > 1 && s.server_crashes == 0 && rng.Chance(0.3);
  if (rng.Chance(0.25)) s.servers_added = 1;
  if (rng.Chance(0.25)) s.drains = 1;
  if (rng.Chance(0.25)) s.workers_added = 1;
  if (rng.Chance(0.3)) {  // transfer scheduling: parts of 1-2 rows or pieces of rows, 1-4 parts in flight per server
    const uint32_t width = s.workers + s.workers_added;
    const uint64_t row_bytes = uint64_t{4} * width;
    const uint64_t rows = rng.Between(1, 3);
    // 3: pieces of half a row (rounded up), when a row has 2 columns or more
    // (the same draws as before pieces existed, so older seeds keep their runs).
    s.part_bytes = rows == 3 && width >= 2 ? uint64_t{4} * ((width + 1) / 2) : row_bytes * rows;
    if (rng.Chance(0.7)) s.max_bytes_in_flight = s.part_bytes * rng.Between(1, 4);
  }
  // (Drawn after everything else, so that older seeds keep their runs.)
  if (rng.Chance(0.3)) s.disk_tier_rows = static_cast<uint32_t>(rng.Between(1, 4));
  // Checkpoints every 20-100 ms and shards restored from them when they
  // lose every copy (on_shard_loss: restore); in most of those runs as many
  // servers as there are copies crash together, so that some shards do.
  // (Drawn last, as above.)
  if (rng.Chance(0.25)) {
    s.checkpoint_every_ns = rng.Between(20, 100) * kMs;
    if (s.servers > s.replication && rng.Chance(0.7)) s.crash_together = s.replication;
    // Then, in half of them, a new job from the checkpoints (drawn last, as above).
    s.restart_from_checkpoints = rng.Chance(0.5);
  }
  return s;
}

std::string Scenario::Describe() const {
  const char* model = consistency == proto::BSP ? "BSP" : consistency == proto::SSP ? "SSP" : "ASP";
  return absl::StrFormat(
      "%u servers, %u workers, %u vshards, replication %u, %s%s, %u clocks, %u keys%s; delay %.2f-%.2f ms, drop %.3f, "
      "duplicate %.3f, reorder %.2f; %u crashes%s, %u pauses, %u partitions, %u worker crashes (on loss: %s), "
      "%u coordinator crashes, %u moves%s, %u servers added, %u drained, %u workers added; parts of %llu B, "
      "%llu B in flight per server%s",
      servers, workers, vshards, replication, model, consistency == proto::SSP ? absl::StrCat("(", staleness, ")") : "",
      clocks, keys, apply_after_ack ? ", apply after ack" : "", static_cast<double>(min_delay_ns) / kMs,
      static_cast<double>(max_delay_ns) / kMs, drop, duplicate, reorder, server_crashes,
      server_crashes > 0 ? (restart_crashed ? " (restarted)" : " (not restarted)") : "", pauses, partitions,
      worker_crashes,
      worker_loss == WorkerLossPolicy::kStopJob ? "stop" : worker_loss == WorkerLossPolicy::kContinue ? "continue" : "wait",
      coordinator_crashes, moves, crash_mid_move ? " (a crash mid-move)" : "", servers_added, drains, workers_added,
      static_cast<unsigned long long>(part_bytes), static_cast<unsigned long long>(max_bytes_in_flight),
      absl::StrCat(disk_tier_rows > 0 ? absl::StrCat("; disk tier, ", disk_tier_rows, " rows in memory") : "",
                   checkpoint_every_ns > 0
                       ? absl::StrCat("; checkpoints every ", checkpoint_every_ns / kMs,
                                      " ms, lost shards restored from them")
                       : "",
                   crash_together > 0 ? absl::StrCat("; ", crash_together, " servers crash together") : "",
                   restart_from_checkpoints && checkpoint_every_ns > 0 ? "; then a new job from the checkpoints" : "",
                   breakage == Breakage::kNone ? "" : absl::StrCat("; BROKEN: ", BreakageName(breakage))));
}

ScaleResult RunScale(uint32_t servers, uint32_t workers, uint32_t vshards, uint64_t seed) {
  Scenario sc;
  sc.servers = servers;
  sc.workers = workers;
  sc.vshards = vshards;
  sc.replication = std::min<uint32_t>(2, servers);
  sc.min_delay_ns = 50'000;  // 50-500 us: one data center
  sc.max_delay_ns = 500'000;
  sc.heartbeat_ns = kDefaultHeartbeatInterval;  // the binaries' defaults
  sc.server_heartbeat_ns = kDefaultServerHeartbeatInterval;
  sc.lease_ns = kDefaultLease;
  sc.server_lease_ns = kDefaultServerLease;
  sc.node_lease_ns = kDefaultLease;
  sc.scale_crash_at_ns = 30 * kSeconds;
  const auto start = std::chrono::steady_clock::now();
  World world(seed, sc, RunOptions{.time_limit_ns = 120 * kSeconds});
  RunResult r = world.Run();
  ScaleResult s = world.Scale();
  s.messages = r.messages;
  s.wall_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return s;
}

Scenario RebalanceScenario(uint64_t seed, double threshold) {
  Scenario s = Scenario::FromSeed(seed);
  s.servers = 3;
  s.workers = 3;
  s.vshards = 16;
  s.replication = std::min<uint32_t>(s.replication, 2);
  s.keys = 64;
  s.clocks = 300;
  s.zipf = 1.3;
  s.rebalance_threshold = threshold;
  s.drop = s.duplicate = s.reorder = 0;
  s.server_crashes = s.pauses = s.partitions = s.worker_crashes = s.coordinator_crashes = s.moves = 0;
  s.crash_together = 0;
  s.checkpoint_every_ns = 0;
  s.restart_from_checkpoints = false;
  s.crash_mid_move = false;
  s.servers_added = static_cast<uint32_t>(seed % 2);  // odd seeds: a fourth server joins, empty
  return s;
}

RunResult Run(uint64_t seed, const Scenario& scenario, const RunOptions& options) {
  World world(seed, scenario, options);
  return world.Run();
}

}  // namespace tessera::sim

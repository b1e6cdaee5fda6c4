#pragma once
// The cluster simulator: the coordinator's, the servers' and the workers'
// protocol cores (CoordinatorCore, ServerCore, WorkerCore, and SessionCore
// for each node's side of the coordinator protocol: the code the binaries run) wired through a simulated network and a simulated clock in
// one thread, driven by one seed.
//
// Promises:
// - Nothing in a run reads a wall clock, a thread scheduler or an unseeded
//   random source: the same seed gives the same run, message for message
//   (RunResult::digest; tessera-sim re-executes itself with address-space
//   randomization off, so hash tables iterate alike in every process).
// - The network delays each message by a seeded amount, keeps each link in
//   order unless a reorder fault lets a message overtake, and drops,
//   duplicates, partitions (node sets that cannot reach each other for a
//   while), pauses nodes (nothing delivered, no timers) and crashes
//   servers and workers, which a new process for the same rank may replace
//   later, and the coordinator, which a new process replaces from its
//   saved state; and it moves shards between live servers (live migration).
// - Workloads: every worker creates one SPARSE table of integer counts with
//   the ACCUMULATE optimizer (one column per worker), then at every clock
//   pushes +1 into its own column of random keys, pulls random keys (all
//   pipelined: nothing waits for an earlier push), and calls Clock: the
//   exact answer of every pull is known. Workers crash too; under the
//   wait policy a replacement asks the servers for its predecessor's clock
//   (ClockQuery) and goes on from there, as the Worker shell does.
// - Checkers run after every run (CheckRun): I1-I4 on the recorded events
//   (a push never acknowledged may be missing; a worker the coordinator
//   announced as left is not waited for from then on);
//   per row: no push applied twice, values equal to the pushes applied,
//   nothing applied that was not issued, every acknowledged push applied
//   (when the job ended well) but those a checkpoint restore may lose (see
//   below), replicas equal to their primary; map epochs
//   only increase at every node; one map per epoch (so one primary per shard
//   per epoch); in runs without failovers, pulls never go backwards and a
//   server that takes a shard over by a move has every value a pull saw; every operation a live worker started completed, OK or
//   with an error (no hang), and the job ended; it ended well unless a fault
//   could end it (a worker crash under the stop policy must, naming it).
// - Checkpoint restores (Scenario::checkpoint_every_ns; tests/sim/
//   sim_checkpoints.h): a shard that lost every copy is restored by the
//   server the coordinator gives it to, from the newest checkpoint holding
//   it in the World's store (by map epoch, then sequence), through the
//   shell's pure RestoreNewestCopies. An acknowledged push may then be
//   missing from a key, and only then: a part of it that carried the key was
//   first acknowledged (by a server, as the network saw it) before a restore
//   of the key's shard, and the newest checkpoint holding that shard at that
//   moment did not hold that part (its number is neither below its writer's
//   window floor there nor in that window). So every push that checkpoint
//   held is in the restored rows, every push first acknowledged after the
//   restore is too, and a restore from an older checkpoint than the newest
//   is caught. The per-row checks stay
//   whole: a restored row's values equal the pushes it lists (the
//   checkpoint's, then those applied since) and none is listed twice. For
//   I1-I4, a push a restore may have lost counts as unacknowledged for
//   those keys (no pull must reflect it). The restore line's count of missed
//   applications is a lower bound from heartbeats and is not checked.
// - A new job from checkpoints (Scenario::restart_from_checkpoints): right
//   after each of its servers' Start, every shard the server holds (primary
//   or backup) has, bit for bit, the rows of the newest checkpoint holding
//   it in the store (by map epoch, then sequence), and a shard no
//   checkpoint holds has no rows; the restore was asked exactly the shards
//   held, and its line names, for each shard, that checkpoint (or says no
//   checkpoint holds it). The new job's maps are checked as the first's
//   (one per epoch, epochs only increase at every node); every server
//   starts, and the job ends well.
// - A violation is reported with the seed; `tessera-sim --seed N --trace F`
//   replays the run and writes every message and fault.
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "coordinator/coordinator_core.h"
#include "proto/tessera.pb.h"

namespace tessera::sim {

// Test-only switches that each break one rule (negative controls): the
// checkers must catch every one of them within the CI seed budget.
enum class Breakage {
  kNone,
  kApplyDuplicates,       // servers apply a sequenced push again when it is resent
  kAckBeforeReplication,  // primaries acknowledge pushes before their backups have them
  kAnswerEarly,           // servers answer pulls and clock advances without waiting for slower workers
  kAcceptOldEpoch,        // servers install older shard maps, and backups apply forwards of an older epoch
  kSwitchBeforeSync,      // the coordinator makes a moving shard's destination primary at once
  kReadDuringMove,        // primaries answer pulls of a moving shard without waiting for its destination
  kJoinAtZero,            // servers start a worker that joins the running job at clock 0
  kRestoreOldest,         // a server restoring lost shards gets only the oldest checkpoint each rank kept
  kRestoreHeldOldest,     // a new job's server restoring the shards it holds gets only the oldest checkpoint each rank kept
};
const char* BreakageName(Breakage b);
bool ParseBreakage(const std::string& name, Breakage* out);

// One run's cluster, workload and faults; FromSeed draws them.
struct Scenario {
  uint32_t servers = 3;
  uint32_t workers = 2;
  uint32_t vshards = 16;
  uint32_t replication = 2;
  proto::ConsistencyKind consistency = proto::BSP;
  uint32_t staleness = 0;  // SSP only
  uint32_t clocks = 6;
  uint32_t keys = 16;
  bool apply_after_ack = false;
  // Network.
  int64_t min_delay_ns = 20'000;
  int64_t max_delay_ns = 2'000'000;
  double drop = 0;       // per message
  double duplicate = 0;  // per message
  double reorder = 0;    // per message: may overtake earlier ones on its link
  // Faults, at seeded times.
  uint32_t server_crashes = 0;   // each at a random time, of a random live server
  bool restart_crashed = true;   // a new process takes the rank over one lease or more later
  uint32_t pauses = 0;           // a random node stops for up to two leases
  uint32_t partitions = 0;       // a random node cut off from the rest or from the coordinator only, or two random node sets, for up to two leases
  uint32_t worker_crashes = 0;   // each at a random time, of a random live worker
  // The coordinator crashes at a random time and a new process takes the
  // job over from its saved state (write-ahead, as tessera-coordinator
  // --state-file does) 0.1-1.5 s later, within the nodes' lease on it.
  uint32_t coordinator_crashes = 0;
  // Live migrations: each at a random time, a random shard is moved to a
  // random server (CoordinatorCore::StartMove, as the rebalancer does; one
  // at a time, so some are refused); a move not in sync within 3 s is
  // cancelled.
  uint32_t moves = 0;
  // The source or the destination of the first move that starts crashes
  // 0-30 ms later (a new process takes its rank over one lease or more later).
  bool crash_mid_move = false;
  // Skew: with zipf > 0, each push and pull draws 8 keys (repeats merged)
  // from Zipf(zipf) over the keys instead of each key with chance 1/3.
  double zipf = 0;
  // With a threshold, the coordinator's rebalancer is on (every 200 ms,
  // loads smoothed over 500 ms; coordinator/rebalancer.h).
  double rebalance_threshold = 0;
  // Elastic membership: this many servers (0 or 1) join the running job at
  // a random time, as rank `servers` (CoordinatorOptions.max_servers).
  uint32_t servers_added = 0;
  // Draining: this many servers (0 or 1; a random rank) are drained at a
  // random time (CoordinatorCore::Drain, as tessera-admin drain asks; refused
  // where too few servers would be left), and removed once they hold nothing.
  uint32_t drains = 0;
  // Joining workers: this many (0 or 1) start at a random time as the next
  // rank (CoordinatorOptions.max_workers) and join the running job at the
  // servers' fastest worker's clock; the table has a column for them.
  uint32_t workers_added = 0;
  // Transfer scheduling (WorkerCoreOptions): pushes and pulls split into
  // parts of at most part_bytes value bytes (0: one per server; less than a
  // row: pushes go in pieces of rows), at most
  // max_bytes_in_flight to a server at once (0: no bound); each push draws
  // a priority 0-2.
  uint64_t part_bytes = 0;
  uint64_t max_bytes_in_flight = 0;
  // Disk tier: with N > 0 the table keeps at most N rows in memory on each
  // server (its memory budget) and the rest in its disk tier (MemoryColdRows,
  // server/cold_rows.h: the store the simulator gives every server), so rows
  // move out and back as pushes, pulls, transfers and moves touch them.
  uint32_t disk_tier_rows = 0;
  // What the job does about a lost worker. Under kWait a new process takes
  // a crashed worker's place one lease or more later and resumes at its
  // predecessor's clock.
  WorkerLossPolicy worker_loss = WorkerLossPolicy::kStopJob;
  Breakage breakage = Breakage::kNone;
  // Timings of the membership protocol.
  int64_t heartbeat_ns = 100'000'000;  // node -> coordinator
  int64_t lease_ns = 500'000'000;      // silence after which the coordinator loses a node
  int64_t server_heartbeat_ns = 0;     // servers' own interval (0: heartbeat_ns)
  int64_t server_lease_ns = 0;         // under replication, a server's lease (the coordinator's server_lease; 0: lease_ns)
  int64_t node_lease_ns = 0;           // a node's lease on the coordinator (0: 4 * lease_ns)
  // Checkpoints (0: none): every live server checkpoints the shards it
  // leads this often (simulated time; at its 20 ms timer), as
  // tessera-server --checkpoint-every does, into one store the World keeps
  // (a shared checkpoint directory: it survives crashes; the newest 3 of
  // each rank kept). The coordinator then restores a shard that lost every
  // copy (on_shard_loss: restore) instead of failing the job.
  int64_t checkpoint_every_ns = 0;
  // Whole-shard loss: this many distinct servers (a random set) crash
  // within 100 ms of each other at a random time, before the coordinator
  // can notice the first (its lease), so the shards whose every copy was
  // on them lose every copy. Restarted as server crashes are.
  uint32_t crash_together = 0;
  // A new job from the checkpoints (with checkpoint_every_ns): once the
  // first job has ended (well or not) and been checked, a second job starts
  // in the same World, as `tessera-server --restore-from DIR` starts one:
  // a fresh coordinator (same servers, vshards, replication; a new job's
  // map), fresh server processes whose ServerNodeCore restores every shard
  // it holds (primary or backup) at Start through restore_held from the
  // World's store, and workers that only report done (after 1 s, so that
  // every server has started). No faults but the network's; the new job
  // writes no checkpoints.
  bool restart_from_checkpoints = false;
  // Scale mode (RunScale): no workload; server 0 crashes at this time and
  // the run ends once every live node has the next map.
  int64_t scale_crash_at_ns = 0;

  static Scenario FromSeed(uint64_t seed);
  std::string Describe() const;  // one line
};

struct RunOptions {
  std::string trace_path;                  // write every message and fault here ("" = none)
  int64_t time_limit_ns = 300'000'000'000;  // simulated; a job still running then is a hang
};

struct RunResult {
  uint64_t seed = 0;
  Scenario scenario;
  bool job_ok = false;              // the coordinator ended the job as done
  std::string job_end;              // how the job ended
  std::vector<std::string> violations;
  uint64_t digest = 0;              // of every delivered message and fault, in order
  uint64_t messages = 0;            // delivered
  uint64_t dropped = 0;
  int64_t sim_time_ns = 0;
  uint64_t pulls_checked = 0;
  uint64_t pushes_acked = 0;
  uint64_t failovers = 0;           // maps published after the first
  uint64_t moves_started = 0;       // shard moves the coordinator began
  uint64_t moves_finished = 0;      // moves whose destination became primary (or took a backup's place)
  uint64_t servers_drained = 0;     // drained and removed
  uint64_t workers_joined = 0;      // joined the running job (their start clock announced)
  uint64_t rows_to_disk = 0;        // rows the servers' budgets moved to their disk tiers (live processes at the end)
  // Checkpoints (Scenario::checkpoint_every_ns).
  uint64_t checkpoints_written = 0;
  uint64_t shards_lost = 0;          // shards that lost every copy, given to a server to restore
  uint64_t shards_restored = 0;      // of those, restored from a checkpoint
  uint64_t missed_reported = 0;      // the restore lines' "the checkpoints miss at least N push applications", summed
  uint64_t pushes_lost = 0;          // acknowledged pushes missing at a final primary, every one allowed by a restore
  uint64_t push_keys_lost = 0;       // the same as (push, key) pairs
  // A new job from the checkpoints (Scenario::restart_from_checkpoints).
  bool second_job = false;           // it ran
  std::string second_job_end;        // how it ended
  uint64_t held_shards = 0;          // shards its servers held at their start (copies: primaries and backups)
  uint64_t held_restored = 0;        // of those, restored from a checkpoint
  // The shards' costs as the coordinator saw them last (ShardCosts), and
  // the imbalance (coordinator/rebalancer.h) they give under the first map
  // and under the last.
  double imbalance_first_map = 0, imbalance_last_map = 0;
  bool ok() const { return violations.empty(); }
};

RunResult Run(uint64_t seed, const Scenario& scenario, const RunOptions& options = {});

// Rebalance mode: the scenario of `seed` with no faults, 3 servers, 3
// workers, 16 shards, 64 keys drawn Zipf(1.3), 300 clocks, and the
// rebalancer on at `threshold`; with odd seeds a fourth server joins the
// running job (empty: the rebalancer must give it load).
Scenario RebalanceScenario(uint64_t seed, double threshold);

// Scale mode (docs/scaling.md): membership, heartbeats, one server lost and
// its failover, for a cluster of any size, with the binaries' default
// timings (node/timing_defaults.h: workers heartbeat every 1 s, servers
// every 0.1 s; a server is lost after 0.5 s, a worker after 5 s) and no
// data traffic.
struct ScaleResult {
  uint32_t servers = 0, workers = 0, vshards = 0;
  double assemble_ms = 0;             // simulated: start to the last JobReady delivered
  double coordinator_msgs_per_s = 0;  // simulated: messages the coordinator handled per second, steady state
  double coordinator_cpu_us_per_msg = 0;  // real: the coordinator core's CPU (messages and timers) per message, steady state
  double detect_ms = 0;               // simulated: crash to the new map published (the lease)
  double publish_ms = 0;              // simulated: new map published to the last live node having it
  double failover_cpu_ms = 0;         // real: the coordinator core's step that published the new map
  uint64_t map_bytes = 0;             // the largest serialized shard map
  uint64_t messages = 0;              // delivered in the whole run
  double wall_s = 0;                  // real time the run took
  std::string problem;                // empty, or why the run did not complete
};
ScaleResult RunScale(uint32_t servers, uint32_t workers, uint32_t vshards, uint64_t seed);

}  // namespace tessera::sim

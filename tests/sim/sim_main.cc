// tessera-sim: runs the cluster simulator (tests/sim/sim.h) over many seeds,
// or replays one. Exit status: 0 when every run passed its checks (or, with
// --expect-violation, when some run failed them), 1 otherwise, 2 for bad
// arguments.
#include <sys/personality.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/strings/str_format.h"
#include "tests/sim/sim.h"

namespace {

// Hash tables seed their hashing from the address of a global: with
// address-space randomization on, two processes iterate them in different
// orders and a seed would not replay. Run again with it off (once).
void ReexecWithoutAslr(char** argv) {
  if (std::getenv("TESSERA_SIM_ASLR") != nullptr) return;
  const int current = personality(0xffffffff);
  if (current == -1 || (current & ADDR_NO_RANDOMIZE) != 0) return;
  if (personality(static_cast<unsigned long>(current) | ADDR_NO_RANDOMIZE) == -1) {
    std::fprintf(stderr, "tessera-sim: cannot turn address-space randomization off; seeds may not replay exactly\n");
    return;
  }
  execv("/proc/self/exe", argv);
  std::fprintf(stderr, "tessera-sim: cannot re-execute itself; seeds may not replay exactly\n");
}

}  // namespace

int main(int argc, char** argv) {
  ReexecWithoutAslr(argv);
  CLI::App app{
      "Deterministic simulation of a whole Tessera cluster: the real coordinator, server and worker cores over a\n"
      "simulated network (delays, drops, duplicates, reordering, partitions, pauses, server crashes and restarts),\n"
      "one seed per run. Every run is checked (consistency I1-I4, no push lost or applied twice, replicas equal,\n"
      "epochs, no hang). A failing run prints its seed and the command that replays it."};
  uint64_t seed = 0, first_seed = 1, seeds = 100;
  double minutes = 0;
  std::string trace, breakage_name = "none";
  bool expect_violation = false, verbose = false, digests = false;
  app.add_option("--seed", seed, "Run (replay) this one seed, and print what it did")->check(CLI::PositiveNumber);
  app.add_option("--first-seed", first_seed, "First seed of a batch")->check(CLI::PositiveNumber);
  app.add_option("--seeds", seeds, "How many seeds in a batch")->check(CLI::PositiveNumber);
  double rebalance = 0;
  app.add_option("--rebalance", rebalance,
                 "Rebalance mode: each seed's cluster without faults, 3 servers, keys drawn Zipf(1.3), the "
                 "rebalancer on at this threshold (e.g. 1.25); a run also fails if the load it ends with, under "
                 "the last map, is more than 5% above the threshold. Prints the imbalance under the first and the "
                 "last map")
      ->check(CLI::Range(1.0001, 100.0));
  app.add_option("--minutes", minutes, "Soak: run seeds from --first-seed on until this much wall time passed")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--trace", trace, "With --seed: write every message and fault of the run to this file");
  app.add_option("--break", breakage_name,
                 "Negative control: break one rule in the servers (apply-duplicates, ack-before-replication, "
                 "answer-early, accept-old-epoch, switch-before-sync, read-during-move, join-at-zero, restore-oldest, "
                 "restore-held-oldest)");
  app.add_flag("--expect-violation", expect_violation,
               "Succeed only if some run fails its checks (for negative controls); stops at the first");
  app.add_flag("--digests", digests, "Print each run's digest (for replay checks)");
  app.add_flag("-v,--verbose", verbose, "Print every run");
  std::vector<std::string> scale;
  app.add_option("--scale", scale,
                 "Scale mode: membership, heartbeats and one server failover (no data) for clusters of "
                 "SERVERSxWORKERSxVSHARDS, e.g. --scale 10x100x1000 100x1000x10000; prints a table for docs/scaling.md");
  CLI11_PARSE(app, argc, argv);

  if (!scale.empty()) {
    std::printf("| servers | workers | vshards | map KiB | assemble ms | coordinator msgs/s | coordinator CPU us/msg "
                "| failover step CPU ms | detect ms | publish ms | recover ms | messages | wall s |\n"
                "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n");
    int rc = 0;
    for (const std::string& size : scale) {
      unsigned s = 0, w = 0, v = 0;
      if (std::sscanf(size.c_str(), "%ux%ux%u", &s, &w, &v) != 3 || s < 2 || w < 1 || v < s) {
        std::fprintf(stderr, "tessera-sim: --scale wants SERVERSxWORKERSxVSHARDS (servers >= 2, vshards >= servers), "
                             "got '%s'\n", size.c_str());
        return 2;
      }
      const tessera::sim::ScaleResult r = tessera::sim::RunScale(s, w, v, first_seed);
      std::printf("| %u | %u | %u | %.1f | %.1f | %.0f | %.2f | %.2f | %.0f | %.1f | %.0f | %llu | %.1f |%s\n", s, w, v,
                  static_cast<double>(r.map_bytes) / 1024, r.assemble_ms, r.coordinator_msgs_per_s,
                  r.coordinator_cpu_us_per_msg, r.failover_cpu_ms, r.detect_ms, r.publish_ms,
                  r.detect_ms + r.publish_ms, static_cast<unsigned long long>(r.messages), r.wall_s,
                  r.problem.empty() ? "" : (" PROBLEM: " + r.problem).c_str());
      std::fflush(stdout);
      if (!r.problem.empty()) rc = 1;
    }
    return rc;
  }
  tessera::sim::Breakage breakage;
  if (!tessera::sim::ParseBreakage(breakage_name, &breakage)) {
    std::fprintf(stderr, "tessera-sim: unknown --break '%s' (apply-duplicates, ack-before-replication, answer-early, "
                         "accept-old-epoch, switch-before-sync, read-during-move, join-at-zero, restore-oldest, restore-held-oldest)\n",
                 breakage_name.c_str());
    return 2;
  }
  if (!trace.empty() && seed == 0) {
    std::fprintf(stderr, "tessera-sim: --trace needs --seed (one run)\n");
    return 2;
  }
  if (!trace.empty() && !std::ofstream(trace)) {
    std::fprintf(stderr, "tessera-sim: cannot write the trace to %s\n", trace.c_str());
    return 2;
  }
  const bool single = seed != 0;
  if (single) {
    first_seed = seed;
    seeds = 1;
    verbose = true;
  }
  const auto start = std::chrono::steady_clock::now();
  auto elapsed = [&] { return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(); };
  uint64_t runs = 0, failed = 0, job_failures = 0, failovers = 0, messages = 0, pulls = 0, acked = 0;
  uint64_t moves_started = 0, moves_finished = 0, drained = 0, joined = 0, to_disk = 0;
  uint64_t checkpoints = 0, runs_restoring = 0, shards_lost = 0, shards_restored = 0, pushes_lost = 0,
           push_keys_lost = 0, missed_reported = 0;
  uint64_t second_jobs = 0, second_jobs_ok = 0, held_shards = 0, held_restored = 0;
  uint64_t first_failed = 0;
  for (uint64_t s = first_seed;; ++s) {
    if (minutes > 0 ? elapsed() >= minutes * 60 : s >= first_seed + seeds) break;
    tessera::sim::Scenario sc =
        rebalance > 0 ? tessera::sim::RebalanceScenario(s, rebalance) : tessera::sim::Scenario::FromSeed(s);
    sc.breakage = breakage;
    tessera::sim::RunOptions options;
    if (single) options.trace_path = trace;
    tessera::sim::RunResult r = tessera::sim::Run(s, sc, options);
    if (rebalance > 0) {
      std::printf("seed %llu: imbalance %.2f under the first map, %.2f under the last, after %llu moves\n",
                  static_cast<unsigned long long>(s), r.imbalance_first_map, r.imbalance_last_map,
                  static_cast<unsigned long long>(r.moves_finished));
      // (The loads are smoothed estimates that still move after the last
      // decision: 5% of slack.)
      if (r.imbalance_last_map > rebalance * 1.05) {
        r.violations.push_back(absl::StrFormat("the rebalancer left the load %.2fx the mean, above its threshold %.2f",
                                               r.imbalance_last_map, rebalance));
      }
      if (r.imbalance_first_map > rebalance * 1.05 && r.moves_finished == 0) {
        r.violations.push_back(absl::StrFormat("the first map's load was %.2fx the mean and nothing moved",
                                               r.imbalance_first_map));
      }
    }
    ++runs;
    job_failures += !r.job_ok;
    failovers += r.failovers;
    moves_started += r.moves_started;
    moves_finished += r.moves_finished;
    drained += r.servers_drained;
    joined += r.workers_joined;
    to_disk += r.rows_to_disk;
    checkpoints += r.checkpoints_written;
    runs_restoring += r.shards_lost > 0;
    shards_lost += r.shards_lost;
    shards_restored += r.shards_restored;
    pushes_lost += r.pushes_lost;
    push_keys_lost += r.push_keys_lost;
    missed_reported += r.missed_reported;
    second_jobs += r.second_job;
    second_jobs_ok += r.second_job && r.second_job_end == "done";
    held_shards += r.held_shards;
    held_restored += r.held_restored;
    messages += r.messages;
    pulls += r.pulls_checked;
    acked += r.pushes_acked;
    if (verbose || digests || !r.ok()) {
      std::printf("seed %llu: %s; %s; %llu messages (%llu lost), %llu maps after the first, %.1f ms simulated%s\n",
                  static_cast<unsigned long long>(s), r.ok() ? "ok" : "FAILED", r.job_end.c_str(),
                  static_cast<unsigned long long>(r.messages), static_cast<unsigned long long>(r.dropped),
                  static_cast<unsigned long long>(r.failovers), static_cast<double>(r.sim_time_ns) / 1e6,
                  digests ? (" digest " + std::to_string(r.digest)).c_str() : "");
      if (verbose || !r.ok()) std::printf("  scenario: %s\n", sc.Describe().c_str());
      if ((verbose || !r.ok()) && r.second_job) {
        std::printf("  a new job from the checkpoints: %s; its servers held %llu shard copies at their start, %llu "
                    "restored from a checkpoint\n",
                    r.second_job_end.c_str(), static_cast<unsigned long long>(r.held_shards),
                    static_cast<unsigned long long>(r.held_restored));
      }
      if ((verbose || !r.ok()) && r.shards_lost > 0) {
        std::printf("  restores: %llu shards lost every copy, %llu restored from checkpoints (%llu written); "
                    "%llu acknowledged pushes lost to them (%llu push-keys), the restore lines said at least %llu "
                    "push applications\n",
                    static_cast<unsigned long long>(r.shards_lost), static_cast<unsigned long long>(r.shards_restored),
                    static_cast<unsigned long long>(r.checkpoints_written),
                    static_cast<unsigned long long>(r.pushes_lost), static_cast<unsigned long long>(r.push_keys_lost),
                    static_cast<unsigned long long>(r.missed_reported));
      }
    }
    if (!r.ok()) {
      ++failed;
      if (first_failed == 0) first_failed = s;
      for (const std::string& v : r.violations) std::printf("  violation: %s\n", v.c_str());
      std::printf("  replay: %s --seed %llu%s%s --trace /tmp/tessera-sim-%llu.trace\n", argv[0],
                  static_cast<unsigned long long>(s), breakage == tessera::sim::Breakage::kNone ? "" : " --break ",
                  breakage == tessera::sim::Breakage::kNone ? "" : breakage_name.c_str(),
                  static_cast<unsigned long long>(s));
      if (expect_violation) break;
    }
    std::fflush(stdout);
  }
  std::printf("%llu runs in %.1f s: %llu failed their checks; %llu jobs ended by faults, %llu new maps, %llu of "
              "%llu shard moves finished, %llu servers drained, %llu workers joined, %llu messages, %llu pulls checked, %llu pushes acknowledged, %llu rows moved to disk%s\n",
              static_cast<unsigned long long>(runs), elapsed(), static_cast<unsigned long long>(failed),
              static_cast<unsigned long long>(job_failures), static_cast<unsigned long long>(failovers),
              static_cast<unsigned long long>(moves_finished), static_cast<unsigned long long>(moves_started),
              static_cast<unsigned long long>(drained), static_cast<unsigned long long>(joined),
              static_cast<unsigned long long>(messages), static_cast<unsigned long long>(pulls),
              static_cast<unsigned long long>(acked), static_cast<unsigned long long>(to_disk),
              breakage == tessera::sim::Breakage::kNone ? "" : (" (broken: " + breakage_name + ")").c_str());
  if (checkpoints > 0) {
    std::printf("checkpoints: %llu written; %llu runs lost shards and restored them: %llu shards lost every copy, "
                "%llu restored from a checkpoint; %llu acknowledged pushes lost to restores (%llu push-keys), every "
                "one a push the newest checkpoint did not hold; the restore lines said at least %llu push "
                "applications missed\n",
                static_cast<unsigned long long>(checkpoints), static_cast<unsigned long long>(runs_restoring),
                static_cast<unsigned long long>(shards_lost), static_cast<unsigned long long>(shards_restored),
                static_cast<unsigned long long>(pushes_lost), static_cast<unsigned long long>(push_keys_lost),
                static_cast<unsigned long long>(missed_reported));
  }
  if (second_jobs > 0) {
    std::printf("new jobs from the checkpoints: %llu (%llu ended well); their servers held %llu shard copies at "
                "their start, %llu restored from the newest checkpoint holding them\n",
                static_cast<unsigned long long>(second_jobs), static_cast<unsigned long long>(second_jobs_ok),
                static_cast<unsigned long long>(held_shards), static_cast<unsigned long long>(held_restored));
  }
  if (expect_violation) {
    if (failed == 0) std::printf("expected a violation with --break %s and found none\n", breakage_name.c_str());
    return failed > 0 ? 0 : 1;
  }
  return failed == 0 ? 0 : 1;
}

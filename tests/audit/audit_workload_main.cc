// tessera-audit-workload: a worker program for fault experiments (audit
// mode). Every push adds +1 to a few random keys of one ACCUMULATE table.
// Before a push is issued the program appends a line
//   I NODE INCARNATION SEQ KEY KEY ...
// to DIR/worker-RANK-node-NODE-inc-INC.log, and once it is acknowledged
//   A NODE INCARNATION SEQ
// (plain write(2) calls: the lines survive a SIGKILL). With servers in audit
// mode (tessera-server --audit-dir), tests/audit/audit_check.py proves
// acknowledged <= applied <= issued, no push applied twice, and replicas equal.
// Every 10 clocks it prints, for the launcher's progress.jsonl,
//   TESSERA_PROGRESS {"step":CLOCK,"acked":ACKED,"t":SECONDS}
// (ACKED: pushes this process had acknowledged; SECONDS: since it started),
// from which bench/fault_matrix_report.py draws throughput over time.
#include <fcntl.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "transport/transport_flags.h"
#include "worker/worker.h"
#include "worker/worker_flags.h"

namespace {

class Log {
 public:
  explicit Log(const std::string& path) : fd_(::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644)) {}
  ~Log() {
    if (fd_ >= 0) ::close(fd_);
  }
  bool ok() const { return fd_ >= 0; }
  bool Write(const std::string& line) { return ::write(fd_, line.data(), line.size()) == static_cast<ssize_t>(line.size()); }

 private:
  int fd_;
};

}  // namespace

int main(int argc, char** argv) {
  const auto started = std::chrono::steady_clock::now();
  tessera::WorkerOptions wo;
  std::string name = "worker", records, consistency = "bsp", bind;
  uint32_t clocks = 100, keys = 64, pushes_per_clock = 4, max_keys_per_push = 4, max_sleep_us = 2000;
  uint64_t seed = 1;
  CLI::App app{"Audit workload: +1 pushes to random keys, each issued and acknowledged push logged for "
               "tests/audit/audit_check.py."};
  app.add_option("--coordinator", wo.coordinator, "Coordinator address")->required();
  app.add_option("--rank", wo.rank, "Worker rank");
  app.add_option("--name", name, "Name in log lines");
  app.add_option("--bind", bind, "Endpoint to listen on");
  app.add_option("--records", records, "Directory for the push logs")->required();
  app.add_option("--consistency", consistency, "bsp | asp")->check(CLI::IsMember({"bsp", "asp"}));
  app.add_option("--clocks", clocks, "Clocks to run (a replacement runs the rest)");
  app.add_option("--keys", keys, "Keys in the table")->check(CLI::PositiveNumber);
  app.add_option("--pushes-per-clock", pushes_per_clock, "Pushes per clock");
  app.add_option("--max-keys-per-push", max_keys_per_push, "Keys per push, 1 to this")->check(CLI::PositiveNumber);
  app.add_option("--max-sleep-us", max_sleep_us, "Longest random pause per clock");
  app.add_option("--seed", seed, "Random seed");
  uint64_t memory_budget_bytes = 0;
  bool disk_tier = false;
  app.add_option("--memory-budget-bytes", memory_budget_bytes,
                 "The table's memory budget per server (0: none); with --disk-tier, rows past it go to disk");
  app.add_option("--disk-tier", disk_tier, "Give the table a disk tier (docs/embeddings.md)");
  tessera::ResendFlags resend;
  resend.AddTo(app);
  double request_timeout = 60, hold_timeout = 120;
  double give_up = static_cast<double>(wo.coordinator_give_up) / 1e9;
  app.add_option("--coordinator_give_up_seconds", give_up, "Coordinator silence this worker waits out")
      ->check(CLI::PositiveNumber);
  app.add_option("--request-timeout-seconds", request_timeout, "A push fails after this long unanswered")
      ->check(CLI::PositiveNumber);
  app.add_option("--hold-timeout-seconds", hold_timeout, "A clock a server holds for slower workers fails after this")
      ->check(CLI::PositiveNumber);
  tessera::TransportFlags transport;  // --transport, --shm*, --coalesce*, --job_keys, --faults, ... from the launcher
  transport.AddTo(app);
  CLI11_PARSE(app, argc, argv);
  wo.transport = transport.choice();
  resend.ApplyTo(wo);
  wo.request_timeout = static_cast<tessera::Nanos>(request_timeout * 1e9);
  wo.hold_timeout = static_cast<tessera::Nanos>(hold_timeout * 1e9);
  wo.coordinator_give_up = static_cast<tessera::Nanos>(give_up * 1e9);
  tessera::InitLogging(name, false);
  tessera::WarnAboutOldTransportVariables();
  if (!bind.empty()) wo.bind = bind;
  auto connected = tessera::Worker::Connect(wo);
  if (!connected.ok()) {
    TLOG_ERROR("{}", connected.status().message());
    return 1;
  }
  tessera::Worker& worker = **connected;
  const uint32_t node = worker.node_id(), inc = worker.incarnation();
  Log log(absl::StrCat(records, "/worker-", worker.rank(), "-node-", node, "-inc-", inc, ".log"));
  if (!log.ok()) {
    TLOG_ERROR("cannot open the push log in {}", records);
    return 1;
  }
  tessera::TableOptions table;
  table.id = 5;
  table.name = "audit";
  table.width = 1;
  table.kind = tessera::proto::SPARSE;
  table.optimizer = tessera::proto::ACCUMULATE;
  table.consistency = consistency == "bsp" ? tessera::proto::BSP : tessera::proto::ASP;
  table.memory_budget_bytes = memory_budget_bytes;
  table.disk_tier = disk_tier;
  if (auto s = worker.CreateTable(table); !s.ok()) {
    TLOG_ERROR("{}", s.message());
    return 1;
  }
  std::mt19937_64 rng(seed * 1000003 + worker.rank() * 7919 + inc);
  const uint64_t start = worker.clock();
  uint64_t pushes = 0, acked = 0;
  for (uint64_t c = start; c < clocks; ++c) {
    struct Pending {
      uint64_t seq;
      std::vector<tessera::Key> keys;
      std::vector<float> ones;
      tessera::Future future;
    };
    std::vector<Pending> pending(pushes_per_clock);
    for (Pending& p : pending) {
      const uint32_t n = 1 + rng() % max_keys_per_push;
      for (uint32_t i = 0; i < n; ++i) p.keys.push_back(rng() % keys);
      p.ones.assign(n, 1.0f);
      p.seq = worker.next_push_seq();
      std::string line = absl::StrCat("I ", node, " ", inc, " ", p.seq);
      for (tessera::Key k : p.keys) absl::StrAppend(&line, " ", k);
      if (!log.Write(line + "\n")) return 1;
      p.future = worker.Push(table.id, p.keys, p.ones);
      ++pushes;
    }
    for (Pending& p : pending) {
      if (absl::Status s = p.future.Wait(); !s.ok()) {
        TLOG_ERROR("push {}: {}", p.seq, s.message());
        return 1;
      }
      if (!log.Write(absl::StrCat("A ", node, " ", inc, " ", p.seq, "\n"))) return 1;
      ++acked;
    }
    if (max_sleep_us > 0) ::usleep(static_cast<useconds_t>(rng() % max_sleep_us));
    if (absl::Status s = worker.Clock(); !s.ok()) {
      TLOG_ERROR("clock {}: {}", c + 1, s.message());
      return 1;
    }
    if ((c + 1) % 10 == 0) {
      const double t = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
      std::printf("TESSERA_PROGRESS {\"step\":%llu,\"acked\":%llu,\"t\":%.3f}\n",
                  static_cast<unsigned long long>(c + 1), static_cast<unsigned long long>(acked), t);
      std::fflush(stdout);
    }
  }
  std::printf("TESSERA_RESULT {\"steps\":%llu,\"final_loss\":0}\n", static_cast<unsigned long long>(clocks - start));
  std::fflush(stdout);
  tessera::proto::WorkerDone done;
  done.set_steps(clocks - start);
  done.set_report_json(absl::StrCat("{\"pushes\":", pushes, "}"));
  if (auto f = worker.Finish(done); !f.ok()) {
    TLOG_ERROR("{}", f.message());
    return 1;
  }
  return 0;
}

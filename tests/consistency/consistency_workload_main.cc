// tessera-consistency-workload: a worker program (started by tessera-launch)
// that runs the consistency workload and writes its events to
// --records DIR/worker-RANK.txt for tessera-consistency-check.
#include <csignal>
#include <cstdio>

#include "CLI/CLI.hpp"
#include "common/logging.h"
#include "transport/transport_flags.h"
#include "tests/consistency/consistency_checker.h"

int main(int argc, char** argv) {
  tessera::WorkerOptions wo;
  tessera::consistency::WorkloadOptions o;
  std::string name = "worker", records, consistency = "bsp", bind;
  CLI::App app{"Consistency workload: pushes, pulls and clocks with random pauses; records every event."};
  app.add_option("--coordinator", wo.coordinator, "Coordinator address")->required();
  app.add_option("--rank", wo.rank, "Worker rank");
  app.add_option("--name", name, "Name in log lines");
  app.add_option("--bind", bind, "Endpoint to listen on");
  app.add_option("--records", records, "Directory for the event records")->required();
  app.add_option("--consistency", consistency, "bsp | ssp | asp")->check(CLI::IsMember({"bsp", "ssp", "asp"}));
  app.add_option("--staleness", o.staleness, "SSP bound");
  app.add_option("--clocks", o.clocks, "Clocks to run");
  app.add_option("--keys", o.num_keys, "Keys in the table");
  app.add_option("--max-sleep-us", o.max_sleep_us, "Longest random pause per clock (worker 0: 3x)");
  app.add_option("--seed", o.seed, "Random seed");
  int die_rank = -1;
  uint32_t die_at_clock = 0;
  app.add_option("--die-rank", die_rank, "Fault injection: this worker kills itself (SIGKILL) ...");
  app.add_option("--die-at-clock", die_at_clock, "... when it reaches this clock");
  tessera::TransportFlags transport;  // --transport, --shm*, --coalesce*, --job_keys, --faults, ... from the launcher
  transport.AddTo(app);
  CLI11_PARSE(app, argc, argv);
  wo.transport = transport.choice();
  tessera::InitLogging(name, false);
  tessera::WarnAboutOldTransportVariables();
  if (!bind.empty()) wo.bind = bind;
  o.consistency = consistency == "bsp" ? tessera::proto::BSP : consistency == "ssp" ? tessera::proto::SSP
                                                                                      : tessera::proto::ASP;
  auto worker = tessera::Worker::Connect(wo);
  if (!worker.ok()) {
    TLOG_ERROR("{}", worker.status().message());
    return 1;
  }
  tessera::consistency::Recorder rec;
  if (die_rank >= 0 && static_cast<uint32_t>(die_rank) == (*worker)->rank()) {
    o.on_clock = [die_at_clock](uint64_t clock) {
      if (clock >= die_at_clock) std::raise(SIGKILL);
    };
  }
  absl::Status s = tessera::consistency::RunWorkload(**worker, o, rec);
  if (s.ok()) s = rec.WriteTo(records + "/worker-" + std::to_string((*worker)->rank()) + ".txt");
  if (!s.ok()) {
    TLOG_ERROR("{}", s.message());
    return 1;
  }
  std::printf("TESSERA_RESULT {\"steps\":%u,\"final_loss\":0}\n", o.clocks);
  std::fflush(stdout);
  tessera::proto::WorkerDone done;
  done.set_steps(o.clocks);
  if (auto f = (*worker)->Finish(done); !f.ok()) {
    TLOG_ERROR("{}", f.message());
    return 1;
  }
  return 0;
}

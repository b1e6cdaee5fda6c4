// tessera-coordinator: the I/O shell around CoordinatorCore. Messages from
// the transport are queued and fed to the core on the main thread, together
// with a Tick every 50 ms; outputs are sent as they come. When the job ends
// it writes the summary file and exits 0 (all workers done) or 1 (failed,
// with the reason in the last log line).
#include <condition_variable>
#include <csignal>
#include <cstdio>
#include <deque>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <thread>

#include "CLI/CLI.hpp"
#include "absl/strings/str_cat.h"
#include "coordinator/coordinator_core.h"
#include "common/logging.h"
#include "transport/transport_factory.h"

namespace tessera {
namespace {

struct CoordinatorFlags {
  std::string bind = "tcp://127.0.0.1:0";
  std::string address_file;
  std::string summary_file;
  std::string name = "coordinator";
  uint32_t servers = 1;
  uint32_t workers = 1;
  uint32_t vshards = 64;
  double assemble_timeout = 30;
  double heartbeat_interval = 1;  // accepted for symmetry with the nodes; the coordinator only watches
  double lease = 5;
  bool debug = false;
};

Nanos ToNanos(double seconds) { return static_cast<Nanos>(seconds * 1e9); }

std::string JsonString(const std::string& s) {
  std::string out = "\"";
  for (unsigned char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\t': out += "\\t"; break;
      default:
        if (c < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\u%04x", c);
          out += buf;
        } else {
          out += static_cast<char>(c);
        }
    }
  }
  return out + "\"";
}

// A worker's report is embedded as a JSON object only if it looks like one
// (balanced braces outside strings); anything else is embedded as a string.
std::string JsonObjectOrString(const std::string& s) {
  if (s.size() < 2 || s.front() != '{' || s.back() != '}') return JsonString(s);
  int depth = 0;
  bool in_string = false, escaped = false;
  for (char c : s) {
    if (in_string) {
      if (escaped) escaped = false;
      else if (c == '\\') escaped = true;
      else if (c == '"') in_string = false;
      continue;
    }
    if (c == '"') in_string = true;
    else if (c == '{' || c == '[') ++depth;
    else if (c == '}' || c == ']') --depth;
    if (depth < 0) return JsonString(s);
  }
  return depth == 0 && !in_string ? s : JsonString(s);
}

bool WriteFileAtomically(const std::string& path, const std::string& content) {
  std::string tmp = path + ".tmp";
  {
    std::ofstream f(tmp, std::ios::trunc);
    if (!f) return false;
    f << content;
    if (!f.flush()) return false;
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  return !ec;
}

std::string Summary(const CoordinatorCore& core) {
  std::vector<const CoordinatorCore::Node*> workers, servers;
  for (const auto& [id, n] : core.nodes()) (n.info.role() == proto::WORKER ? workers : servers).push_back(&n);
  auto by_rank = [](const auto* a, const auto* b) { return a->info.rank() < b->info.rank(); };
  std::sort(workers.begin(), workers.end(), by_rank);
  std::sort(servers.begin(), servers.end(), by_rank);
  std::string j = absl::StrCat("{\"status\": ", core.phase() == CoordinatorCore::Phase::kDone ? "\"ok\"" : "\"failed\"",
                               ", \"reason\": ", JsonString(core.failure_reason()), ", \"workers\": [");
  for (size_t i = 0; i < workers.size(); ++i) {
    const auto& r = workers[i]->report;
    absl::StrAppend(&j, i ? ", " : "", "{\"rank\": ", workers[i]->info.rank(),
                    ", \"done\": ", workers[i]->done ? "true" : "false", ", \"steps\": ", r.steps(),
                    ", \"final_loss\": ", r.final_loss(), ", \"bytes_pushed\": ", r.bytes_pushed(),
                    ", \"bytes_pulled\": ", r.bytes_pulled(), ", \"report\": ",
                    r.report_json().empty() ? "{}" : JsonObjectOrString(r.report_json()), "}");
  }
  absl::StrAppend(&j, "], \"servers\": [");
  for (size_t i = 0; i < servers.size(); ++i) {
    absl::StrAppend(&j, i ? ", " : "", "{\"rank\": ", servers[i]->info.rank(),
                    ", \"address\": ", JsonString(servers[i]->info.address()), "}");
  }
  absl::StrAppend(&j, "]}\n");
  return j;
}

int Run(const CoordinatorFlags& flags) {
  if (flags.servers == 0 || flags.workers == 0 || flags.vshards == 0) {
    TLOG_ERROR("--servers, --workers and --vshards must be positive");
    return 2;
  }
  if (flags.vshards < flags.servers) {
    TLOG_ERROR("--vshards ({}) must be at least --servers ({})", flags.vshards, flags.servers);
    return 2;
  }
  auto transport = MakeTransport(flags.bind);
  if (!transport.ok()) {
    TLOG_ERROR("cannot create transport: {}", transport.status().ToString());
    return 1;
  }
  std::mutex mu;
  std::condition_variable cv;
  std::deque<Message> inbox;
  Transport* t = transport->get();
  if (auto s = t->Start([&](Message m) {
        std::lock_guard lock(mu);
        inbox.push_back(std::move(m));
        cv.notify_one();
      });
      !s.ok()) {
    TLOG_ERROR("cannot listen on {}: {}", flags.bind, s.ToString());
    return 1;
  }
  if (!flags.address_file.empty() && !WriteFileAtomically(flags.address_file, t->address() + "\n")) {
    TLOG_ERROR("cannot write the address file {}", flags.address_file);
    return 1;
  }
  TLOG_INFO("listening on {}; waiting for {} servers and {} workers (assemble timeout {} s)", t->address(),
            flags.servers, flags.workers, flags.assemble_timeout);

  CoordinatorOptions options;
  options.servers = flags.servers;
  options.workers = flags.workers;
  options.vshards = flags.vshards;
  options.assemble_timeout = ToNanos(flags.assemble_timeout);
  options.lease = ToNanos(flags.lease);
  options.address = t->address();
  CoordinatorCore core(options, MonotonicNow());

  auto send_all = [&](std::vector<Outgoing> out) {
    for (Outgoing& o : out) (void)t->Send(o.to, std::move(o.message));
  };
  CoordinatorCore::Phase last_phase = core.phase();
  while (!core.finished()) {
    std::deque<Message> batch;
    {
      std::unique_lock lock(mu);
      cv.wait_for(lock, std::chrono::milliseconds(50), [&] { return !inbox.empty(); });
      batch.swap(inbox);
    }
    for (Message& m : batch) send_all(core.Step(m, MonotonicNow()));
    send_all(core.Tick(MonotonicNow()));
    if (core.phase() != last_phase && core.phase() == CoordinatorCore::Phase::kRunning) {
      TLOG_INFO("job assembled: {} servers, {} workers, {} virtual shards; shard map epoch {}", flags.servers,
                flags.workers, flags.vshards, core.shard_map().epoch());
    }
    last_phase = core.phase();
  }
  // Give the shutdown messages time to leave before the transport closes.
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  t->Stop();
  if (!flags.summary_file.empty() && !WriteFileAtomically(flags.summary_file, Summary(core))) {
    TLOG_ERROR("cannot write the summary file {}", flags.summary_file);
  }
  if (core.phase() == CoordinatorCore::Phase::kDone) {
    TLOG_INFO("job finished: all {} workers done", flags.workers);
    return 0;
  }
  TLOG_ERROR("job failed: {}", core.failure_reason());
  return 1;
}

}  // namespace
}  // namespace tessera

int main(int argc, char** argv) {
  tessera::CoordinatorFlags flags;
  CLI::App app{"tessera-coordinator: membership, shard map, heartbeats, barriers and job end.\n"
               "Started by tessera-launch; servers and workers register with it."};
  app.add_option("--bind", flags.bind, "Endpoint to listen on (tcp://HOST:PORT, port 0 = any; or ipc://PATH)");
  app.add_option("--address-file", flags.address_file, "Write the bound address to this file once listening");
  app.add_option("--summary-file", flags.summary_file, "Write the job summary (JSON) here at the end");
  app.add_option("--servers", flags.servers, "Number of servers in the job")->required();
  app.add_option("--workers", flags.workers, "Number of workers in the job")->required();
  app.add_option("--vshards", flags.vshards, "Virtual shards the key space is hashed onto");
  app.add_option("--assemble-timeout", flags.assemble_timeout, "Seconds for every process to register");
  app.add_option("--heartbeat-interval", flags.heartbeat_interval, "Seconds between node heartbeats (informational)");
  app.add_option("--lease", flags.lease, "Seconds of silence after which a node is declared lost");
  app.add_option("--name", flags.name, "Name in log lines");
  app.add_flag("--debug", flags.debug, "Log debug lines");
  CLI11_PARSE(app, argc, argv);
  tessera::InitLogging(flags.name, flags.debug);
  std::signal(SIGPIPE, SIG_IGN);
  return tessera::Run(flags);
}

// tessera-push-pull-bench: a worker program that measures the throughput of
// Tessera pushes and pulls of large dense rows, to compare with raw ZeroMQ
// (bench/raw_zmq_bench.cc) in bench/run_push_pull.sh.
//
// For every size S it creates one DENSE table with a single row of S/4 floats
// (ACCUMULATE optimizer, so every push is applied) and measures, for each op
// and mode, the payload rate in MB/s (1 MB = 1e6 bytes of values; keys and
// headers are not counted):
//   ops:   push      one Push of the row (S bytes to the server, a tiny ack back)
//          pull      one Pull of the row (a tiny request, S bytes back)
//          pushpull  a Push then a Pull of the row, both in flight (2 S bytes)
//          pullview  one PullView of the row (worker/pulled_rows.h): as pull,
//                    but the row stays in the buffer it arrived in (no copy
//                    into the caller's buffer); the view is dropped once
//                    done, as the raw ZeroMQ receiver drops each message
//   modes: sequential  one op outstanding at a time
//          inflight8   8 ops outstanding (each pull into its own buffer)
//          stream      push only: 64 pushes outstanding, the closest match to
//                      a one-way ZeroMQ PUSH/PULL stream (every push is still
//                      acknowledged, and all acks are awaited)
// Each repeat lasts at least --min_seconds and --min_messages ops; a result
// is the median of --repeats repeats after one short warm-up repeat. Around
// every repeat the program probes how close the two CPUs are
// (bench/cpu_pair_probe.h): a result's probe_ns[r] is measured before repeat
// r, the last entry after the last repeat; -1 where the probe cannot run.
//
// Process contract: the flags every worker program gets (--coordinator,
// --rank, --name, --bind), progress on stdout as TESSERA_PROGRESS lines, one
// TESSERA_RESULT line with every measurement, the same JSON in --out if given,
// Worker::Finish with the report. Exit 0 iff everything succeeded.
#include <algorithm>
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "CLI/CLI.hpp"
#include "bench/cpu_pair_probe.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/logging.h"
#include "worker/worker.h"
#include "worker/worker_flags.h"

namespace tessera::bench {
namespace {

constexpr uint32_t kFirstTable = 100;
constexpr int kStreamWindow = 64;

struct BenchFlags {
  WorkerProcessFlags process;  // the process contract: set by the launcher
  std::vector<size_t> sizes = {4096, 1 << 20, 16 << 20};
  std::vector<std::string> ops = {"push", "pull", "pushpull"};
  std::vector<std::string> modes = {"sequential", "inflight8", "stream"};
  int repeats = 5;
  double min_seconds = 0.5;
  uint64_t min_messages = 20;
  std::string out;
};

void EmitLine(const std::string& tag, const std::string& json) {
  std::fputs(absl::StrCat(tag, " ", json, "\n").c_str(), stdout);
  std::fflush(stdout);
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2.0;
}

int WindowOf(const std::string& mode) {
  if (mode == "sequential") return 1;
  if (mode == "inflight8") return 8;
  return kStreamWindow;
}

class PushPullBench {
 public:
  PushPullBench(const BenchFlags& flags, Worker& worker) : flags_(flags), worker_(worker) {}

  absl::Status Run();

 private:
  // One repeat of (op, mode) on `table`, whose row has values_.size() floats
  // or fewer (`floats`). Returns MB/s.
  absl::StatusOr<double> Repeat(uint32_t table, size_t floats, const std::string& op, const std::string& mode,
                                double min_seconds, uint64_t min_messages);

  const BenchFlags& flags_;
  Worker& worker_;
  std::vector<float> values_;            // what every push sends
  std::vector<std::vector<float>> out_;  // one pull destination per window slot
  std::vector<PulledRows> views_;        // the same for pullview
  uint64_t ops_ = 0;
};

absl::StatusOr<double> PushPullBench::Repeat(uint32_t table, size_t floats, const std::string& op,
                                             const std::string& mode, double min_seconds, uint64_t min_messages) {
  const int window = WindowOf(mode);
  const bool view = op == "pullview";
  const bool push = op == "push" || op == "pushpull";
  const bool pull = op != "push";
  const Key key = 0;
  const std::span<const Key> keys(&key, 1);
  const std::span<const float> values(values_.data(), floats);

  struct Slot {
    Future push, pull;
  };
  std::vector<Slot> slots(window);
  const Nanos start = MonotonicNow();
  const auto keep_going = [&](uint64_t issued) {
    return issued < min_messages || static_cast<double>(MonotonicNow() - start) / kSeconds < min_seconds;
  };
  const auto issue = [&](int s) {
    if (push) slots[s].push = worker_.Push(table, keys, values);
    if (pull && view) {
      slots[s].pull = worker_.PullView(table, keys, &views_[s]);
    } else if (pull) {
      slots[s].pull = worker_.Pull(table, keys, std::span<float>(out_[s].data(), floats));
    }
  };
  // Waits for both requests of a slot (its buffers must outlive them, even
  // on error); returns the first error.
  const auto wait = [&](int s) -> absl::Status {
    absl::Status st = push ? slots[s].push.Wait() : absl::OkStatus();
    if (pull) st.Update(slots[s].pull.Wait());
    if (view && st.ok()) {
      if (views_[s].size() != 1 || views_[s].width() != floats) {
        st = absl::InternalError(absl::StrCat("PullView gave ", views_[s].size(), " rows of ", views_[s].width(),
                                              " floats; expected 1 of ", floats));
      }
      views_[s].Clear();
    }
    return st;
  };

  uint64_t issued = 0, completed = 0;
  int outstanding = 0;
  for (; outstanding < window && keep_going(issued); ++outstanding) issue(static_cast<int>(issued++ % window));
  // Slots complete in issue order: the oldest one is completed % window.
  while (outstanding > 0) {
    const int s = static_cast<int>(completed % window);
    if (absl::Status st = wait(s); !st.ok()) {
      // Let every other issued request finish before the buffers go away.
      for (uint64_t k = completed + 1; k < issued; ++k) (void)wait(static_cast<int>(k % window));
      return st;
    }
    ++completed;
    --outstanding;
    if (keep_going(issued)) {
      issue(static_cast<int>(issued++ % window));
      ++outstanding;
    }
  }
  const double seconds = static_cast<double>(MonotonicNow() - start) / kSeconds;
  ops_ += completed;
  const double bytes_per_op = static_cast<double>(floats * sizeof(float)) * ((push ? 1 : 0) + (pull ? 1 : 0));
  return static_cast<double>(completed) * bytes_per_op / seconds / 1e6;
}

absl::Status PushPullBench::Run() {
  const size_t max_size = *std::max_element(flags_.sizes.begin(), flags_.sizes.end());
  values_.assign(max_size / sizeof(float), 1.0f / 1024);
  out_.assign(8, std::vector<float>(max_size / sizeof(float), 0.0f));
  views_.resize(8);

  for (size_t i = 0; i < flags_.sizes.size(); ++i) {
    TableOptions t;
    t.id = kFirstTable + static_cast<uint32_t>(i);
    t.name = absl::StrCat("bench.row", flags_.sizes[i]);
    t.width = static_cast<uint32_t>(flags_.sizes[i] / sizeof(float));
    t.kind = proto::DENSE;
    t.dense_rows = 1;
    t.optimizer = proto::ACCUMULATE;
    if (absl::Status s = worker_.CreateTable(t); !s.ok()) {
      return absl::Status(s.code(), absl::StrCat("creating table ", t.id, ": ", s.message()));
    }
  }
  if (absl::Status s = worker_.Barrier("start"); !s.ok()) return s;

  std::vector<std::string> results;
  for (size_t i = 0; i < flags_.sizes.size(); ++i) {
    const uint32_t table = kFirstTable + static_cast<uint32_t>(i);
    const size_t floats = flags_.sizes[i] / sizeof(float);
    for (const std::string& mode : flags_.modes) {
      for (const std::string& op : flags_.ops) {
        if (mode == "stream" && op != "push") continue;  // pulls need a buffer per request in flight
        absl::StatusOr<double> warm = Repeat(table, floats, op, mode, std::min(0.1, flags_.min_seconds),
                                             std::min<uint64_t>(5, flags_.min_messages));
        if (!warm.ok()) return warm.status();
        std::vector<double> mbps;
        std::vector<double> probe_ns;  // before each repeat, and after the last
        for (int r = 0; r < flags_.repeats; ++r) {
          probe_ns.push_back(ProbeRoundTripNs("tessera-push-pull-bench"));
          absl::StatusOr<double> rate = Repeat(table, floats, op, mode, flags_.min_seconds, flags_.min_messages);
          if (!rate.ok()) {
            return absl::Status(rate.status().code(), absl::StrCat(op, " ", mode, " of ", flags_.sizes[i],
                                                                   " bytes: ", rate.status().message()));
          }
          mbps.push_back(*rate);
        }
        probe_ns.push_back(ProbeRoundTripNs("tessera-push-pull-bench"));
        const double median = Median(mbps);
        TLOG_INFO("size {} {} {}: median {:.1f} MB/s", flags_.sizes[i], op, mode, median);
        const auto numbers = [](const std::vector<double>& v) {
          return absl::StrJoin(v, ",", [](std::string* o, double x) { absl::StrAppendFormat(o, "%.1f", x); });
        };
        const std::string item = absl::StrFormat(
            "{\"size\":%d,\"op\":\"%s\",\"mode\":\"%s\",\"median_mbps\":%.1f,\"mbps\":[%s],\"probe_ns\":[%s]}",
            flags_.sizes[i], op, mode, median, numbers(mbps), numbers(probe_ns));
        EmitLine("TESSERA_PROGRESS", absl::StrCat("{\"step\":", ops_, ",\"result\":", item, "}"));
        results.push_back(item);
      }
    }
  }

  const WorkerStats stats = worker_.stats();
  const std::string report = absl::StrCat("{\"steps\":", ops_, ",\"final_loss\":0,\"bytes_pushed\":", stats.bytes_pushed,
                                          ",\"bytes_pulled\":", stats.bytes_pulled, ",\"results\":[",
                                          absl::StrJoin(results, ","), "]}");
  EmitLine("TESSERA_RESULT", report);
  if (!flags_.out.empty()) {
    std::ofstream out(flags_.out);
    out << report << "\n";
    if (!out) return absl::InternalError(absl::StrCat("cannot write ", flags_.out));
  }
  if (absl::Status s = worker_.Finish(MakeWorkerDone(stats, ops_, 0, report)); !s.ok()) {
    return absl::Status(s.code(), absl::StrCat("finish: ", s.message()));
  }
  return absl::OkStatus();
}

int Main(int argc, char** argv) {
  BenchFlags flags;
  CLI::App app{"tessera-push-pull-bench: throughput of Tessera pushes and pulls of one large dense row per size. "
               "A worker program, started by tessera-launch (configs/bench_push_pull.yaml) or bench/run_push_pull.sh."};
  app.option_defaults()->always_capture_default();
  flags.process.AddTo(app);
  app.add_option("--sizes", flags.sizes, "row sizes in bytes, comma-separated, multiples of 4")
      ->delimiter(',')
      ->check(CLI::PositiveNumber);
  app.add_option("--ops", flags.ops, "push, pull, pushpull, pullview")
      ->delimiter(',')
      ->check(CLI::IsMember({"push", "pull", "pushpull", "pullview"}));
  app.add_option("--modes", flags.modes, "sequential, inflight8, stream (push only)")
      ->delimiter(',')
      ->check(CLI::IsMember({"sequential", "inflight8", "stream"}));
  app.add_option("--repeats", flags.repeats, "measured repeats per size, op and mode")->check(CLI::PositiveNumber);
  app.add_option("--min_seconds,--min-seconds", flags.min_seconds, "minimum duration of one repeat")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--min_messages,--min-messages", flags.min_messages, "minimum ops of one repeat")
      ->check(CLI::PositiveNumber);
  app.add_option("--out", flags.out, "also write the TESSERA_RESULT JSON to this file");
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    std::fprintf(stderr, "tessera-push-pull-bench: %s (see --help)\n", e.what());
    return 1;
  }
  for (size_t size : flags.sizes) {
    if (size % sizeof(float) != 0) {
      std::fprintf(stderr, "tessera-push-pull-bench: --sizes: %zu is not a multiple of 4\n", size);
      return 1;
    }
  }
  return flags.process.Run("benchmark", [&flags](Worker& worker) { return PushPullBench(flags, worker).Run(); });
}

}  // namespace
}  // namespace tessera::bench

int main(int argc, char** argv) { return tessera::bench::Main(argc, argv); }

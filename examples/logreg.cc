// tessera-logreg: sparse logistic regression on a synthetic click log,
// trained against the parameter server.
//
// Model: one weight per feature key in SPARSE table 0 (width 1, created on
// first touch as zero) and the bias in DENSE table 1 (one row). Both tables
// use the server-side SGD optimizer with --learning_rate, so a worker pushes
// the mean log-loss gradient of its minibatch and the server takes the step.
//
// One step: unique the batch's keys, pull their weights and the bias, compute
// the gradient, push it. The pushes of step t are in flight while the keys of
// step t+1 are prepared; the pull of step t+1 is issued after they complete,
// so every step reads this worker's own previous update. After each step the
// worker calls Clock() (except with asp, the default, where clocks bound
// nothing): with --consistency ssp or bsp the servers then bound how stale
// the weights it reads may be (under asp, Clock() is a notice that waits for
// nothing).
// Every worker takes the same number of steps per epoch.
//
// For experiments on stragglers, --step_ms pads the compute of every step to
// a minimum time (the toy model computes in well under a millisecond; a real
// one does not), and --straggler slows one worker's compute by
// --straggler_slowdown: always the same worker (fixed) or a different one
// from time to time (rotating), see examples/straggler.h. With --eval_every,
// worker 0 also evaluates the test set every that many steps. Progress lines
// carry "t", the seconds since training started (the "start" barrier).
//
// --weights dense keeps the weights in one DENSE row of --features floats
// (a feature's index is its rank in the click log): every step pulls and
// pushes the whole row, the traffic of a dense model, which is what gradient
// compression (--compression, --pull_compression; compress/codec.h specs)
// is for. --weights sparse (the default) pulls and pushes only the batch's keys.
//
// Per epoch every worker passes Barrier("epoch-N"), then evaluates AUC and
// log-loss on the whole held-out test set (the same set on every worker) and
// prints one TESSERA_PROGRESS line with test_auc. At the end it prints one
// TESSERA_RESULT line and reports the same JSON to the coordinator through
// Worker::Finish. Exit status 0 iff everything succeeded; otherwise one
// error line on stderr and status 1.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/logging.h"
#include "examples/straggler.h"
#include "examples/synthetic_clicklog.h"
#include "worker/worker.h"
#include "worker/worker_flags.h"

namespace tessera::examples {
namespace {

constexpr uint32_t kWeightTable = 0;
constexpr uint32_t kBiasTable = 1;
constexpr Key kBiasKey = 0;
constexpr uint64_t kProgressEverySteps = 50;

struct LogRegFlags {
  WorkerProcessFlags process;  // the process contract: set by the launcher
  // The job; the defaults are those of configs/local.yaml.
  uint64_t features = 5000;          // distinct feature ids
  uint32_t fields = 20;              // active features per example
  double zipf = 1.0;                 // exponent of the feature-id distribution
  uint64_t train_examples = 500000;  // of the whole job, split across workers
  uint64_t test_examples = 20000;    // held out, the same on every worker
  uint32_t epochs = 3;               // passes over the training data
  uint32_t batch = 200;              // examples per step
  float learning_rate = 1.0f;        // server-side SGD step size
  uint64_t seed = 7;                 // data, ground truth and shuffling
  std::string consistency = "asp";   // asp | ssp | bsp, for both tables
  uint32_t staleness = 2;            // ssp only: the staleness bound
  // Experiments (examples/straggler.h).
  double step_ms = 0;                 // minimum compute time of a step
  std::string straggler = "none";     // none | fixed | rotating
  int straggler_rank = -1;            // fixed: the slow worker (-1: the last)
  double straggler_slowdown = 2.0;    // compute-time factor of the slow worker
  uint64_t straggler_period = 1;      // rotating: steps before the slow worker changes
  uint64_t eval_every = 0;            // worker 0 evaluates every this many steps (0: per epoch only)
  std::string weights = "sparse";     // sparse | dense: see the file comment
  std::string compression;            // codec spec of pushed gradients ("": none)
  std::string pull_compression;       // codec spec of pulled weights ("": none)
};

// A JSON number, or null when it is not finite (JSON has no NaN).
std::string JsonNumber(double v) { return std::isfinite(v) ? absl::StrFormat("%.6g", v) : "null"; }

// Waits for every future (their buffers must outlive them, even on error)
// and returns the first error, prefixed with `what`.
absl::Status WaitAll(std::span<const Future> futures, const char* what) {
  absl::Status first;
  for (const Future& f : futures) {
    absl::Status s = f.Wait();
    if (first.ok() && !s.ok()) first = absl::Status(s.code(), absl::StrCat(what, ": ", s.message()));
  }
  return first;
}

void EmitLine(const std::string& tag, const std::string& json) {
  std::fputs(absl::StrCat(tag, " ", json, "\n").c_str(), stdout);
  std::fflush(stdout);
}

// The keys of one minibatch, deduplicated, and where each example's features
// sit among them. Reused across steps to avoid reallocation.
struct MinibatchKeys {
  std::vector<Key> unique_keys;
  std::vector<uint32_t> slot;  // per feature occurrence: index into unique_keys
  absl::flat_hash_map<Key, uint32_t> index;

  void Build(const ClickLogBatch& data, std::span<const uint32_t> examples) {
    unique_keys.clear();
    slot.clear();
    index.clear();
    for (uint32_t e : examples) {
      for (Key k : data.keys_of(e)) {
        auto [it, inserted] = index.try_emplace(k, static_cast<uint32_t>(unique_keys.size()));
        if (inserted) unique_keys.push_back(k);
        slot.push_back(it->second);
      }
    }
  }
};

class LogRegJob {
 public:
  LogRegJob(const LogRegFlags& flags, Worker& worker, const SyntheticClickLog& log)
      : flags_(flags), worker_(worker), log_(log) {}

  absl::Status Run();

 private:
  absl::Status CreateTables();
  // Trains one epoch over this worker's partition in a seeded shuffled order.
  absl::Status TrainEpoch(uint32_t epoch);
  // Pulls the weights of every test key and scores the test set.
  absl::Status Evaluate(double& auc, double& loss);
  // Seconds since training started.
  double TrainSeconds() const { return static_cast<double>(MonotonicNow() - train_start_) / kSeconds; }

  const LogRegFlags& flags_;
  Worker& worker_;
  const SyntheticClickLog& log_;
  ClickLogBatch train_;
  ClickLogBatch test_;

  uint64_t steps_ = 0;
  StragglerModel straggler_;
  // --weights dense: feature key -> index in the row, and the pulled row.
  bool dense_ = false;
  absl::flat_hash_map<Key, uint32_t> dense_index_;
  PulledRows dense_row_;  // the dense weights as last pulled
  // Pulls the weights of `keys` into `out` (one per key) and the bias: in
  // dense mode the whole row, then gathered.
  absl::Status PullWeights(std::span<const Key> keys, std::vector<float>& out, float& bias, const char* what);
  // Pushes the gradient of `keys` (dense mode: scattered into a whole row,
  // kept in `row`, which must live until the push completes).
  Future PushWeights(std::span<const Key> keys, std::span<const float> gradient, std::vector<float>& row);
  uint64_t resume_steps_ = 0;         // a replacement worker: steps its predecessor took
  uint64_t epoch_trained_steps_ = 0;  // steps this process took in the current epoch
  Nanos train_start_ = 0;
  double epoch_loss_sum_ = 0;   // sum of example losses this epoch
  uint64_t epoch_examples_ = 0;
  double window_loss_sum_ = 0;  // since the last progress line
  uint64_t window_examples_ = 0;
  double final_train_loss_ = NAN;
};

absl::Status LogRegJob::CreateTables() {
  TableOptions weights;
  weights.id = kWeightTable;
  weights.name = "logreg.weights";
  weights.width = 1;
  weights.kind = proto::SPARSE;
  weights.optimizer = proto::SGD;
  weights.learning_rate = flags_.learning_rate;
  weights.init = proto::ZEROS;
  weights.consistency = flags_.consistency == "bsp"   ? proto::BSP
                        : flags_.consistency == "ssp" ? proto::SSP
                                                      : proto::ASP;
  weights.staleness = flags_.consistency == "ssp" ? flags_.staleness : 0;
  weights.compression = flags_.compression;
  weights.pull_compression = flags_.pull_compression;
  if (dense_) {
    weights.kind = proto::DENSE;
    weights.dense_rows = 1;
    weights.width = static_cast<uint32_t>(flags_.features);
  }
  if (absl::Status s = worker_.CreateTable(weights); !s.ok()) {
    return absl::Status(s.code(), absl::StrCat("creating the weight table: ", s.message()));
  }
  TableOptions bias = weights;
  bias.width = 1;
  bias.id = kBiasTable;
  bias.name = "logreg.bias";
  bias.kind = proto::DENSE;
  bias.dense_rows = 1;
  if (absl::Status s = worker_.CreateTable(bias); !s.ok()) {
    return absl::Status(s.code(), absl::StrCat("creating the bias table: ", s.message()));
  }
  return absl::OkStatus();
}

absl::Status LogRegJob::PullWeights(std::span<const Key> keys, std::vector<float>& out, float& bias,
                                    const char* what) {
  const Key bias_key = kBiasKey;
  out.resize(keys.size());
  if (!dense_) {
    const Future pulls[] = {worker_.Pull(kWeightTable, keys, out),
                            worker_.Pull(kBiasTable, std::span<const Key>(&bias_key, 1), std::span<float>(&bias, 1))};
    return WaitAll(pulls, what);
  }
  // The whole dense row is only read here (a few of its entries per
  // step): a view of it, where it arrived, instead of a copy.
  const Key row = 0;
  const Future pulls[] = {worker_.PullView(kWeightTable, std::span<const Key>(&row, 1), &dense_row_),
                          worker_.Pull(kBiasTable, std::span<const Key>(&bias_key, 1), std::span<float>(&bias, 1))};
  if (absl::Status s = WaitAll(pulls, what); !s.ok()) return s;
  const std::span<const float> w = dense_row_.row(0);
  for (size_t i = 0; i < keys.size(); ++i) out[i] = w[dense_index_.at(keys[i])];
  return absl::OkStatus();
}

Future LogRegJob::PushWeights(std::span<const Key> keys, std::span<const float> gradient, std::vector<float>& row) {
  if (!dense_) return worker_.Push(kWeightTable, keys, gradient);
  row.assign(flags_.features, 0.0f);
  for (size_t i = 0; i < keys.size(); ++i) row[dense_index_.at(keys[i])] += gradient[i];
  static const Key kRow = 0;
  return worker_.Push(kWeightTable, std::span<const Key>(&kRow, 1), row);
}

absl::Status LogRegJob::TrainEpoch(uint32_t epoch) {
  std::vector<uint32_t> order(train_.size());
  for (uint32_t i = 0; i < order.size(); ++i) order[i] = i;
  SplitMixRng shuffle_rng(Mix64(flags_.seed ^ Mix64((uint64_t{worker_.rank()} << 32) | epoch)));
  for (size_t i = order.size(); i > 1; --i) std::swap(order[i - 1], order[shuffle_rng.Next() % i]);

  // Every worker takes the same number of steps (and clocks) per epoch, as
  // many as the largest partition needs: partitions differ by at most one
  // example, and with BSP or SSP a worker that clocked once more than the
  // others would wait for them forever. A worker's surplus steps are empty.
  const size_t batch = flags_.batch;
  const uint64_t largest_partition = (flags_.train_examples + worker_.num_workers() - 1) / worker_.num_workers();
  const size_t steps = (largest_partition + batch - 1) / batch;
  const auto examples_of = [&](size_t step) {
    const size_t begin = std::min(order.size(), step * batch);
    return std::span<const uint32_t>(order).subspan(begin, std::min(batch, order.size() - begin));
  };

  const Key bias_key = kBiasKey;
  const size_t fields = train_.fields;
  // Two sets of buffers: the pushes of one step read one set while the keys
  // of the next step are built in the other.
  MinibatchKeys keys[2];
  std::vector<float> weights[2], gradient[2], dense_gradient[2];
  float bias[2] = {0, 0}, bias_gradient[2] = {0, 0};
  // Empty Futures are an error to wait on: start with completed ones.
  Future pending_push[2] = {Future::Ready(absl::OkStatus()), Future::Ready(absl::OkStatus())};

  if (steps > 0) keys[0].Build(train_, examples_of(0));
  for (size_t step = 0; step < steps; ++step) {
    const int cur = static_cast<int>(step % 2);
    if (steps_ < resume_steps_) {  // a replacement skips what its predecessor did
      if (++steps_ == resume_steps_ && step + 1 < steps) keys[1 - cur].Build(train_, examples_of(step + 1));
      continue;
    }
    ++epoch_trained_steps_;
    const std::span<const uint32_t> examples = examples_of(step);
    const size_t count = examples.size();
    MinibatchKeys& mk = keys[cur];

    // The previous step's pushes must be applied before this step reads.
    if (absl::Status s = WaitAll(pending_push, "push"); !s.ok()) return s;

    if (count > 0) {
      if (absl::Status s = PullWeights(mk.unique_keys, weights[cur], bias[cur], "pull"); !s.ok()) return s;
      const Nanos compute_start = MonotonicNow();

      // Mean log-loss gradient: d/dw_j = mean over examples of (p - y) x_j.
      gradient[cur].assign(mk.unique_keys.size(), 0.0f);
      double bias_grad = 0;
      double loss_sum = 0;
      const double inv_count = 1.0 / static_cast<double>(count);
      for (size_t i = 0; i < count; ++i) {
        const uint32_t* slots = &mk.slot[i * fields];
        double z = bias[cur];
        for (size_t f = 0; f < fields; ++f) z += weights[cur][slots[f]];
        const float y = train_.labels[examples[i]];
        loss_sum += LogLossOfLogit(z, y);
        const double d = (Sigmoid(z) - y) * inv_count;
        for (size_t f = 0; f < fields; ++f) gradient[cur][slots[f]] += static_cast<float>(d);
        bias_grad += d;
      }
      bias_gradient[cur] = static_cast<float>(bias_grad);
      if (flags_.step_ms > 0) {  // the compute a real model would take
        const double ms = flags_.step_ms * straggler_.Factor(worker_.rank(), worker_.num_workers(), steps_);
        std::this_thread::sleep_until(std::chrono::steady_clock::time_point(
            std::chrono::nanoseconds(compute_start + static_cast<Nanos>(ms * kMillis))));
      }
      pending_push[0] = PushWeights(mk.unique_keys, gradient[cur], dense_gradient[cur]);
      pending_push[1] = worker_.Push(kBiasTable, std::span<const Key>(&bias_key, 1),
                                     std::span<const float>(&bias_gradient[cur], 1));
      epoch_loss_sum_ += loss_sum;
      epoch_examples_ += count;
      window_loss_sum_ += loss_sum;
      window_examples_ += count;
    }

    // Overlap: prepare the next step's keys while the pushes travel.
    if (step + 1 < steps) keys[1 - cur].Build(train_, examples_of(step + 1));

    // This step's pushes carry the current clock; the next step's pulls the
    // next one. Under BSP or SSP this may wait for slower workers.
    if (absl::Status s = worker_.Clock(); !s.ok()) {
      (void)WaitAll(pending_push, "push");
      return absl::Status(s.code(), absl::StrCat("clock: ", s.message()));
    }

    ++steps_;
    if (steps_ % kProgressEverySteps == 0 && window_examples_ > 0) {
      EmitLine("TESSERA_PROGRESS",
               absl::StrCat("{\"epoch\":", epoch + 1, ",\"step\":", steps_, ",\"loss\":",
                            JsonNumber(window_loss_sum_ / static_cast<double>(window_examples_)),
                            ",\"t\":", JsonNumber(TrainSeconds()), "}"));
      window_loss_sum_ = 0;
      window_examples_ = 0;
    }
    if (flags_.eval_every > 0 && worker_.rank() == 0 && steps_ % flags_.eval_every == 0) {
      double auc = NAN, loss = NAN;
      if (absl::Status s = Evaluate(auc, loss); !s.ok()) return s;
      EmitLine("TESSERA_PROGRESS", absl::StrCat("{\"epoch\":", epoch + 1, ",\"step\":", steps_, ",\"test_loss\":",
                                                JsonNumber(loss), ",\"test_auc\":", JsonNumber(auc),
                                                ",\"t\":", JsonNumber(TrainSeconds()), "}"));
    }
  }
  return WaitAll(pending_push, "push");
}

absl::Status LogRegJob::Evaluate(double& auc, double& loss) {
  MinibatchKeys mk;
  std::vector<uint32_t> all(test_.size());
  for (uint32_t i = 0; i < all.size(); ++i) all[i] = i;
  mk.Build(test_, all);
  std::vector<float> weights;
  float bias = 0;
  if (absl::Status s = PullWeights(mk.unique_keys, weights, bias, "evaluation pull"); !s.ok()) return s;

  std::vector<float> logits(test_.size());
  const size_t fields = test_.fields;
  for (size_t i = 0; i < test_.size(); ++i) {
    double z = bias;
    for (size_t f = 0; f < fields; ++f) z += weights[mk.slot[i * fields + f]];
    logits[i] = static_cast<float>(z);
  }
  absl::StatusOr<double> a = Auc(logits, test_.labels);
  if (!a.ok()) return a.status();
  auc = *a;
  loss = LogLossFromLogits(logits, test_.labels);
  return absl::OkStatus();
}

absl::Status LogRegJob::Run() {
  const Nanos start = MonotonicNow();
  absl::StatusOr<StragglerModel::Mode> mode = StragglerModel::ParseMode(flags_.straggler);
  if (!mode.ok()) return mode.status();
  straggler_ = StragglerModel{.mode = *mode,
                              .rank = flags_.straggler_rank >= 0 ? static_cast<uint32_t>(flags_.straggler_rank)
                                                                 : worker_.num_workers() - 1,
                              .slowdown = flags_.straggler_slowdown,
                              .period = flags_.straggler_period,
                              .seed = flags_.seed};
  if (absl::Status s = straggler_.Validate(worker_.num_workers()); !s.ok()) return s;
  dense_ = flags_.weights == "dense";
  if (dense_) {
    if (flags_.features > (uint64_t{1} << 28)) {
      return absl::InvalidArgumentError("--weights dense needs --features <= 2^28 (one row of floats)");
    }
    for (uint64_t r = 1; r <= flags_.features; ++r) dense_index_[log_.KeyOfRank(r)] = static_cast<uint32_t>(r - 1);
  }
  if (absl::Status s = CreateTables(); !s.ok()) return s;

  train_ = log_.TrainPartition(worker_.rank(), worker_.num_workers(), flags_.train_examples);
  test_ = log_.TestSet(flags_.test_examples);
  absl::StatusOr<double> truth_auc = Auc(test_.truth_logits, test_.labels);
  if (!truth_auc.ok()) {
    return absl::Status(truth_auc.status().code(),
                        absl::StrCat("test set: ", truth_auc.status().message(), " (raise --test_examples)"));
  }
  const double truth_loss = LogLossFromLogits(test_.truth_logits, test_.labels);
  TLOG_INFO("worker {} of {}: {} train examples, {} test examples, truth test AUC {:.4f}", worker_.rank(),
            worker_.num_workers(), train_.size(), test_.size(), *truth_auc);

  // One clock per step: a replacement for a lost worker (on_worker_loss:
  // wait) resumes where its predecessor's clock stopped.
  resume_steps_ = worker_.clock();
  if (resume_steps_ > 0) {
    TLOG_INFO("replacing a lost worker (incarnation {}): resuming after step {}", worker_.incarnation(),
              resume_steps_);
  }
  if (absl::Status s = worker_.Barrier("start"); !s.ok()) return s;
  train_start_ = MonotonicNow();
  double train_seconds = 0;

  double test_auc = NAN, test_loss = NAN;
  for (uint32_t epoch = 0; epoch < flags_.epochs; ++epoch) {
    epoch_loss_sum_ = 0;
    epoch_examples_ = 0;
    epoch_trained_steps_ = 0;
    if (absl::Status s = TrainEpoch(epoch); !s.ok()) return s;
    train_seconds = TrainSeconds();  // this worker's steps are done (barriers and evaluation excluded)
    final_train_loss_ = epoch_examples_ > 0 ? epoch_loss_sum_ / static_cast<double>(epoch_examples_) : NAN;
    if (absl::Status s = worker_.Barrier(absl::StrCat("epoch-", epoch + 1)); !s.ok()) return s;
    if (epoch_trained_steps_ == 0 && resume_steps_ > 0) continue;  // an epoch its predecessor finished
    if (absl::Status s = Evaluate(test_auc, test_loss); !s.ok()) return s;
    TLOG_INFO("epoch {}: train loss {:.4f}, test loss {:.4f}, test AUC {:.4f} (truth {:.4f})", epoch + 1,
              final_train_loss_, test_loss, test_auc, *truth_auc);
    EmitLine("TESSERA_PROGRESS",
             absl::StrCat("{\"epoch\":", epoch + 1, ",\"step\":", steps_, ",\"loss\":", JsonNumber(final_train_loss_),
                          ",\"test_loss\":", JsonNumber(test_loss), ",\"test_auc\":", JsonNumber(test_auc),
                          ",\"t\":", JsonNumber(TrainSeconds()), "}"));
  }

  const WorkerStats stats = worker_.stats();
  const double seconds = static_cast<double>(MonotonicNow() - start) / kSeconds;
  const std::string result = absl::StrCat(
      "{\"steps\":", steps_, ",\"final_loss\":", JsonNumber(final_train_loss_), ",\"test_loss\":",
      JsonNumber(test_loss), ",\"test_auc\":", JsonNumber(test_auc), ",\"truth_auc\":", JsonNumber(*truth_auc),
      ",\"truth_loss\":", JsonNumber(truth_loss), ",\"train_examples\":", train_.size(), ",\"seconds\":",
      JsonNumber(seconds), ",\"train_seconds\":", JsonNumber(train_seconds), ",\"consistency\":\"", flags_.consistency, "\",\"worker_stats\":", StatsJson(stats),
      ",\"bytes_pushed\":", stats.bytes_pushed, ",\"bytes_pulled\":", stats.bytes_pulled, "}");
  EmitLine("TESSERA_RESULT", result);

  if (absl::Status s = worker_.Finish(MakeWorkerDone(stats, steps_, final_train_loss_, result)); !s.ok()) {
    return absl::Status(s.code(), absl::StrCat("finish: ", s.message()));
  }
  return absl::OkStatus();
}

int Main(int argc, char** argv) {
  LogRegFlags flags;
  CLI::App app{
      "tessera-logreg: sparse logistic regression on a synthetic click log, trained against a Tessera "
      "parameter server. Started by tessera-launch; prints TESSERA_PROGRESS and TESSERA_RESULT lines on stdout."};
  app.option_defaults()->always_capture_default();
  flags.process.AddTo(app);
  app.add_option("--features", flags.features, "distinct feature ids of the synthetic click log")
      ->check(CLI::PositiveNumber);
  app.add_option("--fields", flags.fields, "active features per example")->check(CLI::PositiveNumber);
  app.add_option("--zipf", flags.zipf, "exponent of the Zipf distribution of feature ids")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--train_examples,--train-examples", flags.train_examples, "training examples of the whole job, split across workers")
      ->check(CLI::PositiveNumber);
  app.add_option("--test_examples,--test-examples", flags.test_examples, "held-out examples every worker evaluates on")
      ->check(CLI::Range(uint64_t{2}, uint64_t{1} << 32));
  app.add_option("--epochs", flags.epochs, "passes over the training data")->check(CLI::PositiveNumber);
  app.add_option("--batch", flags.batch, "examples per minibatch (one pull and one push each)")
      ->check(CLI::PositiveNumber);
  app.add_option("--learning_rate,--learning-rate", flags.learning_rate, "SGD step size applied by the servers")
      ->check(CLI::PositiveNumber);
  app.add_option("--seed", flags.seed, "seed of the data, the ground truth and the shuffling");
  app.add_option("--consistency", flags.consistency,
                 "consistency model of both tables: asp (asynchronous), ssp (stale synchronous, see "
                 "--staleness) or bsp (bulk synchronous); with ssp and bsp the worker clocks once per step")
      ->check(CLI::IsMember({"asp", "ssp", "bsp"}));
  app.add_option("--staleness", flags.staleness, "ssp only: how many clocks a worker may run ahead of the slowest");
  app.add_option("--step_ms,--step-ms", flags.step_ms,
                 "experiments: pad the compute of every step to at least this many milliseconds (0: no padding)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--straggler", flags.straggler,
                 "experiments: none, fixed (--straggler_rank computes --straggler_slowdown times slower at every "
                 "step) or rotating (at every step one worker is that much slower; a different one every "
                 "--straggler_period steps); needs --step_ms")
      ->check(CLI::IsMember({"none", "fixed", "rotating"}));
  app.add_option("--straggler_rank,--straggler-rank", flags.straggler_rank, "fixed: the slow worker (-1: the last)");
  app.add_option("--straggler_slowdown,--straggler-slowdown", flags.straggler_slowdown,
                 "compute-time factor of the slow worker")
      ->check(CLI::Range(1.0, 1000.0));
  app.add_option("--straggler_period,--straggler-period", flags.straggler_period,
                 "rotating: steps before the slow worker changes")
      ->check(CLI::PositiveNumber);
  app.add_option("--weights", flags.weights,
                 "sparse: pull and push the batch's keys; dense: the weights are one row of --features floats, "
                 "pulled and pushed whole every step (a dense model's traffic)")
      ->check(CLI::IsMember({"sparse", "dense"}));
  app.add_option("--compression", flags.compression,
                 "codec of pushed gradients, e.g. topk:ratio=0.01 or fp16 (see docs/compression.md; empty: none)");
  app.add_option("--pull_compression,--pull-compression", flags.pull_compression,
                 "codec of pulled weights: none, fp16, bf16, qsgd or terngrad, without error feedback (empty: none)");
  app.add_option("--eval_every,--eval-every", flags.eval_every,
                 "worker 0 evaluates the test set every this many steps and reports test_loss (0: per epoch only)");
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    std::fprintf(stderr, "tessera-logreg: %s (see --help)\n", e.what());
    return 1;
  }
  if (flags.straggler != "none" && flags.step_ms <= 0) {
    std::fprintf(stderr, "tessera-logreg: --straggler %s needs --step_ms > 0 (the base compute time it slows)\n",
                 flags.straggler.c_str());
    return 1;
  }
  flags.process.InitLogs();

  ClickLogOptions data;
  data.features = flags.features;
  data.fields = flags.fields;
  data.zipf = flags.zipf;
  data.seed = flags.seed;
  absl::StatusOr<SyntheticClickLog> log = SyntheticClickLog::Create(data);
  if (!log.ok()) {
    TLOG_ERROR("invalid data options: {}", log.status().message());
    return 1;
  }

  WorkerOptions options = flags.process.ToOptions();
  absl::StatusOr<std::unique_ptr<Worker>> worker = Worker::Connect(options);
  if (!worker.ok()) {
    TLOG_ERROR("could not join the job: {}", worker.status().ToString());
    return 1;
  }
  LogRegJob job(flags, **worker, *log);
  if (absl::Status s = job.Run(); !s.ok()) {
    TLOG_ERROR("training failed: {}", s.ToString());
    return 1;
  }
  TLOG_INFO("done");
  return 0;
}

}  // namespace
}  // namespace tessera::examples

int main(int argc, char** argv) { return tessera::examples::Main(argc, argv); }

#pragma once
// A seeded synthetic click log drawn from a hidden ground-truth logistic model,
// plus the metrics used to judge a model trained on it (exact AUC, log-loss).
//
// The data:
// - There are `features` feature ids. Each example activates `fields` distinct
//   binary features; each id is drawn Zipf(`zipf`) over the ranks
//   1..features (rank 1 the most frequent), redrawn if already active in the
//   example. Ranks are turned into keys by a seeded bijective scramble, so hot
//   keys are spread over the 64-bit key space (never 0, 1, 2, ...).
// - The ground truth is a bias b* and one weight per rank, w*_r ~ N(0, sigma)
//   with sigma = logit_stddev / sqrt(fields), so the true logit of an example
//   has stddev about logit_stddev whatever `fields` is. The label is
//   Bernoulli(sigmoid(b* + sum of w* over the active features)).
// - Determinism: example i of a stream (train or test) depends only on
//   (seed, stream, i). A train partition p of P covers the global indices
//   [p*n/P, (p+1)*n/P) of the train stream, so the partitions of any P
//   together are the same data set. The test set is the first `count`
//   examples of the test stream, identical for every worker.
//
// Thread safety: SyntheticClickLog is immutable after Create(); its const
// methods may be called concurrently. ZipfSampler likewise (the RNG is the
// caller's).
#include <cmath>
#include <cstdint>
#include <span>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "common/keys.h"

namespace tessera::examples {

// A small, fast, deterministic 64-bit generator (splitmix64 sequence). The
// output for a given seed is the same on every platform and compiler.
class SplitMixRng {
 public:
  explicit SplitMixRng(uint64_t seed) : state_(seed) {}
  uint64_t Next() {
    state_ += 0x9e3779b97f4a7c15ULL;
    return Mix64(state_);
  }
  // Uniform in [0, 1) with 53 random bits.
  double Uniform() { return static_cast<double>(Next() >> 11) * 0x1.0p-53; }
  // Standard normal (Box-Muller; one of the pair is discarded for simplicity).
  double Normal();

 private:
  uint64_t state_;
};

// Samples ranks 1..n with P(k) proportional to k^-exponent, in O(1) time and
// memory per draw, by rejection-inversion (W. Hormann, G. Derflinger, "Rejection-
// inversion to generate variates from monotone discrete distributions", 1996).
class ZipfSampler {
 public:
  // Requires n >= 1 and a finite exponent >= 0 (0 = uniform); else an error.
  static absl::StatusOr<ZipfSampler> Create(uint64_t n, double exponent);

  // A rank in [1, n].
  uint64_t Sample(SplitMixRng& rng) const;

  uint64_t n() const { return n_; }
  double exponent() const { return exponent_; }

 private:
  ZipfSampler(uint64_t n, double exponent);
  double H(double x) const;         // an antiderivative of h(x) = x^-exponent
  double HInverse(double y) const;  // its inverse
  double h(double x) const { return std::exp(-exponent_ * std::log(x)); }

  uint64_t n_;
  double exponent_;
  double u_low_;   // H(1.5) - h(1): the lower end of the sampled H-range
  double u_high_;  // H(n + 0.5): the upper end
};

struct ClickLogOptions {
  uint64_t features = 5000;    // distinct feature ids, >= fields
  uint32_t fields = 20;        // active features per example, >= 1
  double zipf = 1.0;           // exponent of the rank distribution, >= 0
  uint64_t seed = 7;           // everything derives from it
  double logit_stddev = 1.6;   // stddev of the true logit (sets the truth AUC)
  double truth_bias = -1.0;    // b*, sets the click rate (about 30% at -1)
};

// Examples of equal width, stored flat.
// Invariants: keys.size() == labels.size() * fields;
//             truth_logits.size() == labels.size().
struct ClickLogBatch {
  uint32_t fields = 0;
  std::vector<Key> keys;             // example i: keys[i*fields, (i+1)*fields), distinct
  std::vector<float> labels;         // 0 or 1
  std::vector<float> truth_logits;   // b* + w*.x of each example (the Bayes score)

  size_t size() const { return labels.size(); }
  std::span<const Key> keys_of(size_t i) const {
    return std::span<const Key>(keys).subspan(i * fields, fields);
  }
};

class SyntheticClickLog {
 public:
  // Validates the options (features >= fields >= 1, zipf >= 0, logit_stddev
  // >= 0); an invalid value is an error naming the option.
  static absl::StatusOr<SyntheticClickLog> Create(const ClickLogOptions& options);

  // Partition `part` of `num_parts` of a train set of `total` examples; see
  // the file comment. Requires part < num_parts (else an empty batch).
  ClickLogBatch TrainPartition(uint32_t part, uint32_t num_parts, uint64_t total) const;
  // The first `count` examples of the test stream.
  ClickLogBatch TestSet(uint64_t count) const;

  // The key of a rank in [1, features]: a bijection, so distinct ranks give
  // distinct keys.
  Key KeyOfRank(uint64_t rank) const { return Mix64(rank + key_salt_); }
  // The true weight of a rank in [1, features].
  float TruthWeight(uint64_t rank) const { return truth_weights_[rank - 1]; }
  float truth_bias() const { return static_cast<float>(options_.truth_bias); }
  const ClickLogOptions& options() const { return options_; }

 private:
  enum class Stream : uint64_t { kTrain = 1, kTest = 2, kWeights = 3 };
  SyntheticClickLog(const ClickLogOptions& options, ZipfSampler sampler);
  // Appends examples [begin, end) of a stream to `batch`.
  void Generate(Stream stream, uint64_t begin, uint64_t end, ClickLogBatch& batch) const;
  uint64_t StreamSeed(Stream stream, uint64_t index) const;

  ClickLogOptions options_;
  ZipfSampler sampler_;
  uint64_t key_salt_;
  std::vector<float> truth_weights_;  // by rank - 1
};

// The global example indices [first, second) of train partition `part` of
// `num_parts` of a set of `total` examples: [part*total/num_parts,
// (part+1)*total/num_parts), computed without overflow. Requires part <
// num_parts.
inline std::pair<uint64_t, uint64_t> PartitionRange(uint32_t part, uint32_t num_parts, uint64_t total) {
  const auto bound = [&](uint64_t p) {
    return static_cast<uint64_t>(static_cast<unsigned __int128>(total) * p / num_parts);
  };
  return {bound(part), bound(part + 1)};
}

// Exact area under the ROC curve of `scores` against binary `labels` (0 or 1):
// the probability that a random positive scores above a random negative, ties
// counting one half (average ranks). Errors: sizes differ, a label that is
// not 0 or 1, or no positive or no negative example.
absl::StatusOr<double> Auc(std::span<const float> scores, std::span<const float> labels);

// Mean log-loss of predictions given as logits z (p = sigmoid(z)), computed
// stably as mean(log(1 + e^z) - y*z). Requires equal sizes; 0 for empty input.
double LogLossFromLogits(std::span<const float> logits, std::span<const float> labels);

inline double Sigmoid(double z) { return 1.0 / (1.0 + std::exp(-z)); }

// The log-loss of one example with logit z and label y: log(1 + e^z) - y*z,
// computed without overflow for any finite z.
inline double LogLossOfLogit(double z, double y) {
  const double softplus = z > 0 ? z + std::log1p(std::exp(-z)) : std::log1p(std::exp(z));
  return softplus - y * z;
}

}  // namespace tessera::examples

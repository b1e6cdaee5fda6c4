#include "examples/synthetic_clicklog.h"

#include <algorithm>
#include <numbers>
#include <numeric>

#include "absl/strings/str_cat.h"

namespace tessera::examples {
namespace {

// expm1(t) / t, continuous at 0.
double ExpM1OverT(double t) {
  if (std::abs(t) > 1e-8) return std::expm1(t) / t;
  return 1.0 + t / 2.0 + t * t / 6.0;
}

// log1p(t) / t, continuous at 0.
double Log1POverT(double t) {
  if (std::abs(t) > 1e-8) return std::log1p(t) / t;
  return 1.0 - t / 2.0 + t * t / 3.0;
}

}  // namespace

double SplitMixRng::Normal() {
  const double u1 = 1.0 - Uniform();  // in (0, 1]
  const double u2 = Uniform();
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * std::numbers::pi * u2);
}

// ---- ZipfSampler ----
//
// Rejection-inversion: the continuous hat h(x) = x^-s is integrated (H) and
// inverted. A uniform u in (H(1.5) - h(1), H(n + 0.5)] is mapped to
// x = H^-1(u) and rounded to k. Rank k receives the u-interval
// [H(k - 0.5), H(k + 0.5)) (for k = 1 it starts at H(1.5) - h(1)); we accept
// only its top part of length exactly h(k), which by convexity of h is never
// longer than the whole interval. Accepted ranks are therefore distributed
// proportionally to h(k) = k^-s.

ZipfSampler::ZipfSampler(uint64_t n, double exponent) : n_(n), exponent_(exponent) {
  u_low_ = H(1.5) - 1.0;
  u_high_ = H(static_cast<double>(n) + 0.5);
}

absl::StatusOr<ZipfSampler> ZipfSampler::Create(uint64_t n, double exponent) {
  if (n == 0) return absl::InvalidArgumentError("zipf: the number of ranks must be >= 1");
  if (!std::isfinite(exponent) || exponent < 0) {
    return absl::InvalidArgumentError(absl::StrCat("zipf: exponent must be finite and >= 0, got ", exponent));
  }
  return ZipfSampler(n, exponent);
}

double ZipfSampler::H(double x) const {
  const double log_x = std::log(x);
  return ExpM1OverT((1.0 - exponent_) * log_x) * log_x;
}

double ZipfSampler::HInverse(double y) const {
  // x^(1-s) = 1 + (1-s) y; the argument stays above -1 inside the sampled range.
  const double t = std::max((1.0 - exponent_) * y, -1.0 + 1e-16);
  return std::exp(Log1POverT(t) * y);
}

uint64_t ZipfSampler::Sample(SplitMixRng& rng) const {
  for (;;) {
    const double u = u_high_ + rng.Uniform() * (u_low_ - u_high_);
    const double x = HInverse(u);
    uint64_t k = static_cast<uint64_t>(std::max(x + 0.5, 1.0));
    k = std::clamp<uint64_t>(k, 1, n_);
    const double kd = static_cast<double>(k);
    if (u >= H(kd + 0.5) - h(kd)) return k;
  }
}

// ---- SyntheticClickLog ----

SyntheticClickLog::SyntheticClickLog(const ClickLogOptions& options, ZipfSampler sampler)
    : options_(options), sampler_(sampler), key_salt_(Mix64(options.seed ^ 0x6a09e667f3bcc909ULL)) {
  const double sigma = options.logit_stddev / std::sqrt(static_cast<double>(options.fields));
  SplitMixRng rng(StreamSeed(Stream::kWeights, 0));
  truth_weights_.resize(options.features);
  for (float& w : truth_weights_) w = static_cast<float>(sigma * rng.Normal());
}

absl::StatusOr<SyntheticClickLog> SyntheticClickLog::Create(const ClickLogOptions& options) {
  if (options.fields == 0) return absl::InvalidArgumentError("fields must be >= 1");
  if (options.features < options.fields) {
    return absl::InvalidArgumentError(
        absl::StrCat("features (", options.features, ") must be >= fields (", options.fields, ")"));
  }
  if (!std::isfinite(options.logit_stddev) || options.logit_stddev < 0) {
    return absl::InvalidArgumentError(absl::StrCat("logit_stddev must be >= 0, got ", options.logit_stddev));
  }
  if (!std::isfinite(options.truth_bias)) return absl::InvalidArgumentError("truth_bias must be finite");
  absl::StatusOr<ZipfSampler> sampler = ZipfSampler::Create(options.features, options.zipf);
  if (!sampler.ok()) return sampler.status();
  return SyntheticClickLog(options, *sampler);
}

uint64_t SyntheticClickLog::StreamSeed(Stream stream, uint64_t index) const {
  const uint64_t stream_seed = Mix64(options_.seed * 0x9e3779b97f4a7c15ULL + static_cast<uint64_t>(stream));
  return Mix64(stream_seed ^ (index * 0xd1b54a32d192ed03ULL + 0x8cb92ba72f3d8dd7ULL));
}

void SyntheticClickLog::Generate(Stream stream, uint64_t begin, uint64_t end, ClickLogBatch& batch) const {
  const uint32_t fields = options_.fields;
  batch.fields = fields;
  const size_t count = end > begin ? end - begin : 0;
  batch.keys.reserve(batch.keys.size() + count * fields);
  batch.labels.reserve(batch.labels.size() + count);
  batch.truth_logits.reserve(batch.truth_logits.size() + count);
  std::vector<uint64_t> ranks(fields);
  constexpr int kMaxRedraws = 64;
  for (uint64_t i = begin; i < end; ++i) {
    SplitMixRng rng(StreamSeed(stream, i));
    double logit = options_.truth_bias;
    for (uint32_t f = 0; f < fields; ++f) {
      const auto taken = [&](uint64_t r) { return std::find(ranks.begin(), ranks.begin() + f, r) != ranks.begin() + f; };
      uint64_t rank = sampler_.Sample(rng);
      for (int tries = 0; taken(rank) && tries < kMaxRedraws; ++tries) rank = sampler_.Sample(rng);
      // Pathological settings (fields close to features, steep zipf): take
      // the hottest free rank so that generation always terminates.
      if (taken(rank)) {
        rank = 1;
        while (taken(rank)) ++rank;
      }
      ranks[f] = rank;
      logit += truth_weights_[rank - 1];
      batch.keys.push_back(KeyOfRank(rank));
    }
    batch.truth_logits.push_back(static_cast<float>(logit));
    batch.labels.push_back(rng.Uniform() < Sigmoid(logit) ? 1.0f : 0.0f);
  }
}

ClickLogBatch SyntheticClickLog::TrainPartition(uint32_t part, uint32_t num_parts, uint64_t total) const {
  ClickLogBatch batch;
  batch.fields = options_.fields;
  if (part >= num_parts) return batch;
  const auto [begin, end] = PartitionRange(part, num_parts, total);
  Generate(Stream::kTrain, begin, end, batch);
  return batch;
}

ClickLogBatch SyntheticClickLog::TestSet(uint64_t count) const {
  ClickLogBatch batch;
  batch.fields = options_.fields;
  Generate(Stream::kTest, 0, count, batch);
  return batch;
}

// ---- metrics ----

absl::StatusOr<double> Auc(std::span<const float> scores, std::span<const float> labels) {
  if (scores.size() != labels.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("auc: ", scores.size(), " scores but ", labels.size(), " labels"));
  }
  uint64_t positives = 0;
  for (size_t i = 0; i < labels.size(); ++i) {
    if (labels[i] != 0.0f && labels[i] != 1.0f) {
      return absl::InvalidArgumentError(absl::StrCat("auc: label ", i, " is ", labels[i], ", not 0 or 1"));
    }
    if (std::isnan(scores[i])) return absl::InvalidArgumentError(absl::StrCat("auc: score ", i, " is NaN"));
    positives += labels[i] == 1.0f;
  }
  const uint64_t negatives = labels.size() - positives;
  if (positives == 0 || negatives == 0) {
    return absl::InvalidArgumentError(absl::StrCat("auc: undefined with ", positives, " positive and ",
                                                   negatives, " negative examples"));
  }
  std::vector<size_t> order(scores.size());
  std::iota(order.begin(), order.end(), size_t{0});
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return scores[a] < scores[b]; });
  // Sum of the (1-based, tie-averaged) ranks of the positives.
  double positive_rank_sum = 0;
  for (size_t i = 0; i < order.size();) {
    size_t j = i;
    uint64_t group_positives = 0;
    while (j < order.size() && scores[order[j]] == scores[order[i]]) group_positives += labels[order[j++]] == 1.0f;
    const double average_rank = (static_cast<double>(i + 1) + static_cast<double>(j)) / 2.0;
    positive_rank_sum += average_rank * static_cast<double>(group_positives);
    i = j;
  }
  const double p = static_cast<double>(positives);
  const double n = static_cast<double>(negatives);
  return (positive_rank_sum - p * (p + 1) / 2.0) / (p * n);
}

double LogLossFromLogits(std::span<const float> logits, std::span<const float> labels) {
  const size_t n = std::min(logits.size(), labels.size());
  if (n == 0) return 0.0;
  double sum = 0;
  for (size_t i = 0; i < n; ++i) sum += LogLossOfLogit(logits[i], labels[i]);
  return sum / static_cast<double>(n);
}

}  // namespace tessera::examples

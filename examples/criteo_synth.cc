#include "examples/criteo_synth.h"

#include <algorithm>
#include <cmath>
#include <set>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace tessera::examples {
namespace {

constexpr uint64_t kGolden = 0x9e3779b97f4a7c15ULL;
constexpr uint64_t kMaxCardinality = (uint64_t{1} << CriteoSynth::kRankBits) - 1;
constexpr uint32_t kMaxCategoricalFields = uint32_t{1} << 24;
constexpr uint32_t kMaxInteractionPairs = 1024;
// Ranks over which a field's hidden values are standardised: the most
// frequent ones, which carry nearly all of the Zipf mass that matters (the
// tail's values average out).
constexpr uint64_t kStandardisationRanks = 16384;
// Draws per dense field to estimate the mean and stddev of log1p(count).
constexpr int kDenseMomentDraws = 8192;

// An approximately standard normal value from 64 hash bits: the centred and
// scaled sum of four 16-bit uniforms (Irwin-Hall with four terms; bounded by
// +-3.47). Much cheaper than Box-Muller, which matters at tens of hidden
// values per example; the exact shape is irrelevant because every field's
// values are standardised over its own Zipf distribution anyway.
inline double NormalFromBits(uint64_t h) {
  const uint64_t sum = (h & 0xffff) + ((h >> 16) & 0xffff) + ((h >> 32) & 0xffff) + (h >> 48);
  // Mean 4 * 65535/2; variance 4 * (65536^2 - 1)/12.
  static const double kInverseStddev = 1.0 / std::sqrt((65536.0 * 65536.0 - 1.0) / 3.0);
  return (static_cast<double>(sum) - 2.0 * 65535.0) * kInverseStddev;
}

// The hash behind component k of the hidden vector of an id whose hash is h.
inline uint64_t ComponentHash(uint64_t h, int k) { return Mix64(h + static_cast<uint64_t>(k + 1) * kGolden); }

absl::Status ValidateShare(const char* name, double share) {
  if (!std::isfinite(share) || share < 0 || share > 1) {
    return absl::InvalidArgumentError(absl::StrCat(name, " must be in [0, 1], got ", share));
  }
  return absl::OkStatus();
}

absl::Status Validate(const CriteoSynthOptions& o) {
  if (o.categorical_fields == 0 || o.categorical_fields > kMaxCategoricalFields) {
    return absl::InvalidArgumentError(absl::StrCat("categorical_fields must be in [1, ", kMaxCategoricalFields,
                                                   "], got ", o.categorical_fields));
  }
  if (o.cardinalities.empty()) {
    if (o.min_cardinality == 0) return absl::InvalidArgumentError("min_cardinality must be >= 1, got 0");
    if (o.max_cardinality < o.min_cardinality || o.max_cardinality > kMaxCardinality) {
      return absl::InvalidArgumentError(absl::StrCat("max_cardinality must be in [min_cardinality (",
                                                     o.min_cardinality, "), 2^40), got ", o.max_cardinality));
    }
  } else {
    if (o.cardinalities.size() != o.categorical_fields) {
      return absl::InvalidArgumentError(absl::StrCat("cardinalities has ", o.cardinalities.size(),
                                                     " values but categorical_fields is ", o.categorical_fields));
    }
    for (size_t f = 0; f < o.cardinalities.size(); ++f) {
      if (o.cardinalities[f] == 0 || o.cardinalities[f] > kMaxCardinality) {
        return absl::InvalidArgumentError(
            absl::StrCat("cardinalities[", f, "] must be in [1, 2^40), got ", o.cardinalities[f]));
      }
    }
  }
  if (!std::isfinite(o.zipf) || o.zipf < 0) {
    return absl::InvalidArgumentError(absl::StrCat("zipf must be finite and >= 0, got ", o.zipf));
  }
  if (!std::isfinite(o.logit_stddev) || o.logit_stddev < 0) {
    return absl::InvalidArgumentError(absl::StrCat("logit_stddev must be finite and >= 0, got ", o.logit_stddev));
  }
  if (!std::isfinite(o.truth_bias)) {
    return absl::InvalidArgumentError(absl::StrCat("truth_bias must be finite, got ", o.truth_bias));
  }
  if (absl::Status s = ValidateShare("dense_share", o.dense_share); !s.ok()) return s;
  if (absl::Status s = ValidateShare("interaction_share", o.interaction_share); !s.ok()) return s;
  if (o.dense_share + o.interaction_share > 1.0 + 1e-12) {
    return absl::InvalidArgumentError(absl::StrCat("dense_share + interaction_share must be <= 1, got ",
                                                   o.dense_share, " + ", o.interaction_share));
  }
  const uint64_t fields = o.categorical_fields;
  const uint64_t possible_pairs = std::min<uint64_t>(fields * (fields - 1) / 2, kMaxInteractionPairs);
  if (o.interaction_pairs > possible_pairs) {
    return absl::InvalidArgumentError(absl::StrCat("interaction_pairs must be <= ", possible_pairs, " with ", fields,
                                                   " categorical_fields, got ", o.interaction_pairs));
  }
  return absl::OkStatus();
}

}  // namespace

std::vector<uint64_t> CriteoSynth::DefaultCardinalities(uint32_t fields, uint64_t min, uint64_t max) {
  std::vector<uint64_t> cardinalities;
  if (fields == 0) return cardinalities;
  if (fields == 1) return {min};
  const double log_min = std::log(static_cast<double>(min));
  const double log_max = std::log(static_cast<double>(max));
  for (uint32_t f = 0; f < fields; ++f) {
    const double c = std::exp(log_min + (log_max - log_min) * f / (fields - 1));
    cardinalities.push_back(std::clamp<uint64_t>(static_cast<uint64_t>(std::llround(c)), min, max));
  }
  return cardinalities;
}

CriteoSynth::CriteoSynth(const CriteoSynthOptions& options)
    : options_(options),
      key_salt_(Mix64(options.seed ^ 0x3c6ef372fe94f82bULL)),
      weight_salt_(Mix64(options.seed ^ 0xa54ff53a5f1d36f1ULL)) {}

absl::StatusOr<CriteoSynth> CriteoSynth::Create(const CriteoSynthOptions& options) {
  if (absl::Status s = Validate(options); !s.ok()) return s;
  CriteoSynth synth(options);
  if (synth.options_.cardinalities.empty()) {
    synth.options_.cardinalities =
        DefaultCardinalities(options.categorical_fields, options.min_cardinality, options.max_cardinality);
  }
  if (absl::Status s = synth.BuildModel(); !s.ok()) return s;
  return synth;
}

uint64_t CriteoSynth::StreamSeed(Stream stream, uint64_t index) const {
  const uint64_t stream_seed = Mix64(options_.seed * kGolden + 0x510e527fade682d1ULL + static_cast<uint64_t>(stream));
  return Mix64(stream_seed ^ (index * 0xd1b54a32d192ed03ULL + 0x8cb92ba72f3d8dd7ULL));
}

float CriteoSynth::DrawDense(const DenseField& field, SplitMixRng& rng) const {
  if (rng.Uniform() < field.zero_probability) return 0.0f;
  const double count = std::floor(std::exp(field.log_mean + field.log_stddev * rng.Normal()));
  return static_cast<float>(std::log1p(count));
}

absl::Status CriteoSynth::BuildModel() {
  const uint32_t num_dense = options_.dense_fields;
  const uint32_t num_fields = options_.categorical_fields;
  // Variance budget; an absent component gives its share to the id weights.
  const double dense_share = num_dense > 0 ? options_.dense_share : 0.0;
  const double interaction_share = options_.interaction_pairs > 0 ? options_.interaction_share : 0.0;
  const double id_share = std::max(0.0, 1.0 - dense_share - interaction_share);
  const double variance = options_.logit_stddev * options_.logit_stddev;
  SplitMixRng rng(StreamSeed(Stream::kModel, 0));

  // Dense fields: count distributions and weights, scaled so that
  // sum_j a_j^2 Var(x_j) = dense_share * variance.
  std::vector<double> raw_weights(num_dense);
  std::vector<double> stddevs(num_dense);
  double raw_variance = 0;
  dense_.resize(num_dense);
  for (uint32_t j = 0; j < num_dense; ++j) {
    DenseField& field = dense_[j];
    field.zero_probability = 0.05 + 0.55 * rng.Uniform();
    field.log_mean = 5.0 * rng.Uniform();
    field.log_stddev = 1.0 + 1.2 * rng.Uniform();
    raw_weights[j] = rng.Normal();
    SplitMixRng moments_rng(StreamSeed(Stream::kModel, 1 + j));
    double sum = 0, sum_squares = 0;
    for (int d = 0; d < kDenseMomentDraws; ++d) {
      const double x = DrawDense(field, moments_rng);
      sum += x;
      sum_squares += x * x;
    }
    field.mean = sum / kDenseMomentDraws;
    stddevs[j] = std::sqrt(std::max(0.0, sum_squares / kDenseMomentDraws - field.mean * field.mean));
    if (stddevs[j] > 1e-9) raw_variance += raw_weights[j] * raw_weights[j];
  }
  const double dense_scale = raw_variance > 0 ? std::sqrt(dense_share * variance / raw_variance) : 0.0;
  for (uint32_t j = 0; j < num_dense; ++j) {
    dense_[j].weight = stddevs[j] > 1e-9 ? raw_weights[j] * dense_scale / stddevs[j] : 0.0;
  }

  // Interaction pairs, distinct, drawn by the seed.
  std::set<std::pair<uint32_t, uint32_t>> chosen;
  while (pairs_.size() < options_.interaction_pairs) {
    uint32_t f = static_cast<uint32_t>(rng.Next() % num_fields);
    uint32_t g = static_cast<uint32_t>(rng.Next() % num_fields);
    if (f == g) continue;
    if (f > g) std::swap(f, g);
    if (chosen.insert({f, g}).second) pairs_.push_back({f, g});
  }
  std::vector<int32_t> slot_of(num_fields, -1);
  for (const auto& [f, g] : pairs_) {
    slot_of[f] = 0;
    slot_of[g] = 0;
  }
  for (uint32_t f = 0; f < num_fields; ++f) {
    if (slot_of[f] >= 0) slot_of[f] = static_cast<int32_t>(num_slots_++);
  }
  for (const auto& [f, g] : pairs_) {
    pair_slots_.push_back({static_cast<uint32_t>(slot_of[f]), static_cast<uint32_t>(slot_of[g])});
  }
  // Each standardised dot product of kInteractionDim terms has variance about
  // kInteractionDim.
  if (!pairs_.empty()) {
    interaction_scale_ = std::sqrt(interaction_share * variance / (pairs_.size() * double{kInteractionDim}));
  }

  // Categorical fields: per-field importance c_f with sum c_f^2 = id_share *
  // variance, and the standardisation of each field's hidden values.
  std::vector<double> importance(num_fields);
  double importance_squares = 0;
  for (uint32_t f = 0; f < num_fields; ++f) {
    importance[f] = 0.5 + 0.5 * rng.Uniform();
    importance_squares += importance[f] * importance[f];
  }
  const double importance_scale = std::sqrt(id_share * variance / importance_squares);
  categorical_.reserve(num_fields);
  for (uint32_t f = 0; f < num_fields; ++f) {
    absl::StatusOr<ZipfSampler> sampler = ZipfSampler::Create(options_.cardinalities[f], options_.zipf);
    if (!sampler.ok()) return sampler.status();
    const bool interacts = slot_of[f] >= 0;
    // Zipf-weighted moments of the raw values over the head ranks.
    double mass = 0, sum = 0, sum_squares = 0;
    double vector_sum[kInteractionDim] = {}, vector_squares[kInteractionDim] = {};
    const uint64_t head = std::min(options_.cardinalities[f], kStandardisationRanks);
    for (uint64_t r = 1; r <= head; ++r) {
      const double p = std::exp(-options_.zipf * std::log(static_cast<double>(r)));
      const uint64_t h = IdHash(f, r);
      const double w = NormalFromBits(h);
      mass += p;
      sum += p * w;
      sum_squares += p * w * w;
      if (!interacts) continue;
      for (int k = 0; k < kInteractionDim; ++k) {
        const double v = NormalFromBits(ComponentHash(h, k));
        vector_sum[k] += p * v;
        vector_squares[k] += p * v * v;
      }
    }
    // A value that is constant over the field (one rank) carries nothing.
    const auto standardise = [&](double s, double s2, double& mean, double& inverse_stddev) {
      mean = s / mass;
      const double stddev = std::sqrt(std::max(0.0, s2 / mass - mean * mean));
      inverse_stddev = stddev > 1e-9 ? 1.0 / stddev : 0.0;
    };
    CategoricalField field{.sampler = *sampler, .weight_scale = 0, .weight_offset = 0, .slot = slot_of[f]};
    double mean = 0, inverse_stddev = 0;
    standardise(sum, sum_squares, mean, inverse_stddev);
    const double c = importance[f] * importance_scale;
    field.weight_scale = c * inverse_stddev;
    field.weight_offset = c * mean * inverse_stddev;
    for (int k = 0; k < kInteractionDim; ++k) {
      field.vector_mean[k] = 0;
      field.vector_inverse_stddev[k] = 0;
      if (interacts) standardise(vector_sum[k], vector_squares[k], field.vector_mean[k], field.vector_inverse_stddev[k]);
    }
    categorical_.push_back(field);
  }
  return absl::OkStatus();
}

void CriteoSynth::Generate(Stream stream, uint64_t begin, uint64_t end, CriteoBatch& batch) const {
  const uint32_t num_dense = options_.dense_fields;
  const uint32_t num_fields = options_.categorical_fields;
  batch.dense_fields = num_dense;
  batch.categorical_fields = num_fields;
  const size_t first = batch.size();
  const size_t count = end > begin ? end - begin : 0;
  batch.dense.resize((first + count) * num_dense);
  batch.keys.resize((first + count) * num_fields);
  batch.labels.resize(first + count);
  batch.truth_logits.resize(first + count);
  std::vector<double> vectors(size_t{num_slots_} * kInteractionDim);
  for (size_t e = 0; e < count; ++e) {
    SplitMixRng rng(StreamSeed(stream, begin + e));
    double logit = options_.truth_bias;
    float* dense = batch.dense.data() + (first + e) * num_dense;
    for (uint32_t j = 0; j < num_dense; ++j) {
      const DenseField& field = dense_[j];
      dense[j] = DrawDense(field, rng);
      logit += field.weight * (static_cast<double>(dense[j]) - field.mean);
    }
    Key* keys = batch.keys.data() + (first + e) * num_fields;
    for (uint32_t f = 0; f < num_fields; ++f) {
      const CategoricalField& field = categorical_[f];
      const uint64_t rank = field.sampler.Sample(rng);
      keys[f] = KeyOf(f, rank);
      const uint64_t h = IdHash(f, rank);
      logit += field.weight_scale * NormalFromBits(h) - field.weight_offset;
      if (field.slot < 0) continue;
      double* v = vectors.data() + size_t(field.slot) * kInteractionDim;
      for (int k = 0; k < kInteractionDim; ++k) {
        v[k] = (NormalFromBits(ComponentHash(h, k)) - field.vector_mean[k]) * field.vector_inverse_stddev[k];
      }
    }
    double interaction = 0;
    for (const auto& [a, b] : pair_slots_) {
      const double* u = vectors.data() + size_t{a} * kInteractionDim;
      const double* v = vectors.data() + size_t{b} * kInteractionDim;
      for (int k = 0; k < kInteractionDim; ++k) interaction += u[k] * v[k];
    }
    logit += interaction_scale_ * interaction;
    batch.truth_logits[first + e] = static_cast<float>(logit);
    batch.labels[first + e] = rng.Uniform() < Sigmoid(logit) ? 1.0f : 0.0f;
  }
}

CriteoBatch CriteoSynth::TrainPartition(uint32_t part, uint32_t num_parts, uint64_t total) const {
  CriteoBatch batch;
  batch.dense_fields = options_.dense_fields;
  batch.categorical_fields = options_.categorical_fields;
  if (part >= num_parts) return batch;
  const auto [begin, end] = PartitionRange(part, num_parts, total);
  Generate(Stream::kTrain, begin, end, batch);
  return batch;
}

CriteoBatch CriteoSynth::TrainRange(uint64_t begin, uint64_t end) const {
  CriteoBatch batch;
  FillTrainRange(begin, end, batch);
  return batch;
}

void CriteoSynth::FillTrainRange(uint64_t begin, uint64_t end, CriteoBatch& batch) const {
  batch.dense.clear();
  batch.keys.clear();
  batch.labels.clear();
  batch.truth_logits.clear();
  Generate(Stream::kTrain, begin, end, batch);
}

CriteoBatch CriteoSynth::TestSet(uint64_t count) const {
  CriteoBatch batch;
  Generate(Stream::kTest, 0, count, batch);
  return batch;
}

}  // namespace tessera::examples

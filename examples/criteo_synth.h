#pragma once
// A seeded, Criteo-like synthetic data set for recommender training: per
// example, dense count features and one categorical id per field, labelled by
// a hidden ground-truth model.
//
// The data (defaults in brackets):
// - Dense features [13]: feature j is a count, 0 with a per-field probability,
//   else floor(exp(mu_j + s_j * N(0, 1))) (log-normal, heavy-tailed); the
//   count's distribution parameters are fixed per field by the seed. Examples
//   carry log1p(count), so every dense value is finite and >= 0 and ready to
//   feed a model.
// - Categorical ids [26 fields]: field f draws a rank r ~ Zipf(zipf) over
//   [1, cardinality_f] (rank 1 the most frequent); the default cardinalities
//   are log-spaced from tens to millions. The key sent to the parameter
//   server is KeyOf(f, r), a seeded bijective scramble of (f, r): distinct
//   (field, rank) pairs always give distinct keys, so the fields share one
//   key space without collisions, and hot ids are spread over the 64-bit key
//   space.
// - The hidden model. The true logit of an example is
//     truth_bias
//     + sum_j a_j * (x_j - m_j)                      (dense, linear)
//     + sum_f c_f * w(f, r_f)                        (one weight per id)
//     + lambda * sum_{(f,g) in pairs} <v(f, r_f), v(g, r_g)>   (interactions)
//   where w(f, r) and the 4-d vectors v(f, r) are approximately normal values
//   derived from a hash of (seed, f, r) — nothing is stored per id — each
//   standardised over the field's Zipf distribution (mean 0, variance 1), so
//   no single id's weight moves the click rate (a field of cardinality 1
//   carries no signal). The interaction pairs are
//   `interaction_pairs` distinct field pairs chosen by the seed; their term has
//   (about) zero mean given any one field's id, so a model that is linear in
//   the ids cannot learn it, while a model with embeddings and dot products
//   (FM, DLRM) can. The scales a, c, lambda are set so that the dense, id and
//   interaction terms contribute the fractions dense_share,
//   1 - dense_share - interaction_share and interaction_share of the logit's
//   variance, and its total stddev is about logit_stddev (which sets the
//   ground-truth AUC); truth_bias sets the click rate. The label is
//   Bernoulli(sigmoid(true logit)); each example also carries its true logit
//   (the Bayes-optimal score), to be scored with Auc() from
//   synthetic_clicklog.h.
// - Determinism: example i of a stream (train or test) depends only on
//   (options, stream, i) — not on how the stream is cut into batches or
//   partitions. A train partition p of P covers the global indices
//   [p*n/P, (p+1)*n/P) of the train stream, so the partitions of any P
//   together are the same data set (as in SyntheticClickLog). The test set is
//   the first `count` examples of the test stream, identical for every worker.
//   The same options give the same data on every platform up to floating
//   point library differences in exp/log (the keys of an example, being
//   drawn through exp/log as well, are not promised bit-identical across
//   libm versions either).
//
// Thread safety: CriteoSynth is immutable after Create(); its const methods
// may be called concurrently. A CriteoBatch is a plain value.
#include <cstdint>
#include <span>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "common/keys.h"
#include "examples/synthetic_clicklog.h"

namespace tessera::examples {

struct CriteoSynthOptions {
  uint32_t dense_fields = 13;          // dense count features per example, >= 0
  uint32_t categorical_fields = 26;    // categorical ids per example, in [1, 2^24]
  std::vector<uint64_t> cardinalities; // ranks per field, each in [1, 2^40); empty =
                                       // log-spaced from min_ to max_cardinality
  uint64_t min_cardinality = 10;       // the smallest default cardinality (used only
                                       // when cardinalities is empty), >= 1
  uint64_t max_cardinality = 1'000'000;  // the largest default one, in [min, 2^40)
  double zipf = 1.1;                   // exponent of every field's rank distribution, >= 0
  uint64_t seed = 7;                   // everything derives from it
  double logit_stddev = 1.2;           // stddev of the true logit, >= 0 (sets the truth
                                       // AUC: about 0.775 at 1.2 with the default shares)
  double truth_bias = -1.3;            // mean of the true logit (sets the click rate:
                                       // about 26.5% with the default stddev)
  double dense_share = 0.2;            // fraction of the logit variance from dense features
  double interaction_share = 0.3;      // fraction from the field-pair interactions
  uint32_t interaction_pairs = 8;      // interacting field pairs, <= fields*(fields-1)/2
                                       // and <= 1024; 0 = none
};

// Examples stored flat, example-major, in plain vectors (a Python binding can
// expose them without copies).
// Invariants: dense.size() == size() * dense_fields;
//             keys.size() == size() * categorical_fields;
//             truth_logits.size() == labels.size() == size().
struct CriteoBatch {
  uint32_t dense_fields = 0;
  uint32_t categorical_fields = 0;
  std::vector<float> dense;          // example i: [i*dense_fields, (i+1)*dense_fields), log1p(count)
  std::vector<Key> keys;             // example i: [i*categorical_fields, ...), field order
  std::vector<float> labels;         // 0 or 1
  std::vector<float> truth_logits;   // the true logit of each example (the Bayes score)

  size_t size() const { return labels.size(); }
  std::span<const float> dense_of(size_t i) const {
    return std::span<const float>(dense).subspan(i * dense_fields, dense_fields);
  }
  std::span<const Key> keys_of(size_t i) const {
    return std::span<const Key>(keys).subspan(i * categorical_fields, categorical_fields);
  }
};

class CriteoSynth {
 public:
  // Validates the options; an invalid value is an InvalidArgument error naming
  // the option (e.g. "cardinalities[3]"). Does O(fields * 16384) work to
  // standardise the hidden weights (a few milliseconds).
  static absl::StatusOr<CriteoSynth> Create(const CriteoSynthOptions& options);

  // The default cardinalities: `fields` values log-spaced from `min` to `max`
  // (both included) and rounded; one field gets `min`. Requires 1 <= min <= max.
  static std::vector<uint64_t> DefaultCardinalities(uint32_t fields, uint64_t min, uint64_t max);

  // Partition `part` of `num_parts` of a train set of `total` examples; see
  // the file comment. Requires part < num_parts (else an empty batch).
  CriteoBatch TrainPartition(uint32_t part, uint32_t num_parts, uint64_t total) const;
  // Examples [begin, end) of the train stream (empty if end <= begin), for
  // streaming mini-batches without materialising a partition.
  CriteoBatch TrainRange(uint64_t begin, uint64_t end) const;
  // The same into `batch`, whose contents are replaced (its capacity is
  // reused, so a training loop allocates only on its first batch).
  void FillTrainRange(uint64_t begin, uint64_t end, CriteoBatch& batch) const;
  // The first `count` examples of the test (held-out) stream.
  CriteoBatch TestSet(uint64_t count) const;

  // The key of rank `rank` in [1, cardinality(field)] of `field`: injective
  // over all (field, rank), so keys never collide across or within fields.
  Key KeyOf(uint32_t field, uint64_t rank) const {
    return Mix64(((uint64_t{field} << kRankBits) | rank) ^ key_salt_);
  }
  uint64_t cardinality(uint32_t field) const { return options_.cardinalities[field]; }
  // The field pairs (f < g) of the hidden interaction term.
  std::span<const std::pair<uint32_t, uint32_t>> interaction_pairs() const { return pairs_; }
  // The options as given, with `cardinalities` filled in when it was empty.
  const CriteoSynthOptions& options() const { return options_; }

  static constexpr int kRankBits = 40;          // ranks are < 2^40
  static constexpr int kInteractionDim = 4;     // dimension of the hidden vectors v(f, r)

 private:
  enum class Stream : uint64_t { kTrain = 1, kTest = 2, kModel = 3 };
  // How a dense field's counts are drawn, and its standardised hidden weight.
  struct DenseField {
    double zero_probability;  // P(count == 0)
    double log_mean;          // mu_j
    double log_stddev;        // s_j
    double weight;            // a_j
    double mean;              // m_j, the mean of log1p(count)
  };
  // A categorical field's sampler and the standardisation of its hidden values.
  struct CategoricalField {
    ZipfSampler sampler;
    double weight_scale;   // c_f / stddev of the raw id weight
    double weight_offset;  // c_f * mean / stddev of the raw id weight
    int32_t slot;          // index among the interacting fields, or -1
    double vector_mean[kInteractionDim];
    double vector_inverse_stddev[kInteractionDim];
  };

  explicit CriteoSynth(const CriteoSynthOptions& options);
  absl::Status BuildModel();
  // Appends examples [begin, end) of a stream to `batch`.
  void Generate(Stream stream, uint64_t begin, uint64_t end, CriteoBatch& batch) const;
  uint64_t StreamSeed(Stream stream, uint64_t index) const;
  // A dense value log1p(count) of field j.
  float DrawDense(const DenseField& field, SplitMixRng& rng) const;
  uint64_t IdHash(uint32_t field, uint64_t rank) const {
    return Mix64(((uint64_t{field} << kRankBits) | rank) ^ weight_salt_);
  }

  CriteoSynthOptions options_;
  uint64_t key_salt_;
  uint64_t weight_salt_;
  std::vector<DenseField> dense_;
  std::vector<CategoricalField> categorical_;
  std::vector<std::pair<uint32_t, uint32_t>> pairs_;       // by field
  std::vector<std::pair<uint32_t, uint32_t>> pair_slots_;  // the same pairs, by slot
  uint32_t num_slots_ = 0;                                 // interacting fields
  double interaction_scale_ = 0;                           // lambda
};

}  // namespace tessera::examples

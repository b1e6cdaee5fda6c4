#pragma once
// SparseBatch: deduplicates the keys of one batched sparse lookup, so that
// each distinct key is pulled (and pushed) once. Workers use it before
// sending; a server's table uses it to sum the rows of a key listed twice
// in one push.
//
// A minibatch of embedding ids usually repeats hot ids many times. Build()
// maps the batch's keys (one per position) to its distinct keys, in order of
// first occurrence, and records for every position the index of its key
// among them (`inverse`). Pull the unique keys, then Gather() expands their
// rows to every position; ScatterAdd() does the reverse for gradients: it
// sums the rows of positions that share a key into one row per unique key,
// ready to Push().
//
// Contract:
// - Build(keys): unique()[inverse()[i]] == keys[i] for every position i;
//   unique() holds each distinct key once, in order of first occurrence;
//   inverse()[i] < unique().size(). Fails with InvalidArgument if keys has
//   2^32 or more positions (indices are 32-bit).
// - Gather(unique_rows, width, out): unique_rows holds unique().size() rows
//   of `width` floats (row u for unique()[u]); writes row inverse()[i] to row
//   i of out (positions() rows). ScatterAdd(grads, width, unique_grads):
//   grads holds positions() rows; OVERWRITES unique_grads (unique().size()
//   rows) with, for each unique key, the sum of the rows of its positions, in
//   position order (deterministic). Both fail with InvalidArgument, writing
//   nothing, when a span's size does not match or width is 0; they never
//   allocate.
// - Reset(keys) rebuilds the batch in place, reusing the vectors'
//   allocations (one SparseBatch per training loop); on failure the batch
//   is left empty.
// - Ownership: a SparseBatch owns copies of the unique keys and the inverse
//   indices; it keeps no reference to the spans passed in.
// - Thread safety: a value type; const methods may run concurrently, Reset()
//   needs exclusive access.
// - Cost: Build is one hash-map probe per position (absl::flat_hash_map,
//   reserved up front); Gather and ScatterAdd are one row copy / add per
//   position.
#include <cstdint>
#include <span>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/keys.h"

namespace tessera {

class SparseBatch {
 public:
  SparseBatch() = default;  // an empty batch: no positions, no keys

  static absl::StatusOr<SparseBatch> Build(std::span<const Key> keys);
  absl::Status Reset(std::span<const Key> keys);

  // Distinct keys in order of first occurrence.
  std::span<const Key> unique() const { return unique_; }
  // Per input position: index of its key in unique().
  std::span<const uint32_t> inverse() const { return inverse_; }
  size_t positions() const { return inverse_.size(); }

  absl::Status Gather(std::span<const float> unique_rows, uint32_t width, std::span<float> out) const;
  absl::Status ScatterAdd(std::span<const float> grads_per_position, uint32_t width,
                          std::span<float> unique_grads) const;

 private:
  // Invariants: inverse_[i] < unique_.size() for every i; unique_ has no
  // duplicates. index_ is scratch for Reset() (maps key -> its index in
  // unique_ during a build) and may be empty otherwise.
  std::vector<Key> unique_;
  std::vector<uint32_t> inverse_;
  absl::flat_hash_map<Key, uint32_t> index_;
};

}  // namespace tessera

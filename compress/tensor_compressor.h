#pragma once
// TensorCompressor: applies a CodecSpec to one tensor (a table's values, a
// gradient): the raw threshold, the split into parts, and error feedback.
//
// Contract:
// - A tensor with fewer than spec.raw_below elements is sent raw (codec
//   "none", no residual). Otherwise it is cut into parts of
//   spec.part_elements elements (the last part may be shorter); part i covers
//   [i * part_elements, min((i + 1) * part_elements, n)).
// - Each part is encoded on its own into its own wire bytes (a complete
//   compressed tensor whose header names its element offset), so parts can be
//   encoded in parallel, sent as separate frames, and decoded independently:
//   a receiver calls DecodeAdd(wire, acc.subspan(info.element_offset, n)).
// - EncodedPartSize(i) is exact: allocate that much (e.g. from a BufferPool).
// - With spec.error_feedback, one residual covers the whole tensor.
// - Thread safety: EncodePart for different parts may run concurrently; the
//   same part must not be encoded concurrently.
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "absl/status/statusor.h"
#include "compress/codec.h"
#include "compress/error_feedback.h"

namespace tessera::compress {

struct PartRange {
  uint64_t offset = 0;  // first element
  uint64_t size = 0;    // number of elements
  bool operator==(const PartRange&) const = default;
};

// [0, n) cut into consecutive parts of part_elements (>= 1); the last part
// holds the remainder. No parts for n == 0.
std::vector<PartRange> SplitIntoParts(uint64_t n, uint64_t part_elements);

// A tensor id for EncodeContext that changes every step: a hash of what the
// tensor is (table, key range or slot) and the step (worker clock).
uint64_t TensorStepId(uint64_t table_id, uint64_t slot, uint64_t step);

class TensorCompressor {
 public:
  // Errors: spec.Validate()'s.
  static absl::StatusOr<TensorCompressor> Create(const CodecSpec& spec, uint64_t num_elements);

  uint64_t num_elements() const { return num_elements_; }
  // True when the tensor is below spec.raw_below and goes out uncompressed.
  bool raw() const { return raw_; }
  const Codec& codec() const { return codec_; }
  const std::vector<PartRange>& parts() const { return parts_; }
  size_t EncodedPartSize(size_t part) const { return codec_.EncodedSize(parts_[part].size); }
  size_t EncodedSize() const;  // sum over parts

  // Encodes part `part` of `tensor` (all num_elements values) into out, with
  // error feedback when the spec asks for it. tensor_id: see EncodeContext
  // (fresh per step). Errors: wrong tensor size, bad part index, codec errors.
  absl::StatusOr<size_t> EncodePart(size_t part, std::span<const float> tensor, uint64_t tensor_id,
                                    std::span<std::byte> out);

  // Null without error feedback.
  const ErrorFeedback* error_feedback() const {
    return error_feedback_ ? &*error_feedback_ : nullptr;
  }

 private:
  TensorCompressor(Codec codec, uint64_t n, bool raw, std::vector<PartRange> parts, bool ef)
      : codec_(std::move(codec)), num_elements_(n), raw_(raw), parts_(std::move(parts)) {
    if (ef) error_feedback_.emplace(n);
  }
  Codec codec_;
  uint64_t num_elements_;
  bool raw_;
  std::vector<PartRange> parts_;
  std::optional<ErrorFeedback> error_feedback_;
};

}  // namespace tessera::compress

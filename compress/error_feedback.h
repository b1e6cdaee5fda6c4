#pragma once
// ErrorFeedback: the sender-side residual that makes biased codecs (onebit,
// topk, and rounding codecs) converge: whatever a step did not send is added
// to the next step's input.
//
//   corrected = input + residual
//   wire      = codec.Encode(corrected)
//   residual  = corrected - Decode(wire)
//
// Contract:
// - Conservation: after any number of successful steps,
//   sum(inputs) == sum(decoded wires) + residual, up to float rounding of the
//   two additions per step (tests check this with a bound from magnitudes).
// - The residual covers a tensor of num_elements floats; a call encodes the
//   part [ctx.element_offset, ctx.element_offset + input.size()) of it, so a
//   tensor split into parts keeps one residual, and parts are independent.
// - Cost: one pass to add the residual, the encode, and one DecodeAdd (sparse
//   for topk/randomk). No allocation beyond the codec's own.
// - On an encode error the residual of that part is reset to zero (its
//   carried error is dropped) and the error is returned.
// - Thread safety: calls for disjoint parts may run concurrently; calls that
//   touch the same part, or Reset, must not overlap.
#include <cstddef>
#include <span>
#include <vector>

#include "absl/status/statusor.h"
#include "compress/codec.h"

namespace tessera::compress {

class ErrorFeedback {
 public:
  explicit ErrorFeedback(size_t num_elements) : residual_(num_elements, 0.0f) {}

  // Encodes input + residual (of the part at ctx.element_offset) into out and
  // updates the residual. Errors: the part does not fit the residual, or the
  // codec's own errors (see Codec::Encode).
  absl::StatusOr<size_t> Encode(const Codec& codec, std::span<const float> input,
                                const EncodeContext& ctx, std::span<std::byte> out);

  std::span<const float> residual() const { return residual_; }
  size_t num_elements() const { return residual_.size(); }
  void Reset();

 private:
  std::vector<float> residual_;
};

}  // namespace tessera::compress

#include "compress/error_feedback.h"

#include <algorithm>

#include "absl/strings/str_format.h"

namespace tessera::compress {

absl::StatusOr<size_t> ErrorFeedback::Encode(const Codec& codec, std::span<const float> input,
                                             const EncodeContext& ctx, std::span<std::byte> out) {
  if (ctx.element_offset > residual_.size() ||
      input.size() > residual_.size() - ctx.element_offset) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "error feedback: part [%d, %d) outside a residual of %d elements", ctx.element_offset,
        ctx.element_offset + input.size(), residual_.size()));
  }
  std::span<float> r(residual_.data() + ctx.element_offset, input.size());
  // r becomes the corrected input (fp32 add, vectorized by the compiler).
  {
    float* __restrict rp = r.data();
    const float* __restrict ip = input.data();
    for (size_t i = 0; i < r.size(); ++i) rp[i] += ip[i];
  }
  absl::StatusOr<size_t> size = codec.Encode(r, ctx, out);
  if (!size.ok()) {
    std::fill(r.begin(), r.end(), 0.0f);
    return size.status();
  }
  // r = corrected - decoded. Cannot fail: the bytes were just produced.
  absl::Status s = DecodeAdd(out.first(*size), r, -1.0f);
  if (!s.ok()) {
    std::fill(r.begin(), r.end(), 0.0f);
    return absl::InternalError(absl::StrCat("error feedback: own encoding did not decode: ", s.message()));
  }
  return size;
}

void ErrorFeedback::Reset() { std::fill(residual_.begin(), residual_.end(), 0.0f); }

}  // namespace tessera::compress

#include "compress/tensor_compressor.h"

#include "absl/strings/str_format.h"
#include "compress/scalar_ops.h"

namespace tessera::compress {

std::vector<PartRange> SplitIntoParts(uint64_t n, uint64_t part_elements) {
  std::vector<PartRange> parts;
  if (part_elements == 0) part_elements = 1;
  parts.reserve(n / part_elements + 1);
  for (uint64_t off = 0; off < n; off += part_elements) {
    parts.push_back({off, std::min(part_elements, n - off)});
  }
  return parts;
}

uint64_t TensorStepId(uint64_t table_id, uint64_t slot, uint64_t step) {
  return scalar::Mix64(scalar::Mix64(scalar::Mix64(table_id) ^ slot) ^ step);
}

absl::StatusOr<TensorCompressor> TensorCompressor::Create(const CodecSpec& spec, uint64_t num_elements) {
  if (absl::Status s = spec.Validate(); !s.ok()) return s;
  const bool raw = num_elements < spec.raw_below;
  CodecSpec effective = spec;
  if (raw) {
    effective.codec = CodecId::kNone;
    effective.error_feedback = false;
  }
  absl::StatusOr<Codec> codec = Codec::Create(effective);
  if (!codec.ok()) return codec.status();
  return TensorCompressor(*std::move(codec), num_elements, raw,
                          SplitIntoParts(num_elements, spec.part_elements), effective.error_feedback);
}

size_t TensorCompressor::EncodedSize() const {
  size_t total = 0;
  for (size_t i = 0; i < parts_.size(); ++i) total += EncodedPartSize(i);
  return total;
}

absl::StatusOr<size_t> TensorCompressor::EncodePart(size_t part, std::span<const float> tensor,
                                                    uint64_t tensor_id, std::span<std::byte> out) {
  if (tensor.size() != num_elements_) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "tensor compressor: tensor has %d elements, expected %d", tensor.size(), num_elements_));
  }
  if (part >= parts_.size()) {
    return absl::InvalidArgumentError(
        absl::StrFormat("tensor compressor: part %d of %d", part, parts_.size()));
  }
  const PartRange& r = parts_[part];
  const EncodeContext ctx{.tensor_id = tensor_id, .element_offset = r.offset};
  std::span<const float> input = tensor.subspan(r.offset, r.size);
  if (error_feedback_) return error_feedback_->Encode(codec_, input, ctx, out);
  return codec_.Encode(input, ctx, out);
}

}  // namespace tessera::compress

#pragma once
// Compression of the values of a push or a pull: rows of `width` floats, one
// per key, sent as one tensor of keys.size() * width elements.
//
// RowCompressor (the sender):
// - Values of fewer than spec.raw_below elements are not compressed
//   (EncodedRows::raw; the caller sends the plain fp32 frame).
// - Otherwise the tensor is cut into parts of spec.part_elements elements
//   and each part is encoded into its own Buffer (compress/codec.h wire
//   format; the header carries the part's element offset).
// - Error feedback (spec.error_feedback) keeps one residual row per key ever
//   sent: before encoding, each key's residual is added to its row (once per
//   key, however often the key repeats in the push); after encoding, what
//   was not sent becomes the key's new residual (summed over repeats). So for
//   every key, sum(values pushed) == sum(values decoded) + residual, up to
//   float rounding, whatever the mix of keys per push. Memory: one row per
//   distinct key pushed.
// - tensor ids: each Encode draws a fresh stream (a counter mixed with the
//   compressor's salt), so stochastic codecs never reuse draws.
// - Thread safety: Encode may be called from any thread; calls are
//   serialized by an internal mutex (the residuals are shared).
//
// DecodeRowParts (the receiver): decodes parts that must tile [0, out.size())
// exactly (no gap, no overlap, in any order) into `out`. Any bad part (bad
// bytes, wrong coverage) is an error naming it; `out` is then unspecified.
#include <cstdint>
#include <mutex>
#include <span>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "common/buffer.h"
#include "common/keys.h"
#include "compress/codec.h"

namespace tessera::compress {

struct EncodedRows {
  bool raw = false;           // below the threshold: send the fp32 values as they are
  std::vector<Buffer> parts;  // otherwise one encoded part per Buffer
  size_t wire_bytes = 0;      // sum of the parts' sizes
};

class RowCompressor {
 public:
  // Errors: spec.Validate()'s; width must be at least 1.
  static absl::StatusOr<std::unique_ptr<RowCompressor>> Create(const CodecSpec& spec, uint32_t width,
                                                               uint64_t salt);

  // values.size() must be keys.size() * width.
  absl::StatusOr<EncodedRows> Encode(std::span<const Key> keys, std::span<const float> values);

  const CodecSpec& spec() const { return codec_.spec(); }
  uint32_t width() const { return width_; }
  // Distinct keys holding a residual (0 without error feedback).
  size_t residual_rows() const;
  // The residual row of `key` (zeros if it has none); for tests and metrics.
  std::vector<float> Residual(Key key) const;

 private:
  RowCompressor(Codec codec, uint32_t width, uint64_t salt) : codec_(std::move(codec)), width_(width), salt_(salt) {}

  const Codec codec_;
  const uint32_t width_;
  const uint64_t salt_;
  mutable std::mutex mu_;
  uint64_t encodes_ = 0;                                        // guarded by mu_
  absl::flat_hash_map<Key, std::vector<float>> residuals_;      // guarded by mu_
  std::vector<float> scratch_;                                  // guarded by mu_
};

// Decodes `parts` (each a complete encoded part) into out. See the file comment.
absl::Status DecodeRowParts(std::span<const Buffer> parts, std::span<float> out);
// The checks of DecodeRowParts that need only the parts' headers: each is a
// well-formed part and together they tile [0, n) exactly. Receivers call it
// before allocating the n decoded values, so a bad header costs no memory.
absl::Status CheckRowParts(std::span<const Buffer> parts, uint64_t n);

// Encodes `values` with `codec` (no error feedback): raw below the spec's
// threshold, else one Buffer per part of spec.part_elements. For senders
// without residuals, such as servers compressing pull replies.
absl::StatusOr<EncodedRows> EncodeValues(const Codec& codec, std::span<const float> values, uint64_t tensor_id);

// A spec that may compress pulled weights: an elementwise codec (none, fp16,
// bf16, qsgd, terngrad) without error feedback; sparse and sign codecs would
// replace most weights by zeros or by one magnitude. InvalidArgument says why.
absl::StatusOr<CodecSpec> ParsePullSpec(std::string_view text);

}  // namespace tessera::compress

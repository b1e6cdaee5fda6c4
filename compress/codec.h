#pragma once
// Gradient compression: codecs that turn a float tensor into wire bytes and
// back. This header is the contract between senders (workers pushing
// gradients, servers encoding pulls) and receivers (servers aggregating
// pushes, workers applying pulls).
//
// Pieces:
// - CodecSpec: what to use (codec name, ratio, levels, error feedback, seed,
//   raw threshold, part size), parsed from a string and validated once.
// - Codec: an immutable encoder built from a spec. Encode writes exactly
//   EncodedSize(n) bytes.
// - Decode / DecodeAdd / InspectWire: free functions. The wire bytes are
//   self-describing (codec id, element count, element offset, parameters,
//   scales), so a receiver needs no spec to decode.
// - ErrorFeedback (error_feedback.h) wraps any Codec with a residual;
//   TensorCompressor (tensor_compressor.h) applies a spec to a whole tensor:
//   raw threshold, parts, and one residual per tensor.
//
// Wire format (all integers little-endian; see docs/compression.md):
//   [0,4)   magic "TSC1"
//   [4]     codec id (CodecId)
//   [5]     reserved, 0
//   [6,8)   u16 levels (qsgd), else 0
//   [8,16)  u64 n: elements in this part
//   [16,24) u64 element_offset: index of the part's first element in its
//           tensor (the RNG counter base; where a receiver puts the part)
//   [24,32) u64 stream key: the RNG stream (from seed and tensor id)
//   then, by codec:
//   none      f32[n]
//   fp16      u16[n] (IEEE binary16)          bf16  u16[n]
//   qsgd      f32 scale, u32 0, i8[n] in [-levels, levels]; x = q*scale/levels
//   terngrad  f32 scale, u32 0, 2-bit codes[n] (0: 0, 1: +scale, 2: -scale),
//             four per byte, element i at bits 2*(i%4); unused bits 0
//   onebit    f32 scale, u32 0, sign bits[n] (1 = negative), eight per byte,
//             element i at bit i%8; unused bits 0; x = +-scale
//   topk      u64 k, u32 index[k] strictly increasing, f32 value[k]
//   randomk   u64 k, f32 value[k] (indices are recomputed from the stream key,
//             the offset, n and k; values are already multiplied by the
//             stratum size)
//
// Promises common to every codec:
// - Deterministic: the same (spec, input, EncodeContext) gives the same bytes,
//   whatever the CPU path (scalar or AVX2) and, for the CUDA kernels, on a GPU.
// - Stochastic codecs (qsgd, terngrad, randomk) draw from a counter-based RNG
//   keyed by (seed, tensor id, element index); see scalar_ops.h. For qsgd and
//   terngrad the draw of an element depends on its index in the whole tensor
//   (element_offset + i), so splitting a tensor into parts does not change any
//   element's draw.
// - Unbiased codecs: qsgd, terngrad, randomk (E[decode(encode(x))] = x over
//   the RNG, up to float rounding). Biased: fp16, bf16 (rounding), onebit and
//   topk (use them with error feedback).
// - Non-finite input: none, fp16, bf16 and randomk carry inf/NaN through as
//   IEEE values; qsgd, terngrad, onebit and topk compute scales or rank by
//   magnitude and return InvalidArgument.
// - Decoding validates everything it can check structurally (magic, codec,
//   reserved fields, exact size, levels, scale finite and >= 0, k <= n,
//   index order and range, code and padding bits) and returns
//   InvalidArgument (DataLoss for a size mismatch) without writing to the
//   destination. It never reads outside the given bytes. Payload values of
//   fp32/fp16/bf16 codecs cannot be checked: integrity is the transport's job.
//
// Thread safety: Codec is immutable; its const methods may be called from any
// number of threads. The free functions are reentrant.
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace tessera::compress {

enum class CodecId : uint8_t {
  kNone = 0,      // raw fp32
  kFp16 = 1,      // IEEE half, round to nearest even
  kBf16 = 2,      // bfloat16, round to nearest even
  kQsgd = 3,      // int8 stochastic rounding to `levels` levels of max|x|
  kTernGrad = 4,  // {-1, 0, +1} * max|x|, stochastic
  kOneBit = 5,    // sign * mean|x|
  kTopK = 6,      // exact top-k by magnitude, indices + values
  kRandomK = 7,   // stratified random-k, shared seed, values scaled
};
inline constexpr int kNumCodecs = 8;

// "none", "fp16", "bf16", "qsgd", "terngrad", "onebit", "topk", "randomk".
std::string_view CodecName(CodecId id);
// Accepts the names above and the aliases "raw", "fp32", "int8", "sign",
// "1bit", "top-k", "random-k", "randk" (case-insensitive).
absl::StatusOr<CodecId> ParseCodecName(std::string_view name);

// What a table (or a direction of traffic) is compressed with.
struct CodecSpec {
  CodecId codec = CodecId::kNone;  // which codec
  double ratio = 0.01;        // topk/randomk: fraction of elements sent, in (0, 1]
  int levels = 127;           // qsgd: positive levels s (values q*max/s), 1..127
  bool error_feedback = false;  // keep a residual at the sender (see error_feedback.h)
  uint64_t seed = 0;          // RNG seed shared by senders and receivers
  uint64_t raw_below = 1024;  // tensors with fewer elements are sent raw ("none")
  uint64_t part_elements = 1u << 20;  // tensors are encoded in independent parts
                                      // of at most this many elements (1..2^32-1)

  // OK, or InvalidArgument naming the bad field and its allowed range.
  absl::Status Validate() const;
  // The canonical text form, accepted by ParseCodecSpec.
  std::string ToString() const;
};

// Parses "NAME" or "NAME:key=value,key=value" with keys ratio, levels,
// ef (true/false/yes/no/on/off/1/0), seed, raw_below, part. A bare name gets the
// defaults above, except that onebit and topk default to ef=true (they are
// biased and are meant to run with error feedback). The result is validated.
//   ParseCodecSpec("topk")                      -> topk, ratio 0.01, ef on
//   ParseCodecSpec("qsgd:levels=15,seed=7")
//   ParseCodecSpec("topk:ratio=0.001,ef=false,part=262144")
absl::StatusOr<CodecSpec> ParseCodecSpec(std::string_view text);

// Per-encode context: which tensor, which step, which part.
struct EncodeContext {
  // Names the tensor AND the step: stochastic codecs draw from the stream
  // (spec.seed, tensor_id), so a sender must use a fresh id for every encode
  // of new data (e.g. a hash of table, key range and clock). Senders that use
  // the same seed and id select the same random-k coordinates.
  uint64_t tensor_id = 0;
  // Index of input[0] in the whole tensor (for parts); written to the wire.
  uint64_t element_offset = 0;
};

// Number of elements topk/randomk keep of n: ceil(ratio * n) clamped to
// [1, n], and 0 for n == 0.
uint64_t KeptElements(double ratio, uint64_t n);

class Codec {
 public:
  // Validates the spec (the error of Validate()).
  static absl::StatusOr<Codec> Create(const CodecSpec& spec);

  CodecId id() const { return id_; }
  const CodecSpec& spec() const { return spec_; }
  bool unbiased() const;    // qsgd, terngrad, randomk, none
  bool stochastic() const;  // qsgd, terngrad, randomk

  // Largest part this codec encodes: 2^32-1 elements for topk/randomk
  // (u32 indices), else limited by the RNG counter: element_offset + n must
  // stay below 2^33.
  uint64_t MaxElements() const;

  // Exact number of bytes Encode writes for n elements.
  size_t EncodedSize(uint64_t n) const;

  // Encodes `input` into out[0, EncodedSize(input.size())) and returns that
  // size. Errors (InvalidArgument): out too small, too many elements,
  // non-finite input for codecs that reject it (see the file comment). On
  // error the content of `out` is unspecified. Does not allocate except for
  // topk (scratch proportional to k).
  absl::StatusOr<size_t> Encode(std::span<const float> input, const EncodeContext& ctx,
                                std::span<std::byte> out) const;

 private:
  explicit Codec(const CodecSpec& spec) : spec_(spec), id_(spec.codec) {}
  CodecSpec spec_;
  CodecId id_;
};

// What the header of an encoded part says. InspectWire validates the header
// and the total size (not the payload).
struct WireInfo {
  CodecId codec = CodecId::kNone;
  uint64_t num_elements = 0;    // n
  uint64_t element_offset = 0;  // where the part starts in its tensor
  uint64_t stream_key = 0;
  int levels = 0;               // qsgd only
  uint64_t kept = 0;            // topk/randomk: k
  size_t wire_bytes = 0;        // == the buffer size
};
absl::StatusOr<WireInfo> InspectWire(std::span<const std::byte> wire);
// InspectWire plus every payload check Decode makes (qsgd value range,
// terngrad codes, padding bits, top-k index order and range). A part that
// passes decodes without error into a destination of num_elements.
absl::StatusOr<WireInfo> ValidateWire(std::span<const std::byte> wire);

// Writes the decoded values into out (out.size() must equal n): every element
// is written, sparse codecs write zeros elsewhere. On error `out` is unchanged.
absl::Status Decode(std::span<const std::byte> wire, std::span<float> out);

// acc[i] += alpha * decoded[i] for the n elements of the part (acc.size() must
// equal n; pass the accumulator's subspan at element_offset). Sparse codecs
// touch only their k elements. This is how servers aggregate pushes in fp32
// without materialising the decoded tensor. On error `acc` is unchanged.
// alpha == 1 adds the decoded value exactly as Decode would produce it.
absl::Status DecodeAdd(std::span<const std::byte> wire, std::span<float> acc, float alpha = 1.0f);

// Size in bytes of the fixed header that starts every encoded part.
inline constexpr size_t kWireHeaderBytes = 32;

}  // namespace tessera::compress

#include "compress/row_compressor.h"

#include <algorithm>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "compress/tensor_compressor.h"

namespace tessera::compress {

absl::StatusOr<std::unique_ptr<RowCompressor>> RowCompressor::Create(const CodecSpec& spec, uint32_t width,
                                                                     uint64_t salt) {
  if (width == 0) return absl::InvalidArgumentError("row compressor: width must be at least 1");
  absl::StatusOr<Codec> codec = Codec::Create(spec);
  if (!codec.ok()) return codec.status();
  return std::unique_ptr<RowCompressor>(new RowCompressor(*std::move(codec), width, salt));
}

absl::StatusOr<EncodedRows> RowCompressor::Encode(std::span<const Key> keys, std::span<const float> values) {
  const size_t n = keys.size() * width_;
  if (values.size() != n) {
    return absl::InvalidArgumentError(absl::StrCat("row compressor: ", values.size(), " values for ", keys.size(),
                                                   " keys of width ", width_));
  }
  EncodedRows out;
  if (n < codec_.spec().raw_below) {
    out.raw = true;
    return out;
  }
  std::lock_guard lock(mu_);
  const bool ef = codec_.spec().error_feedback;
  std::span<const float> input = values;
  if (ef) {  // corrected = values + residual, the residual added once per distinct key
    scratch_.assign(values.begin(), values.end());
    absl::flat_hash_set<Key> seen;
    seen.reserve(keys.size());
    for (size_t i = 0; i < keys.size(); ++i) {
      if (!seen.insert(keys[i]).second) continue;
      auto it = residuals_.find(keys[i]);
      if (it == residuals_.end()) continue;
      float* row = &scratch_[i * width_];
      for (uint32_t j = 0; j < width_; ++j) row[j] += it->second[j];
    }
    input = scratch_;
  }
  absl::StatusOr<EncodedRows> encoded = EncodeValues(codec_, input, TensorStepId(salt_, keys.size(), ++encodes_));
  if (!encoded.ok()) return encoded.status();  // residuals untouched: nothing was sent
  out = *std::move(encoded);
  if (ef) {  // what was not sent: corrected - decoded, summed per key
    for (const Buffer& part : out.parts) {
      absl::StatusOr<WireInfo> info = InspectWire(part.As<std::byte>());
      if (!info.ok()) return info.status();
      if (absl::Status s = DecodeAdd(part.As<std::byte>(),
                                     std::span<float>(scratch_).subspan(info->element_offset, info->num_elements),
                                     -1.0f);
          !s.ok()) {
        return s;
      }
    }
    absl::flat_hash_set<Key> written_keys;
    written_keys.reserve(keys.size());
    for (size_t i = 0; i < keys.size(); ++i) {
      std::vector<float>& r = residuals_[keys[i]];
      const float* row = &scratch_[i * width_];
      if (written_keys.insert(keys[i]).second) {
        r.assign(row, row + width_);
      } else {
        for (uint32_t j = 0; j < width_; ++j) r[j] += row[j];
      }
    }
  }
  return out;
}

size_t RowCompressor::residual_rows() const {
  std::lock_guard lock(mu_);
  return residuals_.size();
}

std::vector<float> RowCompressor::Residual(Key key) const {
  std::lock_guard lock(mu_);
  auto it = residuals_.find(key);
  return it == residuals_.end() ? std::vector<float>(width_, 0.0f) : it->second;
}

absl::StatusOr<EncodedRows> EncodeValues(const Codec& codec, std::span<const float> values, uint64_t tensor_id) {
  EncodedRows out;
  if (values.size() < codec.spec().raw_below) {
    out.raw = true;
    return out;
  }
  for (const PartRange& r : SplitIntoParts(values.size(), codec.spec().part_elements)) {
    Buffer part = Buffer::Allocate(codec.EncodedSize(r.size));
    absl::StatusOr<size_t> written = codec.Encode(values.subspan(r.offset, r.size),
                                                  EncodeContext{.tensor_id = tensor_id, .element_offset = r.offset},
                                                  part.AsMutable<std::byte>());
    if (!written.ok()) return written.status();
    out.wire_bytes += *written;
    out.parts.push_back(std::move(part));
  }
  return out;
}

absl::StatusOr<CodecSpec> ParsePullSpec(std::string_view text) {
  absl::StatusOr<CodecSpec> spec = ParseCodecSpec(text);
  if (!spec.ok()) return spec.status();
  switch (spec->codec) {
    case CodecId::kNone:
    case CodecId::kFp16:
    case CodecId::kBf16:
    case CodecId::kQsgd:
    case CodecId::kTernGrad:
      break;
    default:
      return absl::InvalidArgumentError(absl::StrCat(
          "pulls return weights: ", std::string(CodecName(spec->codec)),
          " would send most of them as zeros or one magnitude; use none, fp16, bf16, qsgd or terngrad"));
  }
  if (spec->error_feedback) {
    return absl::InvalidArgumentError("pull compression takes no error feedback (every pull sends fresh weights)");
  }
  return spec;
}

namespace {

struct Piece {
  uint64_t offset, size;
  size_t index;
};

// The parts' headers, checked to tile [0, n) exactly, sorted by offset.
absl::StatusOr<std::vector<Piece>> TileParts(std::span<const Buffer> parts, uint64_t n) {
  std::vector<Piece> pieces;
  pieces.reserve(parts.size());
  for (size_t i = 0; i < parts.size(); ++i) {
    absl::StatusOr<WireInfo> info = InspectWire(parts[i].As<std::byte>());
    if (!info.ok()) {
      return absl::Status(info.status().code(), absl::StrCat("compressed part ", i, ": ", info.status().message()));
    }
    pieces.push_back({info->element_offset, info->num_elements, i});
  }
  std::sort(pieces.begin(), pieces.end(), [](const Piece& a, const Piece& b) { return a.offset < b.offset; });
  uint64_t next = 0;
  for (const Piece& p : pieces) {
    if (p.offset != next || p.size > n - std::min<uint64_t>(n, p.offset)) {
      return absl::InvalidArgumentError(absl::StrCat("compressed part ", p.index, " covers [", p.offset, ", ",
                                                     p.offset + p.size, ") but the next expected element is ", next,
                                                     " of ", n));
    }
    next = p.offset + p.size;
  }
  if (next != n) return absl::InvalidArgumentError(absl::StrCat("compressed parts cover ", next, " of ", n, " elements"));
  return pieces;
}

}  // namespace

absl::Status CheckRowParts(std::span<const Buffer> parts, uint64_t n) { return TileParts(parts, n).status(); }

absl::Status DecodeRowParts(std::span<const Buffer> parts, std::span<float> out) {
  absl::StatusOr<std::vector<Piece>> pieces = TileParts(parts, out.size());
  if (!pieces.ok()) return pieces.status();
  for (const Piece& p : *pieces) {
    if (absl::Status s = Decode(parts[p.index].As<std::byte>(), out.subspan(p.offset, p.size)); !s.ok()) {
      return absl::Status(s.code(), absl::StrCat("compressed part ", p.index, ": ", s.message()));
    }
  }
  return absl::OkStatus();
}

}  // namespace tessera::compress

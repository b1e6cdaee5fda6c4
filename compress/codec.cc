#include "compress/codec.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "compress/cpu_kernels.h"
#include "compress/scalar_ops.h"
#include "compress/topk_select.h"

static_assert(std::endian::native == std::endian::little,
              "the wire format is little-endian and is written with memcpy");

namespace tessera::compress {
namespace {

// This abseil has its own string_view type.
absl::string_view A(std::string_view s) { return absl::string_view(s.data(), s.size()); }

constexpr uint32_t kMagic = 0x31435354;  // "TSC1"
constexpr uint64_t kRngIndexLimit = 1ull << 33;
constexpr uint64_t kIndexLimit = 0xffffffffull;
// Parts whose largest magnitude is below this are sent as zeros by qsgd and
// terngrad: levels / scale would overflow a float.
constexpr float kMinQuantScale = 0x1p-100f;

template <typename T>
void Put(std::byte* p, T v) {
  std::memcpy(p, &v, sizeof(T));
}
template <typename T>
T Get(const std::byte* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));
  return v;
}

// Bytes after the 32-byte header, or 0 with ok=false on overflow.
bool PayloadBytes(CodecId id, uint64_t n, uint64_t k, uint64_t* bytes) {
  // n is bounded by the index/RNG limits at encode time; at decode time it is
  // untrusted, so guard every product.
  if (n > (1ull << 60)) return false;
  switch (id) {
    case CodecId::kNone: *bytes = 4 * n; return true;
    case CodecId::kFp16:
    case CodecId::kBf16: *bytes = 2 * n; return true;
    case CodecId::kQsgd: *bytes = 8 + n; return true;
    case CodecId::kTernGrad: *bytes = 8 + (n + 3) / 4; return true;
    case CodecId::kOneBit: *bytes = 8 + (n + 7) / 8; return true;
    case CodecId::kTopK:
      if (k > n) return false;
      *bytes = 8 + 8 * k;
      return true;
    case CodecId::kRandomK:
      if (k > n) return false;
      *bytes = 8 + 4 * k;
      return true;
  }
  return false;
}

void WriteHeader(std::byte* out, CodecId id, int levels, uint64_t n, uint64_t offset, uint64_t key) {
  Put<uint32_t>(out, kMagic);
  out[4] = static_cast<std::byte>(id);
  out[5] = std::byte{0};
  Put<uint16_t>(out + 6, static_cast<uint16_t>(levels));
  Put<uint64_t>(out + 8, n);
  Put<uint64_t>(out + 16, offset);
  Put<uint64_t>(out + 24, key);
}

absl::Status Invalid(std::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat("compressed tensor: ", A(what)));
}

// Validates a finite, non-negative scale.
bool ValidScale(float s) { return std::isfinite(s) && s >= 0.0f; }

}  // namespace

std::string_view CodecName(CodecId id) {
  switch (id) {
    case CodecId::kNone: return "none";
    case CodecId::kFp16: return "fp16";
    case CodecId::kBf16: return "bf16";
    case CodecId::kQsgd: return "qsgd";
    case CodecId::kTernGrad: return "terngrad";
    case CodecId::kOneBit: return "onebit";
    case CodecId::kTopK: return "topk";
    case CodecId::kRandomK: return "randomk";
  }
  return "unknown";
}

absl::StatusOr<CodecId> ParseCodecName(std::string_view name) {
  const std::string n = absl::AsciiStrToLower(absl::StripAsciiWhitespace(A(name)));
  struct Alias {
    const char* name;
    CodecId id;
  };
  static constexpr Alias kAliases[] = {
      {"none", CodecId::kNone},       {"raw", CodecId::kNone},         {"fp32", CodecId::kNone},
      {"fp16", CodecId::kFp16},       {"half", CodecId::kFp16},        {"bf16", CodecId::kBf16},
      {"qsgd", CodecId::kQsgd},       {"int8", CodecId::kQsgd},        {"terngrad", CodecId::kTernGrad},
      {"onebit", CodecId::kOneBit},   {"1bit", CodecId::kOneBit},      {"sign", CodecId::kOneBit},
      {"topk", CodecId::kTopK},       {"top-k", CodecId::kTopK},       {"randomk", CodecId::kRandomK},
      {"random-k", CodecId::kRandomK}, {"randk", CodecId::kRandomK},
  };
  for (const Alias& a : kAliases) {
    if (n == a.name) return a.id;
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "unknown codec '", A(name),
      "'; known: none, fp16, bf16, qsgd (int8), terngrad, onebit (sign), topk, randomk"));
}

absl::Status CodecSpec::Validate() const {
  if (static_cast<int>(codec) >= kNumCodecs) {
    return absl::InvalidArgumentError(absl::StrCat("codec: unknown codec id ", static_cast<int>(codec)));
  }
  if (!(ratio > 0.0 && ratio <= 1.0)) {  // also rejects NaN
    return absl::InvalidArgumentError(
        absl::StrCat("codec ratio must be in (0, 1], got ", ratio));
  }
  if (levels < 1 || levels > 127) {
    return absl::InvalidArgumentError(
        absl::StrCat("codec levels must be in [1, 127] (int8 payload), got ", levels));
  }
  if (part_elements < 1 || part_elements > kIndexLimit) {
    return absl::InvalidArgumentError(absl::StrCat(
        "codec part size must be in [1, 4294967295] elements, got ", part_elements));
  }
  return absl::OkStatus();
}

std::string CodecSpec::ToString() const {
  return absl::StrCat(A(CodecName(codec)), ":ratio=", ratio, ",levels=", levels,
                      ",ef=", error_feedback ? "true" : "false", ",seed=", seed,
                      ",raw_below=", raw_below, ",part=", part_elements);
}

absl::StatusOr<CodecSpec> ParseCodecSpec(std::string_view text) {
  CodecSpec spec;
  const size_t colon = text.find(':');
  auto id = ParseCodecName(text.substr(0, colon));
  if (!id.ok()) return id.status();
  spec.codec = *id;
  spec.error_feedback = spec.codec == CodecId::kOneBit || spec.codec == CodecId::kTopK;
  if (colon != std::string_view::npos) {
    for (absl::string_view item : absl::StrSplit(A(text.substr(colon + 1)), ',', absl::SkipEmpty())) {
      const size_t eq = item.find('=');
      if (eq == std::string_view::npos) {
        return absl::InvalidArgumentError(
            absl::StrCat("codec option '", item, "' is not key=value (in '", A(text), "')"));
      }
      const std::string key = absl::AsciiStrToLower(absl::StripAsciiWhitespace(item.substr(0, eq)));
      const absl::string_view value = absl::StripAsciiWhitespace(item.substr(eq + 1));
      bool ok = true;
      if (key == "ratio") {
        ok = absl::SimpleAtod(value, &spec.ratio);
      } else if (key == "levels") {
        ok = absl::SimpleAtoi(value, &spec.levels);
      } else if (key == "ef" || key == "error_feedback") {
        const std::string v = absl::AsciiStrToLower(value);
        if (v == "on" || v == "off") {
          spec.error_feedback = v == "on";
        } else {
          ok = absl::SimpleAtob(value, &spec.error_feedback);
        }
      } else if (key == "seed") {
        ok = absl::SimpleAtoi(value, &spec.seed);
      } else if (key == "raw_below") {
        ok = absl::SimpleAtoi(value, &spec.raw_below);
      } else if (key == "part" || key == "part_elements") {
        ok = absl::SimpleAtoi(value, &spec.part_elements);
      } else {
        return absl::InvalidArgumentError(absl::StrCat(
            "unknown codec option '", key, "' (in '", A(text),
            "'); known: ratio, levels, ef, seed, raw_below, part"));
      }
      if (!ok) {
        return absl::InvalidArgumentError(
            absl::StrCat("codec option ", key, ": cannot parse '", value, "'"));
      }
    }
  }
  if (absl::Status s = spec.Validate(); !s.ok()) return s;
  return spec;
}

uint64_t KeptElements(double ratio, uint64_t n) {
  if (n == 0) return 0;
  const double k = std::ceil(ratio * static_cast<double>(n));
  if (!(k >= 1.0)) return 1;
  if (k >= static_cast<double>(n)) return n;
  return static_cast<uint64_t>(k);
}

absl::StatusOr<Codec> Codec::Create(const CodecSpec& spec) {
  if (absl::Status s = spec.Validate(); !s.ok()) return s;
  return Codec(spec);
}

bool Codec::unbiased() const {
  return id_ == CodecId::kNone || id_ == CodecId::kQsgd || id_ == CodecId::kTernGrad ||
         id_ == CodecId::kRandomK;
}

bool Codec::stochastic() const {
  return id_ == CodecId::kQsgd || id_ == CodecId::kTernGrad || id_ == CodecId::kRandomK;
}

uint64_t Codec::MaxElements() const {
  return (id_ == CodecId::kTopK || id_ == CodecId::kRandomK) ? kIndexLimit : kRngIndexLimit;
}

size_t Codec::EncodedSize(uint64_t n) const {
  uint64_t payload = 0;
  const uint64_t k = (id_ == CodecId::kTopK || id_ == CodecId::kRandomK) ? KeptElements(spec_.ratio, n) : 0;
  PayloadBytes(id_, n, k, &payload);
  return kWireHeaderBytes + payload;
}

absl::StatusOr<size_t> Codec::Encode(std::span<const float> input, const EncodeContext& ctx,
                                     std::span<std::byte> out) const {
  const uint64_t n = input.size();
  if (n > MaxElements() || ctx.element_offset > kRngIndexLimit - n) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s: part of %d elements at offset %d exceeds the codec's limit of %d", CodecName(id_), n,
        ctx.element_offset, MaxElements()));
  }
  const size_t size = EncodedSize(n);
  if (out.size() < size) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s: output of %d bytes is smaller than the encoded size %d", CodecName(id_), out.size(), size));
  }
  const kernels::KernelTable& kt = kernels::Best();
  const uint64_t key = scalar::StreamKey(spec_.seed, ctx.tensor_id);
  std::byte* o = out.data();
  WriteHeader(o, id_, id_ == CodecId::kQsgd ? spec_.levels : 0, n, ctx.element_offset, key);
  std::byte* p = o + kWireHeaderBytes;
  const float* x = input.data();

  auto scale_error = [&]() {
    return absl::InvalidArgumentError(
        absl::StrCat(A(CodecName(id_)), ": input contains a non-finite value"));
  };

  switch (id_) {
    case CodecId::kNone:
      if (n) std::memcpy(p, x, 4 * n);
      break;
    case CodecId::kFp16:
      kt.encode_fp16(x, n, p);
      break;
    case CodecId::kBf16:
      kt.encode_bf16(x, n, p);
      break;
    case CodecId::kQsgd:
    case CodecId::kTernGrad: {
      const uint32_t max_bits = kt.max_abs_bits(x, n);
      if (max_bits >= 0x7f800000u) return scale_error();
      float scale = scalar::BitsToFloat(max_bits);
      if (scale < kMinQuantScale) scale = 0.0f;
      Put<float>(p, scale);
      Put<uint32_t>(p + 4, 0);
      if (id_ == CodecId::kQsgd) {
        auto* q = reinterpret_cast<int8_t*>(p + 8);
        if (scale == 0.0f) {
          std::memset(q, 0, n);
        } else {
          const float inv = static_cast<float>(spec_.levels) / scale;
          kt.encode_qsgd(x, n, inv, static_cast<uint32_t>(spec_.levels), key, ctx.element_offset, q);
        }
      } else {
        if (scale == 0.0f) {
          std::memset(p + 8, 0, (n + 3) / 4);
        } else {
          kt.encode_terngrad(x, n, 1.0f / scale, key, ctx.element_offset, p + 8);
        }
      }
      break;
    }
    case CodecId::kOneBit: {
      const double sum = kt.encode_signs(x, n, p + 8);
      if (!std::isfinite(sum)) return scale_error();
      const float scale = n ? static_cast<float>(sum / static_cast<double>(n)) : 0.0f;
      if (!std::isfinite(scale)) return scale_error();  // mean above FLT_MAX
      Put<float>(p, scale);
      Put<uint32_t>(p + 4, 0);
      break;
    }
    case CodecId::kTopK: {
      const uint64_t k = KeptElements(spec_.ratio, n);
      std::vector<uint32_t> idx;
      if (absl::Status s = SelectTopK(x, n, k, kt, idx); !s.ok()) return s;
      Put<uint64_t>(p, k);
      if (k > 0) std::memcpy(p + 8, idx.data(), 4 * k);  // idx.data() may be null when empty
      std::byte* values = p + 8 + 4 * k;
      for (uint64_t j = 0; j < k; ++j) Put<float>(values + 4 * j, x[idx[j]]);
      break;
    }
    case CodecId::kRandomK: {
      const uint64_t k = KeptElements(spec_.ratio, n);
      Put<uint64_t>(p, k);
      const uint64_t rk = scalar::RandomKStreamKey(key, ctx.element_offset);
      std::byte* values = p + 8;
      for (uint64_t b = 0; b < k; ++b) {
        const uint64_t i = scalar::RandomKIndex(rk, b, n, k);
        const uint64_t stratum = scalar::StratumBegin(b + 1, n, k) - scalar::StratumBegin(b, n, k);
        Put<float>(values + 4 * b, x[i] * static_cast<float>(stratum));
      }
      break;
    }
  }
  return size;
}

absl::StatusOr<WireInfo> InspectWire(std::span<const std::byte> wire) {
  if (wire.size() < kWireHeaderBytes) {
    return absl::DataLossError(absl::StrFormat(
        "compressed tensor: %d bytes is shorter than the %d-byte header", wire.size(), kWireHeaderBytes));
  }
  const std::byte* w = wire.data();
  if (Get<uint32_t>(w) != kMagic) return Invalid("bad magic (not a compressed tensor)");
  const uint8_t id = static_cast<uint8_t>(w[4]);
  if (id >= kNumCodecs) return Invalid(absl::StrCat("unknown codec id ", id));
  if (w[5] != std::byte{0}) return Invalid("reserved header byte is not zero");
  WireInfo info;
  info.codec = static_cast<CodecId>(id);
  info.levels = Get<uint16_t>(w + 6);
  info.num_elements = Get<uint64_t>(w + 8);
  info.element_offset = Get<uint64_t>(w + 16);
  info.stream_key = Get<uint64_t>(w + 24);
  if (info.codec == CodecId::kQsgd) {
    if (info.levels < 1 || info.levels > 127) {
      return Invalid(absl::StrCat("qsgd levels ", info.levels, " outside [1, 127]"));
    }
  } else if (info.levels != 0) {
    return Invalid("levels field is set for a codec without levels");
  }
  const uint64_t n = info.num_elements;
  if (info.element_offset > std::numeric_limits<uint64_t>::max() - n) {
    return Invalid("element offset + count overflows");
  }
  const bool sparse = info.codec == CodecId::kTopK || info.codec == CodecId::kRandomK;
  if (sparse) {
    if (n > kIndexLimit) return Invalid("sparse part has more than 2^32-1 elements");
    if (wire.size() < kWireHeaderBytes + 8) {
      return absl::DataLossError("compressed tensor: truncated before the element count k");
    }
    info.kept = Get<uint64_t>(w + kWireHeaderBytes);
    if (info.kept > n) return Invalid(absl::StrFormat("k = %d exceeds n = %d", info.kept, n));
    if ((info.kept == 0) != (n == 0)) return Invalid("k is 0 for a non-empty part");
  }
  uint64_t payload = 0;
  if (!PayloadBytes(info.codec, n, info.kept, &payload)) return Invalid("element count too large");
  const uint64_t expected = kWireHeaderBytes + payload;
  if (wire.size() != expected) {
    return absl::DataLossError(absl::StrFormat(
        "compressed tensor: %s part of %d elements needs %d bytes, got %d", CodecName(info.codec), n,
        expected, wire.size()));
  }
  if (info.codec == CodecId::kQsgd || info.codec == CodecId::kTernGrad ||
      info.codec == CodecId::kOneBit) {
    const float scale = Get<float>(w + kWireHeaderBytes);
    if (!ValidScale(scale)) return Invalid("scale is negative or not finite");
    if (Get<uint32_t>(w + kWireHeaderBytes + 4) != 0) return Invalid("reserved scale padding is not zero");
  }
  info.wire_bytes = expected;
  return info;
}

absl::StatusOr<WireInfo> ValidateWire(std::span<const std::byte> wire) {
  absl::StatusOr<WireInfo> info = InspectWire(wire);
  if (!info.ok()) return info;
  const uint64_t n = info->num_elements;
  const std::byte* p = wire.data() + kWireHeaderBytes;
  const kernels::KernelTable& kt = kernels::Best();
  switch (info->codec) {
    case CodecId::kQsgd:
      if (kt.max_abs_int8(reinterpret_cast<const int8_t*>(p + 8), n) >
          static_cast<uint32_t>(info->levels)) {
        return Invalid("qsgd value outside [-levels, levels]");
      }
      break;
    case CodecId::kTernGrad:
      if (!kt.valid_terngrad(p + 8, n)) return Invalid("terngrad code 3 or nonzero padding bits");
      break;
    case CodecId::kOneBit:
      if (n % 8 && (static_cast<uint32_t>(p[8 + n / 8]) >> (n % 8)) != 0) {
        return Invalid("onebit padding bits are not zero");
      }
      break;
    case CodecId::kTopK: {
      const std::byte* idx = p + 8;
      uint64_t prev = 0;
      for (uint64_t j = 0; j < info->kept; ++j) {
        const uint64_t i = Get<uint32_t>(idx + 4 * j);
        if (i >= n || (j > 0 && i <= prev)) return Invalid("topk indices not increasing or out of range");
        prev = i;
      }
      break;
    }
    default:
      break;
  }
  return info;
}

namespace {

absl::Status DecodeImpl(std::span<const std::byte> wire, std::span<float> dst, float alpha, bool add) {
  auto info_or = ValidateWire(wire);
  if (!info_or.ok()) return info_or.status();
  const WireInfo& info = *info_or;
  const uint64_t n = info.num_elements;
  if (dst.size() != n) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "compressed tensor: destination has %d elements, the part has %d", dst.size(), n));
  }
  const kernels::KernelTable& kt = kernels::Best();
  const std::byte* p = wire.data() + kWireHeaderBytes;
  float* d = dst.data();
  switch (info.codec) {
    case CodecId::kNone:
      kt.decode_fp32(p, n, d, alpha, add);
      break;
    case CodecId::kFp16:
      kt.decode_fp16(p, n, d, alpha, add);
      break;
    case CodecId::kBf16:
      kt.decode_bf16(p, n, d, alpha, add);
      break;
    case CodecId::kQsgd: {
      const float step = Get<float>(p) / static_cast<float>(info.levels);
      kt.decode_qsgd(reinterpret_cast<const int8_t*>(p + 8), n, step, d, alpha, add);
      break;
    }
    case CodecId::kTernGrad:
      kt.decode_terngrad(p + 8, n, Get<float>(p), d, alpha, add);
      break;
    case CodecId::kOneBit:
      kt.decode_signs(p + 8, n, Get<float>(p), d, alpha, add);
      break;
    case CodecId::kTopK: {
      const uint64_t k = info.kept;
      const std::byte* idx = p + 8;
      const std::byte* val = p + 8 + 4 * k;
      if (!add) std::fill(dst.begin(), dst.end(), 0.0f);
      for (uint64_t j = 0; j < k; ++j) {
        const uint32_t i = Get<uint32_t>(idx + 4 * j);
        const float v = Get<float>(val + 4 * j);
        if (add) {
          d[i] += alpha * v;
        } else {
          d[i] = v;
        }
      }
      break;
    }
    case CodecId::kRandomK: {
      const uint64_t k = info.kept;
      const uint64_t rk = scalar::RandomKStreamKey(info.stream_key, info.element_offset);
      if (!add) std::fill(dst.begin(), dst.end(), 0.0f);
      for (uint64_t b = 0; b < k; ++b) {
        const uint64_t i = scalar::RandomKIndex(rk, b, n, k);
        const float v = Get<float>(p + 8 + 4 * b);
        if (add) {
          d[i] += alpha * v;
        } else {
          d[i] = v;
        }
      }
      break;
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status Decode(std::span<const std::byte> wire, std::span<float> out) {
  return DecodeImpl(wire, out, 1.0f, false);
}

absl::Status DecodeAdd(std::span<const std::byte> wire, std::span<float> acc, float alpha) {
  return DecodeImpl(wire, acc, alpha, true);
}

}  // namespace tessera::compress

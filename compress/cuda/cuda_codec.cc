#include "compress/cuda/cuda_codec.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <vector>

#include "absl/strings/str_cat.h"
#include "compress/cuda/cuda_kernels.h"
#include "compress/scalar_ops.h"

namespace tessera::compress::cuda {
namespace {

namespace k = ::tessera::compress::cuda_kernels;

absl::Status CudaError(int code, const char* what) {
  if (code == 0) return absl::OkStatus();
  const cudaError_t e = static_cast<cudaError_t>(code);
  return absl::InternalError(absl::StrCat("CUDA ", what, ": ", cudaGetErrorName(e), " (",
                                          cudaGetErrorString(e), ")"));
}

#define RETURN_IF_CUDA(expr, what)                         \
  do {                                                     \
    if (absl::Status _s = CudaError((expr), what); !_s.ok()) return _s; \
  } while (0)

// Scratch device memory freed at scope exit (stream-ordered).
class DeviceScratch {
 public:
  explicit DeviceScratch(cudaStream_t stream) : stream_(stream) {}
  ~DeviceScratch() {
    for (void* p : blocks_) cudaFreeAsync(p, stream_);
  }
  DeviceScratch(const DeviceScratch&) = delete;
  DeviceScratch& operator=(const DeviceScratch&) = delete;

  template <typename T>
  absl::StatusOr<T*> Zeroed(size_t count) {
    void* p = nullptr;
    const size_t bytes = std::max<size_t>(1, count * sizeof(T));
    RETURN_IF_CUDA(cudaMallocAsync(&p, bytes, stream_), "allocation");
    blocks_.push_back(p);
    RETURN_IF_CUDA(cudaMemsetAsync(p, 0, bytes, stream_), "memset");
    return static_cast<T*>(p);
  }

 private:
  cudaStream_t stream_;
  std::vector<void*> blocks_;
};

template <typename T>
absl::StatusOr<T> ReadBack(const T* device, cudaStream_t stream) {
  T v;
  RETURN_IF_CUDA(cudaMemcpyAsync(&v, device, sizeof(T), cudaMemcpyDeviceToHost, stream), "copy");
  RETURN_IF_CUDA(cudaStreamSynchronize(stream), "synchronize");
  return v;
}

absl::Status NonFinite(CodecId id) {
  return absl::InvalidArgumentError(absl::StrCat(CodecName(id).data(), ": input contains a non-finite value"));
}

// Exact top-k on the device; writes k indices (increasing) and values.
absl::Status TopK(const float* x, size_t n, size_t kk, uint32_t* out_idx, float* out_val,
                  cudaStream_t stream) {
  DeviceScratch scratch(stream);
  uint32_t threshold = 0;
  size_t capacity = n;
  if (n >= 65536 && kk <= n / 16) {
    // The same strided sample as the CPU path.
    const size_t m = std::clamp<size_t>(n / 256, 1024, 16384);
    const size_t stride = n / m;
    auto sample_d = scratch.Zeroed<uint32_t>(m);
    if (!sample_d.ok()) return sample_d.status();
    RETURN_IF_CUDA(k::SampleAbsBits(x, m, stride, *sample_d, stream), "sample");
    std::vector<uint32_t> sample(m);
    RETURN_IF_CUDA(cudaMemcpyAsync(sample.data(), *sample_d, 4 * m, cudaMemcpyDeviceToHost, stream), "copy");
    RETURN_IF_CUDA(cudaStreamSynchronize(stream), "synchronize");
    const double expected = static_cast<double>(kk) * m / static_cast<double>(n);
    const size_t rank = static_cast<size_t>(2.0 * expected + 4.0 * std::sqrt(expected) + 8.0);
    if (rank < m) {
      std::nth_element(sample.begin(), sample.begin() + rank, sample.end(), std::greater<uint32_t>());
      threshold = std::min(sample[rank], 0x7f800000u);
      if (threshold > 0) capacity = std::min(n, 8 * kk + 4096);
    }
  }
  for (int attempt = 0; attempt < 2; ++attempt) {
    auto keys = scratch.Zeroed<uint64_t>(capacity);
    auto keys_alt = scratch.Zeroed<uint64_t>(capacity);
    auto count = scratch.Zeroed<unsigned long long>(1);
    auto non_finite = scratch.Zeroed<uint32_t>(1);
    if (!keys.ok() || !keys_alt.ok() || !count.ok() || !non_finite.ok()) {
      return absl::ResourceExhaustedError("CUDA top-k: scratch allocation failed");
    }
    RETURN_IF_CUDA(k::CollectCandidates(x, n, threshold, *keys, capacity, *count, *non_finite, stream),
                   "collect");
    auto c = ReadBack(*count, stream);
    auto nf = ReadBack(*non_finite, stream);
    if (!c.ok()) return c.status();
    if (!nf.ok()) return nf.status();
    if (*nf) return NonFinite(CodecId::kTopK);
    if (*c < kk || *c > capacity) {
      // The sample misjudged: take every element.
      threshold = 0;
      capacity = n;
      continue;
    }
    const size_t count_v = *c;
    const size_t temp_bytes = k::SortTempBytes(std::max(count_v, kk));
    auto temp = scratch.Zeroed<uint8_t>(temp_bytes);
    if (!temp.ok()) return temp.status();
    uint64_t* sorted = nullptr;
    RETURN_IF_CUDA(k::SortKeys64(*keys, *keys_alt, count_v, *temp, temp_bytes, &sorted, stream), "sort");
    // The first k keys are the winners (magnitude descending, index ascending).
    auto idx = scratch.Zeroed<uint32_t>(kk);
    auto idx_alt = scratch.Zeroed<uint32_t>(kk);
    if (!idx.ok() || !idx_alt.ok()) return absl::ResourceExhaustedError("CUDA top-k: scratch");
    RETURN_IF_CUDA(k::ExtractIndices(sorted, kk, *idx, stream), "extract");
    uint32_t* sorted_idx = nullptr;
    RETURN_IF_CUDA(k::SortKeys32(*idx, *idx_alt, kk, *temp, temp_bytes, &sorted_idx, stream), "sort");
    RETURN_IF_CUDA(cudaMemcpyAsync(out_idx, sorted_idx, 4 * kk, cudaMemcpyDeviceToDevice, stream), "copy");
    RETURN_IF_CUDA(k::GatherValues(x, sorted_idx, kk, out_val, stream), "gather");
    RETURN_IF_CUDA(cudaStreamSynchronize(stream), "synchronize");
    return absl::OkStatus();
  }
  return absl::InternalError("CUDA top-k: candidate collection failed twice");
}

}  // namespace

absl::Status CudaDeviceStatus() {
  int count = 0;  // left unwritten by some failures
  const cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess) {
    return absl::FailedPreconditionError(
        absl::StrCat("no usable CUDA device: ", cudaGetErrorName(e), " (", cudaGetErrorString(e), ")"));
  }
  if (count == 0) return absl::FailedPreconditionError("no CUDA device present");
  return absl::OkStatus();
}

absl::StatusOr<size_t> EncodeOnDevice(const Codec& codec, const float* x, size_t n,
                                      const EncodeContext& ctx, std::byte* out, void* stream_ptr) {
  if (absl::Status s = CudaDeviceStatus(); !s.ok()) return s;
  const CodecId id = codec.id();
  if (n > codec.MaxElements() || ctx.element_offset > (1ull << 33) - n) {
    return absl::InvalidArgumentError(absl::StrCat(CodecName(id).data(), ": part too large for the codec"));
  }
  cudaStream_t stream = static_cast<cudaStream_t>(stream_ptr);
  const CodecSpec& spec = codec.spec();
  const uint64_t key = scalar::StreamKey(spec.seed, ctx.tensor_id);
  const size_t size = codec.EncodedSize(n);

  // Header (and the codec's fixed fields) composed on the host.
  unsigned char head[kWireHeaderBytes + 8] = {};
  const uint32_t magic = 0x31435354;
  std::memcpy(head, &magic, 4);
  head[4] = static_cast<unsigned char>(id);
  const uint16_t levels = id == CodecId::kQsgd ? static_cast<uint16_t>(spec.levels) : 0;
  std::memcpy(head + 6, &levels, 2);
  const uint64_t n64 = n;
  std::memcpy(head + 8, &n64, 8);
  std::memcpy(head + 16, &ctx.element_offset, 8);
  std::memcpy(head + 24, &key, 8);
  size_t head_bytes = kWireHeaderBytes;
  auto* payload = reinterpret_cast<unsigned char*>(out) + kWireHeaderBytes;
  DeviceScratch scratch(stream);

  switch (id) {
    case CodecId::kNone:
      if (n) RETURN_IF_CUDA(cudaMemcpyAsync(payload, x, 4 * n, cudaMemcpyDeviceToDevice, stream), "copy");
      break;
    case CodecId::kFp16:
      RETURN_IF_CUDA(k::EncodeFp16(x, n, reinterpret_cast<uint16_t*>(payload), stream), "fp16");
      break;
    case CodecId::kBf16:
      RETURN_IF_CUDA(k::EncodeBf16(x, n, reinterpret_cast<uint16_t*>(payload), stream), "bf16");
      break;
    case CodecId::kQsgd:
    case CodecId::kTernGrad: {
      auto max_d = scratch.Zeroed<uint32_t>(1);
      if (!max_d.ok()) return max_d.status();
      RETURN_IF_CUDA(k::MaxAbsBits(x, n, *max_d, stream), "max");
      auto max_bits = ReadBack(*max_d, stream);
      if (!max_bits.ok()) return max_bits.status();
      if (*max_bits >= 0x7f800000u) return NonFinite(id);
      // Scale and reciprocal exactly as the CPU encoder computes them.
      float scale = scalar::BitsToFloat(*max_bits);
      if (scale < 0x1p-100f) scale = 0.0f;
      std::memcpy(head + kWireHeaderBytes, &scale, 4);
      head_bytes += 8;
      if (id == CodecId::kQsgd) {
        if (scale == 0.0f) {
          RETURN_IF_CUDA(cudaMemsetAsync(payload + 8, 0, n, stream), "memset");
        } else {
          const float inv = static_cast<float>(spec.levels) / scale;
          RETURN_IF_CUDA(k::EncodeQsgd(x, n, inv, static_cast<uint32_t>(spec.levels), key, ctx.element_offset,
                                       reinterpret_cast<int8_t*>(payload + 8), stream),
                         "qsgd");
        }
      } else {
        if (scale == 0.0f) {
          RETURN_IF_CUDA(cudaMemsetAsync(payload + 8, 0, (n + 3) / 4, stream), "memset");
        } else {
          RETURN_IF_CUDA(k::EncodeTernGrad(x, n, 1.0f / scale, key, ctx.element_offset, payload + 8, stream),
                         "terngrad");
        }
      }
      break;
    }
    case CodecId::kOneBit: {
      auto sum_d = scratch.Zeroed<double>(1);
      if (!sum_d.ok()) return sum_d.status();
      RETURN_IF_CUDA(k::EncodeSigns(x, n, payload + 8, *sum_d, stream), "signs");
      auto sum = ReadBack(*sum_d, stream);
      if (!sum.ok()) return sum.status();
      if (!std::isfinite(*sum)) return NonFinite(id);
      const float scale = n ? static_cast<float>(*sum / static_cast<double>(n)) : 0.0f;
      std::memcpy(head + kWireHeaderBytes, &scale, 4);
      head_bytes += 8;
      break;
    }
    case CodecId::kTopK: {
      const uint64_t kk = KeptElements(spec.ratio, n);
      std::memcpy(head + kWireHeaderBytes, &kk, 8);
      head_bytes += 8;
      if (kk > 0) {
        auto* idx = reinterpret_cast<uint32_t*>(payload + 8);
        auto* val = reinterpret_cast<float*>(payload + 8 + 4 * kk);
        if (kk == n) {
          auto max_d = scratch.Zeroed<uint32_t>(1);
          if (!max_d.ok()) return max_d.status();
          RETURN_IF_CUDA(k::MaxAbsBits(x, n, *max_d, stream), "max");
          auto max_bits = ReadBack(*max_d, stream);
          if (!max_bits.ok()) return max_bits.status();
          if (*max_bits >= 0x7f800000u) return NonFinite(id);
          RETURN_IF_CUDA(k::Iota(idx, n, stream), "iota");
          RETURN_IF_CUDA(cudaMemcpyAsync(val, x, 4 * n, cudaMemcpyDeviceToDevice, stream), "copy");
        } else if (absl::Status s = TopK(x, n, kk, idx, val, stream); !s.ok()) {
          return s;
        }
      }
      break;
    }
    case CodecId::kRandomK: {
      const uint64_t kk = KeptElements(spec.ratio, n);
      std::memcpy(head + kWireHeaderBytes, &kk, 8);
      head_bytes += 8;
      RETURN_IF_CUDA(k::EncodeRandomK(x, n, kk, scalar::RandomKStreamKey(key, ctx.element_offset),
                                      reinterpret_cast<float*>(payload + 8), stream),
                     "randomk");
      break;
    }
  }
  RETURN_IF_CUDA(cudaMemcpyAsync(out, head, head_bytes, cudaMemcpyHostToDevice, stream), "copy");
  RETURN_IF_CUDA(cudaStreamSynchronize(stream), "synchronize");
  return size;
}

absl::Status DecodeAddOnDevice(std::span<const std::byte> wire, float* acc, size_t n, float alpha,
                               void* stream_ptr) {
  absl::StatusOr<WireInfo> info = ValidateWire(wire);
  if (!info.ok()) return info.status();
  if (info->num_elements != n) {
    return absl::InvalidArgumentError(absl::StrCat("compressed tensor: destination has ", n,
                                                   " elements, the part has ", info->num_elements));
  }
  if (absl::Status s = CudaDeviceStatus(); !s.ok()) return s;
  cudaStream_t stream = static_cast<cudaStream_t>(stream_ptr);
  DeviceScratch scratch(stream);
  const size_t payload_bytes = wire.size() - kWireHeaderBytes;
  auto payload = scratch.Zeroed<uint8_t>(payload_bytes);
  if (!payload.ok()) return payload.status();
  RETURN_IF_CUDA(cudaMemcpyAsync(*payload, wire.data() + kWireHeaderBytes, payload_bytes,
                                 cudaMemcpyHostToDevice, stream),
                 "copy");
  float scale = 0.0f;
  if (info->codec == CodecId::kQsgd || info->codec == CodecId::kTernGrad || info->codec == CodecId::kOneBit) {
    std::memcpy(&scale, wire.data() + kWireHeaderBytes, 4);
  }
  const uint64_t rk = info->codec == CodecId::kRandomK
                          ? scalar::RandomKStreamKey(info->stream_key, info->element_offset)
                          : 0;
  RETURN_IF_CUDA(k::DecodeAdd(static_cast<int>(info->codec), *payload, n, info->kept, info->levels, scale,
                              rk, acc, alpha, stream),
                 "decode");
  RETURN_IF_CUDA(cudaStreamSynchronize(stream), "synchronize");
  return absl::OkStatus();
}

}  // namespace tessera::compress::cuda

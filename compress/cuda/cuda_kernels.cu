// CUDA kernels of the codecs. Every value computation goes through
// compress/scalar_ops.h (the same functions the CPU uses), and the target is
// compiled with --fmad=false, so results match the CPU bit for bit (the
// onebit scale, a floating-point sum, is the one exception: its order of
// additions differs).
#include <cub/device/device_radix_sort.cuh>
#include <cuda_runtime.h>

#include "compress/cuda/cuda_kernels.h"
#include "compress/scalar_ops.h"

namespace tessera::compress::cuda_kernels {
namespace {

namespace s = ::tessera::compress::scalar;

constexpr int kThreads = 256;

unsigned Blocks(size_t n) {
  size_t b = (n + kThreads - 1) / kThreads;
  if (b > 65535u * 64u) b = 65535u * 64u;  // grid-stride loops cover the rest
  return static_cast<unsigned>(b == 0 ? 1 : b);
}

cudaStream_t S(void* stream) { return static_cast<cudaStream_t>(stream); }

int Launched() { return static_cast<int>(cudaGetLastError()); }

#define GRID_STRIDE(i, n)                                                    \
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; \
       i < (n); i += static_cast<size_t>(gridDim.x) * blockDim.x)

__global__ void MaxAbsBitsKernel(const float* x, size_t n, uint32_t* result) {
  uint32_t m = 0;
  GRID_STRIDE(i, n) {
    const uint32_t b = __float_as_uint(x[i]) & 0x7fffffffu;
    m = b > m ? b : m;
  }
  // Warp reduction, then one atomic per warp.
  for (int off = 16; off > 0; off /= 2) {
    const uint32_t o = __shfl_down_sync(0xffffffffu, m, off);
    m = o > m ? o : m;
  }
  if ((threadIdx.x & 31) == 0 && m != 0) atomicMax(result, m);
}

__global__ void EncodeFp16Kernel(const float* x, size_t n, uint16_t* out) {
  GRID_STRIDE(i, n) { out[i] = s::FloatToHalf(x[i]); }
}

__global__ void EncodeBf16Kernel(const float* x, size_t n, uint16_t* out) {
  GRID_STRIDE(i, n) { out[i] = s::FloatToBf16(x[i]); }
}

__device__ __forceinline__ int32_t SignedLevel(float v, float inv, uint32_t levels, uint32_t u16) {
  const uint32_t b = __float_as_uint(v);
  const int32_t q = static_cast<int32_t>(s::StochasticLevel(__uint_as_float(b & 0x7fffffffu), inv, levels, u16));
  return (b >> 31) ? -q : q;
}

__global__ void EncodeQsgdKernel(const float* x, size_t n, float inv, uint32_t levels, uint64_t key,
                                 uint64_t index0, int8_t* out) {
  GRID_STRIDE(i, n) {
    out[i] = static_cast<int8_t>(SignedLevel(x[i], inv, levels, s::ElementUniform16(key, index0 + i)));
  }
}

// One thread per output byte (four elements).
__global__ void EncodeTernKernel(const float* x, size_t n, float inv, uint64_t key, uint64_t index0,
                                 uint8_t* out) {
  const size_t bytes = (n + 3) / 4;
  GRID_STRIDE(j, bytes) {
    uint32_t byte = 0;
    for (size_t t = 0; t < 4; ++t) {
      const size_t i = 4 * j + t;
      if (i >= n) break;
      const int32_t q = SignedLevel(x[i], inv, 1, s::ElementUniform16(key, index0 + i));
      const uint32_t code = q == 0 ? 0u : (q < 0 ? 2u : 1u);
      byte |= code << (2 * t);
    }
    out[j] = static_cast<uint8_t>(byte);
  }
}

// One thread per output byte (eight elements); |x| summed per block in double.
__global__ void EncodeSignsKernel(const float* x, size_t n, uint8_t* out, double* sum) {
  __shared__ double partial[kThreads / 32];
  double acc = 0.0;
  const size_t bytes = (n + 7) / 8;
  GRID_STRIDE(j, bytes) {
    uint32_t byte = 0;
    for (size_t t = 0; t < 8; ++t) {
      const size_t i = 8 * j + t;
      if (i >= n) break;
      const uint32_t b = __float_as_uint(x[i]);
      byte |= (b >> 31) << t;
      acc += static_cast<double>(__uint_as_float(b & 0x7fffffffu));
    }
    out[j] = static_cast<uint8_t>(byte);
  }
  for (int off = 16; off > 0; off /= 2) acc += __shfl_down_sync(0xffffffffu, acc, off);
  if ((threadIdx.x & 31) == 0) partial[threadIdx.x / 32] = acc;
  __syncthreads();
  if (threadIdx.x == 0) {
    double total = 0.0;
    for (int w = 0; w < kThreads / 32; ++w) total += partial[w];
    atomicAdd(sum, total);
  }
}

__global__ void EncodeRandomKKernel(const float* x, size_t n, size_t k, uint64_t rk_key, float* values) {
  GRID_STRIDE(b, k) {
    const uint64_t i = s::RandomKIndex(rk_key, b, n, k);
    const uint64_t stratum = s::StratumBegin(b + 1, n, k) - s::StratumBegin(b, n, k);
    values[b] = x[i] * static_cast<float>(stratum);
  }
}

__global__ void SampleKernel(const float* x, size_t m, size_t stride, uint32_t* sample) {
  GRID_STRIDE(j, m) {
    const size_t jitter = s::CounterHash32(0x746f706b73616d70ull, static_cast<uint32_t>(j)) % stride;
    sample[j] = __float_as_uint(x[j * stride + jitter]) & 0x7fffffffu;
  }
}

__global__ void CollectKernel(const float* x, size_t n, uint32_t threshold, uint64_t* keys,
                              size_t capacity, unsigned long long* count, uint32_t* non_finite) {
  GRID_STRIDE(i, n) {
    const uint32_t b = __float_as_uint(x[i]) & 0x7fffffffu;
    if (b >= 0x7f800000u) *non_finite = 1;
    if (b >= threshold) {
      const unsigned long long slot = atomicAdd(count, 1ull);
      if (slot < capacity) keys[slot] = (static_cast<uint64_t>(~b) << 32) | static_cast<uint64_t>(i);
    }
  }
}

__global__ void ExtractKernel(const uint64_t* keys, size_t k, uint32_t* idx) {
  GRID_STRIDE(j, k) { idx[j] = static_cast<uint32_t>(keys[j] & 0xffffffffull); }
}

__global__ void GatherKernel(const float* x, const uint32_t* idx, size_t k, float* values) {
  GRID_STRIDE(j, k) { values[j] = x[idx[j]]; }
}

__global__ void IotaKernel(uint32_t* idx, size_t n) {
  GRID_STRIDE(i, n) { idx[i] = static_cast<uint32_t>(i); }
}

// ---- decode-add ---------------------------------------------------------
// Codec ids as in compress/codec.h.
enum : int { kNone = 0, kFp16 = 1, kBf16 = 2, kQsgd = 3, kTernGrad = 4, kOneBit = 5, kTopK = 6, kRandomK = 7 };

__device__ __forceinline__ uint32_t LoadU32(const uint8_t* p) {
  return static_cast<uint32_t>(p[0]) | (static_cast<uint32_t>(p[1]) << 8) |
         (static_cast<uint32_t>(p[2]) << 16) | (static_cast<uint32_t>(p[3]) << 24);
}
__device__ __forceinline__ uint16_t LoadU16(const uint8_t* p) {
  return static_cast<uint16_t>(p[0] | (p[1] << 8));
}

__global__ void DecodeAddDenseKernel(int codec, const uint8_t* payload, size_t n, float step,
                                     float scale, float* acc, float alpha) {
  GRID_STRIDE(i, n) {
    float v = 0.0f;
    switch (codec) {
      case kNone: v = __uint_as_float(LoadU32(payload + 4 * i)); break;
      case kFp16: v = s::HalfToFloat(LoadU16(payload + 2 * i)); break;
      case kBf16: v = s::Bf16ToFloat(LoadU16(payload + 2 * i)); break;
      case kQsgd: v = static_cast<float>(static_cast<int8_t>(payload[8 + i])) * step; break;
      case kTernGrad: {
        const uint32_t code = (payload[8 + i / 4] >> (2 * (i % 4))) & 3u;
        v = code == 1 ? scale : (code == 2 ? -scale : 0.0f);
        break;
      }
      case kOneBit: v = ((payload[8 + i / 8] >> (i % 8)) & 1u) ? -scale : scale; break;
    }
    acc[i] = acc[i] + alpha * v;
  }
}

__global__ void DecodeAddTopKKernel(const uint8_t* payload, size_t k, float* acc, float alpha) {
  GRID_STRIDE(j, k) {
    const uint32_t i = LoadU32(payload + 8 + 4 * j);
    const float v = __uint_as_float(LoadU32(payload + 8 + 4 * k + 4 * j));
    acc[i] = acc[i] + alpha * v;
  }
}

__global__ void DecodeAddRandomKKernel(const uint8_t* payload, size_t n, size_t k, uint64_t rk_key,
                                       float* acc, float alpha) {
  GRID_STRIDE(b, k) {
    const uint64_t i = s::RandomKIndex(rk_key, b, n, k);
    const float v = __uint_as_float(LoadU32(payload + 8 + 4 * b));
    acc[i] = acc[i] + alpha * v;
  }
}

}  // namespace

int MaxAbsBits(const float* x, size_t n, uint32_t* result, void* stream) {
  if (n == 0) return 0;
  MaxAbsBitsKernel<<<Blocks(n), kThreads, 0, S(stream)>>>(x, n, result);
  return Launched();
}

int EncodeFp16(const float* x, size_t n, uint16_t* out, void* stream) {
  if (n == 0) return 0;
  EncodeFp16Kernel<<<Blocks(n), kThreads, 0, S(stream)>>>(x, n, out);
  return Launched();
}

int EncodeBf16(const float* x, size_t n, uint16_t* out, void* stream) {
  if (n == 0) return 0;
  EncodeBf16Kernel<<<Blocks(n), kThreads, 0, S(stream)>>>(x, n, out);
  return Launched();
}

int EncodeQsgd(const float* x, size_t n, float inv, uint32_t levels, uint64_t key, uint64_t index0,
               int8_t* out, void* stream) {
  if (n == 0) return 0;
  EncodeQsgdKernel<<<Blocks(n), kThreads, 0, S(stream)>>>(x, n, inv, levels, key, index0, out);
  return Launched();
}

int EncodeTernGrad(const float* x, size_t n, float inv, uint64_t key, uint64_t index0, uint8_t* out,
                   void* stream) {
  if (n == 0) return 0;
  EncodeTernKernel<<<Blocks((n + 3) / 4), kThreads, 0, S(stream)>>>(x, n, inv, key, index0, out);
  return Launched();
}

int EncodeSigns(const float* x, size_t n, uint8_t* out, double* sum, void* stream) {
  if (n == 0) return 0;
  EncodeSignsKernel<<<Blocks((n + 7) / 8), kThreads, 0, S(stream)>>>(x, n, out, sum);
  return Launched();
}

int EncodeRandomK(const float* x, size_t n, size_t k, uint64_t rk_key, float* values, void* stream) {
  if (k == 0) return 0;
  EncodeRandomKKernel<<<Blocks(k), kThreads, 0, S(stream)>>>(x, n, k, rk_key, values);
  return Launched();
}

int SampleAbsBits(const float* x, size_t m, size_t stride, uint32_t* sample, void* stream) {
  SampleKernel<<<Blocks(m), kThreads, 0, S(stream)>>>(x, m, stride, sample);
  return Launched();
}

int CollectCandidates(const float* x, size_t n, uint32_t threshold, uint64_t* keys, size_t capacity,
                      unsigned long long* count, uint32_t* non_finite, void* stream) {
  if (n == 0) return 0;
  CollectKernel<<<Blocks(n), kThreads, 0, S(stream)>>>(x, n, threshold, keys, capacity, count,
                                                        non_finite);
  return Launched();
}

size_t SortTempBytes(size_t count) {
  size_t a = 0, b = 0;
  cub::DoubleBuffer<uint64_t> k64(nullptr, nullptr);
  cub::DoubleBuffer<uint32_t> k32(nullptr, nullptr);
  cub::DeviceRadixSort::SortKeys(nullptr, a, k64, static_cast<int>(count));
  cub::DeviceRadixSort::SortKeys(nullptr, b, k32, static_cast<int>(count));
  return a > b ? a : b;
}

int SortKeys64(uint64_t* keys, uint64_t* keys_alt, size_t count, void* temp, size_t temp_bytes,
               uint64_t** sorted, void* stream) {
  cub::DoubleBuffer<uint64_t> buf(keys, keys_alt);
  const cudaError_t e = cub::DeviceRadixSort::SortKeys(temp, temp_bytes, buf, static_cast<int>(count),
                                                       0, 64, S(stream));
  *sorted = buf.Current();
  return static_cast<int>(e);
}

int SortKeys32(uint32_t* keys, uint32_t* keys_alt, size_t count, void* temp, size_t temp_bytes,
               uint32_t** sorted, void* stream) {
  cub::DoubleBuffer<uint32_t> buf(keys, keys_alt);
  const cudaError_t e = cub::DeviceRadixSort::SortKeys(temp, temp_bytes, buf, static_cast<int>(count),
                                                       0, 32, S(stream));
  *sorted = buf.Current();
  return static_cast<int>(e);
}

int ExtractIndices(const uint64_t* keys, size_t k, uint32_t* idx, void* stream) {
  if (k == 0) return 0;
  ExtractKernel<<<Blocks(k), kThreads, 0, S(stream)>>>(keys, k, idx);
  return Launched();
}

int GatherValues(const float* x, const uint32_t* idx, size_t k, float* values, void* stream) {
  if (k == 0) return 0;
  GatherKernel<<<Blocks(k), kThreads, 0, S(stream)>>>(x, idx, k, values);
  return Launched();
}

int Iota(uint32_t* idx, size_t n, void* stream) {
  if (n == 0) return 0;
  IotaKernel<<<Blocks(n), kThreads, 0, S(stream)>>>(idx, n);
  return Launched();
}

int DecodeAdd(int codec, const uint8_t* payload, size_t n, size_t k, int levels, float scale,
              uint64_t rk_key, float* acc, float alpha, void* stream) {
  if (n == 0) return 0;
  if (codec == kTopK) {
    DecodeAddTopKKernel<<<Blocks(k), kThreads, 0, S(stream)>>>(payload, k, acc, alpha);
  } else if (codec == kRandomK) {
    DecodeAddRandomKKernel<<<Blocks(k), kThreads, 0, S(stream)>>>(payload, n, k, rk_key, acc, alpha);
  } else {
    // Same float division as the CPU decoder (IEEE, round to nearest).
    const float step = codec == kQsgd ? scale / static_cast<float>(levels) : 0.0f;
    DecodeAddDenseKernel<<<Blocks(n), kThreads, 0, S(stream)>>>(codec, payload, n, step, scale, acc, alpha);
  }
  return Launched();
}

}  // namespace tessera::compress::cuda_kernels

#pragma once
// Launchers for the CUDA codec kernels (internal to tessera_compress_cuda).
// Plain C++ declarations so that host code compiled by the C++ compiler can
// call them; `stream` is a cudaStream_t. Each returns a cudaError_t as int
// (0 = success) from the launch; errors of the kernels themselves surface at
// the next synchronisation. All pointers are device pointers unless noted.
#include <cstddef>
#include <cstdint>

namespace tessera::compress::cuda_kernels {

int MaxAbsBits(const float* x, size_t n, uint32_t* result, void* stream);  // *result must be 0
int EncodeFp16(const float* x, size_t n, uint16_t* out, void* stream);
int EncodeBf16(const float* x, size_t n, uint16_t* out, void* stream);
int EncodeQsgd(const float* x, size_t n, float inv, uint32_t levels, uint64_t key, uint64_t index0,
               int8_t* out, void* stream);
int EncodeTernGrad(const float* x, size_t n, float inv, uint64_t key, uint64_t index0,
                   uint8_t* out, void* stream);
// Sign bits (whole bytes) and the sum of |x| added to *sum (must be 0).
int EncodeSigns(const float* x, size_t n, uint8_t* out, double* sum, void* stream);
int EncodeRandomK(const float* x, size_t n, size_t k, uint64_t rk_key, float* values, void* stream);

// Top-k pieces.
int SampleAbsBits(const float* x, size_t m, size_t stride, uint32_t* sample, void* stream);
// Writes key = (uint64(~abs_bits) << 32) | index for abs_bits >= threshold at
// slots taken from *count (must be 0), up to capacity; sets *non_finite to 1
// when any element is inf or NaN.
int CollectCandidates(const float* x, size_t n, uint32_t threshold, uint64_t* keys, size_t capacity,
                      unsigned long long* count, uint32_t* non_finite, void* stream);
// Sorts keys ascending (radix sort); temp is scratch of TopKSortTempBytes(count).
size_t SortTempBytes(size_t count);
int SortKeys64(uint64_t* keys, uint64_t* keys_alt, size_t count, void* temp, size_t temp_bytes,
               uint64_t** sorted, void* stream);
int SortKeys32(uint32_t* keys, uint32_t* keys_alt, size_t count, void* temp, size_t temp_bytes,
               uint32_t** sorted, void* stream);
// idx[j] = low 32 bits of keys[j], j < k.
int ExtractIndices(const uint64_t* keys, size_t k, uint32_t* idx, void* stream);
int GatherValues(const float* x, const uint32_t* idx, size_t k, float* values, void* stream);
int Iota(uint32_t* idx, size_t n, void* stream);

// acc[i] += alpha * decoded[i] for a part whose payload (after the 32-byte
// header) is at `payload`; parameters come from the validated header.
int DecodeAdd(int codec, const uint8_t* payload, size_t n, size_t k, int levels, float scale,
              uint64_t rk_key, float* acc, float alpha, void* stream);

}  // namespace tessera::compress::cuda_kernels

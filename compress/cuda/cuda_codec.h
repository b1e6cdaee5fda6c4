#pragma once
// Codecs on CUDA device tensors: the same wire bytes as Codec::Encode and the
// same accumulation as DecodeAdd, computed on a GPU.
//
// Contract:
// - EncodeOnDevice(codec, x, ctx, out) writes into device memory `out`
//   (at least codec.EncodedSize(n) bytes, 8-byte aligned, e.g. from
//   cudaMalloc) exactly the bytes Codec::Encode writes for the same input on
//   the CPU, for every codec except onebit, whose sign bits are identical but
//   whose scale (a floating-point sum in a different order) may differ from
//   the CPU's in the last bit.
// - Top-k is exact with the CPU's tie rule: a threshold from a strided
//   sample, one pass collecting the candidates at or above it, a radix sort of
//   the candidates only, and a full sort only when the sample misjudged.
// - DecodeAddOnDevice(wire, acc, alpha): wire bytes in host memory (as
//   received), validated on the host exactly as Decode does, then decoded on
//   the device into the device accumulator `acc` (n floats). On error `acc`
//   is unchanged.
// - Both run on `stream` (a cudaStream_t; null = the default stream) and
//   return after the stream has finished the work (they read results back:
//   scales, candidate counts, non-finite flags), so the buffers may be reused
//   at once. Scratch memory is allocated per call with cudaMallocAsync.
// - Errors: the codec's own (see codec.h), FailedPrecondition when no CUDA
//   device is usable, Internal for a CUDA runtime error (with its name).
// - Without a CUDA toolkit at build time this target does not exist;
//   CudaDeviceStatus() reports why a device cannot be used.
#include <cstddef>
#include <span>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "compress/codec.h"

namespace tessera::compress::cuda {

// OK when a CUDA device can be used; else FailedPrecondition with the reason
// (no device, no driver, ...).
absl::Status CudaDeviceStatus();

absl::StatusOr<size_t> EncodeOnDevice(const Codec& codec, const float* device_input, size_t n,
                                      const EncodeContext& ctx, std::byte* device_out,
                                      void* stream = nullptr);

absl::Status DecodeAddOnDevice(std::span<const std::byte> host_wire, float* device_acc, size_t n,
                               float alpha = 1.0f, void* stream = nullptr);

}  // namespace tessera::compress::cuda

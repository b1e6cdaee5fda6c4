#pragma once
// Exact top-k selection by magnitude (internal to tessera_compress).
//
// Order: larger |x| first; equal magnitudes (including +0/-0) by lower index
// first. SelectTopK returns the k winners' indices in increasing index order.
// Inputs must be finite: a non-finite element gives InvalidArgument.
//
// Method: estimate a magnitude threshold from a strided sample, collect the
// elements at or above it in one pass, then select exactly among those. When
// the estimate keeps too few or too many, fall back to an exact three-pass
// radix select (histograms of the high and low 16 bits of |x|). Either way
// the result is the exact top-k; the sample only decides the speed.
#include <cstddef>
#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "compress/cpu_kernels.h"

namespace tessera::compress {

absl::Status SelectTopK(const float* x, size_t n, size_t k, const kernels::KernelTable& kt,
                        std::vector<uint32_t>& indices);

// The exact radix path alone (tests compare the two).
absl::Status SelectTopKRadix(const float* x, size_t n, size_t k, std::vector<uint32_t>& indices);

}  // namespace tessera::compress

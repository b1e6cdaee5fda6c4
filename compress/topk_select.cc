#include "compress/topk_select.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "absl/strings/str_format.h"
#include "compress/scalar_ops.h"

namespace tessera::compress {
namespace {

constexpr uint32_t kNonFinite = 0x7f800000u;

uint32_t AbsBits(const float* x, size_t i) {
  uint32_t b;
  std::memcpy(&b, x + i, 4);
  return b & 0x7fffffffu;
}

absl::Status NonFiniteError(size_t i) {
  return absl::InvalidArgumentError(
      absl::StrFormat("topk: input element %d is not finite", i));
}

// Among `candidates` (increasing indices), keeps exactly the k with the
// largest magnitude, ties by lower index. Requires candidates.size() >= k and
// every element outside `candidates` to be smaller than every candidate's
// threshold-qualifying magnitude.
void SelectAmong(const float* x, const std::vector<uint32_t>& candidates, size_t k,
                 std::vector<uint32_t>& out) {
  std::vector<uint32_t> mags(candidates.size());
  for (size_t j = 0; j < candidates.size(); ++j) mags[j] = AbsBits(x, candidates[j]);
  std::vector<uint32_t> order = mags;
  // The k-th largest magnitude.
  std::nth_element(order.begin(), order.begin() + (k - 1), order.end(), std::greater<uint32_t>());
  const uint32_t kth = order[k - 1];
  size_t above = 0;
  for (uint32_t m : mags) above += m > kth;
  size_t ties = k - above;
  out.clear();
  out.reserve(k);
  for (size_t j = 0; j < candidates.size(); ++j) {
    if (mags[j] > kth) {
      out.push_back(candidates[j]);
    } else if (mags[j] == kth && ties > 0) {
      out.push_back(candidates[j]);
      --ties;
    }
  }
}

}  // namespace

absl::Status SelectTopKRadix(const float* x, size_t n, size_t k, std::vector<uint32_t>& out) {
  out.clear();
  if (k == 0) return absl::OkStatus();
  std::vector<uint32_t> hist(65536, 0);
  for (size_t i = 0; i < n; ++i) {
    const uint32_t b = AbsBits(x, i);
    if (b >= kNonFinite) return NonFiniteError(i);
    ++hist[b >> 16];
  }
  // Highest bin where the running count from the top reaches k.
  size_t above = 0;
  uint32_t hi = 0xffff;
  for (;; --hi) {
    if (above + hist[hi] >= k) break;
    above += hist[hi];
  }
  std::fill(hist.begin(), hist.end(), 0);
  for (size_t i = 0; i < n; ++i) {
    const uint32_t b = AbsBits(x, i);
    if ((b >> 16) == hi) ++hist[b & 0xffff];
  }
  uint32_t lo = 0xffff;
  for (;; --lo) {
    if (above + hist[lo] >= k) break;
    above += hist[lo];
  }
  const uint32_t kth = (hi << 16) | lo;
  size_t ties = k - above;
  out.reserve(k);
  for (size_t i = 0; i < n && out.size() < k; ++i) {
    const uint32_t b = AbsBits(x, i);
    if (b > kth) {
      out.push_back(static_cast<uint32_t>(i));
    } else if (b == kth && ties > 0) {
      out.push_back(static_cast<uint32_t>(i));
      --ties;
    }
  }
  return absl::OkStatus();
}

absl::Status SelectTopK(const float* x, size_t n, size_t k, const kernels::KernelTable& kt,
                        std::vector<uint32_t>& out) {
  out.clear();
  if (k == 0) return absl::OkStatus();
  if (k == n) {
    const uint32_t m = kt.max_abs_bits(x, n);
    if (m >= kNonFinite) {
      for (size_t i = 0; i < n; ++i) {
        if (AbsBits(x, i) >= kNonFinite) return NonFiniteError(i);
      }
    }
    out.resize(n);
    for (size_t i = 0; i < n; ++i) out[i] = static_cast<uint32_t>(i);
    return absl::OkStatus();
  }
  // Dense selections and small parts: the exact radix select is as cheap.
  if (n < 65536 || k > n / 16) return SelectTopKRadix(x, n, k, out);
  // One sample per 256 elements, 1024 to 16384 of them.
  const size_t kSample = std::clamp<size_t>(n / 256, 1024, 16384);

  // Strided sample: element (j * n) / kSample + a fixed jitter.
  std::vector<uint32_t> sample(kSample);
  const size_t stride = n / kSample;
  for (size_t j = 0; j < kSample; ++j) {
    const size_t jitter = scalar::CounterHash32(0x746f706b73616d70ull, static_cast<uint32_t>(j)) % stride;
    const uint32_t b = AbsBits(x, j * stride + jitter);
    if (b >= kNonFinite) return NonFiniteError(j * stride + jitter);
    sample[j] = b;
  }
  // Aim for about 2k candidates plus a margin of four standard deviations.
  const double expected_in_sample = static_cast<double>(k) * kSample / static_cast<double>(n);
  size_t rank = static_cast<size_t>(2.0 * expected_in_sample + 4.0 * std::sqrt(expected_in_sample) + 8.0);
  if (rank >= kSample) return SelectTopKRadix(x, n, k, out);
  std::nth_element(sample.begin(), sample.begin() + rank, sample.end(), std::greater<uint32_t>());
  const uint32_t threshold = sample[rank];
  if (threshold == 0) return SelectTopKRadix(x, n, k, out);  // mostly zeros: no filter

  const size_t capacity = 8 * k + 4096;
  std::vector<uint32_t> candidates(capacity);
  const size_t count = kt.collect_at_least(x, n, threshold, candidates.data(), capacity);
  if (count < k || count > capacity) return SelectTopKRadix(x, n, k, out);
  candidates.resize(count);
  // Every non-finite element is at or above any finite threshold.
  for (uint32_t i : candidates) {
    if (AbsBits(x, i) >= kNonFinite) return NonFiniteError(i);
  }
  SelectAmong(x, candidates, k, out);
  return absl::OkStatus();
}

}  // namespace tessera::compress

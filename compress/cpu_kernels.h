#pragma once
// CPU kernels behind the codecs (internal to tessera_compress; tests use it to
// compare the code paths).
//
// Contract:
// - Three tables of the same kernels: Portable() (plain loops the compiler
//   vectorizes for the baseline ISA), Avx2() (the same loops compiled for
//   AVX2+F16C, plus intrinsics for fp16/bf16 conversion, sign packing and the
//   QSGD/TernGrad random draws) and Avx512() (Avx2() with 16-lane QSGD,
//   TernGrad and bf16 encoders, which are compute-bound). All give bit-identical
//   results for every input; they differ only in speed. Avx2() is null when
//   the CPU lacks AVX2 or F16C, Avx512() when it lacks AVX-512 F/BW/DQ/VL or
//   BMI2. Best() picks the widest present, capped by CapBest (a benchmark's
//   --cpu-kernels flag, to compare paths; the library reads no environment).
// - Pointers to wire bytes may have any alignment. Float and int pointers
//   into caller arrays must be naturally aligned.
// - `add` selects accumulate (dst[i] += alpha * v) instead of store (dst[i] = v).
// - No kernel allocates; all are reentrant.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace tessera::compress::kernels {

struct KernelTable {
  const char* name;

  // max over i of (bits(x[i]) & 0x7fffffff); a result >= 0x7f800000 means a
  // non-finite element. 0 for n == 0.
  uint32_t (*max_abs_bits)(const float* x, size_t n);

  void (*encode_fp16)(const float* x, size_t n, std::byte* out);
  void (*decode_fp16)(const std::byte* in, size_t n, float* dst, float alpha, bool add);
  void (*encode_bf16)(const float* x, size_t n, std::byte* out);
  void (*decode_bf16)(const std::byte* in, size_t n, float* dst, float alpha, bool add);
  void (*decode_fp32)(const std::byte* in, size_t n, float* dst, float alpha, bool add);

  // q[i] = sign(x[i]) * StochasticLevel(|x[i]|, inv, levels, u16(key, index0 + i)).
  void (*encode_qsgd)(const float* x, size_t n, float inv, uint32_t levels, uint64_t key,
                      uint64_t index0, int8_t* out);
  // max |q[i]| (validation).
  uint32_t (*max_abs_int8)(const int8_t* q, size_t n);
  void (*decode_qsgd)(const int8_t* q, size_t n, float step, float* dst, float alpha, bool add);

  // 2-bit codes, see codec.h. inv = 1 / scale.
  void (*encode_terngrad)(const float* x, size_t n, float inv, uint64_t key, uint64_t index0,
                          std::byte* out);
  // True when no code is 3 and the padding bits of the last byte are 0.
  bool (*valid_terngrad)(const std::byte* in, size_t n);
  void (*decode_terngrad)(const std::byte* in, size_t n, float scale, float* dst, float alpha,
                          bool add);

  // Packs sign bits (element i at bit i%8 of byte i/8, unused bits 0) and
  // returns the sum of |x[i]| in double, accumulated in 16 lanes (element i
  // into lane i%16, in index order) and combined pairwise (lane j += lane
  // j+8, then j+4, j+2, j+1): a fixed order, so every path gives the same sum.
  double (*encode_signs)(const float* x, size_t n, std::byte* out);
  void (*decode_signs)(const std::byte* in, size_t n, float scale, float* dst, float alpha,
                       bool add);

  // Writes the indices i with (bits(x[i]) & 0x7fffffff) >= threshold_bits, in
  // increasing order, to out[0, capacity). Returns how many there are; when
  // that exceeds capacity only the first `capacity` were written.
  size_t (*collect_at_least)(const float* x, size_t n, uint32_t threshold_bits, uint32_t* out,
                             size_t capacity);
};

const KernelTable& Portable();
const KernelTable* Avx2();
const KernelTable* Avx512();
const KernelTable& Best();

// The table `name` ("portable", "avx2" or "avx512") caps the choice at:
// the widest present at or below it (avx512 on a CPU without it is the
// widest present). InvalidArgument naming the choices for any other name.
absl::StatusOr<const KernelTable*> CappedTable(std::string_view name);
// Caps what Best() returns from now on, for benchmarks comparing paths (every
// table gives the same results). Must come before the first Best() (a codec's
// first use): afterwards FailedPrecondition, unless the cap picks the table
// Best() already returns. Not thread-safe with a concurrent first Best().
absl::Status CapBest(std::string_view name);

}  // namespace tessera::compress::kernels

#include "compress/cpu_kernels.h"

// The portable table and the choice of table (Portable, Avx2, Avx512, Best);
// the loop bodies are in cpu_kernel_bodies.h, the x86 tables and their CPU
// checks in cpu_kernels_x86.cc.
#include <cstdio>
#include <cstdlib>
#include <string>

#include "compress/cpu_kernel_bodies.h"
#include "compress/cpu_kernels_x86.h"

namespace tessera::compress::kernels {
namespace {

// ---- portable table ---------------------------------------------------------
namespace portable {
uint32_t MaxAbsBits(const float* x, size_t n) { return MaxAbsBitsBody(x, n); }
void EncodeFp16(const float* x, size_t n, std::byte* out) { EncodeFp16Body(x, n, out); }
void DecodeFp16(const std::byte* in, size_t n, float* d, float a, bool add) {
  DecodeFp16Body(in, n, d, a, add);
}
void EncodeBf16(const float* x, size_t n, std::byte* out) { EncodeBf16Body(x, n, out); }
void DecodeBf16(const std::byte* in, size_t n, float* d, float a, bool add) {
  DecodeBf16Body(in, n, d, a, add);
}
void DecodeFp32(const std::byte* in, size_t n, float* d, float a, bool add) {
  DecodeFp32Body(in, n, d, a, add);
}
void EncodeQsgd(const float* x, size_t n, float inv, uint32_t levels, uint64_t key, uint64_t i0,
                int8_t* out) {
  EncodeQsgdBody(x, n, inv, levels, key, i0, out);
}
uint32_t MaxAbsInt8(const int8_t* q, size_t n) { return MaxAbsInt8Body(q, n); }
void DecodeQsgd(const int8_t* q, size_t n, float step, float* d, float a, bool add) {
  DecodeQsgdBody(q, n, step, d, a, add);
}
void EncodeTern(const float* x, size_t n, float inv, uint64_t key, uint64_t i0, std::byte* out) {
  EncodeTernBody(x, n, inv, key, i0, out);
}
bool ValidTern(const std::byte* in, size_t n) { return ValidTernBody(in, n); }
void DecodeTern(const std::byte* in, size_t n, float scale, float* d, float a, bool add) {
  DecodeTernBody(in, n, scale, d, a, add);
}
double EncodeSigns(const float* x, size_t n, std::byte* out) { return EncodeSignsBody(x, n, out); }
void DecodeSigns(const std::byte* in, size_t n, float scale, float* d, float a, bool add) {
  DecodeSignsBody(in, n, scale, d, a, add);
}
size_t Collect(const float* x, size_t n, uint32_t t, uint32_t* out, size_t cap) {
  return CollectBody(x, n, t, out, cap);
}
}  // namespace portable

constexpr KernelTable kPortable = {
    "portable",
    portable::MaxAbsBits,
    portable::EncodeFp16,
    portable::DecodeFp16,
    portable::EncodeBf16,
    portable::DecodeBf16,
    portable::DecodeFp32,
    portable::EncodeQsgd,
    portable::MaxAbsInt8,
    portable::DecodeQsgd,
    portable::EncodeTern,
    portable::ValidTern,
    portable::DecodeTern,
    portable::EncodeSigns,
    portable::DecodeSigns,
    portable::Collect,
};

// TESSERA_CPU_KERNELS caps the table Best() picks; anything else is an error.
// A benchmark and test knob, not a job setting: every table gives
// bit-identical results (cpu_kernels.h), so a process that does not get the
// variable (a remote shell drops it) computes the same, only at another
// speed; so it stays an environment variable rather than a flag of every
// binary.
const KernelTable& PickBest() {
  const KernelTable* best = Avx512();
  if (best == nullptr) best = Avx2();
  if (best == nullptr) best = &kPortable;
  const char* cap = std::getenv("TESSERA_CPU_KERNELS");
  if (cap == nullptr || *cap == '\0') return *best;
  const std::string want = cap;
  if (want == "portable") return kPortable;
  if (want == "avx2") return Avx2() != nullptr ? *Avx2() : kPortable;
  if (want == "avx512") return *best;
  std::fprintf(stderr, "TESSERA_CPU_KERNELS=%s: expected portable, avx2 or avx512\n", cap);
  std::abort();
}

}  // namespace

const KernelTable& Portable() { return kPortable; }

const KernelTable* Avx2() {
#if TESSERA_HAVE_X86
  static const bool supported = x86::CpuHasAvx2();
  return supported ? &x86::kAvx2 : nullptr;
#else
  return nullptr;
#endif
}

const KernelTable* Avx512() {
#if TESSERA_HAVE_X86
  static const bool supported = x86::CpuHasAvx512();
  return supported ? &x86::kAvx512 : nullptr;
#else
  return nullptr;
#endif
}

const KernelTable& Best() {
  static const KernelTable& best = PickBest();
  return best;
}

}  // namespace tessera::compress::kernels

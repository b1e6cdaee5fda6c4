#include "compress/cpu_kernels.h"

// The portable table and the choice of table (Portable, Avx2, Avx512, Best);
// the loop bodies are in cpu_kernel_bodies.h, the x86 tables and their CPU
// checks in cpu_kernels_x86.cc.
#include <string>

#include "absl/strings/str_cat.h"

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

const KernelTable& Widest() {
  if (const KernelTable* t = Avx512()) return *t;
  if (const KernelTable* t = Avx2()) return *t;
  return kPortable;
}

// Set by CapBest before the first Best(); Best() fixes its choice once.
const KernelTable* g_cap = nullptr;
bool g_best_chosen = false;

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

absl::StatusOr<const KernelTable*> CappedTable(std::string_view name) {
  if (name == "portable") return &kPortable;
  if (name == "avx2") return Avx2() != nullptr ? Avx2() : &kPortable;
  if (name == "avx512") return &Widest();
  return absl::InvalidArgumentError(
      absl::StrCat("CPU kernels \"", std::string(name), "\": expected portable, avx2 or avx512"));
}

const KernelTable& Best() {
  static const KernelTable& best = []() -> const KernelTable& {
    g_best_chosen = true;
    return g_cap != nullptr ? *g_cap : Widest();
  }();
  return best;
}

absl::Status CapBest(std::string_view name) {
  absl::StatusOr<const KernelTable*> table = CappedTable(name);
  if (!table.ok()) return table.status();
  if (g_best_chosen && *table != &Best()) {
    return absl::FailedPreconditionError(absl::StrCat("cannot cap the CPU kernels at ", std::string(name), ": the codecs use the ",
                                                      Best().name, " table already"));
  }
  g_cap = *table;
  return absl::OkStatus();
}

}  // namespace tessera::compress::kernels

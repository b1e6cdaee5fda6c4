#pragma once
// The x86 kernel tables (internal to tessera_compress).
//
// Contract:
// - Owns the AVX2+F16C and AVX-512 kernels (cpu_kernels_x86.cc), the two
//   tables made of them, and the CPU check that says whether each table can
//   run here. cpu_kernels.cc (Avx2(), Avx512(), Best()) is the only caller:
//   it hands out a table only after the matching check passed once.
// - The tables are constant-initialized (usable before any dynamic
//   initialization) and immutable; the checks are reentrant.
// - On other architectures TESSERA_HAVE_X86 is 0 and nothing here exists.
#include "compress/cpu_kernels.h"

#if defined(__x86_64__) || defined(__i386__)
#define TESSERA_HAVE_X86 1
#else
#define TESSERA_HAVE_X86 0
#endif

#if TESSERA_HAVE_X86
namespace tessera::compress::kernels::x86 {

// cpu_kernels.h describes both; every kernel gives the portable table's bits.
extern const KernelTable kAvx2;
extern const KernelTable kAvx512;

// AVX2 and F16C.
bool CpuHasAvx2();
// CpuHasAvx2() and AVX-512 F/BW/DQ/VL and BMI2.
bool CpuHasAvx512();

}  // namespace tessera::compress::kernels::x86
#endif  // TESSERA_HAVE_X86

#pragma once
// Memory for large, randomly accessed tables, backed by transparent huge
// pages where the kernel allows it (madvise mode): a lookup into a table of
// millions of rows misses the TLB on nearly every access with 4 KiB pages;
// with 2 MiB pages the page walk mostly goes away. Blocks under 2 MiB are
// plain allocations. Where the kernel refuses (THP "never"), the memory is
// ordinary and everything works the same, a little slower.
#include <sys/mman.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <new>

namespace tessera {

inline constexpr size_t kHugePageBytes = size_t{2} << 20;

inline size_t PageRounded(size_t bytes) { return (bytes + 4095) / 4096 * 4096; }

// `bytes` of memory (zeroed from 2 MiB up, else uninitialized); free with
// FreeHugePageBacked(p, bytes). Throws bad_alloc like operator new.
// Blocks of 2 MiB and more are mapped from the kernel, not taken from the
// malloc heap: freed, they go back at once. (The heap would keep them: the
// server's malloc settings keep freed memory for reuse, common/memory.h, so
// the arrays a growing table leaves behind, its index's before each
// doubling, stayed resident: a table with a 48 MiB budget grew the process
// by 68 MiB.)
inline void* AllocateHugePageBacked(size_t bytes) {
  if (bytes < kHugePageBytes) {
    void* p = std::malloc(bytes == 0 ? 1 : bytes);
    if (p == nullptr) throw std::bad_alloc();
    return p;
  }
  // Aligned to a huge page, but not rounded up to one: the whole 2 MiB
  // pieces get huge pages, the tail ordinary ones (no memory is wasted on
  // sizes that are not a multiple of 2 MiB).
  const size_t len = PageRounded(bytes);
  void* raw = mmap(nullptr, len + kHugePageBytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (raw == MAP_FAILED) throw std::bad_alloc();
  const auto start = reinterpret_cast<uintptr_t>(raw);
  const uintptr_t aligned = (start + kHugePageBytes - 1) / kHugePageBytes * kHugePageBytes;
  if (aligned > start) munmap(raw, aligned - start);
  const uintptr_t end = start + len + kHugePageBytes;
  if (end > aligned + len) munmap(reinterpret_cast<void*>(aligned + len), end - (aligned + len));
  void* p = reinterpret_cast<void*>(aligned);
  (void)madvise(p, bytes / kHugePageBytes * kHugePageBytes, MADV_HUGEPAGE);  // advice only
  return p;
}

// Frees what AllocateHugePageBacked(bytes) returned (the same `bytes`).
inline void FreeHugePageBacked(void* p, size_t bytes) {
  if (p == nullptr) return;
  if (bytes < kHugePageBytes) {
    std::free(p);
  } else {
    munmap(p, PageRounded(bytes));
  }
}

// A std allocator over AllocateHugePageBacked, for containers whose arrays
// grow large (a table's hash index).
template <typename T>
struct HugePageAllocator {
  using value_type = T;
  HugePageAllocator() = default;
  template <typename U>
  HugePageAllocator(const HugePageAllocator<U>&) {}  // NOLINT: allocators convert implicitly
  T* allocate(size_t n) { return static_cast<T*>(AllocateHugePageBacked(n * sizeof(T))); }
  void deallocate(T* p, size_t n) { FreeHugePageBacked(p, n * sizeof(T)); }
  template <typename U>
  bool operator==(const HugePageAllocator<U>&) const { return true; }
};

}  // namespace tessera

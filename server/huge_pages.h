#pragma once
// Memory for large, randomly accessed tables, backed by transparent huge
// pages where the kernel allows it (madvise mode): a lookup into a table of
// millions of rows misses the TLB on nearly every access with 4 KiB pages;
// with 2 MiB pages the page walk mostly goes away. Blocks under 2 MiB are
// plain allocations. Where the kernel refuses (THP "never"), the memory is
// ordinary and everything works the same, a little slower.
#include <sys/mman.h>

#include <cstddef>
#include <cstdlib>
#include <new>

namespace tessera {

inline constexpr size_t kHugePageBytes = size_t{2} << 20;

// `bytes` of uninitialized memory; free with std::free. Throws bad_alloc
// like operator new.
inline void* AllocateHugePageBacked(size_t bytes) {
  if (bytes < kHugePageBytes) {
    void* p = std::malloc(bytes == 0 ? 1 : bytes);
    if (p == nullptr) throw std::bad_alloc();
    return p;
  }
  // Aligned to a huge page, but not rounded up to one: the whole 2 MiB
  // pieces get huge pages, the tail ordinary ones (no memory is wasted on
  // sizes that are not a multiple of 2 MiB).
  void* p = nullptr;
  if (posix_memalign(&p, kHugePageBytes, bytes) != 0) throw std::bad_alloc();
  (void)madvise(p, bytes / kHugePageBytes * kHugePageBytes, MADV_HUGEPAGE);  // advice only
  return p;
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
  void deallocate(T* p, size_t) { std::free(p); }
  template <typename U>
  bool operator==(const HugePageAllocator<U>&) const { return true; }
};

}  // namespace tessera

#pragma once
// Process-wide allocator settings for the data path.
//
// libzmq receives every large message into a fresh malloc() block. With
// glibc's defaults such blocks are mapped and unmapped (or the heap top is
// trimmed and regrown) every few messages, and every page of them faults
// again: on a VM that costs more than the copy of the data. Keeping large
// blocks in the heap and the heap untrimmed makes the freed blocks come
// back warm. This is the receive-side buffer pooling the design asks for,
// done where libzmq allocates (it has no hook to receive into our pool).
//
// KeepLargeAllocationsMapped() sets M_MMAP_THRESHOLD to 64 MiB,
// M_TRIM_THRESHOLD to 1 GiB and M_ARENA_MAX to 1 for the whole process,
// once; later calls do nothing. One arena because the heaps of a thread's
// own arena are at most 64 MiB and are unmapped as they empty: 16 MiB
// blocks allocated on the delivery thread (PullView's copy of a lent
// reply) faulted in again every time, and 16 MiB pull views 8 in flight
// over the same-host path ran at 3.3-4.8 GB/s against 8.3-10.4 with one
// arena (docs/benchmarks.md, "One malloc arena"). Small allocations are
// served from glibc's per-thread caches without the arena's lock. It
// trades up to about 1 GiB of idle heap kept by the process for the page
// faults. Must run before any other thread of the process allocates:
// glibc fixes its limit on arenas when a second one is made, so in a
// process whose threads already allocated (a Python interpreter with
// torch's threads, say) the arena setting is accepted and has no effect;
// the thresholds still apply. Returns whether glibc accepted the settings.
#include <cstdint>
#include <optional>
#include <string_view>

namespace tessera {

bool KeepLargeAllocationsMapped();

// The memory this process may use: the host's physical memory, or the
// limit of its control group where that is lower (cgroup v2 memory.max,
// else v1 memory.limit_in_bytes, of the group /proc/self/cgroup names).
// Never 0: 1 GiB when neither can be read.
uint64_t UsableMemoryBytes();

// This process's anonymous resident memory (RssAnon in /proc/self/status:
// its heap and the like, not the page cache of files it maps); nullopt
// where it cannot be read.
std::optional<uint64_t> ResidentAnonymousBytes();

// Whether this binary was built with a sanitizer whose allocator replaces
// glibc's malloc (ASan, TSan, MSan): memory figures and malloc settings
// then mean something else (tests that check them skip).
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__) || defined(__SANITIZE_MEMORY__)
inline constexpr bool kSanitizedAllocator = true;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer) || __has_feature(memory_sanitizer)
inline constexpr bool kSanitizedAllocator = true;
#else
inline constexpr bool kSanitizedAllocator = false;
#endif
#else
inline constexpr bool kSanitizedAllocator = false;
#endif

// A cgroup memory limit file's text ("max\n", "1073741824\n"): the limit
// in bytes, or nullopt for "max", an empty or malformed text, or a value so
// large that it means no limit (v1 writes about 2^63 for none).
std::optional<uint64_t> ParseCgroupMemoryLimit(std::string_view text);

}  // namespace tessera

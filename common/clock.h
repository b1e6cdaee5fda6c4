#pragma once
// Time as the pure cores see it: a monotonic count of nanoseconds passed in
// by the shell (Tick(now)), never read from a wall clock inside a core.
#include <chrono>
#include <cstdint>

namespace tessera {

using Nanos = int64_t;
constexpr Nanos kMillis = 1'000'000;
constexpr Nanos kSeconds = 1'000'000'000;

// For shells: the monotonic clock in nanoseconds.
inline Nanos MonotonicNow() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

}  // namespace tessera

#pragma once
// RDMA_CHECK(condition): guards a broken invariant (a bug in this module or in
// its caller), never input. On failure it prints the condition and where it
// failed to stderr and aborts.
#include <cstdio>
#include <cstdlib>

namespace tessera::rdma::internal {
[[noreturn]] inline void InvariantFailed(const char* condition, const char* file, int line) {
  std::fprintf(stderr, "%s:%d: invariant failed: %s\n", file, line, condition);
  std::fflush(stderr);
  std::abort();
}
}  // namespace tessera::rdma::internal

#define RDMA_CHECK(condition) \
  ((condition) ? static_cast<void>(0) : ::tessera::rdma::internal::InvariantFailed(#condition, __FILE__, __LINE__))

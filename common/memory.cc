#include "common/memory.h"

#include <malloc.h>

#include <mutex>

namespace tessera {

bool KeepLargeAllocationsMapped() {
  static const bool accepted = [] {
    bool ok = mallopt(M_MMAP_THRESHOLD, 64 << 20) == 1;
    ok &= mallopt(M_TRIM_THRESHOLD, 1 << 30) == 1;
    return ok;
  }();
  return accepted;
}

}  // namespace tessera

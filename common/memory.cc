#include "common/memory.h"

#include <malloc.h>
#include <unistd.h>

#include <charconv>
#include <fstream>
#include <mutex>
#include <sstream>
#include <string>

namespace tessera {

bool KeepLargeAllocationsMapped() {
  static const bool accepted = [] {
    bool ok = mallopt(M_MMAP_THRESHOLD, 64 << 20) == 1;
    ok &= mallopt(M_TRIM_THRESHOLD, 1 << 30) == 1;
    // One arena: a thread's own arena lives in heaps of at most 64 MiB that
    // glibc unmaps as they empty, so large blocks allocated off the main
    // thread (a lent reply copied for a PullView on the delivery thread,
    // libzmq's receive buffers on its I/O thread) faulted in again each time
    // whatever the thresholds above say.
    ok &= mallopt(M_ARENA_MAX, 1) == 1;
    return ok;
  }();
  return accepted;
}

std::optional<uint64_t> ParseCgroupMemoryLimit(std::string_view text) {
  while (!text.empty() && (text.back() == '\n' || text.back() == ' ')) text.remove_suffix(1);
  if (text.empty() || text == "max") return std::nullopt;
  uint64_t value = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc() || end != text.data() + text.size() || value == 0) return std::nullopt;
  if (value >= (uint64_t{1} << 62)) return std::nullopt;  // v1's "no limit" (page-rounded 2^63 - 1)
  return value;
}

namespace {

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  if (!in) return "";
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

// The limit of this process's cgroup, if one is set and readable.
std::optional<uint64_t> CgroupMemoryLimit() {
  std::istringstream groups(ReadFile("/proc/self/cgroup"));
  std::string line;
  std::optional<uint64_t> lowest;
  auto consider = [&](const std::string& file) {
    if (auto v = ParseCgroupMemoryLimit(ReadFile(file)); v && (!lowest || *v < *lowest)) lowest = v;
  };
  while (std::getline(groups, line)) {
    // "0::/path" (v2) or "N:memory:/path" (v1, possibly "N:cpu,memory:/path").
    const size_t a = line.find(':');
    const size_t b = a == std::string::npos ? a : line.find(':', a + 1);
    if (b == std::string::npos) continue;
    const std::string controllers = line.substr(a + 1, b - a - 1);
    const std::string path = line.substr(b + 1);
    if (controllers.empty()) {
      consider("/sys/fs/cgroup" + path + "/memory.max");
    } else if (("," + controllers + ",").find(",memory,") != std::string::npos) {
      consider("/sys/fs/cgroup/memory" + path + "/memory.limit_in_bytes");
    }
  }
  return lowest;
}

}  // namespace

std::optional<uint64_t> ResidentAnonymousBytes() {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("RssAnon:", 0) != 0) continue;
    uint64_t kib = 0;
    std::istringstream(line.substr(8)) >> kib;
    return kib * 1024;
  }
  return std::nullopt;
}

uint64_t UsableMemoryBytes() {
  const long pages = sysconf(_SC_PHYS_PAGES);
  const long page = sysconf(_SC_PAGESIZE);
  uint64_t bytes = pages > 0 && page > 0 ? static_cast<uint64_t>(pages) * static_cast<uint64_t>(page) : 0;
  if (auto limit = CgroupMemoryLimit(); limit && (bytes == 0 || *limit < bytes)) bytes = *limit;
  return bytes == 0 ? uint64_t{1} << 30 : bytes;  // nothing readable: assume 1 GiB rather than no limit
}

}  // namespace tessera

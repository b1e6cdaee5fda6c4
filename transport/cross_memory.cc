#include "transport/cross_memory.h"

#include <poll.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <random>

#include "absl/strings/str_cat.h"

namespace tessera::xmem {
namespace {

#ifndef SYS_pidfd_open
constexpr long kPidfdOpen = 434;  // the same number on every Linux architecture
#else
constexpr long kPidfdOpen = SYS_pidfd_open;
#endif

constexpr size_t kMaxIov = 1024;  // IOV_MAX on Linux

uint64_t NonZeroRandom() {
  std::random_device rd;
  uint64_t v = 0;
  while (v == 0) v = (uint64_t{rd()} << 32) ^ rd();
  return v;
}

// The token peers read to prove they see this process: its own cache line.
struct alignas(64) Token {
  uint64_t value = NonZeroRandom();
};

}  // namespace

SelfIdentity Self() {
  static const Token token;
  static const SelfIdentity fixed = [] {
    SelfIdentity s;
    struct stat st {};
    if (::stat("/proc/self/ns/pid", &st) == 0) s.pid_namespace = static_cast<uint64_t>(st.st_ino);
    s.probe_address = reinterpret_cast<uint64_t>(&token.value);
    s.token = token.value;
    return s;
  }();
  SelfIdentity s = fixed;
  s.pid = static_cast<uint32_t>(::getpid());  // not cached: a forked child is another process
  return s;
}

absl::StatusOr<std::shared_ptr<ProcessHandle>> ProcessHandle::Open(uint32_t pid) {
  if (pid == 0) return absl::InvalidArgumentError("no process id");
  const long fd = ::syscall(kPidfdOpen, static_cast<pid_t>(pid), 0);
  if (fd < 0) {
    const int e = errno;
    const std::string why = absl::StrCat("pidfd_open(", pid, "): ", std::strerror(e));
    if (e == ESRCH) return absl::UnavailableError(why);
    if (e == ENOSYS) return absl::UnimplementedError(why);
    return absl::PermissionDeniedError(why);
  }
  return std::shared_ptr<ProcessHandle>(new ProcessHandle(pid, static_cast<int>(fd)));
}

ProcessHandle::~ProcessHandle() { ::close(fd_); }

bool ProcessHandle::Exited() const {
  pollfd p{fd_, POLLIN, 0};
  const int n = ::poll(&p, 1, 0);
  return n > 0 && (p.revents & (POLLIN | POLLHUP | POLLERR)) != 0;
}

absl::Status ProcessHandle::Verify(uint64_t probe_address, uint64_t token) const {
  uint64_t seen = 0;
  const CopyRange r{0, &seen, sizeof(seen)};
  if (absl::Status s = Read(probe_address, {&r, 1}); !s.ok()) return s;
  if (seen != token) {
    return absl::FailedPreconditionError(absl::StrCat("process ", pid_,
                                                      " is not the peer (another pid namespace?): its token differs"));
  }
  return absl::OkStatus();
}

absl::Status ProcessHandle::Read(uint64_t address, std::span<const CopyRange> ranges) const {
  iovec local[kMaxIov], remote[kMaxIov];
  for (size_t first = 0; first < ranges.size(); first += kMaxIov) {
    const size_t n = std::min(kMaxIov, ranges.size() - first);
    size_t want = 0;
    for (size_t i = 0; i < n; ++i) {
      const CopyRange& r = ranges[first + i];
      local[i] = iovec{r.dst, r.length};
      remote[i] = iovec{reinterpret_cast<void*>(address + r.offset), r.length};
      want += r.length;
    }
    // A read may stop short at an iovec boundary; go on from there.
    size_t done = 0, li = 0, ri = 0;
    while (done < want) {
      const ssize_t got = ::process_vm_readv(static_cast<pid_t>(pid_), local + li, n - li, remote + ri, n - ri, 0);
      if (got <= 0) {
        const int e = got < 0 ? errno : EFAULT;
        if (e == ESRCH || Exited()) return absl::UnavailableError(absl::StrCat("process ", pid_, " has exited"));
        return absl::InternalError(
            absl::StrCat("reading ", want - done, " bytes of process ", pid_, ": ", std::strerror(e)));
      }
      done += static_cast<size_t>(got);
      // Advance both iovec lists by `got` bytes (they have equal lengths).
      size_t left = static_cast<size_t>(got);
      while (left > 0) {
        const size_t step = std::min(left, local[li].iov_len);
        local[li].iov_base = static_cast<char*>(local[li].iov_base) + step;
        local[li].iov_len -= step;
        remote[ri].iov_base = static_cast<char*>(remote[ri].iov_base) + step;
        remote[ri].iov_len -= step;
        left -= step;
        if (local[li].iov_len == 0) ++li, ++ri;
      }
      while (li < n && local[li].iov_len == 0) ++li, ++ri;
    }
  }
  // The process may have ended while we copied: then nothing read counts.
  if (Exited()) return absl::UnavailableError(absl::StrCat("process ", pid_, " has exited"));
  return absl::OkStatus();
}

void LendBook::Lend(uint64_t id, std::vector<Buffer> frames) {
  Lent l;
  for (const Buffer& f : frames) l.bytes += f.size();
  l.frames = std::move(frames);
  lent_bytes_ += l.bytes;
  lends_.emplace(id, std::move(l));
}

uint64_t LendBook::Release(uint64_t id) {
  auto it = lends_.find(id);
  if (it == lends_.end()) return 0;
  const uint64_t bytes = it->second.bytes;
  lent_bytes_ -= bytes;
  lends_.erase(it);
  return bytes;
}

size_t LendBook::ReleaseAll() {
  const size_t n = lends_.size();
  lends_.clear();
  lent_bytes_ = 0;
  return n;
}

}  // namespace tessera::xmem

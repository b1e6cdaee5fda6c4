#include "transport/shm_ring.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <random>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace tessera::shm {
namespace {

uint64_t AlignUp(uint64_t v) { return (v + kAlignment - 1) & ~(kAlignment - 1); }

constexpr char kDir[] = "/dev/shm/";
constexpr char kPrefix[] = "tessera-shm-";

// The header as it lies in the file. `released` gets a cache line of its own.
struct alignas(64) SharedHeader {
  uint64_t magic;
  uint32_t version;
  uint32_t header_bytes;
  uint64_t capacity;
  uint64_t creator_pid;
  alignas(64) std::atomic<uint64_t> released;
};
static_assert(sizeof(SharedHeader) <= kHeaderBytes);
static_assert(std::atomic<uint64_t>::is_always_lock_free);

std::string Errno(int e) { return std::strerror(e); }

uint64_t Mix(uint64_t h, uint64_t v) {
  // splitmix64 finalizer over a running hash.
  h ^= v + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2);
  h ^= h >> 30;
  h *= 0xbf58476d1ce4e5b9ull;
  h ^= h >> 27;
  h *= 0x94d049bb133111ebull;
  h ^= h >> 31;
  return h;
}

}  // namespace

// ---- ShmRingWriter ----

ShmRingWriter::ShmRingWriter(uint64_t capacity, uint64_t start) : capacity_(capacity), head_(start) {}

std::optional<Region> ShmRingWriter::Allocate(uint64_t length, uint64_t released) {
  if (length == 0 || length > capacity_) return std::nullopt;
  // Every subtraction below is modulo 2^64 (see "Positions"): `end - free`
  // is the space from the oldest byte that may be in use to the frame's end.
  const uint64_t free = FreeUpTo(released);
  const auto fits = [&](uint64_t data) { return data + length - free <= capacity_; };
  uint64_t data = AlignUp(head_);
  const uint64_t next_lap = head_ - head_ % capacity_ + capacity_;
  // Back to the ring's start (see "Lowest offset first") when no frame is in
  // use, or when the free space before the frames in use is at least the
  // most this ring has had in use (this frame included): the frames that
  // follow fill the start while those in use are given back. Never from
  // below `length` (the region, padding and frame, must fit the ring; a
  // frame placed there is near the start anyway).
  const uint64_t in_use = head_ - free, head_offset = head_ % capacity_;
  // The peak counts frame bytes: padding between `free` and the head holds none.
  uint64_t frame_bytes = in_use;
  for (const auto& [begin, end] : paddings_)
    if (static_cast<int64_t>(begin - free) >= 0) frame_bytes -= end - begin;
  peak_in_use_ = std::max(peak_in_use_, frame_bytes + length);
  const bool same_lap = in_use <= head_offset;  // the frames in use do not wrap
  if (head_offset >= length && same_lap && (in_use == 0 || head_offset - in_use >= peak_in_use_)) {
    data = next_lap;  // lowest offset first
  } else {
    const uint64_t offset = data % capacity_;
    if (offset + length > capacity_) data += capacity_ - offset;  // skip to the ring's start
    if (!fits(data)) return std::nullopt;
  }
  Region r{head_, data, length};
  if (data != head_) paddings_.emplace_back(head_, data);
  const uint64_t end = data + length;
  head_ = end;
  stuck_released_.reset();
  return r;
}

uint64_t ShmRingWriter::FreeUpTo(uint64_t released) {
  const auto at_or_before = [](uint64_t a, uint64_t b) { return static_cast<int64_t>(b - a) >= 0; };
  while (!paddings_.empty() && at_or_before(paddings_.front().second, released)) paddings_.pop_front();
  uint64_t free = released;
  for (const auto& [begin, end] : paddings_) {
    if (!at_or_before(begin, free)) break;
    free = end;  // a padding that starts where the free space ends holds no frame
  }
  return free;
}

bool ShmRingWriter::Stuck(uint64_t released, int64_t now, int64_t patience) {
  if (!stuck_released_ || *stuck_released_ != released) {
    stuck_released_ = released;
    stuck_since_ = now;
    return false;
  }
  return now - stuck_since_ >= patience;
}

absl::Status ValidateRegion(const Region& r, uint64_t capacity) {
  if (r.length == 0) return absl::InvalidArgumentError("shared-memory frame of 0 bytes");
  // Positions are serial numbers modulo 2^64: a frame that "starts before its
  // region" is one whose distance from the region's begin wraps.
  if (r.data - r.begin >= capacity) return absl::InvalidArgumentError("shared-memory frame starts before its region");
  if (r.data % kAlignment != 0) return absl::InvalidArgumentError("shared-memory frame not 64-byte aligned");
  if (r.length > capacity || r.data % capacity + r.length > capacity) {
    return absl::InvalidArgumentError(
        absl::StrCat("shared-memory frame of ", r.length, " bytes at ", r.data, " does not fit a ring of ",
                     capacity, " bytes"));
  }
  if (r.end() - r.begin > capacity) {
    return absl::InvalidArgumentError("shared-memory region larger than its ring");
  }
  return absl::OkStatus();
}

// ---- ShmRingReleaser ----

ShmRingReleaser::ShmRingReleaser(uint64_t released) : published_(released), known_end_(released) {}

absl::Status ShmRingReleaser::Arrived(const Region& r) {
  std::lock_guard lock(mu_);
  // Serial comparison (positions wrap modulo 2^64).
  const auto ahead = static_cast<int64_t>(r.begin - known_end_);
  if (ahead < 0) {
    return absl::FailedPreconditionError(absl::StrCat("shared-memory region at ", r.begin,
                                                      " arrived after one that ended at ", known_end_,
                                                      " (out of order or repeated)"));
  }
  if (ahead > 0) entries_.push_back({known_end_, r.begin, true});  // lost on the way
  entries_.push_back({r.begin, r.end(), false});
  known_end_ = r.end();
  return absl::OkStatus();
}

uint64_t ShmRingReleaser::Release(uint64_t begin) {
  std::lock_guard lock(mu_);
  for (Entry& e : entries_) {
    if (e.begin == begin) {
      e.released = true;
      break;
    }
  }
  while (!entries_.empty() && entries_.front().released) {
    published_ = entries_.front().end;
    entries_.pop_front();
  }
  return published_;
}

uint64_t ShmRingReleaser::published() const {
  std::lock_guard lock(mu_);
  return published_;
}

size_t ShmRingReleaser::outstanding() const {
  std::lock_guard lock(mu_);
  size_t n = 0;
  for (const Entry& e : entries_) n += e.released ? 0 : 1;
  return n;
}

// ---- ShmSegment ----

bool IsRingName(const std::string& name) {
  if (name.rfind(kPrefix, 0) != 0 || name.size() > 96) return false;
  for (char c : name.substr(sizeof(kPrefix) - 1)) {
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || c == '-')) return false;
  }
  return true;
}

absl::StatusOr<std::unique_ptr<ShmSegment>> ShmSegment::Create(uint64_t capacity) {
  if (capacity < 4096 || (capacity & (capacity - 1)) != 0) {
    return absl::InvalidArgumentError(absl::StrCat("ring capacity ", capacity, " is not a power of two >= 4096"));
  }
  static std::atomic<uint64_t> counter{0};
  std::random_device rd;
  const uint64_t salt = (uint64_t{rd()} << 32) ^ rd();
  char hex[17];
  std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(salt));
  const std::string name = absl::StrCat(kPrefix, getpid(), "-", counter.fetch_add(1), "-", hex);
  const std::string path = absl::StrCat(kDir, name);
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
  if (fd < 0) return absl::InternalError(absl::StrCat("cannot create ", path, ": ", Errno(errno)));
  const uint64_t total = kHeaderBytes + capacity;
  // Reserve every page now: a ring on a full tmpfs must fail here, not raise
  // SIGBUS at the first write.
  if (const int e = ::posix_fallocate(fd, 0, static_cast<off_t>(total)); e != 0) {
    ::close(fd);
    ::unlink(path.c_str());
    const std::string why = absl::StrCat("cannot reserve ", total, " bytes for ", path, ": ", Errno(e));
    return e == ENOSPC ? absl::ResourceExhaustedError(why) : absl::InternalError(why);
  }
  void* base = ::mmap(nullptr, total, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  const int map_errno = errno;
  ::close(fd);
  if (base == MAP_FAILED) {
    ::unlink(path.c_str());
    return absl::InternalError(absl::StrCat("cannot map ", path, ": ", Errno(map_errno)));
  }
  auto* h = new (base) SharedHeader{};
  h->version = kVersion;
  h->header_bytes = kHeaderBytes;
  h->capacity = capacity;
  h->creator_pid = static_cast<uint64_t>(getpid());
  h->released.store(0, std::memory_order_relaxed);
  std::atomic_thread_fence(std::memory_order_release);
  h->magic = kMagic;
  return std::unique_ptr<ShmSegment>(new ShmSegment(name, static_cast<std::byte*>(base), capacity, true));
}

absl::StatusOr<std::unique_ptr<ShmSegment>> ShmSegment::Open(const std::string& name) {
  if (!IsRingName(name)) return absl::InvalidArgumentError(absl::StrCat("'", name, "' is not a ring name"));
  const std::string path = absl::StrCat(kDir, name);
  const int fd = ::open(path.c_str(), O_RDWR | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) {
    const int e = errno;
    const std::string why = absl::StrCat("cannot open ", path, ": ", Errno(e));
    return e == ENOENT ? absl::NotFoundError(why) : absl::PermissionDeniedError(why);
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_uid != ::getuid() ||
      static_cast<uint64_t>(st.st_size) < kHeaderBytes + 4096) {
    ::close(fd);
    return absl::PermissionDeniedError(absl::StrCat(path, " is not a ring file of this user"));
  }
  const uint64_t total = static_cast<uint64_t>(st.st_size);
  void* base = ::mmap(nullptr, total, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  const int map_errno = errno;
  ::close(fd);
  if (base == MAP_FAILED) return absl::InternalError(absl::StrCat("cannot map ", path, ": ", Errno(map_errno)));
  const auto* h = static_cast<const SharedHeader*>(base);
  const uint64_t magic = h->magic;
  std::atomic_thread_fence(std::memory_order_acquire);
  if (magic != kMagic || h->version != kVersion || h->header_bytes != kHeaderBytes ||
      h->capacity + kHeaderBytes != total || (h->capacity & (h->capacity - 1)) != 0) {
    ::munmap(base, total);
    return absl::InvalidArgumentError(absl::StrCat(path, ": not a ring of this version"));
  }
  return std::unique_ptr<ShmSegment>(new ShmSegment(name, static_cast<std::byte*>(base), h->capacity, false));
}

ShmSegment::~ShmSegment() {
  if (owner_) Unlink();
  ::munmap(base_, kHeaderBytes + capacity_);
}

uint64_t ShmSegment::LoadReleased() const {
  return reinterpret_cast<const SharedHeader*>(base_)->released.load(std::memory_order_acquire);
}

void ShmSegment::StoreReleased(uint64_t position) {
  // Releases run on many threads: a later, larger position may have been
  // stored first. Never move backwards.
  std::atomic<uint64_t>& released = reinterpret_cast<SharedHeader*>(base_)->released;
  uint64_t seen = released.load(std::memory_order_relaxed);
  while (static_cast<int64_t>(position - seen) > 0 && !released.compare_exchange_weak(seen, position, std::memory_order_release,
                                                            std::memory_order_relaxed)) {
  }
}

void ShmSegment::Unlink() {
  if (unlinked_) return;
  unlinked_ = true;
  ::unlink(absl::StrCat(kDir, name_).c_str());
}

int RemoveDeadRings() {
  DIR* dir = ::opendir(kDir);
  if (dir == nullptr) return 0;
  int removed = 0;
  while (dirent* e = ::readdir(dir)) {
    const std::string name = e->d_name;
    if (!IsRingName(name)) continue;
    std::vector<std::string> parts = absl::StrSplit(name.substr(sizeof(kPrefix) - 1), '-');
    int pid = 0;
    if (parts.empty() || !absl::SimpleAtoi(parts[0], &pid) || pid <= 0) continue;
    if (::kill(pid, 0) != 0 && errno == ESRCH) {
      if (::unlink(absl::StrCat(kDir, name).c_str()) == 0) ++removed;
    }
  }
  ::closedir(dir);
  return removed;
}

uint64_t HostIdentity(const std::string& host_id) {
  std::ifstream boot("/proc/sys/kernel/random/boot_id");
  std::string boot_id;
  if (!(boot >> boot_id) || boot_id.empty()) return 0;
  struct stat st {};
  if (::stat(kDir, &st) != 0) return 0;
  struct stat net {};
  if (::stat("/proc/self/ns/net", &net) != 0) return 0;
  uint64_t h = 0x7465737365726121ull;
  for (char c : boot_id) h = Mix(h, static_cast<unsigned char>(c));
  h = Mix(h, static_cast<uint64_t>(st.st_dev));
  h = Mix(h, static_cast<uint64_t>(st.st_ino));
  h = Mix(h, static_cast<uint64_t>(::getuid()));
  h = Mix(h, static_cast<uint64_t>(net.st_dev));
  h = Mix(h, static_cast<uint64_t>(net.st_ino));
  h = Mix(h, host_id.size());
  for (char c : host_id) h = Mix(h, static_cast<unsigned char>(c));
  return h == 0 ? 1 : h;
}

}  // namespace tessera::shm

#include "server/bucket_file_cold_rows.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>

#include "absl/strings/str_cat.h"
#include "common/check.h"
#include "common/env.h"
#include "server/store_directory.h"
#include "common/keys.h"

namespace tessera {
namespace {

namespace fs = std::filesystem;

constexpr size_t kPage = 4096;
constexpr size_t kReserveBytes = size_t{1} << 40;  // address space per file: 1 TiB
constexpr size_t kMinGrowBytes = size_t{1} << 20;
constexpr char kPrimaryName[] = "buckets";
constexpr char kOverflowName[] = "overflow";

uint64_t HashOf(Key key) { return Mix64(key ^ 0x6a09e667f3bcc909ULL); }

size_t RoundUp(size_t n, size_t to) { return (n + to - 1) / to * to; }

// At least 16 records a bucket: with fewer, the Poisson spread of keys over
// buckets at a load of 3/4 sends a good share of them into overflow buckets
// (7 a bucket, dim 64 with Adagrad in one page: one bucket in five).
constexpr size_t kMinRecordsPerBucket = 16;

size_t BucketBytesFor(size_t record_bytes) {
  constexpr size_t kHeader = 16;
  return RoundUp(kHeader + kMinRecordsPerBucket * record_bytes, kPage);
}

}  // namespace

BucketFileColdRows::BucketFileColdRows(std::string directory, uint32_t row_floats)
    : directory_(std::move(directory)),
      row_floats_(row_floats),
      row_bytes_(size_t{row_floats} * sizeof(float)),
      record_bytes_(sizeof(Key) + row_bytes_),
      bucket_bytes_(BucketBytesFor(record_bytes_)),
      per_bucket_(static_cast<uint32_t>((bucket_bytes_ - kHeaderBytes) / record_bytes_)) {
  static_assert(sizeof(Header) == 16);
}

absl::StatusOr<std::unique_ptr<BucketFileColdRows>> BucketFileColdRows::Open(const std::string& directory,
                                                                             uint32_t row_floats) {
  if (absl::Status s = PrepareStoreDirectory(directory, row_floats, kPrimaryName); !s.ok()) return s;
  std::unique_ptr<BucketFileColdRows> store(new BucketFileColdRows(directory, row_floats));
  if (absl::Status s = store->OpenFiles(); !s.ok()) return s;
  return store;
}

absl::Status BucketFileColdRows::OpenFiles() {
  for (Mapped* m : {&primary_, &overflow_}) {
    m->path = (fs::path(directory_) / (m == &primary_ ? kPrimaryName : kOverflowName)).string();
    m->fd = open(m->path.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (m->fd < 0) return absl::FailedPreconditionError(absl::StrCat("disk tier: cannot make ", m->path, ": ", ErrnoText(errno)));
    void* base = mmap(nullptr, kReserveBytes, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (base == MAP_FAILED) {
      return absl::ResourceExhaustedError(
          absl::StrCat("disk tier: cannot reserve address space for ", m->path, ": ", ErrnoText(errno)));
    }
    m->base = static_cast<char*>(base);
    m->reserved = kReserveBytes;
  }
  Grow(primary_, kInitialBuckets * bucket_bytes_);
  return absl::OkStatus();
}

BucketFileColdRows::~BucketFileColdRows() {
  for (Mapped* m : {&primary_, &overflow_}) {
    if (m->base != nullptr) munmap(m->base, m->reserved);
    if (m->fd >= 0) close(m->fd);
  }
  std::error_code ec;
  fs::remove_all(directory_, ec);  // scratch
}

void BucketFileColdRows::Grow(Mapped& file, size_t bytes) {
  if (bytes <= file.mapped) return;
  const size_t target = RoundUp(std::max({bytes, file.mapped + file.mapped / 8, file.mapped + kMinGrowBytes}), kPage);
  TESSERA_CHECK_MSG(target <= file.reserved, absl::StrCat("disk tier ", file.path, ": more than ", file.reserved,
                                                          " bytes of rows"));
  // Allocate the blocks now: a full disk is an error here, not a SIGBUS on a
  // later write into the mapping.
  int rc = posix_fallocate(file.fd, static_cast<off_t>(file.mapped), static_cast<off_t>(target - file.mapped));
  if (rc == EOPNOTSUPP || rc == EINVAL) rc = ftruncate(file.fd, static_cast<off_t>(target)) == 0 ? 0 : errno;
  TESSERA_CHECK_MSG(rc == 0, absl::StrCat("disk tier ", file.path, ": cannot grow to ", target,
                                          " bytes: ", ErrnoText(rc)));
  void* p = mmap(file.base + file.mapped, target - file.mapped, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED,
                 file.fd, static_cast<off_t>(file.mapped));
  TESSERA_CHECK_MSG(p != MAP_FAILED, absl::StrCat("disk tier ", file.path, ": cannot map: ", ErrnoText(errno)));
  file.mapped = target;
}

uint64_t BucketFileColdRows::BucketOf(uint64_t hash) const {
  const uint64_t m = kInitialBuckets << level_;
  const uint64_t b = hash % m;
  return b < split_ ? hash % (2 * m) : b;
}

std::pair<BucketFileColdRows::Header*, uint32_t> BucketFileColdRows::Find(Key key) {
  for (Header* h = Primary(BucketOf(HashOf(key))); h != nullptr; h = Next(h)) {
    const Key* keys = Keys(h);
    for (uint32_t i = 0; i < h->count; ++i)
      if (keys[i] == key) return {h, i};
  }
  return {nullptr, 0};
}

uint64_t BucketFileColdRows::NewOverflow() {
  if (!overflow_free_.empty()) {
    const uint64_t o = overflow_free_.back();
    overflow_free_.pop_back();
    return o;
  }
  const uint64_t o = overflow_used_++;
  Grow(overflow_, (o + 1) * bucket_bytes_);
  return o;
}

void BucketFileColdRows::Append(Header* head, Key key, const char* row) {
  // Every bucket of a chain but the last is full: append to the last.
  Header* last = head;
  while (last->overflow != 0) last = Next(last);
  if (last->count == per_bucket_) {
    const uint64_t o = NewOverflow();  // (may map more of the overflow file; `last` stays valid)
    Header* fresh = Overflow(o);
    fresh->count = 0;
    fresh->overflow = 0;
    last->overflow = o + 1;
    last = fresh;
  }
  Keys(last)[last->count] = key;
  std::memcpy(Row(last, last->count), row, row_bytes_);
  ++last->count;
}

void BucketFileColdRows::Remove(Header* head, Header* h, uint32_t i) {
  Header* before = nullptr;
  Header* last = head;
  while (last->overflow != 0) {
    before = last;
    last = Next(last);
  }
  const uint32_t from = last->count - 1;
  if (last != h || from != i) {
    Keys(h)[i] = Keys(last)[from];
    std::memcpy(Row(h, i), Row(last, from), row_bytes_);
  }
  --last->count;
  if (last->count == 0 && before != nullptr) {
    overflow_free_.push_back(before->overflow - 1);
    before->overflow = 0;
  }
  --rows_;
}

void BucketFileColdRows::GrowIfFull() {
  if (rows_ * 4 > buckets_ * per_bucket_ * 3) SplitOne();
}

void BucketFileColdRows::Put(Key key, std::span<const float> row) {
  TESSERA_CHECK(row.size() == row_floats_);
  ++stats_.rows_written;
  if (auto [h, i] = Find(key); h != nullptr) {
    std::memcpy(Row(h, i), row.data(), row_bytes_);
    return;
  }
  Append(Primary(BucketOf(HashOf(key))), key, reinterpret_cast<const char*>(row.data()));
  ++rows_;
  GrowIfFull();
}

void BucketFileColdRows::Add(Key key, std::span<const float> row) {
  TESSERA_CHECK(row.size() == row_floats_);
  TESSERA_DCHECK(Find(key).first == nullptr);
  ++stats_.rows_written;
  Append(Primary(BucketOf(HashOf(key))), key, reinterpret_cast<const char*>(row.data()));
  ++rows_;
  GrowIfFull();
}

void BucketFileColdRows::SplitOne() {
  const uint64_t old_bucket = split_;
  const uint64_t new_bucket = (kInitialBuckets << level_) + split_;
  Grow(primary_, (new_bucket + 1) * bucket_bytes_);
  // Take the old chain's records out, give its overflow buckets back, then
  // put each record where the new geometry says (the old bucket or the new).
  std::vector<Key> keys;
  std::vector<char> rows;
  Header* head = Primary(old_bucket);
  for (Header* h = head; h != nullptr; h = Next(h)) {
    keys.insert(keys.end(), Keys(h), Keys(h) + h->count);
    rows.insert(rows.end(), Row(h, 0), Row(h, h->count));
  }
  for (uint64_t o = head->overflow; o != 0;) {
    const uint64_t next = Overflow(o - 1)->overflow;
    overflow_free_.push_back(o - 1);
    o = next;
  }
  head->count = 0;
  head->overflow = 0;
  Header* fresh = Primary(new_bucket);
  fresh->count = 0;
  fresh->overflow = 0;
  if (++split_ == (kInitialBuckets << level_)) {
    ++level_;
    split_ = 0;
  }
  ++buckets_;
  for (size_t j = 0; j < keys.size(); ++j) Append(Primary(BucketOf(HashOf(keys[j]))), keys[j], rows.data() + j * row_bytes_);
}

size_t BucketFileColdRows::Read(std::span<const Key> keys, std::span<float> out, std::span<uint8_t> found, bool take) {
  TESSERA_CHECK(out.size() == keys.size() * row_floats_ && found.size() == keys.size());
  size_t n = 0;
  for (size_t i = 0; i < keys.size(); ++i) {
    const auto [h, r] = Find(keys[i]);
    found[i] = h != nullptr;
    if (h == nullptr) {
      ++stats_.lookups_absent;
      continue;
    }
    std::memcpy(out.data() + i * row_floats_, Row(h, r), row_bytes_);
    ++stats_.rows_read;
    ++n;
    if (take) {
      Remove(Primary(BucketOf(HashOf(keys[i]))), h, r);
      ++stats_.rows_erased;
    }
  }
  return n;
}

bool BucketFileColdRows::Contains(Key key) { return Find(key).first != nullptr; }

void BucketFileColdRows::Erase(Key key) {
  ++stats_.rows_erased;
  const auto [h, i] = Find(key);
  if (h == nullptr) return;
  Remove(Primary(BucketOf(HashOf(key))), h, i);
}

void BucketFileColdRows::ForEach(absl::FunctionRef<void(Key, std::span<const float>)> fn) {
  std::vector<float> row(row_floats_);
  for (uint64_t b = 0; b < buckets_; ++b) {
    for (Header* h = Primary(b); h != nullptr; h = Next(h)) {
      for (uint32_t i = 0; i < h->count; ++i) {
        std::memcpy(row.data(), Row(h, i), row_bytes_);  // a copy: the caller may not change the store meanwhile
        fn(Keys(h)[i], row);
      }
    }
  }
}

void BucketFileColdRows::ForEachKey(absl::FunctionRef<void(Key)> fn) {
  for (uint64_t b = 0; b < buckets_; ++b) {
    for (Header* h = Primary(b); h != nullptr; h = Next(h)) {
      for (uint32_t i = 0; i < h->count; ++i) fn(Keys(h)[i]);
    }
  }
}

ColdRowStats BucketFileColdRows::stats() const {
  ColdRowStats s = stats_;
  s.bytes_on_disk = primary_.mapped + overflow_.mapped;
  return s;
}

}  // namespace tessera

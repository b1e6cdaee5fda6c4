#include "server/log_cold_rows.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <limits>

#include "absl/strings/str_cat.h"
#include "common/check.h"
#include "common/env.h"
#include "server/store_directory.h"

namespace tessera {
namespace {

namespace fs = std::filesystem;

constexpr size_t kPage = 4096;
constexpr size_t kReserveBytes = size_t{1} << 40;  // address space for the file: 1 TiB
constexpr char kFileName[] = "log";
constexpr uint8_t kInUse = 0, kFree = 1;

size_t RoundUp(size_t n, size_t to) { return (n + to - 1) / to * to; }

}  // namespace

LogColdRows::LogColdRows(std::string directory, uint32_t row_floats, size_t segment_bytes)
    : directory_(std::move(directory)),
      row_floats_(row_floats),
      row_bytes_(size_t{row_floats} * sizeof(float)),
      record_bytes_(sizeof(Key) + row_bytes_),
      per_segment_(std::max<size_t>(1, segment_bytes / record_bytes_)),
      segment_stride_(RoundUp(per_segment_ * record_bytes_, kPage)),
      buffer_records_(std::clamp<size_t>(kBufferBytes / record_bytes_, 1, per_segment_)),
      index_([this](uint32_t slot) { return KeyAt(slot); }),
      buffer_(buffer_records_ * record_bytes_) {}

absl::StatusOr<std::unique_ptr<LogColdRows>> LogColdRows::Open(const std::string& directory, uint32_t row_floats,
                                                               size_t segment_bytes) {
  if (absl::Status s = PrepareStoreDirectory(directory, row_floats, kFileName); !s.ok()) return s;
  std::unique_ptr<LogColdRows> store(new LogColdRows(directory, row_floats, segment_bytes));
  if (absl::Status s = store->OpenFile(); !s.ok()) return s;
  return store;
}

absl::Status LogColdRows::OpenFile() {
  path_ = (fs::path(directory_) / kFileName).string();
  fd_ = open(path_.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd_ < 0) return absl::FailedPreconditionError(absl::StrCat("disk tier: cannot make ", path_, ": ", ErrnoText(errno)));
  // One read-only mapping of the whole reservation: pages past the file's
  // end are never read (only written slots are), so it never moves.
  void* p = mmap(nullptr, kReserveBytes, PROT_READ, MAP_SHARED | MAP_NORESERVE, fd_, 0);
  if (p == MAP_FAILED) {
    return absl::ResourceExhaustedError(absl::StrCat("disk tier: cannot map ", path_, ": ", ErrnoText(errno)));
  }
  map_ = static_cast<char*>(p);
  // Records are read one at a time, at random: no read-around (by default
  // a fault reads 128 KiB around the page, which at 10^7 rows a server was
  // gigabytes a second of reads nobody used).
  (void)madvise(map_, kReserveBytes, MADV_RANDOM);
  return absl::OkStatus();
}

LogColdRows::~LogColdRows() {
  if (map_ != nullptr) munmap(map_, kReserveBytes);
  if (fd_ >= 0) close(fd_);
  std::error_code ec;
  fs::remove_all(directory_, ec);  // scratch
}

size_t LogColdRows::Offset(uint32_t slot) const {
  return size_t{slot / per_segment_} * segment_stride_ + size_t{slot % per_segment_} * record_bytes_;
}

Key LogColdRows::KeyAt(uint32_t slot) const {
  Key key;
  std::memcpy(&key, Record(slot), sizeof(Key));
  return key;
}

const char* LogColdRows::Record(uint32_t slot) const {
  if (slot >= buffer_slot_ && slot < next_slot_) return buffer_.data() + size_t{slot - buffer_slot_} * record_bytes_;
  return map_ + Offset(slot);
}

void LogColdRows::WriteAll(const char* data, size_t bytes, size_t offset) {
  while (bytes > 0) {
    const ssize_t n = pwrite(fd_, data, bytes, static_cast<off_t>(offset));
    if (n < 0 && errno == EINTR) continue;
    TESSERA_CHECK_MSG(n > 0, absl::StrCat("disk tier ", path_, ": cannot write ", bytes, " bytes at ", offset, ": ",
                                          ErrnoText(n < 0 ? errno : ENOSPC)));
    data += n;
    bytes -= static_cast<size_t>(n);
    offset += static_cast<size_t>(n);
  }
}

void LogColdRows::Flush() {
  const size_t records = next_slot_ - buffer_slot_;
  if (records == 0) return;
  const size_t offset = Offset(buffer_slot_), bytes = records * record_bytes_;
  WriteAll(buffer_.data(), bytes, offset);
  buffer_slot_ = next_slot_;
  // Start writing it back now, rather than leave gigabytes dirty for the
  // kernel to write at once: then every write on the file system (a small
  // file's fsync, a file growing) waits behind that, and a run of 10^8 rows
  // stalled servers and the coordinator for a minute. Asynchronous: this
  // waits for no disk.
  (void)sync_file_range(fd_, static_cast<off64_t>(offset), static_cast<off64_t>(bytes), SYNC_FILE_RANGE_WRITE);
}

void LogColdRows::OpenSegment() {
  Flush();
  uint64_t segment;
  if (!free_segments_.empty()) {
    segment = free_segments_.back();
    free_segments_.pop_back();
  } else {
    segment = segments_++;
    TESSERA_CHECK_MSG(segments_ * per_segment_ < LogIndex::kNoSlot && segments_ * segment_stride_ <= kReserveBytes,
                      absl::StrCat("disk tier ", path_, ": more than ", segments_ - 1, " segments of rows"));
    live_.push_back(0);
    state_.push_back(kInUse);
  }
  state_[segment] = kInUse;
  open_segment_ = segment;
  has_open_ = true;
  next_slot_ = buffer_slot_ = static_cast<uint32_t>(segment * per_segment_);
}

uint32_t LogColdRows::Append(Key key, const char* row) {
  if (!has_open_ || next_slot_ == (open_segment_ + 1) * per_segment_) OpenSegment();
  const uint32_t slot = next_slot_++;
  char* record = buffer_.data() + size_t{slot - buffer_slot_} * record_bytes_;
  std::memcpy(record, &key, sizeof(Key));
  std::memcpy(record + sizeof(Key), row, row_bytes_);
  ++live_[open_segment_];
  if (next_slot_ - buffer_slot_ == buffer_records_ || next_slot_ == (open_segment_ + 1) * per_segment_) Flush();
  return slot;
}

void LogColdRows::Kill(uint32_t slot) {
  --live_[slot / per_segment_];
  ++dead_;
}

void LogColdRows::Put(Key key, std::span<const float> row) {
  TESSERA_CHECK(row.size() == row_floats_);
  ++stats_.rows_written;
  const uint64_t hash = LogIndex::Hash(key);
  const uint32_t old = index_.Find(key, hash);
  const uint32_t slot = Append(key, reinterpret_cast<const char*>(row.data()));
  if (old != LogIndex::kNoSlot) {
    index_.Replace(key, hash, slot);
    Kill(old);
  } else {
    index_.Insert(key, hash, slot);
  }
  CompactIfNeeded();
}

void LogColdRows::Add(Key key, std::span<const float> row) {
  TESSERA_CHECK(row.size() == row_floats_);
  ++stats_.rows_written;
  index_.Insert(key, LogIndex::Hash(key), Append(key, reinterpret_cast<const char*>(row.data())));
}

size_t LogColdRows::Read(std::span<const Key> keys, std::span<float> out, std::span<uint8_t> found, bool take) {
  TESSERA_CHECK(out.size() == keys.size() * row_floats_ && found.size() == keys.size());
  size_t n = 0;
  for (size_t i = 0; i < keys.size(); ++i) {
    const uint64_t hash = LogIndex::Hash(keys[i]);
    const uint32_t slot = index_.Find(keys[i], hash);
    found[i] = slot != LogIndex::kNoSlot;
    if (slot == LogIndex::kNoSlot) {
      ++stats_.lookups_absent;
      continue;
    }
    std::memcpy(out.data() + i * row_floats_, Record(slot) + sizeof(Key), row_bytes_);
    ++stats_.rows_read;
    ++n;
    if (take) {
      index_.Erase(keys[i], hash);
      Kill(slot);
      ++stats_.rows_erased;
    }
  }
  if (take) CompactIfNeeded();
  return n;
}

void LogColdRows::Erase(Key key) {
  ++stats_.rows_erased;
  const uint64_t hash = LogIndex::Hash(key);
  const uint32_t slot = index_.Find(key, hash);
  if (slot == LogIndex::kNoSlot) return;
  index_.Erase(key, hash);
  Kill(slot);
  CompactIfNeeded();
}

void LogColdRows::ForEach(absl::FunctionRef<void(Key, std::span<const float>)> fn) {
  std::vector<float> row(row_floats_);
  index_.ForEach([&](uint32_t slot) {
    std::memcpy(row.data(), Record(slot) + sizeof(Key), row_bytes_);  // a copy: the span outlives no call
    fn(KeyAt(slot), row);
  });
}

void LogColdRows::ForEachKey(absl::FunctionRef<void(Key)> fn) {
  index_.ForEach([&](uint32_t slot) { fn(KeyAt(slot)); });
}

void LogColdRows::CompactIfNeeded() {
  if (compacting_) return;  // (compaction appends, and appends call nothing that compacts)
  compacting_ = true;
  while (dead_ > index_.size() + per_segment_) {
    uint64_t best = segments_;
    for (uint64_t s = 0; s < segments_; ++s) {
      if (state_[s] == kFree || (has_open_ && s == open_segment_)) continue;
      if (best == segments_ || live_[s] < live_[best]) best = s;
    }
    if (best == segments_ || live_[best] == per_segment_) break;  // nothing sealed holds a dead record
    CompactSegment(best);
  }
  compacting_ = false;
}

void LogColdRows::CompactSegment(uint64_t segment) {
  const uint32_t first = static_cast<uint32_t>(segment * per_segment_);
  const uint32_t live_before = live_[segment];
  // Read the sealed segment in buffer-sized runs (one sequential read each),
  // and write its live records again at the log's end.
  std::vector<char> run(buffer_records_ * record_bytes_);
  for (size_t at = 0; at < per_segment_ && live_[segment] > 0; at += buffer_records_) {
    const size_t records = std::min(buffer_records_, per_segment_ - at);
    const size_t bytes = records * record_bytes_;
    for (size_t done = 0; done < bytes;) {
      const ssize_t n = pread(fd_, run.data() + done, bytes - done, static_cast<off_t>(Offset(first + at) + done));
      if (n < 0 && errno == EINTR) continue;
      TESSERA_CHECK_MSG(n > 0, absl::StrCat("disk tier ", path_, ": cannot read ", bytes, " bytes at ",
                                            Offset(first + at), ": ", n < 0 ? ErrnoText(errno) : "end of file"));
      done += static_cast<size_t>(n);
    }
    for (size_t i = 0; i < records; ++i) {
      const char* record = run.data() + i * record_bytes_;
      Key key;
      std::memcpy(&key, record, sizeof(Key));
      const uint32_t slot = first + static_cast<uint32_t>(at + i);
      const uint64_t hash = LogIndex::Hash(key);
      if (index_.Find(key, hash) != slot) continue;  // dead: taken back, erased or replaced
      --live_[segment];
      index_.Replace(key, hash, Append(key, record + sizeof(Key)));
    }
  }
  TESSERA_CHECK(live_[segment] == 0);
  dead_ -= per_segment_ - live_before;
  // Give the space back; a file system that cannot punch holes keeps it
  // until the segment is written again.
  (void)fallocate(fd_, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, static_cast<off_t>(segment * segment_stride_),
                  static_cast<off_t>(segment_stride_));
  state_[segment] = kFree;
  free_segments_.push_back(segment);
  ++compacted_;
}

uint64_t LogColdRows::memory_bytes(uint64_t rows) const {
  // What the index holds now and a page for its next split; rows beyond the
  // ones it holds at the bound's rate.
  const uint64_t more = rows > index_.size() ? LogIndex::MemoryFor(rows - index_.size()) : 0;
  return index_.memory_bytes() + LogIndex::kPageBytes + more + kFixedMemoryBytes;
}

ColdRowStats LogColdRows::stats() const {
  ColdRowStats s = stats_;
  s.bytes_on_disk = (segments_ - free_segments_.size()) * segment_stride_;
  return s;
}

}  // namespace tessera

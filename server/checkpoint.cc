#include "server/checkpoint.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <array>
#include <bit>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <initializer_list>
#include <limits>
#include <optional>
#include <system_error>

#if defined(__x86_64__)
#include <nmmintrin.h>
#endif

#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/env.h"

namespace tessera {

// Keys and values are written as their in-memory bytes; the format is
// little-endian.
static_assert(std::endian::native == std::endian::little, "checkpoint files are little-endian; add byte swaps");
static_assert(sizeof(float) == 4 && std::numeric_limits<float>::is_iec559);

// ---- CRC32C ----

namespace {

constexpr uint32_t kCrc32cPoly = 0x82F63B78u;  // reflected Castagnoli

// kCrcTables[k][b]: the CRC register after byte b followed by k zero bytes.
constexpr std::array<std::array<uint32_t, 256>, 8> MakeCrcTables() {
  std::array<std::array<uint32_t, 256>, 8> t{};
  for (uint32_t b = 0; b < 256; ++b) {
    uint32_t c = b;
    for (int bit = 0; bit < 8; ++bit) c = (c >> 1) ^ (kCrc32cPoly & (0u - (c & 1u)));
    t[0][b] = c;
  }
  for (size_t k = 1; k < 8; ++k)
    for (uint32_t b = 0; b < 256; ++b) t[k][b] = (t[k - 1][b] >> 8) ^ t[0][t[k - 1][b] & 0xff];
  return t;
}
constexpr auto kCrcTables = MakeCrcTables();

}  // namespace

namespace checkpoint_internal {

// Slice-by-8: eight table lookups per eight bytes.
uint32_t Crc32cPortable(uint32_t crc, const void* data, size_t size) {
  const auto* p = static_cast<const uint8_t*>(data);
  uint32_t c = ~crc;
  for (; size >= 8; p += 8, size -= 8) {
    uint64_t v;
    std::memcpy(&v, p, 8);
    v ^= c;
    c = kCrcTables[7][v & 0xff] ^ kCrcTables[6][(v >> 8) & 0xff] ^ kCrcTables[5][(v >> 16) & 0xff] ^
        kCrcTables[4][(v >> 24) & 0xff] ^ kCrcTables[3][(v >> 32) & 0xff] ^ kCrcTables[2][(v >> 40) & 0xff] ^
        kCrcTables[1][(v >> 48) & 0xff] ^ kCrcTables[0][v >> 56];
  }
  for (; size > 0; ++p, --size) c = kCrcTables[0][(c ^ *p) & 0xff] ^ (c >> 8);
  return ~c;
}

#if defined(__x86_64__)
bool Crc32cHardwareAvailable() { return __builtin_cpu_supports("sse4.2"); }

__attribute__((target("sse4.2"))) uint32_t Crc32cHardware(uint32_t crc, const void* data, size_t size) {
  const auto* p = static_cast<const uint8_t*>(data);
  uint64_t c = ~crc;
  for (; size >= 8; p += 8, size -= 8) {
    uint64_t v;
    std::memcpy(&v, p, 8);
    c = _mm_crc32_u64(c, v);
  }
  uint32_t c32 = static_cast<uint32_t>(c);
  for (; size > 0; ++p, --size) c32 = _mm_crc32_u8(c32, *p);
  return ~c32;
}
#else
bool Crc32cHardwareAvailable() { return false; }
uint32_t Crc32cHardware(uint32_t crc, const void* data, size_t size) { return Crc32cPortable(crc, data, size); }
#endif

}  // namespace checkpoint_internal

uint32_t Crc32cExtend(uint32_t crc, const void* data, size_t size) {
  static const bool hardware = checkpoint_internal::Crc32cHardwareAvailable();
  return hardware ? checkpoint_internal::Crc32cHardware(crc, data, size)
                  : checkpoint_internal::Crc32cPortable(crc, data, size);
}

// ---- validation ----

namespace {

// Checks one table's invariants; errors start with "table ID".
absl::Status ValidateTableSnapshot(const TableSnapshot& t) {
  if (auto s = ValidateTableConfig(t.config); !s.ok()) return s;
  const uint32_t id = t.config.table_id();
  const size_t w = StoredRowFloats(t.config);
  if (t.values.size() != t.keys.size() * w) {
    return absl::InvalidArgumentError(absl::StrCat("table ", id, ": ", t.keys.size(), " keys of width ", w,
                                                   " need ", t.keys.size() * w, " values, got ", t.values.size()));
  }
  for (size_t i = 0; i < t.keys.size(); ++i) {
    if (i > 0 && t.keys[i] <= t.keys[i - 1]) {
      return absl::InvalidArgumentError(absl::StrCat("table ", id, ": key ", t.keys[i], " (row ", i,
                                                     ") follows key ", t.keys[i - 1],
                                                     "; keys must be strictly increasing"));
    }
  }
  if (t.config.kind() == proto::DENSE && !t.keys.empty() && t.keys.back() >= t.config.dense_rows()) {
    return absl::InvalidArgumentError(absl::StrCat("table ", id, " is dense with ", t.config.dense_rows(),
                                                   " rows; key ", t.keys.back(), " is out of range"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status ValidateSnapshot(const ShardSnapshot& snapshot) {
  for (size_t i = 1; i < snapshot.vshards.size(); ++i) {
    if (snapshot.vshards[i] <= snapshot.vshards[i - 1]) {
      return absl::InvalidArgumentError(absl::StrCat("vshard ", snapshot.vshards[i], " follows vshard ",
                                                     snapshot.vshards[i - 1],
                                                     "; vshards must be strictly increasing"));
    }
  }
  std::vector<uint32_t> ids;
  for (const TableSnapshot& t : snapshot.tables) {
    if (auto s = ValidateTableSnapshot(t); !s.ok()) return s;
    ids.push_back(t.config.table_id());
  }
  std::sort(ids.begin(), ids.end());
  if (auto dup = std::adjacent_find(ids.begin(), ids.end()); dup != ids.end())
    return absl::InvalidArgumentError(absl::StrCat("table ", *dup, " appears more than once"));
  return absl::OkStatus();
}

// ---- the byte layout (docs/checkpoints.md) ----

namespace {

constexpr uint64_t kHeaderBytes = 48;
constexpr uint64_t kSectionHeaderBytes = 24;
constexpr uint64_t kEndPayloadBytes = 12;
constexpr uint64_t kMinRowsPayloadBytes = 8;  // the row count

const char kFileSuffix[] = ".tckpt";
const char kTemporarySuffix[] = ".tmp";

void PutU32(std::string& out, uint32_t v) { out.append(reinterpret_cast<const char*>(&v), 4); }
void PutU64(std::string& out, uint64_t v) { out.append(reinterpret_cast<const char*>(&v), 8); }
uint32_t GetU32(const std::byte* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}
uint64_t GetU64(const std::byte* p) {
  uint64_t v;
  std::memcpy(&v, p, 8);
  return v;
}

bool IsKnownSectionType(uint32_t t) { return t >= 1 && t <= 5; }


// A file written through a buffer; small pieces are gathered, large ones go
// straight through. Closes (and, unless released, removes) the file.
class FileSink {
 public:
  static absl::StatusOr<FileSink> Create(const std::string& path) {
    int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) return absl::InternalError(absl::StrCat("cannot create ", path, ": ", ErrnoText(errno)));
    return FileSink(path, fd);
  }
  FileSink(FileSink&& o) noexcept : path_(std::move(o.path_)), fd_(std::exchange(o.fd_, -1)), offset_(o.offset_) {}
  FileSink& operator=(FileSink&&) = delete;
  ~FileSink() {
    if (fd_ >= 0) {
      ::close(fd_);
      ::unlink(path_.c_str());
    }
  }

  uint64_t offset() const { return offset_; }

  absl::Status Write(const void* data, size_t size) {
    offset_ += size;
    if (buffer_.size() + size <= kBufferBytes) {
      buffer_.append(static_cast<const char*>(data), size);
      return absl::OkStatus();
    }
    if (auto s = Flush(); !s.ok()) return s;
    if (size < kBufferBytes) {
      buffer_.append(static_cast<const char*>(data), size);
      return absl::OkStatus();
    }
    return WriteAll(data, size);
  }

  // Flushes, fsyncs and closes; on success the file stays.
  absl::Status Finish() {
    if (auto s = Flush(); !s.ok()) return s;
    if (::fsync(fd_) != 0) return absl::InternalError(absl::StrCat("cannot fsync ", path_, ": ", ErrnoText(errno)));
    const int fd = std::exchange(fd_, -1);
    if (::close(fd) != 0) {
      const int e = errno;
      ::unlink(path_.c_str());
      return absl::InternalError(absl::StrCat("cannot close ", path_, ": ", ErrnoText(e)));
    }
    return absl::OkStatus();
  }

 private:
  static constexpr size_t kBufferBytes = 1 << 20;

  FileSink(std::string path, int fd) : path_(std::move(path)), fd_(fd) { buffer_.reserve(kBufferBytes); }

  absl::Status Flush() {
    auto s = WriteAll(buffer_.data(), buffer_.size());
    buffer_.clear();
    return s;
  }

  absl::Status WriteAll(const void* data, size_t size) {
    const char* p = static_cast<const char*>(data);
    while (size > 0) {
      const ssize_t n = ::write(fd_, p, std::min<size_t>(size, size_t{1} << 30));
      if (n < 0) {
        if (errno == EINTR) continue;
        return absl::InternalError(absl::StrCat("cannot write ", path_, ": ", ErrnoText(errno)));
      }
      p += n;
      size -= static_cast<size_t>(n);
    }
    return absl::OkStatus();
  }

  std::string path_;
  int fd_ = -1;
  uint64_t offset_ = 0;
  std::string buffer_;
};

struct Piece {
  const void* data;
  size_t size;
};

// Writes one section: header (type, table id, payload length, payload CRC,
// header CRC), then the pieces of its payload.
absl::Status WriteSection(FileSink& sink, SectionType type, uint32_t table_id, std::initializer_list<Piece> pieces,
                          uint32_t& sections_written) {
  uint64_t length = 0;
  uint32_t crc = 0;
  for (const Piece& p : pieces) {
    length += p.size;
    crc = Crc32cExtend(crc, p.data, p.size);
  }
  std::string header;
  PutU32(header, static_cast<uint32_t>(type));
  PutU32(header, table_id);
  PutU64(header, length);
  PutU32(header, crc);
  PutU32(header, Crc32c(header.data(), header.size()));
  if (auto s = sink.Write(header.data(), header.size()); !s.ok()) return s;
  for (const Piece& p : pieces) {
    if (p.size == 0) continue;
    if (auto s = sink.Write(p.data, p.size); !s.ok()) return s;
  }
  ++sections_written;
  return absl::OkStatus();
}

absl::Status WriteSnapshot(FileSink& sink, const ShardSnapshot& snap, uint64_t sequence,
                           const CheckpointWriteOptions& options) {
  // Header.
  std::string header(kCheckpointMagic, sizeof(kCheckpointMagic));
  PutU32(header, kCheckpointVersion);
  PutU32(header, static_cast<uint32_t>(kHeaderBytes));
  PutU32(header, snap.server_rank);
  PutU32(header, 0);  // flags
  PutU64(header, snap.epoch);
  PutU64(header, sequence);
  PutU32(header, 0);  // reserved
  PutU32(header, Crc32c(header.data(), header.size()));
  if (auto s = sink.Write(header.data(), header.size()); !s.ok()) return s;

  uint32_t sections = 0;
  // META.
  std::string meta;
  PutU32(meta, static_cast<uint32_t>(snap.vshards.size()));
  for (uint32_t v : snap.vshards) PutU32(meta, v);
  PutU32(meta, static_cast<uint32_t>(snap.applied_pushes_by_vshard.size()));
  for (const auto& [vshard, count] : snap.applied_pushes_by_vshard) {
    PutU32(meta, vshard);
    PutU64(meta, count);
  }
  PutU32(meta, static_cast<uint32_t>(snap.tables.size()));
  if (auto s = WriteSection(sink, SectionType::kMeta, 0, {{meta.data(), meta.size()}}, sections); !s.ok()) return s;
  // CORE_STATE.
  if (auto s = WriteSection(sink, SectionType::kCoreState, 0, {{snap.core_state.data(), snap.core_state.size()}},
                            sections);
      !s.ok())
    return s;
  // Tables.
  for (const TableSnapshot& t : snap.tables) {
    const uint32_t id = t.config.table_id();
    const uint64_t w = StoredRowFloats(t.config);
    const uint64_t row_bytes = 8 + 4 * w;
    const uint64_t rows = t.keys.size();
    const uint64_t room = options.max_section_bytes > kMinRowsPayloadBytes
                              ? options.max_section_bytes - kMinRowsPayloadBytes
                              : 0;
    const uint64_t rows_per_section = std::max<uint64_t>(1, room / row_bytes);
    const uint64_t row_sections = (rows + rows_per_section - 1) / rows_per_section;
    if (row_sections > std::numeric_limits<uint32_t>::max()) {
      return absl::InvalidArgumentError(absl::StrCat("table ", id, ": ", rows, " rows in sections of ",
                                                     options.max_section_bytes,
                                                     " bytes make too many sections; raise max_section_bytes"));
    }
    std::string config;
    if (!t.config.SerializeToString(&config))
      return absl::InternalError(absl::StrCat("table ", id, ": cannot serialize its config"));
    std::string table;
    PutU32(table, static_cast<uint32_t>(config.size()));
    table += config;
    PutU64(table, rows);
    PutU32(table, static_cast<uint32_t>(row_sections));
    if (auto s = WriteSection(sink, SectionType::kTable, id, {{table.data(), table.size()}}, sections); !s.ok())
      return s;
    for (uint64_t first = 0; first < rows; first += rows_per_section) {
      const uint64_t n = std::min(rows_per_section, rows - first);
      const uint64_t count = n;
      if (auto s = WriteSection(sink, SectionType::kRows, id,
                                {{&count, 8},
                                 {t.keys.data() + first, n * 8},
                                 {t.values.data() + first * w, n * w * 4}},
                                sections);
          !s.ok())
        return s;
    }
  }
  // END: the number of sections before it and its own offset.
  std::string end;
  PutU32(end, sections);
  PutU64(end, sink.offset());
  return WriteSection(sink, SectionType::kEnd, 0, {{end.data(), end.size()}}, sections);
}

// ---- reading ----

// A file read by offset; reads past what it had at open are errors.
class FileSource {
 public:
  static absl::StatusOr<FileSource> Open(const std::string& path) {
    int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
      const int e = errno;
      std::string what = absl::StrCat("checkpoint ", path, ": cannot open: ", ErrnoText(e));
      if (e == ENOENT) return absl::NotFoundError(what);
      if (e == EACCES || e == EPERM) return absl::PermissionDeniedError(what);
      return absl::InternalError(what);
    }
    struct stat st;
    if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
      ::close(fd);
      return absl::InvalidArgumentError(absl::StrCat("checkpoint ", path, ": not a regular file"));
    }
    return FileSource(fd, static_cast<uint64_t>(st.st_size));
  }
  FileSource(FileSource&& o) noexcept : fd_(std::exchange(o.fd_, -1)), size_(o.size_) {}
  FileSource& operator=(FileSource&&) = delete;
  ~FileSource() {
    if (fd_ >= 0) ::close(fd_);
  }
  uint64_t size() const { return size_; }

  // Reads [offset, offset + n), which the caller checked lies inside size().
  // Returns the errno text, or empty on success.
  std::string ReadAt(uint64_t offset, void* out, size_t n) const {
    char* p = static_cast<char*>(out);
    while (n > 0) {
      const ssize_t got = ::pread(fd_, p, std::min<size_t>(n, size_t{1} << 30), static_cast<off_t>(offset));
      if (got < 0) {
        if (errno == EINTR) continue;
        return ErrnoText(errno);
      }
      if (got == 0) return "the file is shorter than when it was opened";
      p += got;
      n -= static_cast<size_t>(got);
      offset += static_cast<uint64_t>(got);
    }
    return {};
  }

 private:
  FileSource(int fd, uint64_t size) : fd_(fd), size_(size) {}
  int fd_ = -1;
  uint64_t size_ = 0;
};

// Bounds-checked reads from one section's payload.
class PayloadReader {
 public:
  explicit PayloadReader(std::span<const std::byte> bytes) : bytes_(bytes) {}
  uint64_t remaining() const { return bytes_.size() - at_; }
  uint64_t position() const { return at_; }
  bool U32(uint32_t& v) {
    if (remaining() < 4) return false;
    v = GetU32(bytes_.data() + at_);
    at_ += 4;
    return true;
  }
  bool U64(uint64_t& v) {
    if (remaining() < 8) return false;
    v = GetU64(bytes_.data() + at_);
    at_ += 8;
    return true;
  }
  // The next n bytes; requires n <= remaining().
  const std::byte* Take(uint64_t n) {
    const std::byte* p = bytes_.data() + at_;
    at_ += n;
    return p;
  }

 private:
  std::span<const std::byte> bytes_;
  uint64_t at_ = 0;
};

std::string DescribeSection(size_t index, SectionType type, uint32_t table_id) {
  std::string s = absl::StrCat("section ", index, " (", SectionTypeName(type));
  if (type == SectionType::kTable || type == SectionType::kRows) absl::StrAppend(&s, " of table ", table_id);
  return s + ")";
}

// Parses and checks a whole file. Every error is DataLoss (or, for a newer
// version, FailedPrecondition) naming the file, the place and the offset.
class CheckpointParser {
 public:
  CheckpointParser(const std::string& path, const FileSource& file) : path_(path), file_(file) {}

  absl::StatusOr<CheckpointFile> Parse() {
    out_.file_bytes = file_.size();
    if (auto s = ParseHeader(); !s.ok()) return s;
    uint64_t offset = kHeaderBytes;
    while (true) {
      auto done = ParseSection(offset);
      if (!done.ok()) return done.status();
      if (*done) break;
    }
    if (auto s = ValidateSnapshot(out_.snapshot); !s.ok())
      return absl::DataLossError(absl::StrCat("checkpoint ", path_, ": ", s.message()));
    return std::move(out_);
  }

 private:
  absl::Status Corrupt(const std::string& where, uint64_t offset, const std::string& what) const {
    return absl::DataLossError(absl::StrCat("checkpoint ", path_, ": ", where, " at byte offset ", offset, ": ", what));
  }

  absl::Status Read(const std::string& where, uint64_t offset, void* out, size_t n) const {
    if (std::string e = file_.ReadAt(offset, out, n); !e.empty())
      return absl::InternalError(absl::StrCat("checkpoint ", path_, ": ", where, " at byte offset ", offset,
                                              ": cannot read: ", e));
    return absl::OkStatus();
  }

  absl::Status ParseHeader() {
    if (file_.size() < kHeaderBytes) {
      return Corrupt("header", 0, absl::StrCat("the file has ", file_.size(), " bytes, less than the ", kHeaderBytes,
                                               "-byte header (truncated or not a checkpoint)"));
    }
    std::array<std::byte, kHeaderBytes> h;
    if (auto s = Read("header", 0, h.data(), h.size()); !s.ok()) return s;
    if (std::memcmp(h.data(), kCheckpointMagic, sizeof(kCheckpointMagic)) != 0)
      return Corrupt("header", 0, "bad magic number: not a Tessera checkpoint");
    out_.version = GetU32(h.data() + 8);
    if (out_.version != kCheckpointVersion) {
      return absl::FailedPreconditionError(absl::StrCat("checkpoint ", path_, ": header at byte offset 8: format version ",
                                                        out_.version, "; this build reads version ",
                                                        kCheckpointVersion));
    }
    const uint32_t header_bytes = GetU32(h.data() + 12);
    if (header_bytes != kHeaderBytes)
      return Corrupt("header", 12, absl::StrCat("header length ", header_bytes, ", expected ", kHeaderBytes));
    const uint32_t stored = GetU32(h.data() + 44);
    const uint32_t computed = Crc32c(h.data(), 44);
    if (stored != computed) {
      return Corrupt("header", 44, absl::StrFormat("header checksum mismatch (stored %08x, computed %08x)", stored,
                                                   computed));
    }
    if (GetU32(h.data() + 20) != 0 || GetU32(h.data() + 40) != 0)
      return Corrupt("header", 20, "unknown flags or reserved bits set");
    out_.snapshot.server_rank = GetU32(h.data() + 16);
    out_.snapshot.epoch = GetU64(h.data() + 24);
    out_.sequence = GetU64(h.data() + 32);
    return absl::OkStatus();
  }

  // The type the next section must have.
  SectionType Expected() const {
    if (index_ == 0) return SectionType::kMeta;
    if (index_ == 1) return SectionType::kCoreState;
    if (row_sections_left_ > 0) return SectionType::kRows;
    if (out_.snapshot.tables.size() < num_tables_) return SectionType::kTable;
    return SectionType::kEnd;
  }

  // Reads the section at `offset`; true once it was the END.
  absl::StatusOr<bool> ParseSection(uint64_t& offset) {
    const std::string where_header = absl::StrCat("section ", index_, " header");
    const uint64_t left = file_.size() - offset;
    if (left < kSectionHeaderBytes) {
      return Corrupt(where_header, offset,
                     absl::StrCat("the file ends ", left, " bytes into a ", kSectionHeaderBytes,
                                  "-byte section header (", SectionTypeName(Expected()),
                                  " expected next; truncated?)"));
    }
    std::array<std::byte, kSectionHeaderBytes> h;
    if (auto s = Read(where_header, offset, h.data(), h.size()); !s.ok()) return s;
    const uint32_t stored_header_crc = GetU32(h.data() + 20);
    const uint32_t computed_header_crc = Crc32c(h.data(), 20);
    if (stored_header_crc != computed_header_crc) {
      return Corrupt(where_header, offset,
                     absl::StrFormat("section header checksum mismatch (stored %08x, computed %08x)",
                                     stored_header_crc, computed_header_crc));
    }
    const uint32_t raw_type = GetU32(h.data());
    const uint32_t table_id = GetU32(h.data() + 4);
    const uint64_t length = GetU64(h.data() + 8);
    const uint32_t payload_crc = GetU32(h.data() + 16);
    if (!IsKnownSectionType(raw_type)) return Corrupt(where_header, offset, absl::StrCat("unknown section type ", raw_type));
    const auto type = static_cast<SectionType>(raw_type);
    const std::string where = DescribeSection(index_, type, table_id);
    if (type != Expected()) {
      return Corrupt(where, offset, absl::StrCat(SectionTypeName(Expected()), " expected here, found ",
                                                 SectionTypeName(type)));
    }
    if (length > left - kSectionHeaderBytes) {
      return Corrupt(where, offset,
                     absl::StrCat("payload of ", length, " bytes runs past the end of the file (", left - kSectionHeaderBytes,
                                  " bytes follow the section header; truncated?)"));
    }
    // Bounded by the file's size (checked just above).
    std::vector<std::byte> payload(length);
    const uint64_t payload_offset = offset + kSectionHeaderBytes;
    if (auto s = Read(where, payload_offset, payload.data(), payload.size()); !s.ok()) return s;
    const uint32_t computed = Crc32c(payload.data(), payload.size());
    if (computed != payload_crc) {
      return Corrupt(where, offset,
                     absl::StrFormat("payload checksum mismatch over %d bytes (stored %08x, computed %08x)", length,
                                     payload_crc, computed));
    }
    out_.sections.push_back(SectionInfo{
        .type = type, .table_id = table_id, .offset = offset, .payload_bytes = length, .payload_crc = payload_crc});
    PayloadReader r(payload);
    absl::Status s;
    switch (type) {
      case SectionType::kMeta: s = ParseMeta(r, where, payload_offset); break;
      case SectionType::kCoreState:
        out_.snapshot.core_state.assign(reinterpret_cast<const char*>(r.Take(payload.size())), payload.size());
        break;
      case SectionType::kTable: s = ParseTable(r, where, payload_offset, table_id); break;
      case SectionType::kRows: s = ParseRows(r, where, payload_offset, table_id); break;
      case SectionType::kEnd: s = ParseEnd(r, where, offset); break;
    }
    if (!s.ok()) return s;
    if (r.remaining() != 0) {
      return Corrupt(where, payload_offset + r.position(),
                     absl::StrCat(r.remaining(), " unexpected bytes at the end of the payload"));
    }
    offset = payload_offset + length;
    ++index_;
    if (type != SectionType::kEnd) return false;
    if (offset != file_.size()) {
      return Corrupt("after the END section", offset,
                     absl::StrCat(file_.size() - offset, " trailing bytes; nothing may follow the END section"));
    }
    return true;
  }

  absl::Status ParseMeta(PayloadReader& r, const std::string& where, uint64_t base) {
    ShardSnapshot& snap = out_.snapshot;
    uint32_t n = 0;
    if (!r.U32(n) || r.remaining() / 4 < n)
      return Corrupt(where, base + r.position(), absl::StrCat("vshard count ", n, " does not fit in the payload"));
    snap.vshards.resize(n);
    for (uint32_t& v : snap.vshards) r.U32(v);
    uint32_t applied = 0;
    if (!r.U32(applied) || r.remaining() / 12 < applied) {
      return Corrupt(where, base + r.position(),
                     absl::StrCat("applied-push count ", applied, " does not fit in the payload"));
    }
    for (uint32_t i = 0; i < applied; ++i) {
      const uint64_t at = base + r.position();
      uint32_t vshard = 0;
      uint64_t count = 0;
      r.U32(vshard);
      r.U64(count);
      if (!snap.applied_pushes_by_vshard.emplace(vshard, count).second)
        return Corrupt(where, at, absl::StrCat("applied pushes of vshard ", vshard, " listed twice"));
    }
    if (!r.U32(num_tables_)) return Corrupt(where, base + r.position(), "the table count is missing");
    // Each table takes at least a section header and a minimal TABLE payload.
    if (num_tables_ > file_.size() / (kSectionHeaderBytes + 16))
      return Corrupt(where, base + r.position() - 4, absl::StrCat("table count ", num_tables_, " cannot fit in the file"));
    snap.tables.reserve(num_tables_);
    return absl::OkStatus();
  }

  absl::Status ParseTable(PayloadReader& r, const std::string& where, uint64_t base, uint32_t table_id) {
    uint32_t config_bytes = 0;
    if (!r.U32(config_bytes) || r.remaining() < config_bytes) {
      return Corrupt(where, base, absl::StrCat("config of ", config_bytes, " bytes does not fit in the payload of ",
                                               r.remaining() + 4, " bytes"));
    }
    TableSnapshot t;
    if (!t.config.ParseFromArray(r.Take(config_bytes), static_cast<int>(config_bytes)))
      return Corrupt(where, base + 4, "the table config does not parse");
    if (auto s = ValidateTableConfig(t.config); !s.ok()) return Corrupt(where, base + 4, std::string(s.message()));
    if (t.config.table_id() != table_id) {
      return Corrupt(where, base + 4, absl::StrCat("the config names table ", t.config.table_id(),
                                                   ", the section header table ", table_id));
    }
    for (const TableSnapshot& other : out_.snapshot.tables)
      if (other.config.table_id() == table_id) return Corrupt(where, base + 4, "a second table with this id");
    uint64_t rows = 0;
    uint32_t sections = 0;
    const uint64_t rows_at = base + r.position();
    if (!r.U64(rows) || !r.U32(sections)) return Corrupt(where, rows_at, "the row and section counts are missing");
    // The rows must fit in what is left of the file: this bounds the
    // allocations below by the file's size.
    const uint64_t file_left = file_.size() - (base + r.position());
    const uint64_t row_bytes = 8 + 4 * uint64_t{StoredRowFloats(t.config)};
    if (rows > file_left / row_bytes) {
      return Corrupt(where, rows_at, absl::StrCat(rows, " rows of ", row_bytes, " bytes cannot fit in the ",
                                                  file_left, " bytes left in the file"));
    }
    if ((rows == 0) != (sections == 0) || sections > rows ||
        sections > file_left / (kSectionHeaderBytes + kMinRowsPayloadBytes)) {
      return Corrupt(where, rows_at + 8, absl::StrCat(rows, " rows cannot be in ", sections, " row sections"));
    }
    t.keys.reserve(rows);
    t.values.reserve(rows * StoredRowFloats(t.config));
    out_.snapshot.tables.push_back(std::move(t));
    rows_left_ = rows;
    row_sections_left_ = sections;
    return absl::OkStatus();
  }

  absl::Status ParseRows(PayloadReader& r, const std::string& where, uint64_t base, uint32_t table_id) {
    TableSnapshot& t = out_.snapshot.tables.back();
    if (table_id != t.config.table_id()) {
      return Corrupt(where, base - kSectionHeaderBytes,
                     absl::StrCat("rows of table ", t.config.table_id(), " expected here"));
    }
    const uint64_t w = StoredRowFloats(t.config);
    uint64_t n = 0;
    if (!r.U64(n)) return Corrupt(where, base, "the row count is missing");
    const uint64_t row_bytes = 8 + 4 * w;
    if (n == 0 || n > rows_left_ || r.remaining() != n * row_bytes) {
      return Corrupt(where, base,
                     absl::StrCat(n, " rows of ", row_bytes, " bytes do not match the payload (", r.remaining(),
                                  " bytes) or the ", rows_left_, " rows the table has left"));
    }
    const uint64_t keys_at = base + r.position();
    const std::byte* keys = r.Take(n * 8);
    const std::byte* values = r.Take(n * w * 4);
    const size_t first = t.keys.size();
    t.keys.resize(first + n);
    std::memcpy(t.keys.data() + first, keys, n * 8);
    for (size_t i = first; i < t.keys.size(); ++i) {
      if (i > 0 && t.keys[i] <= t.keys[i - 1]) {
        return Corrupt(where, keys_at + (i - first) * 8,
                       absl::StrCat("key ", t.keys[i], " follows key ", t.keys[i - 1],
                                    "; keys must be strictly increasing"));
      }
      if (t.config.kind() == proto::DENSE && t.keys[i] >= t.config.dense_rows()) {
        return Corrupt(where, keys_at + (i - first) * 8,
                       absl::StrCat("key ", t.keys[i], " is out of range for a dense table of ",
                                    t.config.dense_rows(), " rows"));
      }
    }
    const size_t first_value = t.values.size();
    t.values.resize(first_value + n * w);
    std::memcpy(t.values.data() + first_value, values, n * w * 4);
    rows_left_ -= n;
    --row_sections_left_;
    if (row_sections_left_ == 0 && rows_left_ != 0) {
      return Corrupt(where, base, absl::StrCat("the last row section of table ", t.config.table_id(), " leaves ",
                                               rows_left_, " of its rows missing"));
    }
    return absl::OkStatus();
  }

  absl::Status ParseEnd(PayloadReader& r, const std::string& where, uint64_t offset) {
    uint32_t sections = 0;
    uint64_t end_offset = 0;
    if (r.remaining() != kEndPayloadBytes || !r.U32(sections) || !r.U64(end_offset))
      return Corrupt(where, offset, absl::StrCat("END payload must be ", kEndPayloadBytes, " bytes"));
    if (sections != index_ || end_offset != offset) {
      return Corrupt(where, offset, absl::StrCat("END records ", sections, " sections before it and its offset as ",
                                                 end_offset, "; found ", index_, " and ", offset));
    }
    return absl::OkStatus();
  }

  const std::string& path_;
  const FileSource& file_;
  CheckpointFile out_;
  size_t index_ = 0;            // of the next section
  uint32_t num_tables_ = 0;     // from META
  uint64_t rows_left_ = 0;      // of the current table
  uint32_t row_sections_left_ = 0;
};

// ---- names ----

// "server-<rank>-<sequence>.tckpt" (temporary = false) or the same with
// ".tmp" appended (temporary = true), as rank and sequence; nullopt for any
// other name.
std::optional<std::pair<uint32_t, uint64_t>> ParseName(const std::string& name, bool temporary) {
  std::string rest = name;
  const std::string suffix = std::string(kFileSuffix) + (temporary ? kTemporarySuffix : "");
  if (rest.size() <= suffix.size() || rest.compare(rest.size() - suffix.size(), suffix.size(), suffix) != 0)
    return std::nullopt;
  rest.resize(rest.size() - suffix.size());
  const std::string prefix = "server-";
  if (rest.compare(0, prefix.size(), prefix) != 0) return std::nullopt;
  rest = rest.substr(prefix.size());
  const size_t dash = rest.find('-');
  if (dash == std::string::npos) return std::nullopt;
  auto number = [](const std::string& digits, uint64_t max) -> std::optional<uint64_t> {
    if (digits.empty() || digits.size() > 20) return std::nullopt;
    uint64_t v = 0;
    for (char c : digits) {
      if (c < '0' || c > '9') return std::nullopt;
      const uint64_t d = static_cast<uint64_t>(c - '0');
      if (v > (max - d) / 10) return std::nullopt;
      v = v * 10 + d;
    }
    return v;
  };
  auto rank = number(rest.substr(0, dash), std::numeric_limits<uint32_t>::max());
  auto sequence = number(rest.substr(dash + 1), std::numeric_limits<uint64_t>::max());
  if (!rank || !sequence) return std::nullopt;
  return std::make_pair(static_cast<uint32_t>(*rank), *sequence);
}

struct DirectoryEntries {
  std::vector<CheckpointInfo> complete;
  std::vector<CheckpointInfo> temporaries;
};

absl::StatusOr<DirectoryEntries> ScanDirectory(const std::string& dir) {
  namespace fs = std::filesystem;
  DirectoryEntries out;
  std::error_code ec;
  fs::directory_iterator it(dir, ec);
  if (ec == std::errc::no_such_file_or_directory) return out;
  if (ec) return absl::InternalError(absl::StrCat("checkpoint directory ", dir, ": ", ec.message()));
  for (; it != fs::directory_iterator(); it.increment(ec)) {
    if (ec) break;
    const std::string name = it->path().filename().string();
    for (bool temporary : {false, true}) {
      auto parsed = ParseName(name, temporary);
      if (!parsed) continue;
      std::error_code type_ec;
      if (!temporary && !it->is_regular_file(type_ec)) continue;
      (temporary ? out.temporaries : out.complete)
          .push_back(CheckpointInfo{.path = it->path().string(), .server_rank = parsed->first,
                                    .sequence = parsed->second});
    }
  }
  if (ec) return absl::InternalError(absl::StrCat("checkpoint directory ", dir, ": ", ec.message()));
  auto newest_first = [](const CheckpointInfo& a, const CheckpointInfo& b) {
    return a.sequence != b.sequence ? a.sequence > b.sequence : a.server_rank < b.server_rank;
  };
  std::sort(out.complete.begin(), out.complete.end(), newest_first);
  return out;
}

}  // namespace

const char* SectionTypeName(SectionType type) {
  switch (type) {
    case SectionType::kMeta: return "META";
    case SectionType::kCoreState: return "CORE_STATE";
    case SectionType::kTable: return "TABLE";
    case SectionType::kRows: return "ROWS";
    case SectionType::kEnd: return "END";
  }
  return "UNKNOWN";
}

std::string CheckpointPath(const std::string& dir, uint32_t server_rank, uint64_t sequence) {
  return (std::filesystem::path(dir) / absl::StrFormat("server-%d-%010d%s", server_rank, sequence, kFileSuffix))
      .string();
}

std::string CheckpointTemporaryPath(const std::string& dir, uint32_t server_rank, uint64_t sequence) {
  return CheckpointPath(dir, server_rank, sequence) + kTemporarySuffix;
}

absl::StatusOr<CheckpointInfo> WriteCheckpoint(const std::string& dir, const ShardSnapshot& snapshot,
                                               const CheckpointWriteOptions& options) {
  if (auto s = ValidateSnapshot(snapshot); !s.ok())
    return absl::InvalidArgumentError(absl::StrCat("checkpoint not written: ", s.message()));
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return absl::InternalError(absl::StrCat("cannot create checkpoint directory ", dir, ": ", ec.message()));
  auto entries = ScanDirectory(dir);
  if (!entries.ok()) return entries.status();
  uint64_t last = 0;
  for (const CheckpointInfo& c : entries->complete)
    if (c.server_rank == snapshot.server_rank) last = std::max(last, c.sequence);
  if (last == std::numeric_limits<uint64_t>::max())
    return absl::FailedPreconditionError(absl::StrCat("checkpoint directory ", dir, ": sequence numbers exhausted"));
  CheckpointInfo info{.path = CheckpointPath(dir, snapshot.server_rank, last + 1),
                      .server_rank = snapshot.server_rank,
                      .sequence = last + 1};
  const std::string temporary = CheckpointTemporaryPath(dir, info.server_rank, info.sequence);
  {
    auto sink = FileSink::Create(temporary);
    if (!sink.ok()) return sink.status();
    if (auto s = WriteSnapshot(*sink, snapshot, info.sequence, options); !s.ok()) return s;  // removes the temporary
    if (auto s = sink->Finish(); !s.ok()) return s;
  }
  if (::rename(temporary.c_str(), info.path.c_str()) != 0) {
    const int e = errno;
    ::unlink(temporary.c_str());
    return absl::InternalError(absl::StrCat("cannot rename ", temporary, " to ", info.path, ": ", ErrnoText(e)));
  }
  if (auto s = SyncDirectory(dir); !s.ok()) return s;
  if (options.keep_last > 0) {
    if (auto s = PruneCheckpoints(dir, info.server_rank, options.keep_last); !s.ok())
      return absl::Status(s.code(), absl::StrCat("checkpoint ", info.path, " written, but pruning failed: ", s.message()));
  }
  return info;
}

absl::StatusOr<CheckpointFile> ReadCheckpointFile(const std::string& path) {
  auto file = FileSource::Open(path);
  if (!file.ok()) return file.status();
  return CheckpointParser(path, *file).Parse();
}

absl::StatusOr<std::vector<CheckpointInfo>> ListCheckpoints(const std::string& dir) {
  auto entries = ScanDirectory(dir);
  if (!entries.ok()) return entries.status();
  return std::move(entries->complete);
}

absl::StatusOr<CheckpointInfo> LatestCheckpoint(const std::string& dir, uint32_t server_rank) {
  auto list = ListCheckpoints(dir);
  if (!list.ok()) return list.status();
  for (const CheckpointInfo& c : *list)
    if (c.server_rank == server_rank) return c;
  return absl::NotFoundError(absl::StrCat("no checkpoint of server rank ", server_rank, " in ", dir));
}

absl::StatusOr<LoadedCheckpoint> LoadLatestCheckpoint(const std::string& dir, uint32_t server_rank) {
  auto list = ListCheckpoints(dir);
  if (!list.ok()) return list.status();
  LoadedCheckpoint out;
  bool any = false;
  for (const CheckpointInfo& c : *list) {
    if (c.server_rank != server_rank) continue;
    any = true;
    auto snapshot = ReadCheckpoint(c.path);
    if (snapshot.ok() && snapshot->server_rank != server_rank) {
      snapshot = absl::DataLossError(absl::StrCat("checkpoint ", c.path, ": its header says server rank ",
                                                  snapshot->server_rank, ", its name rank ", server_rank));
    }
    if (!snapshot.ok()) {
      out.skipped.push_back(snapshot.status());
      continue;
    }
    out.info = c;
    out.snapshot = std::move(*snapshot);
    return out;
  }
  if (!any) return absl::NotFoundError(absl::StrCat("no checkpoint of server rank ", server_rank, " in ", dir));
  return absl::DataLossError(absl::StrCat(
      "no checkpoint of server rank ", server_rank, " in ", dir, " reads cleanly: ",
      absl::StrJoin(out.skipped, "; ", [](std::string* o, const absl::Status& s) { absl::StrAppend(o, s.message()); })));
}

std::vector<std::pair<size_t, std::vector<uint32_t>>> ChooseNewestCopies(std::span<const ShardSnapshot> snapshots,
                                                                         std::span<const uint64_t> sequences,
                                                                         std::span<const uint32_t> vshards,
                                                                         std::vector<uint32_t>* none) {
  std::map<size_t, std::vector<uint32_t>> by_snapshot;
  std::vector<uint32_t> wanted(vshards.begin(), vshards.end());
  std::sort(wanted.begin(), wanted.end());
  for (uint32_t v : wanted) {
    size_t best = snapshots.size();
    for (size_t i = 0; i < snapshots.size(); ++i) {
      const ShardSnapshot& s = snapshots[i];
      if (!std::binary_search(s.vshards.begin(), s.vshards.end(), v)) continue;
      if (best == snapshots.size() ||
          std::make_pair(s.epoch, sequences[i]) > std::make_pair(snapshots[best].epoch, sequences[best])) {
        best = i;
      }
    }
    if (best == snapshots.size()) {
      if (none != nullptr) none->push_back(v);
    } else {
      by_snapshot[best].push_back(v);
    }
  }
  return {by_snapshot.begin(), by_snapshot.end()};
}

uint64_t MissedApplications(const ShardSnapshot& snapshot, std::span<const uint32_t> vshards,
                            const std::map<uint32_t, uint64_t>& last_applied) {
  uint64_t missed = 0;
  for (uint32_t v : vshards) {
    auto had = snapshot.applied_pushes_by_vshard.find(v);
    auto last = last_applied.find(v);
    const uint64_t h = had == snapshot.applied_pushes_by_vshard.end() ? 0 : had->second;
    const uint64_t l = last == last_applied.end() ? 0 : last->second;
    if (l > h) missed += l - h;
  }
  return missed;
}

absl::Status PruneCheckpoints(const std::string& dir, uint32_t server_rank, uint32_t keep_last) {
  if (keep_last == 0)
    return absl::InvalidArgumentError("PruneCheckpoints: keep_last must be at least 1 (it would remove every checkpoint)");
  auto entries = ScanDirectory(dir);
  if (!entries.ok()) return entries.status();
  absl::Status first_error;
  auto remove = [&](const std::string& path) {
    if (::unlink(path.c_str()) != 0 && errno != ENOENT && first_error.ok())
      first_error = absl::InternalError(absl::StrCat("cannot remove ", path, ": ", ErrnoText(errno)));
  };
  uint32_t kept = 0;
  for (const CheckpointInfo& c : entries->complete) {  // newest first
    if (c.server_rank != server_rank) continue;
    if (kept < keep_last) {
      ++kept;
    } else {
      remove(c.path);
    }
  }
  for (const CheckpointInfo& c : entries->temporaries)
    if (c.server_rank == server_rank) remove(c.path);
  return first_error;
}

}  // namespace tessera

// Reading checkpoint files: every byte checked (sizes, CRCs, section order,
// the snapshot's invariants) in the layout of server/checkpoint_format.h.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <optional>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/env.h"
#include "server/checkpoint.h"
#include "server/checkpoint_format.h"

namespace tessera {
namespace checkpoint_internal {
namespace {

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

}  // namespace
}  // namespace checkpoint_internal

absl::StatusOr<CheckpointFile> ReadCheckpointFile(const std::string& path) {
  auto file = checkpoint_internal::FileSource::Open(path);
  if (!file.ok()) return file.status();
  return checkpoint_internal::CheckpointParser(path, *file).Parse();
}

}  // namespace tessera

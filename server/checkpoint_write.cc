// Writing checkpoint files: the buffered file sink and the sections of a
// snapshot in the layout of server/checkpoint_format.h (docs/checkpoints.md).
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <initializer_list>
#include <optional>

#include "absl/strings/str_cat.h"
#include "common/env.h"
#include "server/checkpoint.h"
#include "server/checkpoint_format.h"

namespace tessera::checkpoint_internal {
namespace {


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

}  // namespace


absl::Status WriteSnapshotFile(const std::string& path, const ShardSnapshot& snapshot, uint64_t sequence,
                               const CheckpointWriteOptions& options) {
  auto sink = FileSink::Create(path);
  if (!sink.ok()) return sink.status();
  if (auto s = WriteSnapshot(*sink, snapshot, sequence, options); !s.ok()) return s;  // removes the file
  return sink->Finish();
}

}  // namespace tessera::checkpoint_internal

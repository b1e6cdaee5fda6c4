#include "common/env.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <filesystem>
#include <system_error>

#include "absl/strings/str_cat.h"

namespace tessera {
std::string ErrnoText(int e) { return std::generic_category().message(e); }

namespace {

// The directory that holds `path` ("." for a bare file name).
std::string DirectoryOf(const std::string& path) {
  std::string dir = std::filesystem::path(path).parent_path().string();
  return dir.empty() ? "." : dir;
}

// A name beside `path` that no other writer in this process uses now, nor
// (by the process id) any live process.
std::string TemporaryPathFor(const std::string& path) {
  static std::atomic<uint64_t> next{0};
  return absl::StrCat(path, ".tmp.", ::getpid(), ".", next.fetch_add(1, std::memory_order_relaxed));
}

absl::Status WriteAll(int fd, std::string_view bytes) {
  const char* p = bytes.data();
  size_t left = bytes.size();
  while (left > 0) {
    const ssize_t n = ::write(fd, p, std::min<size_t>(left, size_t{1} << 30));
    if (n < 0) {
      if (errno == EINTR) continue;
      return absl::InternalError(ErrnoText(errno));
    }
    p += n;
    left -= static_cast<size_t>(n);
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status WriteFileAtomically(const std::string& path, std::string_view bytes) {
  const std::string temporary = TemporaryPathFor(path);
  // Removes the temporary (where there is one) and names the step that failed.
  auto fail = [&](const char* step, absl::string_view why) {
    ::unlink(temporary.c_str());
    return absl::InternalError(absl::StrCat("cannot write ", path, ": ", step, " ", temporary, ": ", why));
  };
  const int fd = ::open(temporary.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0666);
  if (fd < 0) return fail("cannot create", ErrnoText(errno));
  if (absl::Status s = WriteAll(fd, bytes); !s.ok()) {
    ::close(fd);
    return fail("writing", s.message());
  }
  if (::fsync(fd) != 0) {
    const std::string why = ErrnoText(errno);
    ::close(fd);
    return fail("cannot fsync", why);
  }
  if (::close(fd) != 0) return fail("cannot close", ErrnoText(errno));
  if (::rename(temporary.c_str(), path.c_str()) != 0) return fail("cannot rename", ErrnoText(errno));
  if (absl::Status s = SyncDirectory(DirectoryOf(path)); !s.ok())
    return absl::InternalError(absl::StrCat("wrote ", path, " but ", s.message()));
  return absl::OkStatus();
}

absl::Status SyncDirectory(const std::string& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) {
    return absl::InternalError(absl::StrCat("cannot open directory ", dir, " to fsync it: ", ErrnoText(errno)));
  }
  const int rc = ::fsync(fd);
  const int e = errno;
  ::close(fd);
  // Some file systems cannot fsync a directory at all (EINVAL): there the
  // rename is as durable as it gets, and refusing would stop every writer.
  if (rc != 0 && e != EINVAL) {
    return absl::InternalError(absl::StrCat("cannot fsync directory ", dir, ": ", ErrnoText(e)));
  }
  return absl::OkStatus();
}

}  // namespace tessera

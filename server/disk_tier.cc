#include "server/disk_tier.h"

#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <filesystem>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "server/bucket_file_cold_rows.h"
#include "server/log_cold_rows.h"

namespace tessera {
namespace {

// The directory of one process's stores; removed with the last reference.
class ProcessDiskDir {
 public:
  explicit ProcessDiskDir(std::filesystem::path path) : path_(std::move(path)) {}
  ~ProcessDiskDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
};

std::string HostName() {
  char name[256] = {};
  if (gethostname(name, sizeof(name) - 1) != 0 || name[0] == '\0') return "host";
  std::string s = name;
  for (char& c : s)
    if (c == '/' || c == '-') c = '_';  // the name splits at the last '-'
  return s;
}

// A store just opened, keeping the process's directory while it lives.
template <typename Store>
absl::StatusOr<std::unique_ptr<ColdRows>> Kept(absl::StatusOr<std::unique_ptr<Store>> opened,
                                               std::shared_ptr<const void> dir) {
  if (!opened.ok()) return opened.status();
  (*opened)->KeepAlive(std::move(dir));
  return std::unique_ptr<ColdRows>(std::move(*opened));
}

}  // namespace

const char* DiskStoreName(DiskStore store) {
  switch (store) {
    case DiskStore::kBucketFile: return "bucket";
    case DiskStore::kLog: return "log";
    case DiskStore::kRocks: return "rocks";
  }
  return "?";
}

absl::StatusOr<DiskStore> ParseDiskStore(std::string_view name) {
  if (name == "bucket") return DiskStore::kBucketFile;
  if (name == "rocks") return DiskStore::kRocks;
  if (name == "log") return DiskStore::kLog;
  return absl::InvalidArgumentError(
      absl::StrCat("disk store '", std::string(name), "': expected bucket (the default), log or rocks"));
}

absl::StatusOr<ColdRowsFactory> MakeDiskTierFactory(const std::string& disk_dir, DiskStore store,
                                                    RocksColdRowsOptions options) {
  namespace fs = std::filesystem;
  if (disk_dir.empty()) return absl::InvalidArgumentError("disk tier: no directory given (--disk_dir)");
  std::error_code ec;
  fs::create_directories(disk_dir, ec);
  if (ec) return absl::FailedPreconditionError(absl::StrCat("--disk_dir ", disk_dir, ": cannot make it: ", ec.message()));
  const std::string host = HostName();
  const std::string prefix = absl::StrCat("tessera-", host, "-");
  // What dead processes of this host left behind.
  for (const fs::directory_entry& e : fs::directory_iterator(disk_dir, ec)) {
    const std::string name = e.path().filename().string();
    if (name.rfind(prefix, 0) != 0) continue;
    pid_t pid = 0;
    if (!absl::SimpleAtoi(name.substr(prefix.size()), &pid) || pid <= 0) continue;
    if (kill(pid, 0) == 0 || errno != ESRCH) continue;  // alive (or not ours to judge)
    std::error_code ignored;
    fs::remove_all(e.path(), ignored);
  }
  auto dir = std::make_shared<ProcessDiskDir>(fs::path(disk_dir) / absl::StrCat(prefix, getpid()));
  fs::remove_all(dir->path(), ec);  // a pid reused after a crash
  // The process's directory is made with its first store (a server whose
  // tables have no disk tier leaves nothing behind); what is checked now is
  // that disk_dir takes files.
  const fs::path probe = fs::path(disk_dir) / absl::StrCat(".probe-", prefix, getpid());
  fs::create_directories(probe, ec);
  if (ec) {
    return absl::FailedPreconditionError(
        absl::StrCat("--disk_dir ", disk_dir, ": cannot make a directory in it: ", ec.message()));
  }
  fs::remove(probe, ec);
  // A number per store: a table made again in this process (a server that
  // rejoins makes a new core) never opens the directory of one still open.
  auto made = std::make_shared<std::atomic<uint64_t>>(0);
  return ColdRowsFactory([dir, made, store, options](
                             uint32_t table_id, uint32_t row_floats) -> absl::StatusOr<std::unique_ptr<ColdRows>> {
    const std::string path = (dir->path() / absl::StrCat("table-", table_id, "-", made->fetch_add(1))).string();
    TLOG_INFO("disk tier of table {}: {} ({} store)", table_id, path, DiskStoreName(store));
    if (store == DiskStore::kBucketFile) return Kept(BucketFileColdRows::Open(path, row_floats), dir);
    if (store == DiskStore::kLog) return Kept(LogColdRows::Open(path, row_floats), dir);
    RocksColdRowsOptions o = options;
    o.directory = path;
    return Kept(RocksColdRows::Open(o, row_floats), dir);
  });
}

}  // namespace tessera

#include "server/store_directory.h"

#include <filesystem>

#include "absl/strings/str_cat.h"

namespace tessera {

absl::Status PrepareStoreDirectory(const std::string& directory, uint32_t row_floats, std::string_view marker) {
  namespace fs = std::filesystem;
  if (directory.empty()) return absl::InvalidArgumentError("disk tier: no directory given");
  if (row_floats == 0) return absl::InvalidArgumentError("disk tier: rows of 0 floats");
  std::error_code ec;
  if (fs::exists(directory, ec) && !fs::is_empty(directory, ec) && !fs::exists(fs::path(directory) / marker, ec)) {
    return absl::FailedPreconditionError(
        absl::StrCat("disk tier: ", directory, " holds files that are not a disk tier's; not removing them"));
  }
  fs::remove_all(directory, ec);
  if (ec) return absl::FailedPreconditionError(absl::StrCat("disk tier: cannot clear ", directory, ": ", ec.message()));
  fs::create_directories(directory, ec);
  if (ec) return absl::FailedPreconditionError(absl::StrCat("disk tier: cannot make ", directory, ": ", ec.message()));
  return absl::OkStatus();
}

}  // namespace tessera

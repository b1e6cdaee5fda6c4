#pragma once
// The directory a file store of the disk tier (server/cold_rows.h) starts
// in: what every store's Open does before it makes its files.
//
// PrepareStoreDirectory(directory, row_floats, marker):
// - InvalidArgument for an empty directory or rows of 0 floats;
// - FailedPrecondition, removing nothing, when the directory holds files
//   and not `marker` (the file each store of that kind makes): a mistyped
//   path must not cost a user files;
// - otherwise removes what an earlier store left (the disk tier is
//   scratch) and makes the directory empty; FailedPrecondition naming it if
//   it cannot.
#include <cstdint>
#include <string>
#include <string_view>

#include "absl/status/status.h"

namespace tessera {

absl::Status PrepareStoreDirectory(const std::string& directory, uint32_t row_floats, std::string_view marker);

}  // namespace tessera

#pragma once
// The job's CURVE key pair (ZmqTransport authentication and encryption):
// one pair per job, held by every process of the job and nobody else.
//
// File format (written by WriteNewJobKeys, `tessera-keys`): two lines,
//   public <40 Z85 characters>
//   secret <40 Z85 characters>
// The file must not be readable by group or others (mode 0600 or 0400):
// ReadJobKeys refuses one that is, as ssh does with private keys.
//
// Processes are given the file with the flag --job_keys FILE
// (TransportChoice::job_keys, transport/transport_flags.h), which the
// launcher passes to every process it starts (docs/security.md).
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace tessera {

struct JobKeys {
  std::string public_key;  // Z85, 40 characters
  std::string secret_key;  // Z85, 40 characters
};

// Reads and checks a key file. Errors name the file and what is wrong:
// missing or unreadable (NotFound / PermissionDenied), readable by others
// (PermissionDenied, with the chmod that fixes it), malformed or not one
// pair (InvalidArgument).
absl::StatusOr<JobKeys> ReadJobKeys(const std::string& path);

// Makes a new key pair and writes it to `path` (created with mode 0600;
// an existing file is refused with AlreadyExists).
absl::StatusOr<JobKeys> WriteNewJobKeys(const std::string& path);

}  // namespace tessera

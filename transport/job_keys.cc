#include "transport/job_keys.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>
#include <zmq.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace tessera {
namespace {

absl::Status CheckPair(const JobKeys& keys, const std::string& path) {
  uint8_t decoded[32];
  char derived[41];
  if (keys.public_key.size() != 40 || keys.secret_key.size() != 40 ||
      zmq_z85_decode(decoded, keys.public_key.c_str()) == nullptr ||
      zmq_z85_decode(decoded, keys.secret_key.c_str()) == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("job key file ", path, ": expected the lines 'public KEY' and 'secret KEY', each KEY 40 Z85 "
                     "characters (make one with tessera-keys)"));
  }
  if (zmq_curve_public(derived, keys.secret_key.c_str()) != 0 || keys.public_key != derived) {
    return absl::InvalidArgumentError(absl::StrCat("job key file ", path, ": the public and secret keys are not one pair"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<JobKeys> ReadJobKeys(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) {
    const int err = errno;
    std::string what = absl::StrCat("job key file ", path, ": ", std::strerror(err));
    return err == EACCES ? absl::PermissionDeniedError(what) : absl::NotFoundError(what);
  }
  if ((st.st_mode & (S_IRWXG | S_IRWXO)) != 0) {
    return absl::PermissionDeniedError(absl::StrFormat(
        "job key file %s is open to other users (mode %04o): it is the job's secret; chmod 600 %s", path,
        st.st_mode & 07777, path));
  }
  std::ifstream in(path);
  if (!in) return absl::PermissionDeniedError(absl::StrCat("job key file ", path, ": cannot read it"));
  JobKeys keys;
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream words(line);
    std::string name, value, extra;
    if (!(words >> name)) continue;  // blank line
    words >> value;
    if (words >> extra) name = "?";
    if (name == "public") {
      keys.public_key = value;
    } else if (name == "secret") {
      keys.secret_key = value;
    } else {
      keys = {};
      break;
    }
  }
  if (absl::Status s = CheckPair(keys, path); !s.ok()) return s;
  return keys;
}

absl::StatusOr<JobKeys> WriteNewJobKeys(const std::string& path) {
  char public_key[41], secret_key[41];
  if (zmq_curve_keypair(public_key, secret_key) != 0) {
    return absl::FailedPreconditionError("cannot make a CURVE key pair: this libzmq was built without CURVE");
  }
  JobKeys keys{public_key, secret_key};
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0) {
    const int err = errno;
    std::string what = absl::StrCat("cannot create the job key file ", path, ": ", std::strerror(err));
    return err == EEXIST ? absl::AlreadyExistsError(what) : absl::PermissionDeniedError(what);
  }
  const std::string text = absl::StrCat("public ", keys.public_key, "\nsecret ", keys.secret_key, "\n");
  const bool ok = ::write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size());
  ::close(fd);
  if (!ok) {
    ::unlink(path.c_str());
    return absl::DataLossError(absl::StrCat("cannot write the job key file ", path));
  }
  return keys;
}

}  // namespace tessera

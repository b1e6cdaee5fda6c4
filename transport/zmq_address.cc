#include "transport/zmq_address.h"

#include <sys/stat.h>
#include <unistd.h>

#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace tessera::zmq_internal {
namespace {

std::string Hostname() {
  char name[256] = {};
  if (gethostname(name, sizeof(name) - 1) != 0 || name[0] == '\0') return "localhost";
  return name;
}

bool IsWildcardHost(const std::string& host) {
  return host == "*" || host == "0.0.0.0" || host == "[::]" || host == "::" || host == "[::0]";
}

std::string BracketIfIpv6(const std::string& host) {
  if (host.find(':') != std::string::npos && !absl::StartsWith(host, "[")) {
    return absl::StrCat("[", host, "]");
  }
  return host;
}

}  // namespace

std::string ErrorText(const zmq::error_t& e) { return absl::StrCat(e.what(), " (errno ", e.num(), ")"); }

std::string AdvertisedAddress(const std::string& endpoint, const std::string& advertise_host) {
  constexpr absl::string_view kTcp = "tcp://";
  if (!absl::StartsWith(endpoint, kTcp)) return endpoint;
  const std::string host_port = endpoint.substr(kTcp.size());
  const size_t colon = host_port.rfind(':');
  if (colon == std::string::npos) return endpoint;
  std::string host = host_port.substr(0, colon);
  const std::string port = host_port.substr(colon + 1);
  if (!advertise_host.empty()) {
    host = BracketIfIpv6(advertise_host);
  } else if (IsWildcardHost(host)) {
    host = Hostname();
  }
  return absl::StrCat(kTcp, host, ":", port);
}

void IpcSocketFile::Remember(const std::string& endpoint) {
  constexpr absl::string_view kIpc = "ipc://";
  if (!absl::StartsWith(endpoint, kIpc)) return;
  std::string path = endpoint.substr(kIpc.size());
  if (path.empty() || path[0] == '@') return;  // abstract namespace: no file
  struct stat st {};
  if (stat(path.c_str(), &st) != 0) return;
  file_ = File{std::move(path), st.st_dev, st.st_ino};
}

void IpcSocketFile::Remove() {
  if (!file_) return;
  struct stat st {};
  if (stat(file_->path.c_str(), &st) == 0 && st.st_dev == file_->device && st.st_ino == file_->inode) {
    unlink(file_->path.c_str());
  }
  file_.reset();
}

}  // namespace tessera::zmq_internal

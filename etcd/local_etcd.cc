#include "etcd/local_etcd.h"

#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"

namespace tessera {
namespace {

int FreePort() {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  int port = 0;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0 &&
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0) {
    port = ntohs(a.sin_port);
  }
  ::close(fd);
  return port;
}

// TESSERA_ETCD: where the tests find an etcd binary. A test knob, not a job
// setting: LocalEtcd is linked only into tests (local_etcd.h), so this is no
// library reading its settings from the environment.
std::string FindEtcd() {
  if (const char* env = std::getenv("TESSERA_ETCD"); env && *env) return env;
  for (const char* p : {"/usr/bin/etcd", "/usr/local/bin/etcd"}) {
    if (::access(p, X_OK) == 0) return p;
  }
  return "";
}

}  // namespace

LocalEtcd::LocalEtcd() {
  const std::string binary = FindEtcd();
  if (binary.empty()) {
    why_ = "no etcd binary (install etcd-server: scripts/setup.sh)";
    return;
  }
  char tmpl[] = "/tmp/tessera-etcd-XXXXXX";
  if (::mkdtemp(tmpl) == nullptr) {
    why_ = "cannot make a data directory";
    return;
  }
  dir_ = tmpl;
  const int client = FreePort(), peer = FreePort();
  endpoint_ = absl::StrCat("http://127.0.0.1:", client);
  const std::string peer_url = absl::StrCat("http://127.0.0.1:", peer);
  std::vector<std::string> args = {binary,
                                    "--name", "test",
                                    "--data-dir", dir_ + "/data",
                                    "--listen-client-urls", endpoint_,
                                    "--advertise-client-urls", endpoint_,
                                    "--listen-peer-urls", peer_url,
                                    "--initial-advertise-peer-urls", peer_url,
                                    "--initial-cluster", "test=" + peer_url};
  const std::string log = dir_ + "/etcd.log";
  pid_ = ::fork();
  if (pid_ == 0) {
    int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd >= 0) {
      ::dup2(fd, 1);
      ::dup2(fd, 2);
    }
    std::vector<char*> argv;
    for (std::string& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    ::execv(argv[0], argv.data());
    ::_exit(127);
  }
  if (pid_ < 0) {
    why_ = "fork failed";
    return;
  }
  auto client_or = EtcdClient::Create(endpoint_, 500 * kMillis);
  const Nanos deadline = MonotonicNow() + 20 * kSeconds;
  while (MonotonicNow() < deadline) {
    if ((*client_or)->Get("/probe").ok()) return;
    int status = 0;
    if (::waitpid(pid_, &status, WNOHANG) == pid_) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  why_ = absl::StrCat("etcd did not come up within 20 s (log: ", log, ")");
  ::kill(pid_, SIGKILL);
  ::waitpid(pid_, nullptr, 0);
  pid_ = -1;
}

LocalEtcd::~LocalEtcd() {
  if (pid_ > 0) {
    ::kill(pid_, SIGKILL);
    ::waitpid(pid_, nullptr, 0);
  }
  if (!dir_.empty() && why_.empty()) {
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }
}

}  // namespace tessera

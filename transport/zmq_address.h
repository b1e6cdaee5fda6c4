#pragma once
// Address helpers of ZmqTransport (internal to transport/): the address a
// bound endpoint is advertised as, the ipc socket file a bind leaves behind,
// and the text of a ZeroMQ error for status messages.
//
// Contract:
// - Callers: ZmqTransport::Impl, when it starts (AdvertisedAddress,
//   IpcSocketFile::Remember), when it finishes (IpcSocketFile::Remove) and
//   when a ZeroMQ call fails (ErrorText); the link watcher's log lines use
//   ErrorText too. None of them is on the per-message path.
// - AdvertisedAddress and ErrorText are pure and reentrant (Hostname() asks
//   the system). IpcSocketFile is not thread-safe: its owner serializes
//   Remember and Remove (ZmqTransport does, under its lifecycle lock).
#include <sys/types.h>

#include <optional>
#include <string>

#include <zmq.hpp>

namespace tessera::zmq_internal {

// The address other nodes must send to, for the endpoint a ROUTER bound
// (ZMQ_LAST_ENDPOINT). For tcp: `advertise_host` (bracketed when it is an
// IPv6 literal) replaces the host when set; otherwise a wildcard host
// ("*", "0.0.0.0", "[::]", ...) becomes this machine's hostname. Anything
// else (ipc, a tcp endpoint without a port) is returned as it is.
std::string AdvertisedAddress(const std::string& endpoint, const std::string& advertise_host);

// "<what> (errno <n>)".
std::string ErrorText(const zmq::error_t& e);

// The socket file an ipc bind created. libzmq leaves it behind on close, so
// Finish removes it, but only if the path still names the file we bound: a
// later bind of the same path by someone else replaces it.
class IpcSocketFile {
 public:
  // Notes the file behind `endpoint` (the bound endpoint), when it is an ipc
  // endpoint with a file (not the abstract namespace) that exists now.
  void Remember(const std::string& endpoint);
  // Unlinks the remembered file if the path still names it; forgets it.
  void Remove();

 private:
  struct File {
    std::string path;
    dev_t device = 0;
    ino_t inode = 0;
  };
  std::optional<File> file_;
};

}  // namespace tessera::zmq_internal

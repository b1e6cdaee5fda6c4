#pragma once
// LocalEtcd (tests only): a real etcd server on loopback, in a fresh data
// directory, on free ports; killed and removed when the object goes.
// available() is false (with why()) when no etcd binary is installed, so a
// test can skip with that reason.
#include <sys/types.h>

#include <string>

#include "etcd/etcd_client.h"

namespace tessera {

class LocalEtcd {
 public:
  LocalEtcd();
  ~LocalEtcd();
  LocalEtcd(const LocalEtcd&) = delete;
  LocalEtcd& operator=(const LocalEtcd&) = delete;

  bool available() const { return pid_ > 0; }
  const std::string& why() const { return why_; }
  // "http://127.0.0.1:PORT"
  const std::string& endpoint() const { return endpoint_; }
  // "127.0.0.1:PORT", for etcd:// coordinator addresses.
  std::string host_port() const { return endpoint_.substr(7); }

 private:
  pid_t pid_ = -1;
  std::string dir_, endpoint_, why_;
};

}  // namespace tessera

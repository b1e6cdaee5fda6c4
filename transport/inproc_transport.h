#pragma once
// InProcTransport: a Transport between objects in one process, for tests.
// Nodes attach to a shared InProcNetwork under "inproc://<name>" addresses.
// Frames are shared, never copied. Each endpoint has its own delivery thread,
// so handlers run concurrently across nodes, like separate processes.
#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "absl/container/flat_hash_map.h"
#include "transport/transport.h"

namespace tessera {

class InProcTransport;

// The switchboard. Thread-safe. Must outlive every transport attached to it.
class InProcNetwork {
 public:
  InProcNetwork() = default;
  InProcNetwork(const InProcNetwork&) = delete;
  InProcNetwork& operator=(const InProcNetwork&) = delete;

  // A transport that will listen on "inproc://<name>" once started.
  std::unique_ptr<InProcTransport> Create(const std::string& name);

 private:
  friend class InProcTransport;
  bool Deliver(const std::string& to, Message message);
  absl::Status Attach(const std::string& address, InProcTransport* endpoint);
  void Detach(const std::string& address, const InProcTransport* endpoint);  // only if it is the owner

  std::mutex mu_;
  absl::flat_hash_map<std::string, InProcTransport*> endpoints_ ABSL_GUARDED_BY(mu_);
};

class InProcTransport final : public Transport {
 public:
  ~InProcTransport() override;
  absl::Status Start(Handler handler) override;
  const std::string& address() const override { return address_; }
  absl::Status Send(const std::string& to, Message message) override;
  void Stop() override;
  TransportStats stats() const override;

 private:
  friend class InProcNetwork;
  InProcTransport(InProcNetwork* network, std::string address)
      : network_(network), address_(std::move(address)) {}
  void Enqueue(Message message);
  void DeliveryLoop();

  InProcNetwork* const network_;
  const std::string address_;
  Handler handler_;
  std::thread thread_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Message> queue_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  bool started_ ABSL_GUARDED_BY(mu_) = false;
  TransportStats stats_ ABSL_GUARDED_BY(mu_);
};

}  // namespace tessera

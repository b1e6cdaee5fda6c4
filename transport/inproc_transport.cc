#include "transport/inproc_transport.h"

#include "absl/strings/str_cat.h"

namespace tessera {

std::unique_ptr<InProcTransport> InProcNetwork::Create(const std::string& name) {
  return std::unique_ptr<InProcTransport>(new InProcTransport(this, "inproc://" + name));
}

absl::Status InProcNetwork::Attach(const std::string& address, InProcTransport* endpoint) {
  std::lock_guard lock(mu_);
  if (!endpoints_.emplace(address, endpoint).second) {
    return absl::AlreadyExistsError(absl::StrCat("address in use: ", address));
  }
  return absl::OkStatus();
}

void InProcNetwork::Detach(const std::string& address, const InProcTransport* endpoint) {
  std::lock_guard lock(mu_);
  auto it = endpoints_.find(address);
  if (it != endpoints_.end() && it->second == endpoint) endpoints_.erase(it);
}

bool InProcNetwork::Deliver(const std::string& to, Message message) {
  std::lock_guard lock(mu_);  // held so the endpoint cannot detach mid-enqueue
  auto it = endpoints_.find(to);
  if (it == endpoints_.end()) return false;
  it->second->Enqueue(std::move(message));
  return true;
}

InProcTransport::~InProcTransport() { Stop(); }

absl::Status InProcTransport::Start(Handler handler) {
  {
    std::lock_guard lock(mu_);
    if (started_) return absl::FailedPreconditionError("transport already started");
    started_ = true;
  }
  handler_ = std::move(handler);
  if (auto s = network_->Attach(address_, this); !s.ok()) return s;
  thread_ = std::thread([this] { DeliveryLoop(); });
  return absl::OkStatus();
}

absl::Status InProcTransport::Send(const std::string& to, Message message) {
  {
    std::lock_guard lock(mu_);
    if (!started_ || stopping_) return absl::FailedPreconditionError("transport is not running");
  }
  message.header.set_sender_address(address_);
  size_t bytes = message.header.ByteSizeLong() + message.FrameBytes();
  {
    std::lock_guard lock(mu_);
    stats_.messages_sent++;
    stats_.bytes_sent += bytes;
  }
  if (message.sent_bytes) message.sent_bytes->fetch_add(bytes, std::memory_order_relaxed);
  message.sent_bytes.reset();  // the sender's counter; the receiver gets its own accounting
  network_->Deliver(to, std::move(message));  // unknown address: dropped, per contract
  return absl::OkStatus();
}

void InProcTransport::Enqueue(Message message) {
  std::lock_guard lock(mu_);
  if (stopping_) return;
  stats_.messages_received++;
  message.received_bytes = message.header.ByteSizeLong() + message.FrameBytes();
  stats_.bytes_received += message.received_bytes;
  queue_.push_back(std::move(message));
  cv_.notify_one();
}

void InProcTransport::DeliveryLoop() {
  for (;;) {
    Message m;
    {
      std::unique_lock lock(mu_);
      cv_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
      if (stopping_) return;
      m = std::move(queue_.front());
      queue_.pop_front();
    }
    handler_(std::move(m));
  }
}

void InProcTransport::Stop() {
  network_->Detach(address_, this);
  {
    std::lock_guard lock(mu_);
    stopping_ = true;
    queue_.clear();
  }
  cv_.notify_all();
  if (!thread_.joinable()) return;
  if (thread_.get_id() == std::this_thread::get_id()) {
    thread_.detach();  // Stop() called from the handler: the loop exits on return
  } else {
    thread_.join();
  }
}

TransportStats InProcTransport::stats() const {
  std::lock_guard lock(mu_);
  return stats_;
}

}  // namespace tessera

#include "transport/zmq_link_watcher.h"

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <exception>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "transport/zmq_address.h"

namespace tessera::zmq_internal {

void LinkWatcher::Start() {
  if (handler_) thread_ = std::thread([this] { Loop(); });
}

void LinkWatcher::Join() {
  if (thread_.joinable()) thread_.join();  // woken by the shutdown; closes its monitors
  std::lock_guard monitors_lock(mu_);
  for (auto& m : new_monitors_) m->events.close();  // made after the link thread left
  new_monitors_.clear();
  unwatched_.clear();
}

uint64_t LinkWatcher::Watch(zmq::context_t& ctx, zmq::socket_t& socket, const std::string& to) {
  if (!handler_) return 0;
  std::lock_guard lock(mu_);
  const uint64_t id = ++monitors_made_;
  const std::string endpoint = absl::StrCat("inproc://tessera-link-", reinterpret_cast<uintptr_t>(this), "-", id);
  if (zmq_socket_monitor(socket.handle(), endpoint.c_str(), ZMQ_EVENT_CONNECTED | ZMQ_EVENT_DISCONNECTED) != 0) {
    TLOG_WARN("{}: cannot watch the connection to {} ({}); a broken link is found by timeouts only", name_, to,
              zmq_strerror(zmq_errno()));
    return 0;
  }
  auto monitor = std::make_unique<Monitor>();
  monitor->id = id;
  monitor->address = to;
  monitor->events = zmq::socket_t(ctx, zmq::socket_type::pair);
  monitor->events.set(zmq::sockopt::linger, 0);
  monitor->events.connect(endpoint);
  new_monitors_.push_back(std::move(monitor));
  return id;
}

void LinkWatcher::Unwatch(uint64_t id) {
  if (id == 0) return;
  std::lock_guard lock(mu_);
  for (auto it = new_monitors_.begin(); it != new_monitors_.end(); ++it) {
    if ((*it)->id == id) {  // the link thread never took it: close it here
      (*it)->events.close();
      new_monitors_.erase(it);
      return;
    }
  }
  unwatched_.push_back(id);  // ids are made only while the link thread runs (or ran: Join clears)
}

bool LinkWatcher::Unwatched(uint64_t id) {
  std::lock_guard lock(mu_);
  return std::find(unwatched_.begin(), unwatched_.end(), id) != unwatched_.end();
}

void LinkWatcher::Loop() {
  std::vector<std::unique_ptr<Monitor>> monitors;
  std::vector<zmq::pollitem_t> items;
  for (;;) {
    {
      std::lock_guard lock(mu_);
      for (auto& m : new_monitors_) monitors.push_back(std::move(m));
      new_monitors_.clear();
      for (uint64_t id : unwatched_) {
        auto it = std::find_if(monitors.begin(), monitors.end(), [id](const auto& m) { return m->id == id; });
        if (it == monitors.end()) continue;
        (*it)->events.close();
        monitors.erase(it);
      }
      unwatched_.clear();
    }
    items.clear();
    for (auto& m : monitors) items.push_back(zmq::pollitem_t{m->events.handle(), 0, ZMQ_POLLIN, 0});
    try {
      if (items.empty()) {
        // Nothing to watch yet: wait for the first DEALER (or the end).
        if (!running_()) break;
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
        continue;
      }
      zmq::poll(items.data(), items.size(), std::chrono::milliseconds(100));
      for (size_t i = 0; i < items.size(); ++i) {
        if (!(items[i].revents & ZMQ_POLLIN)) continue;
        Monitor& m = *monitors[i];
        zmq::message_t event, endpoint;
        if (!m.events.recv(event, zmq::recv_flags::dontwait)) continue;
        if (event.more()) (void)m.events.recv(endpoint, zmq::recv_flags::dontwait);
        if (event.size() < sizeof(uint16_t)) continue;
        uint16_t id;
        std::memcpy(&id, event.data(), sizeof(id));
        const bool up = id == ZMQ_EVENT_CONNECTED;
        if (up == !m.down) continue;  // the first connection, or a repeat
        m.down = !up;
        if (!running_() || Unwatched(m.id)) continue;
        TLOG_DEBUG("{}: connection to {} {}", name_, m.address, up ? "made again" : "down");
        try {
          handler_(m.address, up);
        } catch (const std::exception& e) {
          TLOG_ERROR("{}: the link handler threw: {}", name_, e.what());
        }
      }
    } catch (const zmq::error_t& e) {
      if (e.num() == ETERM) break;
      TLOG_WARN("{}: watching connections: {}", name_, ErrorText(e));
    }
  }
  for (auto& m : monitors) m->events.close();
}

}  // namespace tessera::zmq_internal

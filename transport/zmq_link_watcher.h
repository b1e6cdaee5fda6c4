#pragma once
// Link events of ZmqTransport (internal to transport/): watches each DEALER's
// connection with a ZeroMQ socket monitor and tells the transport's link
// handler (Transport::SetLinkHandler) when a connection went down and when
// ZeroMQ made it again.
//
// Contract:
// - Owns one monitor per watched DEALER (its events arrive on a PAIR socket
//   in the transport's context) and the one thread that reads them all and
//   calls the handler. Watch hands new monitors over; the thread takes them
//   over, and closes every one on its way out (ETERM, when the transport
//   shuts its context down); Join closes those it never took.
// - Callers: ZmqTransport::Impl. SetHandler before Start; Start and Join
//   under the transport's lifecycle lock (Join after the context was shut
//   down); Watch from PeerFor when it makes a DEALER (any sending thread,
//   before the DEALER connects); Unwatch from Forget before it closes that
//   DEALER. Without a handler nothing is watched and no thread runs.
//   Nothing here runs per message.
// - The handler hears (address, false) once a connection that was up went
//   down and (address, true) once it is made again; the first connection and
//   repeats are not reported, nor anything once `running` says false, nor
//   anything of a monitor once Unwatch was called for it. An exception from
//   the handler is logged and ignored.
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <zmq.hpp>

#include "absl/base/thread_annotations.h"
#include "transport/transport.h"

namespace tessera::zmq_internal {

class LinkWatcher {
 public:
  // `name` (the transport's address) prefixes log lines and must outlive
  // the watcher; `running` says whether the transport still runs (no event
  // is reported once it says false; while nothing is watched yet the thread
  // leaves then, otherwise the context's shutdown ends it).
  LinkWatcher(const std::string& name, std::function<bool()> running)
      : name_(name), running_(std::move(running)) {}
  LinkWatcher(const LinkWatcher&) = delete;
  LinkWatcher& operator=(const LinkWatcher&) = delete;

  void SetHandler(Transport::LinkHandler handler) { handler_ = std::move(handler); }
  // Starts the thread, when a handler is set.
  void Start();
  // Watches `socket` (a DEALER to `to`, made in `ctx`) when a handler is set;
  // returns the watch's id for Unwatch (0: nothing is watched).
  uint64_t Watch(zmq::context_t& ctx, zmq::socket_t& socket, const std::string& to);
  // Ends watch `id` (its DEALER is about to close): none of its events is
  // reported from now on; its monitor is closed here or by the link thread
  // on its next round. 0 and unknown ids are ignored. Any thread.
  void Unwatch(uint64_t id);
  // Waits for the thread (woken by the context's shutdown) and closes the
  // monitors it did not take over.
  void Join();

 private:
  struct Monitor {
    uint64_t id = 0;
    std::string address;
    zmq::socket_t events;
    bool down = false;
  };
  void Loop();
  // Whether watch `id` was ended by an Unwatch the link thread has not
  // carried out yet.
  bool Unwatched(uint64_t id);

  const std::string& name_;
  const std::function<bool()> running_;
  Transport::LinkHandler handler_;  // set before Start, then only read
  std::mutex mu_;
  std::vector<std::unique_ptr<Monitor>> new_monitors_ ABSL_GUARDED_BY(mu_);
  std::vector<uint64_t> unwatched_ ABSL_GUARDED_BY(mu_);  // ids the link thread has to close
  uint64_t monitors_made_ ABSL_GUARDED_BY(mu_) = 0;
  std::thread thread_;
};

}  // namespace tessera::zmq_internal

#include "transport/zmq_transport.h"

#include <poll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <atomic>
#include <bit>
#include <cerrno>
#include <climits>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <algorithm>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>
#include <utility>
#include <vector>

#include <zmq.hpp>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "transport/zmq_address.h"
#include "transport/zmq_curve_auth.h"
#include "transport/zmq_link_watcher.h"
#include "transport/zmq_send_hold.h"

#if defined(__SANITIZE_THREAD__)
// libzmq is not built with ThreadSanitizer. It passes messages between its
// I/O threads and ours through lock-free queues that TSan cannot see, so the
// allocations and copies it makes (free, memcpy, recv called from inside
// libzmq) would be reported as races against our reads of the same memory.
// Ignore accesses made from inside libzmq; our own code stays checked (the
// hand-off of sent frames carries its own acquire/release, see SendHold in
// transport/zmq_send_hold.h).
// Every binary that links the ZeroMQ transport gets this suppression; more
// can be added with TSAN_OPTIONS=suppressions=FILE.
extern "C" const char* __tsan_default_suppressions() { return "called_from_lib:libzmq.so\n"; }
#endif

namespace tessera {

using zmq_internal::CountedToZmq;
using zmq_internal::ErrorText;
using zmq_internal::FrameToZmq;

namespace {

// Set on a transport's delivery thread while it runs, so Stop() can tell that
// it is called from inside the handler (and must not join itself).
thread_local const void* tls_delivering_transport = nullptr;

// Received frames are handed over without a copy only at this alignment.
constexpr uintptr_t kReceiveAlignment = 8;

// Whether to log the n-th malformed message: the first ten, then powers of two.
bool ShouldLogMalformed(uint64_t n) { return n <= 10 || std::has_single_bit(n); }

}  // namespace

class ZmqTransport::Impl {
 public:
  explicit Impl(Options options) : options_(std::move(options)) {}
  ~Impl() {
    Finish();
    // Closed only here, not in Finish: WakeCallerDelivery may still be
    // called through a transport that has stopped (a Future completing late),
    // and must not write to a descriptor number that was reused.
    for (int fd : {wake_fd_, caller_wake_fd_}) {
      if (fd >= 0) close(fd);
    }
  }

  absl::Status Start(std::shared_ptr<Impl> self, Handler handler);
  absl::Status Send(const std::string& to, Message message);
  PeerBacklog Backlog(const std::string& to) const {
    std::lock_guard lock(peers_mu_);
    auto it = peers_.find(to);
    if (it == peers_.end()) return {};
    const zmq_internal::PeerHolds& holds = *it->second->holds;
    return PeerBacklog{.messages = holds.backlog_messages.load(std::memory_order_acquire),
                       .bytes = holds.backlog_bytes.load(std::memory_order_relaxed)};
  }
  ForgetResult Forget(const std::string& to, std::chrono::milliseconds max_wait);
  void Stop();
  TransportStats stats() const;
  bool DeliverUntil(const std::function<bool()>& done, std::chrono::milliseconds max_wait);
  void WakeCallerDelivery();
  void SetLinkHandler(Transport::LinkHandler handler) { links_.SetHandler(std::move(handler)); }
  const std::string& address() const { return address_; }
  const Options& options() const { return options_; }

 private:
  // One outgoing connection. The socket is used by whoever holds `mu`
  // (ZeroMQ sockets may move between threads across a memory barrier).
  struct Peer {
    Peer() = default;
    Peer(const Peer&) = delete;
    Peer& operator=(const Peer&) = delete;
    ~Peer() { holds->Drop(); }
    std::mutex mu;
    zmq::socket_t socket ABSL_GUARDED_BY(mu);  // closed (null) after Stop or Forget
    bool forgotten ABSL_GUARDED_BY(mu) = false;  // closed by Forget
    uint64_t watch = 0;  // its monitor's id (links_), 0: none; set before it is shared
    // Shared with the holds of its frames libzmq has not released yet.
    zmq_internal::PeerHolds* const holds = zmq_internal::PeerHolds::New();
  };
  // A message as read off the ROUTER, before validation.
  struct Incoming {
    std::vector<zmq::message_t> parts;  // identity, header, data frames (capped)
    size_t frames_over_limit = 0;       // parts beyond the cap, read and dropped
    uint64_t bytes = 0;                 // header + data frames, all of them
  };
  enum class ReadResult { kMessage, kEmpty, kTerminated };
  enum State : int { kNew, kRunning, kStopping };

  absl::Status Validate() const;
  absl::StatusOr<std::shared_ptr<Peer>> PeerFor(const std::string& to);
  Buffer ZmqToFrame(zmq::message_t&& part);
  void ReceiveLoop();
  ReadResult Drain(const std::function<bool()>* stop) ABSL_EXCLUSIVE_LOCKS_REQUIRED(router_mu_);
  ReadResult ReadMessage(Incoming& in) ABSL_EXCLUSIVE_LOCKS_REQUIRED(router_mu_);
  void WakeEveryone();
  void Deliver(Incoming& in);
  void DropMalformed(const std::string& reason);
  void CloseDealers();
  void Finish();

  const Options options_;
  // For received frames that are copied (small or misaligned); large frames
  // normally arrive aligned and are adopted, so little is ever cached here.
  BufferPool receive_pool_{BufferPool::Options{.max_cached_bytes = 64u << 20}};

  // Lifecycle. Start and Finish hold lifecycle_mu_; state_ is also read
  // without it (Send, the delivery loop).
  // Invariants: ctx_ is set from a successful Start until Finish; router_ is
  // used only by Start (before the thread exists) and then under router_mu_
  // by the delivery thread, which closes it on exit, or by a borrower; the
  // context is terminated only after the thread is joined and every DEALER
  // is closed.
  std::mutex lifecycle_mu_;
  std::atomic<int> state_{kNew};
  std::optional<zmq::context_t> ctx_;  // written under lifecycle_mu_ before/after the thread
  // The ROUTER and the handler calls: whoever reads the ROUTER holds
  // router_mu_ from reading a message until its handler call returns, so
  // that messages are handled one at a time and in order, whichever thread
  // does it (the delivery thread, or a caller in DeliverUntil).
  std::mutex router_mu_;
  zmq::socket_t router_ ABSL_GUARDED_BY(router_mu_);
  Incoming incoming_ ABSL_GUARDED_BY(router_mu_);  // reused across reads
  // Caller delivery (DeliverUntil). Invariants: at most one borrower
  // (borrowers_ is 0 or 1); while there is one, the delivery thread does not
  // read the ROUTER (a message may still wake it through the descriptor;
  // it then parks until the borrower leaves); a leaving borrower wakes a
  // parked delivery thread, and otherwise leaves the ROUTER read to empty
  // or wakes it; the ROUTER is closed only when there is no borrower, so
  // the descriptors polled stay valid.
  int router_fd_ = -1;       // the ROUTER's ZMQ_FD: readable when it may have messages
  int wake_fd_ = -1;         // eventfd: the delivery thread leaves its poll
  int caller_wake_fd_ = -1;  // eventfd: the borrower checks done() again
  std::atomic<int> borrowers_{0};
  std::atomic<std::thread::id> borrower_{};
  std::atomic<bool> delivery_idle_{false};    // the delivery thread waits in poll for messages
  std::atomic<bool> delivery_parked_{false};  // the delivery thread waits for the borrower to leave
  std::mutex park_mu_;                      // borrowers_ becoming 0, for the delivery thread's exit
  std::condition_variable park_cv_;
  std::thread thread_ ABSL_GUARDED_BY(lifecycle_mu_);
  std::string address_;  // written once in Start, before state_ becomes kRunning
  Handler handler_;      // written once in Start, then only called by the thread
  // The socket file an ipc bind created (removed by Finish).
  zmq_internal::IpcSocketFile ipc_file_ ABSL_GUARDED_BY(lifecycle_mu_);

  // Outgoing connections, one per destination address.
  // Invariants: once dealers_closed_ is set, no Peer is added and every Peer
  // that was in peers_ has (or is about to have) a closed socket.
  mutable std::mutex peers_mu_;
  absl::flat_hash_map<std::string, std::shared_ptr<Peer>> peers_ ABSL_GUARDED_BY(peers_mu_);
  bool dealers_closed_ ABSL_GUARDED_BY(peers_mu_) = false;

  std::atomic<uint64_t> messages_sent_{0};
  std::atomic<uint64_t> messages_received_{0};
  std::atomic<uint64_t> bytes_sent_{0};
  std::atomic<uint64_t> bytes_received_{0};
  std::atomic<uint64_t> parts_sent_{0};
  std::atomic<uint64_t> parts_received_{0};
  std::atomic<uint64_t> malformed_received_{0};

  // Links: one monitor per DEALER, read by the watcher's thread
  // (transport/zmq_link_watcher.h); started by Start, joined by Finish.
  zmq_internal::LinkWatcher links_{address_,
                                   [this] { return state_.load(std::memory_order_acquire) == kRunning; }};

  // CURVE: the ZAP handler (transport/zmq_curve_auth.h), bound before the
  // ROUTER binds and joined in Finish (context shutdown wakes it with ETERM).
  bool curve() const { return !options_.curve_public_key.empty(); }
  zmq_internal::ZapHandler zap_{address_};
};

absl::Status ZmqTransport::Impl::Validate() const {
  if (options_.io_threads < 1) {
    return absl::InvalidArgumentError(absl::StrCat("io_threads must be at least 1, got ", options_.io_threads));
  }
  if (options_.linger_ms < -1) {
    return absl::InvalidArgumentError(absl::StrCat("linger_ms must be -1 or more, got ", options_.linger_ms));
  }
  if (options_.max_message_bytes == 0 || options_.max_message_bytes > static_cast<size_t>(INT64_MAX)) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_message_bytes out of range: ", options_.max_message_bytes));
  }
  if (!absl::StartsWith(options_.bind, "tcp://") && !absl::StartsWith(options_.bind, "ipc://")) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot bind '", options_.bind, "': ZmqTransport accepts tcp:// and ipc:// endpoints"));
  }
  return zmq_internal::ValidateCurveKeys(options_.curve_public_key, options_.curve_secret_key);
}

absl::Status ZmqTransport::Impl::Start(std::shared_ptr<Impl> self, Handler handler) {
  std::lock_guard lock(lifecycle_mu_);
  if (state_.load() == kRunning) return absl::FailedPreconditionError("transport already started");
  if (state_.load() == kStopping) return absl::FailedPreconditionError("transport was stopped");
  if (absl::Status s = Validate(); !s.ok()) return s;
  if (!handler) return absl::InvalidArgumentError("Start needs a handler");

  std::string endpoint;
  std::lock_guard router_lock(router_mu_);  // uncontended: no thread reads the ROUTER yet
  try {
    ctx_.emplace(options_.io_threads);
    if (curve()) zap_.Bind(*ctx_, options_.curve_public_key);
    router_ = zmq::socket_t(*ctx_, zmq::socket_type::router);
    router_.set(zmq::sockopt::linger, options_.linger_ms);
    router_.set(zmq::sockopt::maxmsgsize, static_cast<int64_t>(options_.max_message_bytes));
    if (curve()) zmq_internal::SetCurveServerOptions(router_, options_.curve_secret_key);
    router_.bind(options_.bind);
    endpoint = router_.get(zmq::sockopt::last_endpoint);
    router_fd_ = router_.get(zmq::sockopt::fd);
  } catch (const zmq::error_t& e) {
    router_.close();
    zap_.Close();
    ctx_.reset();
    return absl::UnavailableError(absl::StrCat("cannot bind ", options_.bind, ": ", ErrorText(e)));
  }
  wake_fd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  caller_wake_fd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (wake_fd_ < 0 || caller_wake_fd_ < 0) {
    const int err = errno;
    for (int* fd : {&wake_fd_, &caller_wake_fd_}) {
      if (*fd >= 0) close(*fd);
      *fd = -1;
    }
    router_.close();
    zap_.Close();
    ctx_.reset();
    return absl::ResourceExhaustedError(absl::StrCat("cannot make an eventfd: ", std::strerror(err)));
  }
  address_ = zmq_internal::AdvertisedAddress(endpoint, options_.advertise_host);
  ipc_file_.Remember(endpoint);
  // The ZAP handler answers handshakes from now on (libzmq waits for it;
  // started after address_ is set, which its log lines read).
  if (curve()) zap_.Start();
  handler_ = std::move(handler);
  state_.store(kRunning);
  links_.Start();
  thread_ = std::thread([self = std::move(self)]() mutable {
    self->ReceiveLoop();
    self.reset();  // may destroy the transport state, if the owner let go from the handler
  });
  return absl::OkStatus();
}

absl::StatusOr<std::shared_ptr<ZmqTransport::Impl::Peer>> ZmqTransport::Impl::PeerFor(const std::string& to) {
  std::lock_guard lock(peers_mu_);
  if (dealers_closed_) return absl::FailedPreconditionError("transport was stopped");
  if (auto it = peers_.find(to); it != peers_.end()) return it->second;
  auto peer = std::make_shared<Peer>();
  try {
    zmq::socket_t socket(*ctx_, zmq::socket_type::dealer);
    socket.set(zmq::sockopt::sndhwm, 0);         // queue without bound: Send never waits
    socket.set(zmq::sockopt::immediate, false);  // queue for peers not connected yet
    socket.set(zmq::sockopt::linger, options_.linger_ms);
    if (options_.link_timeout_ms > 0) socket.set(zmq::sockopt::tcp_maxrt, options_.link_timeout_ms);
    if (options_.connect_timeout_ms > 0) socket.set(zmq::sockopt::connect_timeout, options_.connect_timeout_ms);
    if (options_.reconnect_ms > 0) socket.set(zmq::sockopt::reconnect_ivl, options_.reconnect_ms);
    peer->watch = links_.Watch(*ctx_, socket, to);
    if (curve()) zmq_internal::SetCurveClientOptions(socket, options_.curve_public_key, options_.curve_secret_key);
    socket.connect(to);
    std::lock_guard peer_lock(peer->mu);
    peer->socket = std::move(socket);
  } catch (const zmq::error_t& e) {
    links_.Unwatch(peer->watch);  // its DEALER is gone
    if (e.num() == ETERM) return absl::FailedPreconditionError("transport was stopped");
    if (e.num() == EINVAL || e.num() == EPROTONOSUPPORT || e.num() == ENOCOMPATPROTO) {
      return absl::InvalidArgumentError(absl::StrCat("cannot connect to '", to, "': ", ErrorText(e)));
    }
    return absl::UnavailableError(absl::StrCat("cannot connect to '", to, "': ", ErrorText(e)));
  }
  peers_.emplace(to, peer);
  return peer;
}

absl::Status ZmqTransport::Impl::Send(const std::string& to, Message message) {
  const int state = state_.load(std::memory_order_acquire);
  if (state != kRunning) {
    return absl::FailedPreconditionError(state == kNew ? "transport not started" : "transport was stopped");
  }
  if (message.frames.size() > options_.max_data_frames) {
    return absl::InvalidArgumentError(absl::StrCat("message has ", message.frames.size(),
                                                   " data frames; the limit is ", options_.max_data_frames));
  }
  message.header.set_sender_address(address_);
  const size_t header_bytes = message.header.ByteSizeLong();
  const uint64_t total_bytes = header_bytes + message.FrameBytes();
  if (total_bytes > options_.max_message_bytes) {
    return absl::InvalidArgumentError(absl::StrCat("message of ", total_bytes, " bytes exceeds max_message_bytes ",
                                                   options_.max_message_bytes));
  }

  absl::StatusOr<std::shared_ptr<Peer>> peer = PeerFor(to);
  if (!peer.ok()) return peer.status();
  // Build the parts before taking the destination's lock. Counting
  // backlogs, the last one is always held: its release says the message left.
  std::vector<zmq::message_t> parts;
  parts.reserve(1 + message.frames.size());
  try {
    auto write_header = [&](std::byte* to) {
      message.header.SerializeWithCachedSizesToArray(reinterpret_cast<uint8_t*>(to));
    };
    if (options_.count_backlog && message.frames.empty()) {
      parts.push_back(CountedToZmq(header_bytes, write_header, Buffer(), (*peer)->holds, total_bytes));
    } else {
      parts.emplace_back(header_bytes);
      write_header(static_cast<std::byte*>(parts.back().data()));
      const size_t last = options_.count_backlog ? message.frames.size() - 1 : message.frames.size();
      for (size_t i = 0; i < last; ++i) {
        parts.push_back(FrameToZmq(std::move(message.frames[i]), options_.send_copy_below_bytes, (*peer)->holds));
      }
      if (last < message.frames.size()) {
        Buffer& frame = message.frames.back();
        const size_t size = frame.size();
        auto copy = [&](std::byte* to) {
          if (size > 0) std::memcpy(to, frame.data(), size);
        };
        // A small one is copied (no large buffer kept alive for a few bytes of it).
        parts.push_back(CountedToZmq(size, copy, size < options_.send_copy_below_bytes ? Buffer() : std::move(frame),
                                     (*peer)->holds, total_bytes));
      }
    }
  } catch (const zmq::error_t& e) {
    return absl::ResourceExhaustedError(absl::StrCat("cannot build message for ", to, ": ", ErrorText(e)));
  }
  {
    std::lock_guard lock((*peer)->mu);
    zmq::socket_t& socket = (*peer)->socket;
    // Closed by a Forget this Send overlapped: dropped as if sent before it.
    if (!socket && (*peer)->forgotten) return absl::OkStatus();
    if (!socket) return absl::FailedPreconditionError("transport was stopped");
    try {
      for (size_t i = 0; i < parts.size(); ++i) {
        const bool last = i + 1 == parts.size();
        const zmq::send_flags flags =
            last ? zmq::send_flags::dontwait : (zmq::send_flags::dontwait | zmq::send_flags::sndmore);
        if (!socket.send(parts[i], flags)) {
          // Not expected with an unbounded queue; the contract allows a drop.
          TLOG_WARN("{}: send queue to {} refused a message; dropped", address_, to);
          return absl::OkStatus();
        }
      }
    } catch (const zmq::error_t& e) {
      if (e.num() == ETERM) return absl::FailedPreconditionError("transport was stopped");
      return absl::UnavailableError(absl::StrCat("send to ", to, " failed: ", ErrorText(e)));
    }
  }
  messages_sent_.fetch_add(1, std::memory_order_relaxed);
  bytes_sent_.fetch_add(total_bytes, std::memory_order_relaxed);
  parts_sent_.fetch_add(parts.size(), std::memory_order_relaxed);
  if (message.sent_bytes) message.sent_bytes->fetch_add(total_bytes, std::memory_order_relaxed);
  return absl::OkStatus();
}

Buffer ZmqTransport::Impl::ZmqToFrame(zmq::message_t&& part) {
  const size_t size = part.size();
  if (size == 0) return Buffer();
  const bool aligned = reinterpret_cast<uintptr_t>(part.data()) % kReceiveAlignment == 0;
  if (size >= options_.receive_copy_below_bytes && aligned) {
    auto owner = std::make_shared<zmq::message_t>(std::move(part));
    void* data = owner->data();  // after the move: small messages live inside message_t
    return Buffer::Adopt(std::move(owner), data, size);
  }
  Buffer copy = receive_pool_.Get(size);
  std::memcpy(copy.mutable_data(), part.data(), size);
  return copy;
}

ZmqTransport::Impl::ReadResult ZmqTransport::Impl::ReadMessage(Incoming& in) {
  in.parts.clear();
  in.frames_over_limit = 0;
  in.bytes = 0;
  const size_t cap = 2 + options_.max_data_frames;  // identity + header + data frames
  for (bool first = true;; first = false) {
    zmq::message_t part;
    try {
      // The first part without waiting (EAGAIN: nothing there; the caller
      // polls router_fd_). Once it is there, so is the rest of the message.
      if (!router_.recv(part, first ? zmq::recv_flags::dontwait : zmq::recv_flags::none)) {
        if (first) return ReadResult::kEmpty;
        continue;
      }
    } catch (const zmq::error_t& e) {
      if (e.num() == EINTR) {  // nothing was consumed; read the same part again
        if (first) return ReadResult::kEmpty;
        continue;
      }
      if (e.num() != ETERM) TLOG_ERROR("{}: receive failed, delivery stops: {}", address_, ErrorText(e));
      return ReadResult::kTerminated;
    }
    const bool more = part.more();
    if (!in.parts.empty() || in.frames_over_limit > 0) in.bytes += part.size();  // not the identity
    if (in.parts.size() < cap) {
      in.parts.push_back(std::move(part));
    } else {
      ++in.frames_over_limit;
    }
    if (!more) return ReadResult::kMessage;
  }
}

void ZmqTransport::Impl::DropMalformed(const std::string& reason) {
  const uint64_t n = malformed_received_.fetch_add(1, std::memory_order_relaxed) + 1;
  if (ShouldLogMalformed(n)) {
    TLOG_WARN("{}: dropped malformed message: {} ({} malformed so far)", address_, reason, n);
  }
}

void ZmqTransport::Impl::Deliver(Incoming& in) {
  if (in.parts.size() < 2) return DropMalformed("no header frame");
  if (in.frames_over_limit > 0) {
    return DropMalformed(absl::StrCat("more than ", options_.max_data_frames, " data frames"));
  }
  if (in.bytes > options_.max_message_bytes) {
    return DropMalformed(absl::StrCat(in.bytes, " bytes exceed max_message_bytes ", options_.max_message_bytes));
  }
  const zmq::message_t& header_part = in.parts[1];
  Message message;
  if (header_part.size() > static_cast<size_t>(INT_MAX) ||
      !message.header.ParseFromArray(header_part.data(), static_cast<int>(header_part.size()))) {
    return DropMalformed(absl::StrCat("header of ", header_part.size(), " bytes does not parse"));
  }
  if (message.header.sender_address().empty()) return DropMalformed("header names no sender_address");
  const size_t parts = in.parts.size() - 1;  // the header and the data frames; the identity is local
  message.frames.reserve(in.parts.size() - 2);
  for (size_t i = 2; i < in.parts.size(); ++i) message.frames.push_back(ZmqToFrame(std::move(in.parts[i])));
  in.parts.clear();
  messages_received_.fetch_add(1, std::memory_order_relaxed);
  bytes_received_.fetch_add(in.bytes, std::memory_order_relaxed);
  parts_received_.fetch_add(parts, std::memory_order_relaxed);
  message.received_bytes = in.bytes;

  if (state_.load(std::memory_order_acquire) != kRunning) return;
  try {
    handler_(std::move(message));
  } catch (const std::exception& e) {
    TLOG_ERROR("{}: message handler threw: {}", address_, e.what());
  } catch (...) {
    TLOG_ERROR("{}: message handler threw a non-standard exception", address_);
  }
}

namespace {

void SignalFd(int fd) {
  if (fd >= 0) eventfd_write(fd, 1);
}

void ClearFd(int fd) {
  eventfd_t ignored;
  eventfd_read(fd, &ignored);  // non-blocking: EAGAIN when already clear
}

}  // namespace

ZmqTransport::Impl::ReadResult ZmqTransport::Impl::Drain(const std::function<bool()>* stop) {
  for (;;) {
    const ReadResult r = ReadMessage(incoming_);
    if (r != ReadResult::kMessage) return r;
    Deliver(incoming_);
    WakeCallerDelivery();  // a borrower waiting for router_mu_, or whose reply this was
    if (state_.load(std::memory_order_acquire) != kRunning) return ReadResult::kTerminated;
    if (stop != nullptr && (*stop)()) return ReadResult::kMessage;
  }
}

void ZmqTransport::Impl::ReceiveLoop() {
  tls_delivering_transport = this;
  int woken_while_borrowed = 0;  // since a borrower came
  while (state_.load(std::memory_order_acquire) == kRunning) {
    if (borrowers_.load() == 0) {
      woken_while_borrowed = 0;
      ReadResult r;
      {
        std::lock_guard lock(router_mu_);
        r = Drain(nullptr);
      }
      if (r == ReadResult::kTerminated) break;
      // A caller that came meanwhile may be waiting for router_mu_.
      if (borrowers_.load() > 0) WakeCallerDelivery();
    }
    if (borrowers_.load() > 0 && woken_while_borrowed++ == 0) {
      // A message woke us and the borrower, who reads it: most often its
      // reply, after which it leaves with the ROUTER read to empty. Sleep on
      // the descriptor again (no wake needed when the borrower leaves).
      std::this_thread::yield();
    } else if (borrowers_.load() > 0) {
      // Woken again while the borrower reads (a reply in several messages,
      // or it has not read yet): sleep until it leaves. It wakes us if it
      // sees delivery_parked_, which is set before borrowers_ is looked at
      // again, so one of the two sees the other; Stop wakes us too.
      delivery_parked_.store(true);
      if (borrowers_.load() > 0 && state_.load(std::memory_order_acquire) == kRunning) {
        pollfd fd = {wake_fd_, POLLIN, 0};
        poll(&fd, 1, -1);  // EINTR: go round again
      }
      delivery_parked_.store(false);
      ClearFd(wake_fd_);
      continue;
    }
    // Sleep until the ROUTER may have a message (its ZMQ_FD signals only
    // after a read found it empty: the Drain above, or a borrower's last),
    // or a borrower leaving unread messages, or Stop, wakes us.
    delivery_idle_.store(true);
    pollfd fds[2] = {{router_fd_, POLLIN, 0}, {wake_fd_, POLLIN, 0}};
    poll(fds, 2, -1);  // EINTR: go round again
    delivery_idle_.store(false);
    if (fds[1].revents & POLLIN) ClearFd(wake_fd_);
  }
  // A borrower may still be reading: let it notice the stop and leave before
  // the ROUTER (and the descriptor it polls) goes.
  {
    std::unique_lock lock(park_mu_);
    park_cv_.wait(lock, [&] { return borrowers_.load() == 0; });
  }
  {
    std::lock_guard lock(router_mu_);
    incoming_.parts.clear();
    router_.close();
  }
  tls_delivering_transport = nullptr;
}

bool ZmqTransport::Impl::DeliverUntil(const std::function<bool()>& done, std::chrono::milliseconds max_wait) {
  if (tls_delivering_transport == this) return false;  // inside our own handler
  if (state_.load(std::memory_order_acquire) != kRunning || !delivery_idle_.load()) return false;
  int none = 0;
  if (!borrowers_.compare_exchange_strong(none, 1)) return false;
  borrower_.store(std::this_thread::get_id());
  const void* outer = tls_delivering_transport;  // a handler of another transport may wait on us
  tls_delivering_transport = this;
  // The delivery thread is not told: it sleeps on the same descriptor, and
  // when a message wakes it too, it parks until we leave.
  const int timeout_ms = static_cast<int>(std::clamp<int64_t>(max_wait.count(), 1, INT_MAX));
  bool drained = false;  // the last read found the ROUTER empty
  while (state_.load(std::memory_order_acquire) == kRunning && !done()) {
    drained = false;
    if (router_mu_.try_lock()) {  // else the delivery thread is finishing a message; it wakes us after
      const ReadResult r = Drain(&done);
      router_mu_.unlock();
      if (r == ReadResult::kTerminated) break;
      if (r == ReadResult::kMessage) continue;  // done() holds
      drained = true;
    }
    pollfd fds[2] = {{caller_wake_fd_, POLLIN, 0}, {router_fd_, POLLIN, 0}};
    poll(fds, drained ? 2 : 1, timeout_ms);
    if (fds[0].revents & POLLIN) ClearFd(caller_wake_fd_);
  }
  // Messages may be left in the ROUTER. A parked delivery thread reads them
  // once woken below; one still polling the descriptor would not be woken
  // by them (it signals only after a read found the ROUTER empty), so read
  // it to empty, or wake the thread if more keep coming.
  bool wake = false;
  if (!drained && !delivery_parked_.load() && state_.load(std::memory_order_acquire) == kRunning) {
    ReadResult r = ReadResult::kMessage;
    if (router_mu_.try_lock()) {
      int budget = 16;
      const std::function<bool()> enough = [&budget] { return --budget <= 0; };
      r = Drain(&enough);
      router_mu_.unlock();
    }
    wake = r != ReadResult::kEmpty;
  }
  tls_delivering_transport = outer;
  borrower_.store(std::thread::id());
  {
    // Under the lock: an exiting delivery thread waits for it before the
    // ROUTER and the eventfds go.
    std::lock_guard lock(park_mu_);
    borrowers_.store(0);
    if (wake || delivery_parked_.load()) SignalFd(wake_fd_);
    park_cv_.notify_all();
  }
  return true;
}

void ZmqTransport::Impl::WakeCallerDelivery() {
  if (borrowers_.load() == 0 || borrower_.load() == std::this_thread::get_id()) return;
  SignalFd(caller_wake_fd_);
}

void ZmqTransport::Impl::WakeEveryone() {
  {
    std::lock_guard lock(park_mu_);
    park_cv_.notify_all();
  }
  SignalFd(wake_fd_);
  SignalFd(caller_wake_fd_);
}

void ZmqTransport::Impl::CloseDealers() {
  absl::flat_hash_map<std::string, std::shared_ptr<Peer>> peers;
  {
    std::lock_guard lock(peers_mu_);
    dealers_closed_ = true;
    peers.swap(peers_);
  }
  for (auto& [address, peer] : peers) {
    std::lock_guard lock(peer->mu);
    peer->socket.close();
  }
}

// The peer leaves peers_ first, so that a Send from now on makes a new one;
// its DEALER closes with linger 0 (libzmq drops what it queued and releases
// the holds from its own threads), and its monitor goes with it.
ForgetResult ZmqTransport::Impl::Forget(const std::string& to, std::chrono::milliseconds max_wait) {
  std::shared_ptr<Peer> peer;
  {
    std::lock_guard lock(peers_mu_);
    auto it = peers_.find(to);
    if (it == peers_.end()) return {};
    peer = std::move(it->second);
    peers_.erase(it);
  }
  ForgetResult result;
  result.frames_pending = peer->holds->held_frames();
  links_.Unwatch(peer->watch);  // its close is no link event
  {
    std::lock_guard lock(peer->mu);
    peer->forgotten = true;
    if (peer->socket) {
      try {
        peer->socket.set(zmq::sockopt::linger, 0);
      } catch (const zmq::error_t&) {
        // ETERM: the transport is stopping; the context's end drops it all.
      }
      peer->socket.close();
    }
  }
  result.frames_still_held = peer->holds->WaitForRelease(max_wait);
  if (result.frames_still_held > 0) {
    TLOG_WARN("{}: forgetting {}: {} of {} frames sent to it still held after {} ms", address_, to,
              result.frames_still_held, result.frames_pending, max_wait.count());
  }
  return result;
}

void ZmqTransport::Impl::Stop() {
  state_.store(kStopping, std::memory_order_release);
  if (tls_delivering_transport == this) {
    // Inside the handler: the delivery thread cannot join itself. Make every
    // ZeroMQ call fail fast, close the outgoing sockets, and let the loop end
    // when the handler returns; Finish() (a later Stop, or the destructor)
    // terminates the context. ctx_ cannot change meanwhile: Finish joins us.
    if (ctx_) ctx_->shutdown();
    CloseDealers();
    WakeEveryone();
    return;
  }
  Finish();
}

void ZmqTransport::Impl::Finish() {
  std::lock_guard lock(lifecycle_mu_);
  state_.store(kStopping, std::memory_order_release);  // again under the lock: a racing Start cannot undo it
  if (ctx_) ctx_->shutdown();  // wakes the delivery thread with ETERM
  WakeEveryone();              // parked, or a borrower between polls
  if (thread_.joinable()) {
    if (thread_.get_id() == std::this_thread::get_id()) {
      thread_.detach();  // the last owner let go inside the handler; this is the loop's own exit
    } else {
      thread_.join();
    }
  }
  zap_.Join();    // woken by the shutdown; closes its socket
  links_.Join();  // woken by the shutdown; closes its monitors
  CloseDealers();
  {
    std::lock_guard router_lock(router_mu_);
    router_.close();  // already closed by the loop, unless it never ran
  }
  ctx_.reset();  // zmq_ctx_term: returns once every socket is closed
  ipc_file_.Remove();
}

TransportStats ZmqTransport::Impl::stats() const {
  TransportStats s;
  s.messages_sent = messages_sent_.load(std::memory_order_relaxed);
  s.messages_received = messages_received_.load(std::memory_order_relaxed);
  s.bytes_sent = bytes_sent_.load(std::memory_order_relaxed);
  s.bytes_received = bytes_received_.load(std::memory_order_relaxed);
  s.zmq_parts_sent = parts_sent_.load(std::memory_order_relaxed);
  s.zmq_parts_received = parts_received_.load(std::memory_order_relaxed);
  s.malformed_received = malformed_received_.load(std::memory_order_relaxed);
  s.auth_rejected = zap_.rejected();
  return s;
}

ZmqTransport::ZmqTransport(Options options) : impl_(std::make_shared<Impl>(std::move(options))) {}

ZmqTransport::~ZmqTransport() { impl_->Stop(); }

absl::Status ZmqTransport::Start(Handler handler) { return impl_->Start(impl_, std::move(handler)); }

const std::string& ZmqTransport::address() const { return impl_->address(); }

PeerBacklog ZmqTransport::Backlog(const std::string& to) const { return impl_->Backlog(to); }

ForgetResult ZmqTransport::Forget(const std::string& peer, std::chrono::milliseconds max_wait) {
  return impl_->Forget(peer, max_wait);
}

absl::Status ZmqTransport::Send(const std::string& to, Message message) {
  return impl_->Send(to, std::move(message));
}

void ZmqTransport::Stop() { impl_->Stop(); }

bool ZmqTransport::DeliverUntil(const std::function<bool()>& done, std::chrono::milliseconds max_wait) {
  std::shared_ptr<Impl> impl = impl_;  // the handler may destroy this object meanwhile
  return impl->DeliverUntil(done, max_wait);
}

void ZmqTransport::SetLinkHandler(LinkHandler handler) { impl_->SetLinkHandler(std::move(handler)); }

void ZmqTransport::WakeCallerDelivery() { impl_->WakeCallerDelivery(); }

TransportStats ZmqTransport::stats() const { return impl_->stats(); }

const ZmqTransport::Options& ZmqTransport::options() const { return impl_->options(); }

}  // namespace tessera

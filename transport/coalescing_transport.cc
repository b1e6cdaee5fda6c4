#include "transport/coalescing_transport.h"

#include <algorithm>
#include <bit>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/clock.h"
#include "common/logging.h"

namespace tessera {
namespace {

constexpr size_t kAlign = 8;
size_t Pad(size_t n) { return (n + kAlign - 1) & ~(kAlign - 1); }

// The transport whose handler this thread is running now (one handler call
// of one CoalescingTransport; a handler that delivers for another transport
// saves and restores it).
thread_local const CoalescingTransport* tl_dispatching = nullptr;

// How long the timer keeps ticking after the last held message before it
// sleeps until the next one (so that a steady stream of requests costs no
// wake-up of the timer per request).
constexpr Nanos kTimerLinger = 20 * kMillis;

// Logs at the 1st, 2nd, 4th, 8th, ... occurrence.
bool LogThisOne(uint64_t count) { return std::has_single_bit(count); }

}  // namespace

struct CoalescingTransport::Peer {
  explicit Peer(std::string a) : address(std::move(a)) {}
  const std::string address;
  std::mutex mu;
  std::vector<Message> held;   // guarded by mu
  size_t held_bytes = 0;       // their padded size in a batch; guarded by mu
  uint64_t held_raw_bytes = 0; // headers + frames (Backlog); guarded by mu
  std::atomic<Nanos> first_held{0};  // when the oldest held one was held; 0: none
  std::atomic<bool> owes{false};     // a message went to it and nothing came back since
  // What its messages to us (answers) weigh lately: a moving average of
  // their data bytes (a batch counts as its messages' mean).
  std::atomic<uint64_t> answer_bytes{0};
  bool listed_in_handler = false;    // in held_in_handler_ (the delivery thread's)
};

CoalescingTransport::CoalescingTransport(std::unique_ptr<Transport> inner, Options options)
    : inner_(std::move(inner)), options_(options) {}

CoalescingTransport::~CoalescingTransport() { Stop(); }

const std::string& CoalescingTransport::address() const { return inner_->address(); }

absl::Status CoalescingTransport::Start(Handler handler) {
  if (stopped_.load()) return absl::FailedPreconditionError("coalescing transport: Start after Stop");
  if (started_.load()) return absl::FailedPreconditionError("coalescing transport: started twice");
  if (options_.enabled && options_.hold_requests && options_.max_delay.count() <= 0) {
    return absl::InvalidArgumentError("coalescing transport: hold_requests needs a positive max_delay");
  }
  handler_ = std::move(handler);
  if (absl::Status s = inner_->Start([this](Message m) { OnMessage(std::move(m)); }); !s.ok()) return s;
  started_.store(true);
  if (options_.enabled && options_.hold_requests) timer_ = std::thread([this] { TimerLoop(); });
  return absl::OkStatus();
}

CoalescingTransport::Peer& CoalescingTransport::PeerFor(const std::string& to) {
  std::lock_guard lock(peers_mu_);
  auto it = peers_.find(to);
  if (it == peers_.end()) it = peers_.emplace(to, std::make_unique<Peer>(to)).first;
  return *it->second;
}

absl::Status CoalescingTransport::Send(const std::string& to, Message message) {
  if (!started_.load(std::memory_order_acquire) || stopped_.load(std::memory_order_acquire)) {
    return absl::FailedPreconditionError("coalescing transport: Send before Start or after Stop");
  }
  if (!options_.enabled) return inner_->Send(to, std::move(message));
  const size_t frame_bytes = message.FrameBytes();
  bool small = frame_bytes <= options_.max_message_bytes &&
               !(message.lendable && inner_->LendsTo(to, frame_bytes));
  size_t header_bytes = 0;
  if (small) {
    header_bytes = message.header.ByteSizeLong();
    small = header_bytes + frame_bytes <= options_.max_message_bytes;
  }
  for (const Buffer& f : message.frames) small = small && !f.remote();
  const bool in_handler = tl_dispatching == this;
  Peer& peer = PeerFor(to);
  std::unique_lock lock(peer.mu);
  // Requests wait for an answer only where answers are small: a request for
  // a large answer (a wide pull) gains nothing by going with others, and
  // holding it would leave the server idle while the caller reads the
  // answers it already has.
  const bool hold = small && !message.at_once &&
                    (in_handler || !peer.held.empty() ||
                              (options_.hold_requests && peer.owes.load(std::memory_order_relaxed) &&
                               peer.answer_bytes.load(std::memory_order_relaxed) <= options_.max_message_bytes));
  if (!hold) {
    if (!peer.held.empty()) SendHeldLocked(peer);
    peer.owes.store(true, std::memory_order_relaxed);
    return inner_->Send(to, std::move(message));
  }
  size_t padded = Pad(header_bytes);
  for (const Buffer& f : message.frames) padded += Pad(f.size());
  if (!peer.held.empty() &&
      (peer.held_bytes + padded > options_.max_batch_bytes || peer.held.size() >= options_.max_batch_messages)) {
    SendHeldLocked(peer);
  }
  const bool first = peer.held.empty();
  messages_held_.fetch_add(1, std::memory_order_relaxed);
  peer.held.push_back(std::move(message));
  peer.held_bytes += padded;
  peer.held_raw_bytes += header_bytes + frame_bytes;
  if (first) {
    peer.first_held.store(MonotonicNow(), std::memory_order_relaxed);
    held_peers_.fetch_add(1);  // seq_cst: against the timer's going idle (TimerLoop)
  }
  if (in_handler) {
    if (!peer.listed_in_handler) {
      peer.listed_in_handler = true;
      held_in_handler_.push_back(&peer);
    }
    return absl::OkStatus();
  }
  lock.unlock();
  if (first && timer_idle_.load()) {
    std::lock_guard tl(timer_mu_);
    timer_idle_.store(false, std::memory_order_relaxed);
    timer_cv_.notify_one();
  }
  return absl::OkStatus();
}

void CoalescingTransport::SendHeldLocked(Peer& peer) {
  if (peer.held.empty()) return;
  std::vector<Message> messages = std::move(peer.held);
  peer.held.clear();
  peer.held_bytes = 0;
  peer.held_raw_bytes = 0;
  peer.first_held.store(0, std::memory_order_relaxed);
  held_peers_.fetch_sub(1, std::memory_order_relaxed);
  peer.owes.store(true, std::memory_order_relaxed);
  const size_t n = messages.size();
  absl::Status status;
  if (n == 1) {
    status = inner_->Send(peer.address, std::move(messages[0]));
  } else {
    Message batch = PackBatch(messages);
    status = inner_->Send(peer.address, std::move(batch));
    if (status.ok()) {
      batches_sent_.fetch_add(1, std::memory_order_relaxed);
      messages_batched_.fetch_add(n, std::memory_order_relaxed);
    }
  }
  if (!status.ok()) {
    // Logged by failed send, not by message: a count that grows by a
    // batch's size at a time would step over the powers of two.
    const uint64_t failures = failed_sends_.fetch_add(1, std::memory_order_relaxed) + 1;
    const uint64_t errors = send_errors_.fetch_add(n, std::memory_order_relaxed) + n;
    if (LogThisOne(failures)) {
      TLOG_WARN("coalescing transport: {} held message(s) for {} not sent: {} ({} messages so far)", n,
                peer.address, status.message(), errors);
    }
  }
}

void CoalescingTransport::FlushPeer(Peer& peer) {
  std::lock_guard lock(peer.mu);
  SendHeldLocked(peer);
}

void CoalescingTransport::Flush() {
  if (held_peers_.load(std::memory_order_relaxed) == 0) return;
  std::vector<Peer*> peers;
  {
    std::lock_guard lock(peers_mu_);
    for (auto& [address, peer] : peers_) {
      if (peer->first_held.load(std::memory_order_relaxed) != 0) peers.push_back(peer.get());
    }
  }
  for (Peer* p : peers) FlushPeer(*p);
}

Message CoalescingTransport::PackBatch(std::vector<Message>& messages) {
  Message batch;
  proto::Batch& b = *batch.header.mutable_batch();
  size_t total = 0;
  for (Message& m : messages) {
    m.header.clear_sender_address();  // the batch's stands for every message
    const size_t h = m.header.ByteSizeLong();
    b.add_header_bytes(static_cast<uint32_t>(h));
    b.add_frame_counts(static_cast<uint32_t>(m.frames.size()));
    total += Pad(h);
    for (const Buffer& f : m.frames) {
      b.add_frame_bytes(f.size());
      total += Pad(f.size());
    }
  }
  Buffer payload = Buffer::Allocate(total);
  std::byte* out = payload.AsMutable<std::byte>().data();
  size_t at = 0;
  for (size_t i = 0; i < messages.size(); ++i) {
    Message& m = messages[i];
    const size_t h = b.header_bytes(static_cast<int>(i));
    // Empty headers and frames write nothing: a batch of only those has no
    // payload at all (`out` is null then, and null + 0 is not for memset).
    if (h > 0) {
      m.header.SerializeWithCachedSizesToArray(reinterpret_cast<uint8_t*>(out + at));
      std::memset(out + at + h, 0, Pad(h) - h);
    }
    at += Pad(h);
    uint64_t bytes = h;
    for (const Buffer& f : m.frames) {
      if (f.size() > 0) {
        std::memcpy(out + at, f.data(), f.size());
        std::memset(out + at + f.size(), 0, Pad(f.size()) - f.size());
      }
      at += Pad(f.size());
      bytes += f.size();
    }
    if (m.sent_bytes) m.sent_bytes->fetch_add(bytes, std::memory_order_relaxed);
  }
  if (!messages.empty()) batch.header.set_sender_id(messages[0].header.sender_id());
  batch.frames.push_back(std::move(payload));
  return batch;
}

absl::StatusOr<std::vector<Message>> CoalescingTransport::UnpackBatch(const Message& batch) {
  if (!batch.header.has_batch()) return absl::InvalidArgumentError("not a batch");
  const proto::Batch& b = batch.header.batch();
  const int n = b.header_bytes_size();
  if (n == 0) return absl::InvalidArgumentError("a batch of no messages");
  if (b.frame_counts_size() != n) {
    return absl::InvalidArgumentError(
        absl::StrCat("a batch of ", n, " headers gives frame counts for ", b.frame_counts_size()));
  }
  uint64_t frames_listed = 0;
  for (uint32_t c : b.frame_counts()) frames_listed += c;
  if (frames_listed != static_cast<uint64_t>(b.frame_bytes_size())) {
    return absl::InvalidArgumentError(absl::StrCat("a batch's frame counts add up to ", frames_listed, " but it sizes ",
                                                   b.frame_bytes_size(), " frames"));
  }
  if (batch.frames.size() != 1) {
    return absl::InvalidArgumentError(absl::StrCat("a batch has ", batch.frames.size(), " data frames, not 1"));
  }
  Buffer payload = batch.frames[0];
  if (payload.remote()) {  // a transport that lent it: read it here once
    Buffer local = Buffer::Allocate(payload.size());
    CopyRange range{0, local.AsMutable<std::byte>().data(), payload.size()};
    if (absl::Status s = payload.CopyOut({&range, 1}); !s.ok()) return s;
    payload = std::move(local);
  }
  const uint64_t size = payload.size();
  uint64_t at = 0;
  int frame = 0;
  std::vector<Message> out;
  out.reserve(n);
  for (int i = 0; i < n; ++i) {
    const uint64_t h = b.header_bytes(i);
    if (h > size - at) return absl::InvalidArgumentError(absl::StrCat("message ", i, "'s header runs past the batch"));
    Message m;
    if (!m.header.ParseFromArray(payload.data() + at, static_cast<int>(h))) {
      return absl::InvalidArgumentError(absl::StrCat("message ", i, "'s header does not parse"));
    }
    if (m.header.has_batch()) return absl::InvalidArgumentError(absl::StrCat("message ", i, " is itself a batch"));
    at = std::min<uint64_t>(size, at + Pad(h));
    uint64_t received = h;
    for (uint32_t k = 0; k < b.frame_counts(i); ++k, ++frame) {
      const uint64_t len = b.frame_bytes(frame);
      if (len > size - at) {
        return absl::InvalidArgumentError(absl::StrCat("message ", i, "'s frame ", k, " runs past the batch"));
      }
      m.frames.push_back(payload.Slice(at, len));
      at = std::min<uint64_t>(size, at + Pad(len));
      received += len;
    }
    m.header.set_sender_address(batch.header.sender_address());
    m.received_bytes = received;
    out.push_back(std::move(m));
  }
  if (at != size) {
    return absl::InvalidArgumentError(absl::StrCat("a batch of ", size, " bytes lays out only ", at));
  }
  return out;
}

void CoalescingTransport::OnMessage(Message message) {
  if (stopped_.load(std::memory_order_acquire)) return;
  Peer* sender = FindPeer(message.header.sender_address());
  if (sender != nullptr) {
    uint64_t bytes = message.FrameBytes();
    if (message.header.has_batch()) bytes /= std::max(1, message.header.batch().header_bytes_size());
    const uint64_t before = sender->answer_bytes.load(std::memory_order_relaxed);
    sender->answer_bytes.store((3 * before + bytes) / 4, std::memory_order_relaxed);
    // Before the handler runs: it may complete what a caller waits for,
    // whose next request must not find the answer still owed.
    sender->owes.store(false, std::memory_order_relaxed);
  }
  if (message.header.has_batch()) {
    absl::StatusOr<std::vector<Message>> messages = UnpackBatch(message);
    if (!messages.ok()) {
      const uint64_t bad = malformed_batches_.fetch_add(1, std::memory_order_relaxed) + 1;
      if (LogThisOne(bad)) {
        TLOG_WARN("coalescing transport: dropped a malformed batch from {}: {} ({} so far)",
                  message.header.sender_address(), messages.status().message(), bad);
      }
    } else {
      batches_received_.fetch_add(1, std::memory_order_relaxed);
      messages_unbatched_.fetch_add(messages->size(), std::memory_order_relaxed);
      // What the handler sends for the messages of a batch goes together
      // once it handled them all.
      const CoalescingTransport* outer = tl_dispatching;
      tl_dispatching = this;
      for (Message& m : *messages) {
        if (stopped_.load(std::memory_order_acquire)) break;
        handler_(std::move(m));
      }
      tl_dispatching = outer;
    }
  } else {
    handler_(std::move(message));
  }
  AfterDelivery(sender);
}

CoalescingTransport::Peer* CoalescingTransport::FindPeer(absl::string_view address) const {
  std::lock_guard lock(peers_mu_);
  auto it = peers_.find(address);
  return it == peers_.end() ? nullptr : it->second.get();
}

void CoalescingTransport::AfterDelivery(Peer* sender) {
  std::vector<Peer*> peers = std::move(held_in_handler_);
  held_in_handler_.clear();
  if (sender != nullptr) {
    if (sender->first_held.load(std::memory_order_relaxed) != 0 && !sender->listed_in_handler) peers.push_back(sender);
  }
  for (Peer* p : peers) {
    std::lock_guard lock(p->mu);
    p->listed_in_handler = false;
    SendHeldLocked(*p);
  }
}

void CoalescingTransport::TimerLoop() {
  const Nanos tick = std::max<Nanos>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(options_.max_delay).count() / 2, 1000);
  Nanos last_held = MonotonicNow();
  std::unique_lock lock(timer_mu_);
  while (!stopping_) {
    if (held_peers_.load(std::memory_order_relaxed) == 0 && MonotonicNow() - last_held > kTimerLinger) {
      // A Send that holds first counts held_peers_ and then reads
      // timer_idle_; this stores timer_idle_ and then reads held_peers_
      // (all sequentially consistent): one of the two sees the other.
      timer_idle_.store(true);
      if (held_peers_.load() == 0) {
        timer_cv_.wait(lock, [&] { return stopping_ || !timer_idle_.load(std::memory_order_relaxed); });
      }
      timer_idle_.store(false, std::memory_order_relaxed);
      last_held = MonotonicNow();
      continue;
    }
    timer_cv_.wait_for(lock, std::chrono::nanoseconds(tick));
    if (stopping_) break;
    lock.unlock();
    const Nanos now = MonotonicNow();
    std::vector<Peer*> due;
    bool any = false;
    {
      std::lock_guard pl(peers_mu_);
      for (auto& [address, peer] : peers_) {
        const Nanos since = peer->first_held.load(std::memory_order_relaxed);
        if (since == 0) continue;
        any = true;
        if (now - since >= tick) due.push_back(peer.get());
      }
    }
    if (any) last_held = now;
    for (Peer* p : due) {
      std::lock_guard pl(p->mu);
      if (p->first_held.load(std::memory_order_relaxed) == 0 || p->listed_in_handler) continue;
      timer_flushes_.fetch_add(1, std::memory_order_relaxed);
      SendHeldLocked(*p);
    }
    lock.lock();
  }
}

void CoalescingTransport::Stop() {
  if (stopped_.load(std::memory_order_acquire)) return;
  if (started_.load()) Flush();
  if (stopped_.exchange(true)) return;
  {
    std::lock_guard lock(timer_mu_);
    stopping_ = true;
    timer_cv_.notify_all();
  }
  if (timer_.joinable() && timer_.get_id() != std::this_thread::get_id()) timer_.join();
  inner_->Stop();
}

TransportStats CoalescingTransport::stats() const {
  TransportStats s = inner_->stats();
  s.malformed_received += malformed_batches_.load(std::memory_order_relaxed);
  s.coalesce_batches_sent = batches_sent_.load(std::memory_order_relaxed);
  s.coalesce_messages_batched = messages_batched_.load(std::memory_order_relaxed);
  s.coalesce_batches_received = batches_received_.load(std::memory_order_relaxed);
  s.coalesce_messages_unbatched = messages_unbatched_.load(std::memory_order_relaxed);
  s.coalesce_messages_held = messages_held_.load(std::memory_order_relaxed);
  return s;
}

CoalesceStats CoalescingTransport::coalesce_stats() const {
  CoalesceStats s;
  s.batches_sent = batches_sent_.load();
  s.messages_batched = messages_batched_.load();
  s.batches_received = batches_received_.load();
  s.messages_unbatched = messages_unbatched_.load();
  s.messages_held = messages_held_.load();
  s.timer_flushes = timer_flushes_.load();
  s.send_errors = send_errors_.load();
  return s;
}

bool CoalescingTransport::LendsTo(const std::string& to, size_t bytes) const { return inner_->LendsTo(to, bytes); }
bool CoalescingTransport::SameHostPath(const std::string& peer) const { return inner_->SameHostPath(peer); }

PeerBacklog CoalescingTransport::Backlog(const std::string& to) const {
  PeerBacklog b = inner_->Backlog(to);
  Peer* peer = FindPeer(to);
  if (peer != nullptr) {
    std::lock_guard lock(peer->mu);
    b.messages += peer->held.size();
    b.bytes += peer->held_raw_bytes;
  }
  return b;
}

ForgetResult CoalescingTransport::Forget(const std::string& to, std::chrono::milliseconds max_wait) {
  std::vector<Message> dropped;  // let go outside the lock
  if (Peer* peer = FindPeer(to); peer != nullptr) {
    std::lock_guard lock(peer->mu);
    if (!peer->held.empty()) {
      dropped = std::move(peer->held);
      peer->held.clear();
      peer->held_bytes = 0;
      peer->held_raw_bytes = 0;
      peer->first_held.store(0, std::memory_order_relaxed);
      held_peers_.fetch_sub(1, std::memory_order_relaxed);
    }
    peer->owes.store(false, std::memory_order_relaxed);
    peer->answer_bytes.store(0, std::memory_order_relaxed);
  }
  uint64_t frames = 0;
  for (const Message& m : dropped) {
    for (const Buffer& f : m.frames) frames += f.empty() ? 0 : 1;
  }
  const uint64_t messages = dropped.size();
  dropped.clear();
  ForgetResult result = inner_->Forget(to, max_wait);
  result.messages_dropped += messages;
  result.frames_pending += frames;
  return result;
}

void CoalescingTransport::SetLinkHandler(LinkHandler handler) { inner_->SetLinkHandler(std::move(handler)); }

bool CoalescingTransport::DeliverUntil(const std::function<bool()>& done, std::chrono::milliseconds max_wait) {
  Flush();
  return inner_->DeliverUntil(done, max_wait);
}

void CoalescingTransport::WakeCallerDelivery() { inner_->WakeCallerDelivery(); }

bool CoalescingTransport::PlacesInto(const std::string& from) const { return inner_->PlacesInto(from); }

absl::Status CoalescingTransport::PostDestination(const std::string& from, uint64_t request_id, uint32_t frame_index,
                                                  Buffer destination) {
  return inner_->PostDestination(from, request_id, frame_index, std::move(destination));
}

bool CoalescingTransport::CancelDestination(const std::string& from, uint64_t request_id, uint32_t frame_index) {
  return inner_->CancelDestination(from, request_id, frame_index);
}

}  // namespace tessera

#include "transport/shm_transport.h"

#include <atomic>
#include <chrono>
#include <cstring>
#include <mutex>
#include <map>
#include <shared_mutex>
#include <tuple>
#include <unordered_map>

#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "transport/cross_memory.h"
#include "transport/shm_ring.h"

namespace tessera {
namespace {

int64_t NowMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// The receiving side of one ring: its mapping and its release accounting.
// Kept alive by every Buffer that views it.
struct RingReader {
  RingReader(std::unique_ptr<shm::ShmSegment> s)
      : segment(std::move(s)), releaser(segment->LoadReleased()) {}
  std::unique_ptr<shm::ShmSegment> segment;
  shm::ShmRingReleaser releaser;
};

// Owner of one received frame's bytes: gives the space back when dropped.
// Made in place only: a copy's destructor would give the space back early.
struct RegionHold {
  RegionHold(std::shared_ptr<RingReader> r, uint64_t b) : reader(std::move(r)), begin(b) {}
  RegionHold(const RegionHold&) = delete;
  RegionHold& operator=(const RegionHold&) = delete;
  ~RegionHold() { reader->segment->StoreReleased(reader->releaser.Release(begin)); }
  std::shared_ptr<RingReader> reader;
  uint64_t begin;
};

// Where the releases of lent frames go: the transport while it runs.
// Shared with every lent Buffer, which may outlive the transport.
struct ReleaseSink {
  std::mutex mu;
  std::function<void(const std::string&, uint64_t)> release;  // empty once the transport stopped
  void Release(const std::string& lender, uint64_t id) {
    std::lock_guard lock(mu);
    if (release) release(lender, id);
  }
};

// One lent message's frames: released when the last of them is dropped.
struct LendGroup {
  LendGroup(std::shared_ptr<ReleaseSink> s, std::string l, uint64_t i)
      : sink(std::move(s)), lender(std::move(l)), id(i) {}
  LendGroup(const LendGroup&) = delete;
  LendGroup& operator=(const LendGroup&) = delete;
  ~LendGroup() { sink->Release(lender, id); }
  std::shared_ptr<ReleaseSink> sink;
  std::string lender;
  uint64_t id;
};

// One lent frame, read from the lender's memory on demand.
class LentFrame final : public RemoteBytes {
 public:
  LentFrame(std::shared_ptr<LendGroup> g, std::shared_ptr<xmem::ProcessHandle> p, uint64_t a)
      : group_(std::move(g)), process_(std::move(p)), address_(a) {}
  absl::Status Read(std::span<const CopyRange> ranges) const override { return process_->Read(address_, ranges); }

 private:
  std::shared_ptr<LendGroup> group_;
  std::shared_ptr<xmem::ProcessHandle> process_;
  uint64_t address_;
};

constexpr int64_t kSweepEveryMs = 100;  // how often a lender looks for readers that ended

}  // namespace

class ShmTransport::Impl {
 public:
  Impl(std::unique_ptr<Transport> inner, Options options)
      : inner_(std::move(inner)), options_(options), sink_(std::make_shared<ReleaseSink>()) {
    if (options_.host_identity == 0) options_.host_identity = shm::HostIdentity();
    sink_->release = [this](const std::string& lender, uint64_t id) { SendRelease(lender, id); };
  }

  absl::Status Start(Handler handler) {
    if (auto s = Validate(options_); !s.ok()) return s;
    if (options_.host_identity == 0) {
      return absl::FailedPreconditionError("shared memory: this host's identity cannot be determined");
    }
    handler_ = std::move(handler);
    absl::Status s = inner_->Start([this](Message m) { OnReceive(std::move(m)); });
    if (s.ok()) started_.store(true, std::memory_order_release);
    return s;
  }

  const std::string& address() const { return inner_->address(); }

  absl::Status Send(const std::string& to, Message message) {
    if (stopped_.load(std::memory_order_acquire)) return absl::FailedPreconditionError("transport stopped");
    message.header.clear_shm_frames();
    message.header.set_shm_host(options_.host_identity);
    std::shared_ptr<Peer> peer = PeerFor(to);
    if (options_.cross_memory) {
      const xmem::SelfIdentity self = xmem::Self();
      message.header.set_shm_pid(self.pid);
      message.header.set_shm_pid_namespace(self.pid_namespace);
      message.header.set_shm_probe(self.probe_address);
      message.header.set_shm_token(self.token);
      message.header.set_shm_reads_pid(peer->readable_pid.load(std::memory_order_relaxed));
    }
    const bool local = options_.assume_local_peers || peer->host.load(std::memory_order_relaxed) == options_.host_identity;
    if (!local || !HasLargeFrame(message)) {
      return inner_->Send(to, std::move(message));
    }
    // The inner transport counts the header and the frames left in the
    // message; the ring and lent bytes are counted here (stats() adds them).
    const std::shared_ptr<std::atomic<uint64_t>> sent_bytes = message.sent_bytes;
    if (message.lendable) SweepExitedReaders();
    std::unique_lock lock(peer->mu);
    // Lend (no copy; the peer reads the frames in place) when the peer has
    // proven it reads this process and the lent bytes stay in bounds.
    const bool lend = message.lendable && options_.cross_memory && peer->reads_us && peer->process != nullptr;
    std::vector<Buffer> lent;
    uint64_t lent_bytes = 0;
    const uint64_t id = lend ? next_lend_id_.fetch_add(1, std::memory_order_relaxed) : 0;  // unused ids are harmless
    for (size_t i = 0; i < message.frames.size(); ++i) {
      Buffer& frame = message.frames[i];
      if (frame.size() < options_.min_frame_bytes) continue;
      if (lend && frame.size() >= options_.min_lend_bytes && !frame.remote() &&
          peer->book.Fits(lent_bytes + frame.size(), options_.ring_bytes)) {
        proto::ShmFrame* d = message.header.add_shm_frames();
        d->set_index(static_cast<uint32_t>(i));
        d->set_address(reinterpret_cast<uint64_t>(frame.data()));
        d->set_length(frame.size());
        d->set_lend_id(id);
        lent_bytes += frame.size();
        lent.push_back(std::move(frame));
        frame = Buffer();
        continue;
      }
      std::optional<shm::Region> region = Place(to, *peer, frame.size());
      if (!region) {
        shm_fallback_frames_.fetch_add(1, std::memory_order_relaxed);
        continue;
      }
      std::memcpy(peer->ring->at(region->data), frame.data(), frame.size());
      proto::ShmFrame* d = message.header.add_shm_frames();
      d->set_index(static_cast<uint32_t>(i));
      d->set_ring(peer->ring->name());
      d->set_begin(region->begin);
      d->set_data(region->data);
      d->set_length(region->length);
      shm_frames_sent_.fetch_add(1, std::memory_order_relaxed);
      shm_bytes_sent_.fetch_add(frame.size(), std::memory_order_relaxed);
      if (sent_bytes) sent_bytes->fetch_add(frame.size(), std::memory_order_relaxed);
      frame = Buffer();
    }
    if (lent.empty()) return inner_->Send(to, std::move(message));
    const size_t lent_frames = lent.size();
    peer->book.Lend(id, std::move(lent));
    lent_bytes_now_.fetch_add(lent_bytes, std::memory_order_relaxed);
    if (!peer->lend_logged) {
      peer->lend_logged = true;
      TLOG_INFO("same-host peer {} (pid {}) reads our large frames in place (cross-memory, one copy)", to,
                peer->process->pid());
    }
    absl::Status sent = inner_->Send(to, std::move(message));
    if (!sent.ok()) {
      lent_bytes_now_.fetch_sub(peer->book.Release(id), std::memory_order_relaxed);
      return sent;
    }
    shm_lent_frames_sent_.fetch_add(lent_frames, std::memory_order_relaxed);
    shm_lent_bytes_sent_.fetch_add(lent_bytes, std::memory_order_relaxed);
    if (sent_bytes) sent_bytes->fetch_add(lent_bytes, std::memory_order_relaxed);
    return sent;
  }

  void Stop() {
    stopped_.store(true, std::memory_order_release);
    {
      // Lent frames dropped from now on release nothing (the lender keeps
      // them until this process ends; cross_memory.h).
      std::lock_guard lock(sink_->mu);
      sink_->release = nullptr;
    }
    inner_->Stop();
    {
      // No frame is placed any more (OnReceive has returned for good).
      std::lock_guard posted_lock(posted_mu_);
      posted_.clear();
      posted_count_.store(0, std::memory_order_relaxed);
    }
    // No Send or OnReceive runs past this point that could use a ring
    // (Send checks stopped_ before it takes a peer's lock).
    std::unique_lock lock(peers_mu_);
    for (auto& [address, peer] : peers_) {
      std::lock_guard peer_lock(peer->mu);
      peer->ring.reset();
    }
  }

  TransportStats stats() const {
    TransportStats s = inner_->stats();
    s.shm_frames_sent = shm_frames_sent_.load(std::memory_order_relaxed);
    s.shm_bytes_sent = shm_bytes_sent_.load(std::memory_order_relaxed);
    s.shm_frames_received = shm_frames_received_.load(std::memory_order_relaxed);
    s.shm_bytes_received = shm_bytes_received_.load(std::memory_order_relaxed);
    s.shm_fallback_frames = shm_fallback_frames_.load(std::memory_order_relaxed);
    s.shm_peers = shm_peers_.load(std::memory_order_relaxed);
    s.shm_lent_frames_sent = shm_lent_frames_sent_.load(std::memory_order_relaxed);
    s.shm_lent_bytes_sent = shm_lent_bytes_sent_.load(std::memory_order_relaxed);
    s.shm_lent_frames_received = shm_lent_frames_received_.load(std::memory_order_relaxed);
    s.shm_lent_bytes_received = shm_lent_bytes_received_.load(std::memory_order_relaxed);
    s.shm_lent_bytes_now = lent_bytes_now_.load(std::memory_order_relaxed);
    s.shm_lends_reclaimed = lends_reclaimed_.load(std::memory_order_relaxed);
    s.bytes_sent += s.shm_bytes_sent + s.shm_lent_bytes_sent;
    s.bytes_received += s.shm_bytes_received + s.shm_lent_bytes_received;
    s.malformed_received += malformed_.load(std::memory_order_relaxed);
    s.frames_placed += frames_placed_.load(std::memory_order_relaxed);
    s.bytes_placed += bytes_placed_.load(std::memory_order_relaxed);
    return s;
  }

  // Posted destinations (transport/transport.h). Frames are placed by the
  // delivery thread, under posted_mu_ for the whole copy, so that a Cancel
  // returns only once no copy into its memory is running.
  bool PlacesInto(const std::string& from) const {
    if (stopped_.load(std::memory_order_acquire)) return false;
    if (options_.assume_local_peers) return true;
    std::shared_lock lock(peers_mu_);
    auto it = peers_.find(from);
    return it != peers_.end() && it->second->host.load(std::memory_order_relaxed) == options_.host_identity;
  }
  absl::Status PostDestination(const std::string& from, uint64_t request_id, uint32_t frame_index,
                               Buffer destination) {
    if (!started_.load(std::memory_order_acquire) || stopped_.load(std::memory_order_acquire)) {
      return absl::FailedPreconditionError("transport not running");
    }
    if (destination.empty() || destination.remote()) {
      return absl::InvalidArgumentError("a posted destination must be local memory of at least one byte");
    }
    std::lock_guard lock(posted_mu_);
    auto [it, inserted] = posted_.try_emplace(PostedKey{from, request_id, frame_index}, std::move(destination));
    if (!inserted) {
      return absl::AlreadyExistsError(absl::StrCat("a destination is already posted for request ", request_id,
                                                   " frame ", frame_index, " from ", from));
    }
    posted_count_.fetch_add(1, std::memory_order_relaxed);
    return absl::OkStatus();
  }
  bool CancelDestination(const std::string& from, uint64_t request_id, uint32_t frame_index) {
    std::lock_guard lock(posted_mu_);
    if (posted_.erase(PostedKey{from, request_id, frame_index}) == 0) return false;
    posted_count_.fetch_sub(1, std::memory_order_relaxed);
    return true;
  }

  const Options& options() const { return options_; }

  // Caller delivery is the inner transport's: every message, ring frames
  // included, reaches this transport's handler through it.
  bool DeliverUntil(const std::function<bool()>& done, std::chrono::milliseconds max_wait) {
    return inner_->DeliverUntil(done, max_wait);
  }
  void WakeCallerDelivery() { inner_->WakeCallerDelivery(); }
  void Flush() { inner_->Flush(); }

  void SetLinkHandler(Transport::LinkHandler handler) { inner_->SetLinkHandler(std::move(handler)); }
  PeerBacklog Backlog(const std::string& to) const { return inner_->Backlog(to); }
  ForgetResult Forget(const std::string& to, std::chrono::milliseconds max_wait) {
    return inner_->Forget(to, max_wait);
  }
  bool LendsTo(const std::string& to, size_t bytes) const {
    if (!options_.cross_memory || bytes < options_.min_lend_bytes || stopped_.load(std::memory_order_acquire)) {
      return false;
    }
    std::shared_ptr<Peer> peer;
    {
      std::shared_lock lock(peers_mu_);
      auto it = peers_.find(to);
      if (it == peers_.end()) return false;
      peer = it->second;
    }
    std::lock_guard lock(peer->mu);
    return peer->reads_us && peer->process != nullptr;
  }

 private:
  struct Peer {
    std::atomic<uint64_t> host{0};
    std::mutex mu;  // orders ring placement and the inner Send for this destination
    std::unique_ptr<shm::ShmSegment> ring;
    std::optional<shm::ShmRingWriter> writer;
    bool disabled = false;  // a ring could not be made: wire only
    // Cross-memory reads (guarded by mu; readable_pid is also read without it).
    // Lends go only to a proven process, so `process` is set whenever `book`
    // holds anything.
    std::atomic<uint32_t> pid{0};                     // the pid the peer last advertised
    std::shared_ptr<xmem::ProcessHandle> process;     // that process, proven readable (or null)
    std::atomic<uint32_t> readable_pid{0};            // process->pid() once proven, else 0
    std::atomic<bool> reads_us{false};                // it proved it reads this process
    bool lend_logged = false;
    xmem::LendBook book;                              // our frames it holds
  };

  // Frame `index` of `m` (a ring view or a lent frame, just attached): copied
  // into the destination posted for it when there is one of its exact size;
  // the message then holds that destination instead, and the ring space or
  // the lend goes back as soon as nothing else of the message holds it. A
  // read that fails (the lender is gone) leaves the frame as it came and the
  // destination posted: its reader sees the same failure.
  void PlaceIfPosted(Message& m, uint32_t index) {
    if (posted_count_.load(std::memory_order_relaxed) == 0) return;
    Buffer& frame = m.frames[index];
    std::lock_guard lock(posted_mu_);
    auto it = posted_.find(PostedKey{m.header.sender_address(), m.header.request_id(), index});
    if (it == posted_.end() || it->second.size() != frame.size()) return;
    Buffer destination = it->second;
    const CopyRange whole{0, destination.mutable_data(), destination.size()};
    if (!frame.CopyOut({&whole, 1}).ok()) return;
    posted_.erase(it);
    posted_count_.fetch_sub(1, std::memory_order_relaxed);
    frames_placed_.fetch_add(1, std::memory_order_relaxed);
    bytes_placed_.fetch_add(destination.size(), std::memory_order_relaxed);
    frame = std::move(destination);
  }

  bool HasLargeFrame(const Message& m) const {
    for (const Buffer& f : m.frames) {
      if (f.size() >= options_.min_frame_bytes) return true;
    }
    return false;
  }

  std::shared_ptr<Peer> PeerFor(const std::string& address) {
    {
      std::shared_lock lock(peers_mu_);
      auto it = peers_.find(address);
      if (it != peers_.end()) return it->second;
    }
    std::unique_lock lock(peers_mu_);
    std::shared_ptr<Peer>& p = peers_[address];
    if (!p) p = std::make_shared<Peer>();
    return p;
  }

  // Space in `peer`'s ring for `length` bytes (making or replacing the ring
  // when needed), or nullopt: send the frame over the wire.
  std::optional<shm::Region> Place(const std::string& to, Peer& peer, uint64_t length) {
    if (peer.disabled || length > options_.ring_bytes / 2) return std::nullopt;
    if (!peer.ring && !MakeRing(to, peer)) return std::nullopt;
    const uint64_t released = peer.ring->LoadReleased();
    if (auto r = peer.writer->Allocate(length, released)) return r;
    if (!peer.writer->Stuck(released, NowMs(), options_.stuck_ms)) return std::nullopt;
    TLOG_WARN("shared memory to {}: ring {} has been full for {} ms with no space coming back (its receiver "
              "restarted, or messages were lost); replacing it",
              to, peer.ring->name(), options_.stuck_ms);
    peer.ring.reset();
    shm_peers_.fetch_sub(1, std::memory_order_relaxed);
    if (!MakeRing(to, peer)) return std::nullopt;
    return peer.writer->Allocate(length, peer.ring->LoadReleased());
  }

  bool MakeRing(const std::string& to, Peer& peer) {
    static std::once_flag cleaned;
    std::call_once(cleaned, [] {
      if (int n = shm::RemoveDeadRings(); n > 0) TLOG_INFO("removed {} ring files left by dead processes", n);
    });
    auto segment = shm::ShmSegment::Create(options_.ring_bytes);
    if (!segment.ok()) {
      TLOG_WARN("shared memory to {} is off: {}; its large frames go over the wire", to,
                segment.status().message());
      peer.disabled = true;
      return false;
    }
    peer.ring = std::move(*segment);
    peer.writer.emplace(peer.ring->capacity());
    shm_peers_.fetch_add(1, std::memory_order_relaxed);
    TLOG_INFO("same-host peer {}: frames of at least {} bytes go through shared memory (ring {}, {} MiB)", to,
              options_.min_frame_bytes, peer.ring->name(), peer.ring->capacity() >> 20);
    return true;
  }

  void OnReceive(Message m) {
    std::shared_ptr<Peer> peer;
    const std::string& sender = m.header.sender_address();
    if (const uint64_t host = m.header.shm_host(); host != 0 && !sender.empty()) {
      peer = PeerFor(sender);
      if (peer->host.load(std::memory_order_relaxed) != host) peer->host.store(host, std::memory_order_relaxed);
      if (options_.cross_memory && host == options_.host_identity) LearnProcess(*peer, m.header);
    }
    const bool internal = m.header.shm_internal();
    const uint32_t sender_pid = m.header.shm_pid();
    m.header.clear_shm_host();
    m.header.clear_shm_pid();
    m.header.clear_shm_pid_namespace();
    m.header.clear_shm_probe();
    m.header.clear_shm_token();
    m.header.clear_shm_reads_pid();
    m.header.clear_shm_released();
    m.header.clear_shm_internal();
    if (internal) return;  // releases only, taken above
    if (m.header.shm_frames_size() > 0) {
      if (absl::Status s = AttachFrames(m, peer.get(), sender_pid); !s.ok()) {
        // Lends in a message we drop are released at once (the sender keeps
        // them otherwise until this process ends).
        for (const proto::ShmFrame& d : m.header.shm_frames()) {
          if (d.lend_id() != 0 && !sender.empty()) {
            SendRelease(sender, d.lend_id());
            break;  // one lend per message
          }
        }
        m.frames.clear();
        malformed_.fetch_add(1, std::memory_order_relaxed);
        const uint64_t n = bad_logged_.fetch_add(1, std::memory_order_relaxed);
        if (n < 10 || n % 1000 == 0) {
          TLOG_WARN("dropped a message from {}: {}", sender, s.message());
        }
        return;
      }
      uint64_t bytes = 0, lent_bytes = 0, lent_frames = 0;
      for (const proto::ShmFrame& d : m.header.shm_frames()) {
        if (d.lend_id() != 0) {
          lent_bytes += d.length();
          ++lent_frames;
        } else {
          bytes += d.length();
        }
      }
      shm_frames_received_.fetch_add(m.header.shm_frames_size() - lent_frames, std::memory_order_relaxed);
      shm_bytes_received_.fetch_add(bytes, std::memory_order_relaxed);
      shm_lent_frames_received_.fetch_add(lent_frames, std::memory_order_relaxed);
      shm_lent_bytes_received_.fetch_add(lent_bytes, std::memory_order_relaxed);
      m.received_bytes += bytes + lent_bytes;  // the inner transport's count, plus what came through memory
      m.header.clear_shm_frames();
    }
    handler_(std::move(m));  // last: the handler may destroy this transport
  }

  // Cross-memory state from a same-host peer's header: proves once per peer
  // process that we can read it, takes its releases, and notes whether it
  // reads us. A new pid at the same address is a new process: what the old
  // one held lent is released.
  void LearnProcess(Peer& peer, const proto::Envelope& h) {
    const xmem::SelfIdentity self = xmem::Self();
    // Nothing new (the common case): no lock, so that receiving never waits
    // for a send to this peer copying into its ring.
    if (h.shm_pid() == peer.pid.load(std::memory_order_relaxed) && h.shm_released_size() == 0 &&
        (peer.readable_pid.load(std::memory_order_relaxed) != 0 && h.shm_reads_pid() == self.pid) ==
            peer.reads_us.load(std::memory_order_relaxed)) {
      return;
    }
    std::lock_guard lock(peer.mu);
    if (h.shm_pid() != peer.pid) {
      // Another process at this address. The one before may still be alive
      // (it stopped its transport but holds lent frames): its lends stay
      // until its own process ends.
      if (peer.book.lends() > 0) {
        std::lock_guard retired_lock(retired_mu_);
        retired_.push_back(Retired{peer.process, std::move(peer.book)});
        peer.book = xmem::LendBook();
      }
      peer.pid = h.shm_pid();
      peer.process.reset();
      peer.readable_pid.store(0, std::memory_order_relaxed);
      peer.reads_us = false;
      if (h.shm_pid() != 0 && h.shm_pid_namespace() == self.pid_namespace && self.pid_namespace != 0) {
        absl::Status s;
        if (auto handle = xmem::ProcessHandle::Open(h.shm_pid()); handle.ok()) {
          s = (*handle)->Verify(h.shm_probe(), h.shm_token());
          if (s.ok()) peer.process = std::move(*handle);
        } else {
          s = handle.status();
        }
        if (s.ok()) {
          peer.readable_pid.store(h.shm_pid(), std::memory_order_relaxed);
        } else {
          TLOG_INFO("cannot read the memory of same-host peer {} (pid {}): {}; its large frames come through the "
                    "ring",
                    h.sender_address(), h.shm_pid(), s.message());
        }
      }
    }
    peer.reads_us = peer.process != nullptr && h.shm_reads_pid() == self.pid;
    for (uint64_t id : h.shm_released()) lent_bytes_now_.fetch_sub(peer.book.Release(id), std::memory_order_relaxed);
  }

  // Drops every lend in `book`, held by process `pid`, which has ended.
  void ReclaimLocked(xmem::LendBook& book, uint32_t pid) {
    if (book.lends() == 0) return;
    const uint64_t bytes = book.lent_bytes();
    const size_t n = book.ReleaseAll();
    lent_bytes_now_.fetch_sub(bytes, std::memory_order_relaxed);
    lends_reclaimed_.fetch_add(n, std::memory_order_relaxed);
    TLOG_INFO("same-host reader pid {} ended holding {} lent frames ({} bytes); they are free again", pid, n, bytes);
  }

  // At most every kSweepEveryMs: frees what readers whose process ended held.
  void SweepExitedReaders() {
    if (lent_bytes_now_.load(std::memory_order_relaxed) == 0) return;
    const int64_t now = NowMs();
    int64_t last = last_sweep_ms_.load(std::memory_order_relaxed);
    if (now - last < kSweepEveryMs || !last_sweep_ms_.compare_exchange_strong(last, now)) return;
    std::vector<std::shared_ptr<Peer>> peers;
    {
      std::shared_lock lock(peers_mu_);
      for (const auto& [address, peer] : peers_) peers.push_back(peer);
    }
    for (const auto& peer : peers) {
      std::lock_guard lock(peer->mu);
      if (peer->book.lends() > 0 && peer->process && peer->process->Exited()) {
        ReclaimLocked(peer->book, peer->pid);
        peer->process.reset();
        peer->readable_pid.store(0, std::memory_order_relaxed);
        peer->reads_us = false;
      }
    }
    std::lock_guard lock(retired_mu_);
    for (auto it = retired_.begin(); it != retired_.end();) {
      if (it->process->Exited()) {
        ReclaimLocked(it->book, it->process->pid());
        it = retired_.erase(it);
      } else {
        ++it;
      }
    }
  }

  // Tells `lender` we are done with its lend `id`.
  void SendRelease(const std::string& lender, uint64_t id) {
    Message m;
    m.header.set_shm_internal(true);
    m.header.add_shm_released(id);
    (void)Send(lender, std::move(m));  // best effort: a lost release is reclaimed when this process ends
  }

  // Replaces every described frame with a view of its ring, or, for lent
  // frames, with a remote Buffer reading the sender's memory.
  absl::Status AttachFrames(Message& m, Peer* peer, uint32_t sender_pid) {
    std::shared_ptr<LendGroup> group;
    std::shared_ptr<xmem::ProcessHandle> process;
    for (const proto::ShmFrame& d : m.header.shm_frames()) {
      if (d.index() >= m.frames.size() || !m.frames[d.index()].empty()) {
        return absl::InvalidArgumentError(absl::StrCat("shared-memory frame index ", d.index(), " is not an empty frame"));
      }
      if (d.lend_id() != 0) {
        if (!group) {
          if (peer != nullptr) {
            std::lock_guard lock(peer->mu);
            if (sender_pid != 0 && peer->pid == sender_pid) process = peer->process;
          }
          if (!process) {
            return absl::FailedPreconditionError(
                absl::StrCat("frames lent by pid ", sender_pid, ", whose memory this process cannot read"));
          }
          group = std::make_shared<LendGroup>(sink_, m.header.sender_address(), d.lend_id());
        }
        if (d.lend_id() != group->id || d.length() == 0 || d.address() == 0) {
          return absl::InvalidArgumentError(absl::StrCat("bad lent frame: lend ", d.lend_id(), ", ", d.length(),
                                                         " bytes at ", d.address()));
        }
        m.frames[d.index()] =
            Buffer::Remote(std::make_shared<LentFrame>(group, process, d.address()), d.length());
        PlaceIfPosted(m, d.index());
        continue;
      }
      auto reader = ReaderFor(m.header.sender_address(), d.ring());
      if (!reader.ok()) return reader.status();
      const shm::Region region{d.begin(), d.data(), d.length()};
      if (auto s = shm::ValidateRegion(region, (*reader)->segment->capacity()); !s.ok()) return s;
      if (auto s = (*reader)->releaser.Arrived(region); !s.ok()) return s;
      auto hold = std::make_shared<RegionHold>(*reader, region.begin);
      std::byte* bytes = (*reader)->segment->at(region.data);
      m.frames[d.index()] = Buffer::Adopt(std::move(hold), bytes, region.length).MarkTransient();
      PlaceIfPosted(m, d.index());
    }
    return absl::OkStatus();
  }

  // The mapped ring `name` (only the delivery thread calls this). A sender
  // that moved to a new ring no longer needs the old entry; Buffers that view
  // the old ring keep its mapping alive on their own.
  absl::StatusOr<std::shared_ptr<RingReader>> ReaderFor(const std::string& sender, const std::string& name) {
    auto it = readers_.find(sender);
    if (it != readers_.end() && it->second->segment->name() == name) return it->second;
    auto segment = shm::ShmSegment::Open(name);
    if (!segment.ok()) return segment.status();
    auto reader = std::make_shared<RingReader>(std::move(*segment));
    readers_[sender] = reader;
    return reader;
  }

  std::unique_ptr<Transport> inner_;
  Options options_;
  Handler handler_;
  std::atomic<bool> started_{false};
  std::atomic<bool> stopped_{false};

  // Destinations posted for frames to come: (sender, request id, frame index).
  using PostedKey = std::tuple<std::string, uint64_t, uint32_t>;
  std::mutex posted_mu_;  // taken alone (never with a peer's mu or peers_mu_)
  std::map<PostedKey, Buffer> posted_ ABSL_GUARDED_BY(posted_mu_);
  std::atomic<size_t> posted_count_{0};  // posted_.size(), read without the lock
  std::atomic<uint64_t> frames_placed_{0}, bytes_placed_{0};

  mutable std::shared_mutex peers_mu_;
  std::unordered_map<std::string, std::shared_ptr<Peer>> peers_;
  std::unordered_map<std::string, std::shared_ptr<RingReader>> readers_;  // by sender address; delivery thread

  std::atomic<uint64_t> shm_frames_sent_{0}, shm_bytes_sent_{0}, shm_frames_received_{0}, shm_bytes_received_{0},
      shm_fallback_frames_{0}, shm_peers_{0}, malformed_{0}, bad_logged_{0};
  std::atomic<uint64_t> shm_lent_frames_sent_{0}, shm_lent_bytes_sent_{0}, shm_lent_frames_received_{0},
      shm_lent_bytes_received_{0}, lent_bytes_now_{0}, lends_reclaimed_{0};
  std::atomic<int64_t> last_sweep_ms_{0};
  std::atomic<uint64_t> next_lend_id_{1};
  // Lends held by a process that another one replaced at its address.
  struct Retired {
    std::shared_ptr<xmem::ProcessHandle> process;
    xmem::LendBook book;
  };
  std::mutex retired_mu_;  // after a peer's mu when both are held
  std::vector<Retired> retired_;
  std::shared_ptr<ReleaseSink> sink_;
};

ShmTransport::ShmTransport(std::unique_ptr<Transport> inner, Options options)
    : impl_(std::make_unique<Impl>(std::move(inner), options)) {}

ShmTransport::~ShmTransport() { impl_->Stop(); }

absl::Status ShmTransport::Start(Handler handler) { return impl_->Start(std::move(handler)); }
const std::string& ShmTransport::address() const { return impl_->address(); }
absl::Status ShmTransport::Send(const std::string& to, Message message) {
  return impl_->Send(to, std::move(message));
}
void ShmTransport::Stop() { impl_->Stop(); }
TransportStats ShmTransport::stats() const { return impl_->stats(); }
void ShmTransport::Flush() { impl_->Flush(); }
bool ShmTransport::LendsTo(const std::string& to, size_t bytes) const { return impl_->LendsTo(to, bytes); }
bool ShmTransport::SameHostPath(const std::string& peer) const { return impl_->PlacesInto(peer); }
PeerBacklog ShmTransport::Backlog(const std::string& to) const { return impl_->Backlog(to); }
ForgetResult ShmTransport::Forget(const std::string& peer, std::chrono::milliseconds max_wait) {
  return impl_->Forget(peer, max_wait);
}
void ShmTransport::SetLinkHandler(LinkHandler handler) { impl_->SetLinkHandler(std::move(handler)); }
bool ShmTransport::DeliverUntil(const std::function<bool()>& done, std::chrono::milliseconds max_wait) {
  return impl_->DeliverUntil(done, max_wait);
}
void ShmTransport::WakeCallerDelivery() { impl_->WakeCallerDelivery(); }
bool ShmTransport::PlacesInto(const std::string& from) const { return impl_->PlacesInto(from); }
absl::Status ShmTransport::PostDestination(const std::string& from, uint64_t request_id, uint32_t frame_index,
                                           Buffer destination) {
  return impl_->PostDestination(from, request_id, frame_index, std::move(destination));
}
bool ShmTransport::CancelDestination(const std::string& from, uint64_t request_id, uint32_t frame_index) {
  return impl_->CancelDestination(from, request_id, frame_index);
}

absl::Status ShmTransport::Validate(const Options& o) {
  if (o.ring_bytes < (1ull << 20) || (o.ring_bytes & (o.ring_bytes - 1)) != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("shared-memory ring_bytes must be a power of two of at least 1 MiB, got ", o.ring_bytes));
  }
  if (o.min_frame_bytes == 0 || o.min_frame_bytes > o.ring_bytes / 2) {
    return absl::InvalidArgumentError(absl::StrCat("shared-memory min_frame_bytes must be in [1, ring_bytes/2], got ",
                                                   o.min_frame_bytes));
  }
  if (o.stuck_ms <= 0) return absl::InvalidArgumentError("shared-memory stuck_ms must be positive");
  if (o.min_lend_bytes == 0) return absl::InvalidArgumentError("shared-memory min_lend_bytes must be positive");
  return absl::OkStatus();
}

}  // namespace tessera

#include "transport/shm_transport.h"

#include <atomic>
#include <chrono>
#include <cstring>
#include <mutex>
#include <shared_mutex>
#include <unordered_map>

#include "absl/strings/str_cat.h"
#include "common/logging.h"
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

}  // namespace

class ShmTransport::Impl {
 public:
  Impl(std::unique_ptr<Transport> inner, Options options)
      : inner_(std::move(inner)), options_(options) {
    if (options_.host_identity == 0) options_.host_identity = shm::HostIdentity();
  }

  absl::Status Start(Handler handler) {
    if (auto s = Validate(options_); !s.ok()) return s;
    if (options_.host_identity == 0) {
      return absl::FailedPreconditionError("shared memory: this host's identity cannot be determined");
    }
    handler_ = std::move(handler);
    return inner_->Start([this](Message m) { OnReceive(std::move(m)); });
  }

  const std::string& address() const { return inner_->address(); }

  absl::Status Send(const std::string& to, Message message) {
    if (stopped_.load(std::memory_order_acquire)) return absl::FailedPreconditionError("transport stopped");
    message.header.clear_shm_frames();
    message.header.set_shm_host(options_.host_identity);
    std::shared_ptr<Peer> peer = PeerFor(to);
    const bool local = options_.assume_local_peers || peer->host.load(std::memory_order_relaxed) == options_.host_identity;
    if (!local || !HasLargeFrame(message)) {
      return inner_->Send(to, std::move(message));
    }
    std::lock_guard lock(peer->mu);
    for (size_t i = 0; i < message.frames.size(); ++i) {
      Buffer& frame = message.frames[i];
      if (frame.size() < options_.min_frame_bytes) continue;
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
      frame = Buffer();
    }
    return inner_->Send(to, std::move(message));
  }

  void Stop() {
    stopped_.store(true, std::memory_order_release);
    inner_->Stop();
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
    s.bytes_sent += s.shm_bytes_sent;
    s.bytes_received += s.shm_bytes_received;
    s.malformed_received += malformed_.load(std::memory_order_relaxed);
    return s;
  }

  const Options& options() const { return options_; }

 private:
  struct Peer {
    std::atomic<uint64_t> host{0};
    std::mutex mu;  // orders ring placement and the inner Send for this destination
    std::unique_ptr<shm::ShmSegment> ring;
    std::optional<shm::ShmRingWriter> writer;
    bool disabled = false;  // a ring could not be made: wire only
  };

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
    if (const uint64_t host = m.header.shm_host(); host != 0 && !m.header.sender_address().empty()) {
      std::shared_ptr<Peer> peer = PeerFor(m.header.sender_address());
      if (peer->host.load(std::memory_order_relaxed) != host) peer->host.store(host, std::memory_order_relaxed);
    }
    m.header.clear_shm_host();
    if (m.header.shm_frames_size() > 0) {
      if (absl::Status s = AttachFrames(m); !s.ok()) {
        malformed_.fetch_add(1, std::memory_order_relaxed);
        const uint64_t n = bad_logged_.fetch_add(1, std::memory_order_relaxed);
        if (n < 10 || n % 1000 == 0) {
          TLOG_WARN("dropped a message from {}: {}", m.header.sender_address(), s.message());
        }
        return;
      }
      uint64_t bytes = 0;
      for (const proto::ShmFrame& d : m.header.shm_frames()) bytes += d.length();
      shm_frames_received_.fetch_add(m.header.shm_frames_size(), std::memory_order_relaxed);
      shm_bytes_received_.fetch_add(bytes, std::memory_order_relaxed);
      m.header.clear_shm_frames();
    }
    handler_(std::move(m));  // last: the handler may destroy this transport
  }

  // Replaces every described frame with a view of its ring.
  absl::Status AttachFrames(Message& m) {
    for (const proto::ShmFrame& d : m.header.shm_frames()) {
      if (d.index() >= m.frames.size() || !m.frames[d.index()].empty()) {
        return absl::InvalidArgumentError(absl::StrCat("shared-memory frame index ", d.index(), " is not an empty frame"));
      }
      auto reader = ReaderFor(m.header.sender_address(), d.ring());
      if (!reader.ok()) return reader.status();
      const shm::Region region{d.begin(), d.data(), d.length()};
      if (auto s = shm::ValidateRegion(region, (*reader)->segment->capacity()); !s.ok()) return s;
      if (auto s = (*reader)->releaser.Arrived(region); !s.ok()) return s;
      auto hold = std::make_shared<RegionHold>(*reader, region.begin);
      std::byte* bytes = (*reader)->segment->at(region.data);
      m.frames[d.index()] = Buffer::Adopt(std::move(hold), bytes, region.length);
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
  std::atomic<bool> stopped_{false};

  std::shared_mutex peers_mu_;
  std::unordered_map<std::string, std::shared_ptr<Peer>> peers_;
  std::unordered_map<std::string, std::shared_ptr<RingReader>> readers_;  // by sender address; delivery thread

  std::atomic<uint64_t> shm_frames_sent_{0}, shm_bytes_sent_{0}, shm_frames_received_{0}, shm_bytes_received_{0},
      shm_fallback_frames_{0}, shm_peers_{0}, malformed_{0}, bad_logged_{0};
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
  return absl::OkStatus();
}

}  // namespace tessera

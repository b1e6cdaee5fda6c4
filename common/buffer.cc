#include "common/buffer.h"

#include <bit>
#include <cstdlib>
#include <new>

#include "common/check.h"

namespace tessera {
namespace {

constexpr size_t kAlignment = 64;

std::byte* AlignedAlloc(size_t size) {
  size_t rounded = (size + kAlignment - 1) / kAlignment * kAlignment;
  if (rounded == 0) rounded = kAlignment;
  void* p = std::aligned_alloc(kAlignment, rounded);
  if (p == nullptr) throw std::bad_alloc();
  return static_cast<std::byte*>(p);
}

}  // namespace

Buffer Buffer::Allocate(size_t size) {
  if (size == 0) return Buffer();
  std::byte* data = AlignedAlloc(size);
  return Buffer(std::shared_ptr<void>(data, [](void* p) { std::free(p); }), data, size);
}

Buffer Buffer::CopyOf(const void* data, size_t size) {
  Buffer b = Allocate(size);
  if (size > 0) std::memcpy(b.mutable_data(), data, size);
  return b;
}

Buffer Buffer::Borrow(const void* data, size_t size) {
  return Buffer(nullptr, const_cast<std::byte*>(static_cast<const std::byte*>(data)), size);
}

Buffer Buffer::Adopt(std::shared_ptr<void> owner, void* data, size_t size) {
  return Buffer(std::move(owner), static_cast<std::byte*>(data), size);
}

Buffer Buffer::Remote(std::shared_ptr<const RemoteBytes> bytes, size_t size) {
  Buffer b;
  b.remote_ = std::move(bytes);
  b.size_ = size;
  return b;
}

Buffer Buffer::Slice(size_t offset, size_t length) const {
  TESSERA_CHECK(offset + length <= size_);
  if (remote_) {
    Buffer b = *this;
    b.remote_offset_ += offset;
    b.size_ = length;
    return b;
  }
  Buffer b(owner_, data_ + offset, length);
  b.transient_ = transient_;
  return b;
}

absl::Status Buffer::CopyOut(std::span<const CopyRange> ranges) const {
  // One range per row on some paths: checked in debug builds only.
  for (const CopyRange& r : ranges) TESSERA_DCHECK(r.offset + r.length <= size_);
  if (!remote_) {
    for (const CopyRange& r : ranges) {
      if (r.length > 0) std::memcpy(r.dst, data_ + r.offset, r.length);
    }
    return absl::OkStatus();
  }
  if (remote_offset_ == 0) return remote_->Read(ranges);
  std::vector<CopyRange> shifted(ranges.begin(), ranges.end());
  for (CopyRange& r : shifted) r.offset += remote_offset_;
  return remote_->Read(shifted);
}

struct BufferPool::State {
  explicit State(Options o) : options(o) {}
  ~State() {
    for (auto& cls : free_lists)
      for (std::byte* p : cls) std::free(p);
  }
  const Options options;
  mutable std::mutex mu;
  std::vector<std::vector<std::byte*>> free_lists ABSL_GUARDED_BY(mu) =
      std::vector<std::vector<std::byte*>>(64);
  size_t cached ABSL_GUARDED_BY(mu) = 0;
  uint64_t hits ABSL_GUARDED_BY(mu) = 0;
  uint64_t misses ABSL_GUARDED_BY(mu) = 0;

  void Return(std::byte* p, int cls) {
    size_t bytes = size_t{1} << cls;
    {
      std::lock_guard lock(mu);
      if (cached + bytes <= options.max_cached_bytes) {
        free_lists[cls].push_back(p);
        cached += bytes;
        return;
      }
    }
    std::free(p);
  }
};

BufferPool::BufferPool(Options options) : state_(std::make_shared<State>(options)) {}
BufferPool::~BufferPool() = default;

Buffer BufferPool::Get(size_t size) {
  if (size < state_->options.min_pooled_bytes) return Buffer::Allocate(size);
  int cls = std::bit_width(size - 1);  // 2^cls >= size
  std::byte* p = nullptr;
  {
    std::lock_guard lock(state_->mu);
    auto& list = state_->free_lists[cls];
    if (!list.empty()) {
      p = list.back();
      list.pop_back();
      state_->cached -= size_t{1} << cls;
      ++state_->hits;
    } else {
      ++state_->misses;
    }
  }
  if (p == nullptr) p = AlignedAlloc(size_t{1} << cls);
  std::weak_ptr<State> weak = state_;
  std::shared_ptr<void> owner(p, [weak, cls](void* raw) {
    auto* bytes = static_cast<std::byte*>(raw);
    if (auto state = weak.lock()) {
      state->Return(bytes, cls);
    } else {
      std::free(bytes);
    }
  });
  return Buffer::Adopt(std::move(owner), p, size);
}

uint64_t BufferPool::hits() const {
  std::lock_guard lock(state_->mu);
  return state_->hits;
}
uint64_t BufferPool::misses() const {
  std::lock_guard lock(state_->mu);
  return state_->misses;
}
size_t BufferPool::cached_bytes() const {
  std::lock_guard lock(state_->mu);
  return state_->cached;
}

}  // namespace tessera

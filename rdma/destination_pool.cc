#include "rdma/destination_pool.h"

#include <bit>
#include <cstdlib>
#include <new>

#include "rdma/invariant.h"

namespace tessera::rdma {

DestinationPool::Block::Block(size_t n) : bytes(n) {
  data = static_cast<std::byte*>(std::aligned_alloc(4096, n));
  if (data == nullptr) throw std::bad_alloc();
}

DestinationPool::Block::~Block() { std::free(data); }

DestinationPool::DestinationPool(Options options) : options_(options) {
  RDMA_CHECK(std::has_single_bit(options_.min_block_bytes) && options_.min_block_bytes >= 4096);
}

DestinationPool::Destination DestinationPool::Get(size_t length) {
  RDMA_CHECK(length > 0);
  const size_t want = length < options_.min_block_bytes ? options_.min_block_bytes : length;
  const int cls = std::bit_width(want - 1);
  RDMA_CHECK(cls < 64);
  std::shared_ptr<Block> block;
  for (const std::shared_ptr<Block>& candidate : classes_[cls]) {
    if (!candidate->lent.load(std::memory_order_acquire)) {
      block = candidate;
      ++reuses_;
      break;
    }
  }
  if (block == nullptr) {
    Trim();
    block = std::make_shared<Block>(size_t{1} << cls);
    classes_[cls].push_back(block);
    ++allocations_;
  }
  block->lent.store(true, std::memory_order_relaxed);
  // The token keeps the block alive while lent and hands it back when the
  // last copy of the buffer dies.
  std::shared_ptr<void> token(block.get(), [block](void*) { block->lent.store(false, std::memory_order_release); });
  Destination d;
  d.buffer = Buffer::Adopt(std::move(token), block->data, length);
  d.owner = block;
  d.block_address = block->data;
  d.block_bytes = block->bytes;
  return d;
}

void DestinationPool::Trim() {
  size_t idle = idle_bytes();
  for (auto& blocks : classes_) {
    for (auto it = blocks.begin(); it != blocks.end() && idle > options_.max_idle_bytes;) {
      if (!(*it)->lent.load(std::memory_order_acquire)) {
        idle -= (*it)->bytes;
        it = blocks.erase(it);
      } else {
        ++it;
      }
    }
  }
}

size_t DestinationPool::blocks() const {
  size_t n = 0;
  for (const auto& blocks : classes_) n += blocks.size();
  return n;
}

size_t DestinationPool::idle_bytes() const {
  size_t n = 0;
  for (const auto& blocks : classes_) {
    for (const auto& b : blocks) {
      if (!b->lent.load(std::memory_order_acquire)) n += b->bytes;
    }
  }
  return n;
}

}  // namespace tessera::rdma

#pragma once
// DestinationPool: the memory rendezvous writes land in on the receiving
// side (when the receiver did not pre-post a destination), recycled so that
// each block is registered once and hits the RegistrationCache afterwards.
//
// Contract:
// - Get(length) returns a Destination whose `buffer` is exactly `length`
//   bytes of a block of a power-of-two size class (at least min_block_bytes,
//   page aligned). The block is lent until every copy of `buffer` (and of
//   slices of it) is gone; then it is free for a later Get. The last copy may
//   die on any thread (the hand-back is an atomic flag with release/acquire
//   ordering, so the next writer cannot overtake the last reader).
// - `owner` identifies the block for RegistrationCache::Acquire: the same
//   block always presents the same owner, so its registration is reused.
//   Register the whole block (block_address, block_bytes).
// - Idle blocks beyond max_idle_bytes are freed at the next Get (a block lent
//   out when the pool is destroyed stays valid until its buffer dies).
// - Thread safety: Get and the statistics are for the owner's thread (under
//   its lock); only the hand-back of buffers is thread-safe.
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "common/buffer.h"

namespace tessera::rdma {

class DestinationPool {
 public:
  struct Options {
    size_t min_block_bytes = 4096;       // smallest block (also the alignment)
    size_t max_idle_bytes = 256u << 20;  // free blocks kept for reuse, at most
  };
  struct Destination {
    Buffer buffer;
    std::shared_ptr<void> owner;
    void* block_address = nullptr;
    size_t block_bytes = 0;
  };

  DestinationPool() : DestinationPool(Options{}) {}
  explicit DestinationPool(Options options);
  DestinationPool(const DestinationPool&) = delete;
  DestinationPool& operator=(const DestinationPool&) = delete;

  Destination Get(size_t length);

  size_t blocks() const;
  size_t idle_bytes() const;
  uint64_t reuses() const { return reuses_; }
  uint64_t allocations() const { return allocations_; }

 private:
  struct Block {
    explicit Block(size_t n);
    ~Block();
    std::byte* data;
    size_t bytes;
    std::atomic<bool> lent{false};
  };
  void Trim();

  const Options options_;
  std::vector<std::vector<std::shared_ptr<Block>>> classes_ = std::vector<std::vector<std::shared_ptr<Block>>>(64);
  uint64_t reuses_ = 0;
  uint64_t allocations_ = 0;
};

}  // namespace tessera::rdma

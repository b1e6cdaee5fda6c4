#pragma once
// RegistrationCache: memory registrations of large user buffers, reused
// across operations, with the pinned total bounded.
//
// Registrar is the seam to the hardware: the verbs shell registers with
// ibv_reg_mr / ibv_dereg_mr, tests use a fake that counts pinned bytes.
//
// Contract:
// - Acquire(address, length, owner) returns a Lease whose keys cover
//   [address, address + length). Registrations cover whole pages (the range
//   is rounded out to page_bytes), so neighbouring buffers of one allocation
//   share an entry. A request hits an existing entry when the entry's range
//   covers it and the entry was made for the same owner (the shared_ptr that
//   keeps the memory alive, compared by control block) and that owner is
//   still alive. Otherwise a new registration is made.
// - Staleness: a registration pins the pages it was made on. If the memory
//   were freed and the addresses handed out again, a cached registration
//   would point at the old pages. The cache therefore never hits on an entry
//   whose owner has expired (expired entries are deregistered at the next
//   Acquire), and never caches memory without an owner (owner == nullptr:
//   borrowed memory): such a registration is private to its lease and is
//   deregistered when the lease is released.
// - Bound: pinned_bytes() never exceeds max_pinned_bytes. To make room the
//   cache deregisters unused entries, least recently used first. Entries in
//   use (leases not yet released) are never evicted.
// - Refusal: when the rounded request is larger than max_pinned_bytes it is
//   refused with OutOfRange; when it would fit only if leases in use were
//   released, with ResourceExhausted (retry after a Release). A failing
//   Registrar's status is passed through. A refusal changes nothing but the
//   eviction of unused entries it tried.
// - Release(entry) ends one lease (a lease released twice is a bug: abort).
// - The destructor deregisters every entry; the owner must have stopped all
//   operations that use them.
// - Thread safety: none; used under the owner's lock.
#include <cstddef>
#include <cstdint>
#include <list>
#include <map>
#include <memory>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"

namespace tessera::rdma {

struct MemoryRegistration {
  uint64_t handle = 0;  // the registrar's own id (the shell: the ibv_mr pointer)
  uint32_t lkey = 0;
  uint32_t rkey = 0;
};

class Registrar {
 public:
  virtual ~Registrar() = default;
  // Registers [address, address + length) for local access and remote writes.
  virtual absl::StatusOr<MemoryRegistration> Register(uintptr_t address, size_t length) = 0;
  virtual void Deregister(const MemoryRegistration& registration) = 0;
};

class RegistrationCache {
 public:
  struct Options {
    size_t max_pinned_bytes = 1ull << 30;  // bound on registered bytes (page-rounded)
    size_t page_bytes = 4096;              // registrations are rounded out to this (a power of two)
  };
  struct Lease {
    uint64_t entry = 0;  // pass to Release
    uint32_t lkey = 0;
    uint32_t rkey = 0;
  };

  RegistrationCache(Options options, Registrar& registrar);
  ~RegistrationCache();
  RegistrationCache(const RegistrationCache&) = delete;
  RegistrationCache& operator=(const RegistrationCache&) = delete;

  absl::StatusOr<Lease> Acquire(const void* address, size_t length, const std::shared_ptr<void>& owner);
  void Release(uint64_t entry);

  // Whether a request of `length` bytes at `address` could ever be granted.
  bool CouldFit(const void* address, size_t length) const;

  size_t max_pinned_bytes() const { return options_.max_pinned_bytes; }
  size_t pinned_bytes() const { return pinned_bytes_; }
  size_t high_water_bytes() const { return high_water_bytes_; }
  size_t in_use_bytes() const { return in_use_bytes_; }
  size_t entries() const { return entries_.size(); }
  uint64_t hits() const { return hits_; }
  uint64_t misses() const { return misses_; }
  uint64_t evictions() const { return evictions_; }
  uint64_t refusals() const { return refusals_; }

 private:
  struct Entry {
    uintptr_t begin = 0;
    uintptr_t end = 0;
    std::weak_ptr<void> owner;
    bool cacheable = false;  // false: borrowed memory, deregistered when unused
    MemoryRegistration registration;
    uint32_t leases = 0;
    std::list<uint64_t>::iterator lru_position;  // valid while leases == 0
  };

  void Remove(uint64_t id);
  void PurgeExpired();
  bool EvictOne();

  const Options options_;
  Registrar& registrar_;
  // Invariants: pinned_bytes_ = sum of (end - begin) over entries_ <=
  // max_pinned_bytes; in_use_bytes_ = the same sum over entries with
  // leases > 0; lru_ holds exactly the entries with leases == 0 (cacheable
  // ones only: an unused borrowed entry is removed at once), oldest first;
  // by_begin_ indexes every entry by its begin address.
  absl::flat_hash_map<uint64_t, Entry> entries_;
  std::multimap<uintptr_t, uint64_t> by_begin_;
  std::list<uint64_t> lru_;
  uint64_t next_id_ = 1;
  size_t pinned_bytes_ = 0;
  size_t high_water_bytes_ = 0;
  size_t in_use_bytes_ = 0;
  uint64_t hits_ = 0;
  uint64_t misses_ = 0;
  uint64_t evictions_ = 0;
  uint64_t refusals_ = 0;
};

}  // namespace tessera::rdma

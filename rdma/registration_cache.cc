#include "rdma/registration_cache.h"

#include <iterator>

#include "absl/strings/str_cat.h"
#include "rdma/invariant.h"

namespace tessera::rdma {
namespace {

bool SameOwner(const std::weak_ptr<void>& a, const std::shared_ptr<void>& b) {
  return !a.owner_before(b) && !b.owner_before(a);
}

}  // namespace

RegistrationCache::RegistrationCache(Options options, Registrar& registrar)
    : options_(options), registrar_(registrar) {
  RDMA_CHECK(options_.page_bytes > 0 && (options_.page_bytes & (options_.page_bytes - 1)) == 0);
}

RegistrationCache::~RegistrationCache() {
  for (auto& [id, entry] : entries_) registrar_.Deregister(entry.registration);
}

bool RegistrationCache::CouldFit(const void* address, size_t length) const {
  const uintptr_t a = reinterpret_cast<uintptr_t>(address);
  const uintptr_t mask = options_.page_bytes - 1;
  const uintptr_t begin = a & ~mask;
  const uintptr_t end = (a + length + mask) & ~mask;
  return end - begin <= options_.max_pinned_bytes;
}

absl::StatusOr<RegistrationCache::Lease> RegistrationCache::Acquire(const void* address, size_t length,
                                                                     const std::shared_ptr<void>& owner) {
  RDMA_CHECK(length > 0);
  const uintptr_t a = reinterpret_cast<uintptr_t>(address);
  const uintptr_t mask = options_.page_bytes - 1;
  const uintptr_t begin = a & ~mask;
  const uintptr_t end = (a + length + mask) & ~mask;

  if (owner != nullptr) {
    // Entries starting at or below `begin`, nearest first.
    for (auto it = by_begin_.upper_bound(begin); it != by_begin_.begin();) {
      --it;
      Entry& e = entries_.at(it->second);
      if (!e.cacheable || e.end < a + length || !SameOwner(e.owner, owner) || e.owner.expired()) continue;
      if (e.leases == 0) {
        lru_.erase(e.lru_position);
        in_use_bytes_ += e.end - e.begin;
      }
      ++e.leases;
      ++hits_;
      return Lease{it->second, e.registration.lkey, e.registration.rkey};
    }
  }
  ++misses_;

  const size_t bytes = end - begin;
  if (bytes > options_.max_pinned_bytes) {
    ++refusals_;
    return absl::OutOfRangeError(absl::StrCat("registering ", length, " bytes (", bytes,
                                              " page-rounded) exceeds max_pinned_bytes ",
                                              options_.max_pinned_bytes));
  }
  PurgeExpired();
  while (pinned_bytes_ + bytes > options_.max_pinned_bytes && EvictOne()) {
  }
  if (pinned_bytes_ + bytes > options_.max_pinned_bytes) {
    ++refusals_;
    return absl::ResourceExhaustedError(absl::StrCat("registering ", bytes, " bytes would exceed max_pinned_bytes ",
                                                     options_.max_pinned_bytes, ": ", in_use_bytes_,
                                                     " bytes are held by operations in flight"));
  }
  absl::StatusOr<MemoryRegistration> registration = registrar_.Register(begin, bytes);
  if (!registration.ok()) {
    ++refusals_;
    return registration.status();
  }
  const uint64_t id = next_id_++;
  Entry& e = entries_[id];
  e.begin = begin;
  e.end = end;
  e.owner = owner;
  e.cacheable = owner != nullptr;
  e.registration = *registration;
  e.leases = 1;
  by_begin_.emplace(begin, id);
  pinned_bytes_ += bytes;
  in_use_bytes_ += bytes;
  if (pinned_bytes_ > high_water_bytes_) high_water_bytes_ = pinned_bytes_;
  return Lease{id, e.registration.lkey, e.registration.rkey};
}

void RegistrationCache::Release(uint64_t id) {
  auto it = entries_.find(id);
  RDMA_CHECK(it != entries_.end() && it->second.leases > 0);
  Entry& e = it->second;
  if (--e.leases > 0) return;
  in_use_bytes_ -= e.end - e.begin;
  if (!e.cacheable || e.owner.expired()) {
    Remove(id);
    return;
  }
  e.lru_position = lru_.insert(lru_.end(), id);
}

void RegistrationCache::Remove(uint64_t id) {
  auto it = entries_.find(id);
  RDMA_CHECK(it != entries_.end());
  Entry& e = it->second;
  registrar_.Deregister(e.registration);
  pinned_bytes_ -= e.end - e.begin;
  for (auto [lo, hi] = by_begin_.equal_range(e.begin); lo != hi; ++lo) {
    if (lo->second == id) {
      by_begin_.erase(lo);
      break;
    }
  }
  entries_.erase(it);
}

void RegistrationCache::PurgeExpired() {
  for (auto it = lru_.begin(); it != lru_.end();) {
    const uint64_t id = *it;
    if (entries_.at(id).owner.expired()) {
      it = lru_.erase(it);
      Remove(id);
    } else {
      ++it;
    }
  }
}

bool RegistrationCache::EvictOne() {
  if (lru_.empty()) return false;
  const uint64_t id = lru_.front();
  lru_.pop_front();
  Remove(id);
  ++evictions_;
  return true;
}

}  // namespace tessera::rdma

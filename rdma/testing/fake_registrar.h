#pragma once
// FakeRegistrar: a Registrar for tests. Registrations are bookkeeping only;
// it counts pinned bytes, records the largest total it ever saw and how
// often a registration pushed the total over `bound`, and checks keys and
// ranges the way an adapter would (Covers).
#include <cstdint>
#include <map>

#include "absl/status/statusor.h"
#include "rdma/registration_cache.h"

namespace tessera::rdma::testing {

class FakeRegistrar final : public Registrar {
 public:
  explicit FakeRegistrar(size_t bound = SIZE_MAX) : bound_(bound) {}

  absl::StatusOr<MemoryRegistration> Register(uintptr_t address, size_t length) override {
    if (fail_next_ > 0) {
      --fail_next_;
      return absl::ResourceExhaustedError("fake registrar: cannot pin (memlock)");
    }
    const uint64_t id = next_++;
    regions_[id] = Region{address, length};
    pinned_ += length;
    if (pinned_ > high_water_) high_water_ = pinned_;
    if (pinned_ > bound_) ++violations_;
    ++registers_;
    return MemoryRegistration{id, static_cast<uint32_t>(0x1000 + id), static_cast<uint32_t>(0x80000000u + id)};
  }

  void Deregister(const MemoryRegistration& registration) override {
    auto it = regions_.find(registration.handle);
    if (it == regions_.end()) {
      ++bad_deregisters_;
      return;
    }
    pinned_ -= it->second.length;
    regions_.erase(it);
    ++deregisters_;
  }

  // Whether [address, address + length) lies inside a live registration
  // whose remote (or local) key is `key`.
  bool Covers(uint32_t key, bool remote, uintptr_t address, size_t length) const {
    for (const auto& [id, r] : regions_) {
      const uint32_t k = remote ? static_cast<uint32_t>(0x80000000u + id) : static_cast<uint32_t>(0x1000 + id);
      if (k == key && address >= r.address && address + length <= r.address + r.length) return true;
    }
    return false;
  }

  void FailNext(int n) { fail_next_ = n; }
  size_t pinned() const { return pinned_; }
  size_t high_water() const { return high_water_; }
  uint64_t violations() const { return violations_; }
  uint64_t registers() const { return registers_; }
  uint64_t deregisters() const { return deregisters_; }
  uint64_t bad_deregisters() const { return bad_deregisters_; }
  size_t live() const { return regions_.size(); }

 private:
  struct Region {
    uintptr_t address;
    size_t length;
  };
  const size_t bound_;
  std::map<uint64_t, Region> regions_;
  uint64_t next_ = 1;
  size_t pinned_ = 0;
  size_t high_water_ = 0;
  uint64_t violations_ = 0;
  uint64_t registers_ = 0;
  uint64_t deregisters_ = 0;
  uint64_t bad_deregisters_ = 0;
  int fail_next_ = 0;
};

}  // namespace tessera::rdma::testing

#include "rdma/registration_cache.h"

#include <memory>
#include <random>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "rdma/testing/fake_registrar.h"

namespace tessera::rdma {
namespace {

using ::testing::HasSubstr;
using testing::FakeRegistrar;

constexpr size_t kPage = 4096;

// Page-aligned memory owned by a shared_ptr, like a Buffer's owner.
struct Memory {
  explicit Memory(size_t bytes)
      : owner(std::shared_ptr<std::byte>(static_cast<std::byte*>(std::aligned_alloc(kPage, bytes)),
                                         [](std::byte* p) { std::free(p); })),
        bytes(bytes) {}
  std::byte* data() const { return owner.get(); }
  std::shared_ptr<std::byte> owner;
  size_t bytes;
};

RegistrationCache::Options Bound(size_t bytes) { return {.max_pinned_bytes = bytes, .page_bytes = kPage}; }

TEST(rdmaRegistrationCacheTest, SubRangeOfTheSameOwnerHits) {
  FakeRegistrar reg;
  RegistrationCache cache(Bound(1 << 20), reg);
  Memory m(16 * kPage);
  absl::StatusOr<RegistrationCache::Lease> a = cache.Acquire(m.data(), m.bytes, m.owner);
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_TRUE(reg.Covers(a->rkey, true, reinterpret_cast<uintptr_t>(m.data()), m.bytes));
  cache.Release(a->entry);
  absl::StatusOr<RegistrationCache::Lease> b = cache.Acquire(m.data() + 5000, 20000, m.owner);
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(b->entry, a->entry);
  EXPECT_EQ(b->lkey, a->lkey);
  EXPECT_EQ(cache.hits(), 1u);
  EXPECT_EQ(cache.misses(), 1u);
  EXPECT_EQ(reg.registers(), 1u);
  cache.Release(b->entry);
}

TEST(rdmaRegistrationCacheTest, RangesAreRoundedToPages) {
  FakeRegistrar reg;
  RegistrationCache cache(Bound(1 << 20), reg);
  Memory m(4 * kPage);
  absl::StatusOr<RegistrationCache::Lease> a = cache.Acquire(m.data() + 100, 10, m.owner);
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(cache.pinned_bytes(), kPage);
  // Another buffer in the same page of the same allocation hits.
  absl::StatusOr<RegistrationCache::Lease> b = cache.Acquire(m.data() + 2000, 100, m.owner);
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(b->entry, a->entry);
  // A range crossing into the next page does not.
  absl::StatusOr<RegistrationCache::Lease> c = cache.Acquire(m.data() + 4000, 200, m.owner);
  ASSERT_TRUE(c.ok());
  EXPECT_NE(c->entry, a->entry);
  EXPECT_EQ(cache.pinned_bytes(), kPage + 2 * kPage);
  for (auto* l : {&*a, &*b, &*c}) cache.Release(l->entry);
}

TEST(rdmaRegistrationCacheTest, AnotherOwnerAtTheSameAddressMisses) {
  FakeRegistrar reg;
  RegistrationCache cache(Bound(1 << 20), reg);
  Memory m(2 * kPage);
  std::shared_ptr<void> impostor = std::make_shared<int>(1);  // same bytes, different owner
  auto a = cache.Acquire(m.data(), m.bytes, m.owner);
  ASSERT_TRUE(a.ok());
  cache.Release(a->entry);
  auto b = cache.Acquire(m.data(), m.bytes, impostor);
  ASSERT_TRUE(b.ok());
  EXPECT_NE(b->entry, a->entry);
  EXPECT_EQ(reg.registers(), 2u);
  cache.Release(b->entry);
}

TEST(rdmaRegistrationCacheTest, ExpiredOwnersNeverHitAndArePurged) {
  FakeRegistrar reg;
  RegistrationCache cache(Bound(1 << 20), reg);
  uintptr_t address = 0;
  {
    Memory m(2 * kPage);
    address = reinterpret_cast<uintptr_t>(m.data());
    auto a = cache.Acquire(m.data(), m.bytes, m.owner);
    ASSERT_TRUE(a.ok());
    cache.Release(a->entry);
    EXPECT_EQ(cache.entries(), 1u);
  }  // the memory is freed; its registration is stale
  Memory other(kPage);
  auto b = cache.Acquire(other.data(), other.bytes, other.owner);
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(cache.entries(), 1u) << "the stale entry was not purged";
  EXPECT_EQ(reg.live(), 1u);
  EXPECT_EQ(reg.deregisters(), 1u);
  (void)address;
  cache.Release(b->entry);
}

TEST(rdmaRegistrationCacheTest, BorrowedMemoryIsNeverCached) {
  FakeRegistrar reg;
  RegistrationCache cache(Bound(1 << 20), reg);
  Memory m(kPage);
  auto a = cache.Acquire(m.data(), m.bytes, nullptr);
  ASSERT_TRUE(a.ok());
  auto b = cache.Acquire(m.data(), m.bytes, nullptr);
  ASSERT_TRUE(b.ok());
  EXPECT_NE(a->entry, b->entry);
  EXPECT_EQ(cache.hits(), 0u);
  cache.Release(a->entry);
  cache.Release(b->entry);
  EXPECT_EQ(cache.entries(), 0u);
  EXPECT_EQ(reg.pinned(), 0u);
  EXPECT_EQ(reg.deregisters(), 2u);
}

TEST(rdmaRegistrationCacheTest, LeastRecentlyUsedUnusedEntryIsEvictedFirst) {
  FakeRegistrar reg(4 * kPage);
  RegistrationCache cache(Bound(4 * kPage), reg);
  Memory m1(2 * kPage), m2(kPage), m3(kPage), m4(2 * kPage);
  auto a = cache.Acquire(m1.data(), m1.bytes, m1.owner);
  auto b = cache.Acquire(m2.data(), m2.bytes, m2.owner);
  auto c = cache.Acquire(m3.data(), m3.bytes, m3.owner);
  ASSERT_TRUE(a.ok() && b.ok() && c.ok());
  cache.Release(b->entry);  // unused: b (oldest), then a, then c
  cache.Release(a->entry);
  cache.Release(c->entry);
  // Touch b again so that a becomes the least recently used.
  auto b2 = cache.Acquire(m2.data(), m2.bytes, m2.owner);
  ASSERT_TRUE(b2.ok());
  cache.Release(b2->entry);
  // 2 pages more: pinned is 4 pages, so a (2 pages) must go, and only a.
  auto d = cache.Acquire(m4.data(), m4.bytes, m4.owner);
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(cache.evictions(), 1u);
  EXPECT_EQ(cache.pinned_bytes(), 4 * kPage);
  auto b3 = cache.Acquire(m2.data(), m2.bytes, m2.owner);
  auto c3 = cache.Acquire(m3.data(), m3.bytes, m3.owner);
  ASSERT_TRUE(b3.ok() && c3.ok());
  EXPECT_EQ(cache.hits(), 3u);  // b2, b3, c3
  EXPECT_EQ(reg.violations(), 0u);
  for (auto* l : {&*d, &*b3, &*c3}) cache.Release(l->entry);
}

TEST(rdmaRegistrationCacheTest, EntriesInUseAreNeverEvictedAndRefusalIsClear) {
  FakeRegistrar reg(4 * kPage);
  RegistrationCache cache(Bound(4 * kPage), reg);
  Memory m1(3 * kPage), m2(2 * kPage);
  auto a = cache.Acquire(m1.data(), m1.bytes, m1.owner);
  ASSERT_TRUE(a.ok());
  auto b = cache.Acquire(m2.data(), m2.bytes, m2.owner);
  ASSERT_FALSE(b.ok());
  EXPECT_EQ(b.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(b.status().message()), HasSubstr("held by operations in flight"));
  EXPECT_EQ(cache.evictions(), 0u);
  EXPECT_EQ(cache.refusals(), 1u);
  EXPECT_TRUE(reg.Covers(a->lkey, false, reinterpret_cast<uintptr_t>(m1.data()), m1.bytes));
  // Released, the same request fits (by evicting the now unused entry).
  cache.Release(a->entry);
  b = cache.Acquire(m2.data(), m2.bytes, m2.owner);
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(cache.evictions(), 1u);
  EXPECT_EQ(reg.violations(), 0u);
  cache.Release(b->entry);
}

TEST(rdmaRegistrationCacheTest, LargerThanTheBoundIsOutOfRange) {
  FakeRegistrar reg;
  RegistrationCache cache(Bound(4 * kPage), reg);
  Memory m(5 * kPage);
  EXPECT_FALSE(cache.CouldFit(m.data(), m.bytes));
  EXPECT_TRUE(cache.CouldFit(m.data(), 4 * kPage));
  auto a = cache.Acquire(m.data(), m.bytes, m.owner);
  EXPECT_EQ(a.status().code(), absl::StatusCode::kOutOfRange);
  EXPECT_THAT(std::string(a.status().message()), HasSubstr("exceeds max_pinned_bytes"));
  EXPECT_EQ(reg.registers(), 0u);
}

TEST(rdmaRegistrationCacheTest, RegistrarFailurePassesThrough) {
  FakeRegistrar reg;
  RegistrationCache cache(Bound(1 << 20), reg);
  Memory m(kPage);
  reg.FailNext(1);
  auto a = cache.Acquire(m.data(), m.bytes, m.owner);
  EXPECT_THAT(std::string(a.status().message()), HasSubstr("memlock"));
  EXPECT_EQ(cache.entries(), 0u);
  auto b = cache.Acquire(m.data(), m.bytes, m.owner);
  ASSERT_TRUE(b.ok());
  cache.Release(b->entry);
}

TEST(rdmaRegistrationCacheTest, DestructorDeregistersEverything) {
  FakeRegistrar reg;
  Memory m1(kPage), m2(kPage);
  {
    RegistrationCache cache(Bound(1 << 20), reg);
    auto a = cache.Acquire(m1.data(), m1.bytes, m1.owner);
    auto b = cache.Acquire(m2.data(), m2.bytes, m2.owner);
    ASSERT_TRUE(a.ok() && b.ok());
    cache.Release(a->entry);
  }
  EXPECT_EQ(reg.pinned(), 0u);
  EXPECT_EQ(reg.bad_deregisters(), 0u);
}

TEST(rdmaRegistrationCacheTest, RandomWorkloadNeverExceedsTheBound) {
  constexpr size_t kBound = 64 * kPage;
  FakeRegistrar reg(kBound);
  RegistrationCache cache(Bound(kBound), reg);
  std::vector<Memory> memory;
  for (int i = 0; i < 40; ++i) memory.emplace_back((1 + i % 9) * kPage);
  std::mt19937 rng(7);
  std::vector<uint64_t> held;
  int granted = 0, refused = 0;
  for (int step = 0; step < 5000; ++step) {
    if (!held.empty() && (rng() % 3 == 0 || held.size() > 12)) {
      const size_t i = rng() % held.size();
      cache.Release(held[i]);
      held.erase(held.begin() + static_cast<long>(i));
      continue;
    }
    Memory& m = memory[rng() % memory.size()];
    const size_t offset = rng() % m.bytes;
    const size_t length = 1 + rng() % (m.bytes - offset);
    auto lease = cache.Acquire(m.data() + offset, length, m.owner);
    if (lease.ok()) {
      ++granted;
      ASSERT_TRUE(reg.Covers(lease->rkey, true, reinterpret_cast<uintptr_t>(m.data() + offset), length));
      held.push_back(lease->entry);
    } else {
      ++refused;
      ASSERT_EQ(lease.status().code(), absl::StatusCode::kResourceExhausted) << lease.status();
    }
    ASSERT_LE(cache.pinned_bytes(), kBound);
    ASSERT_EQ(cache.pinned_bytes(), reg.pinned());
  }
  for (uint64_t e : held) cache.Release(e);
  EXPECT_EQ(cache.in_use_bytes(), 0u);
  EXPECT_EQ(reg.violations(), 0u);
  EXPECT_LE(reg.high_water(), kBound);
  EXPECT_GT(granted, 1000);
  EXPECT_GT(cache.hits(), 100u);
  EXPECT_GT(cache.evictions(), 0u);
  (void)refused;
}

}  // namespace
}  // namespace tessera::rdma

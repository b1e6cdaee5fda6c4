// Tests of the small resource accountants: CreditWindow, SlotPool, DestinationPool.
#include <set>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "rdma/credit_window.h"
#include "rdma/destination_pool.h"
#include "rdma/slot_pool.h"

namespace tessera::rdma {
namespace {

TEST(rdmaCreditsTest, ConsumeUntilEmptyThenReturn) {
  CreditWindow w(/*local_window=*/8, /*peer_window=*/4);
  EXPECT_EQ(w.ReceiveSlots(), 8u + CreditWindow::kReservedSlots);
  for (int i = 0; i < 4; ++i) EXPECT_TRUE(w.TryConsume());
  EXPECT_FALSE(w.TryConsume());
  EXPECT_EQ(w.available(), 0u);
  EXPECT_TRUE(w.OnReturned(3).ok());
  EXPECT_EQ(w.available(), 3u);
  // Returning more than was taken is a protocol violation and changes nothing.
  absl::Status s = w.OnReturned(2);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(w.available(), 3u);
  EXPECT_TRUE(w.OnReturned(1).ok());
  EXPECT_EQ(w.available(), 4u);
}

TEST(rdmaCreditsTest, ExplicitUpdateAtHalfTheWindow) {
  CreditWindow w(/*local_window=*/7, /*peer_window=*/7);
  EXPECT_EQ(w.UpdateThreshold(), 4u);  // ceil(7 / 2)
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(w.OnRegularReceived().ok());
  EXPECT_FALSE(w.ShouldSendUpdate());
  ASSERT_TRUE(w.OnRegularReceived().ok());
  EXPECT_TRUE(w.ShouldSendUpdate());
  EXPECT_EQ(w.TakeReturnable(), 4);
  EXPECT_EQ(w.returnable(), 0u);
  EXPECT_FALSE(w.ShouldSendUpdate());

  CreditWindow one(1, 1);
  EXPECT_EQ(one.UpdateThreshold(), 1u);
}

TEST(rdmaCreditsTest, OverrunIsDetected) {
  CreditWindow w(2, 2);
  ASSERT_TRUE(w.OnRegularReceived().ok());
  ASSERT_TRUE(w.OnRegularReceived().ok());
  // All credits of the window are returnable here: the peer cannot hold one.
  EXPECT_EQ(w.OnRegularReceived().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(w.overruns(), 1u);
  EXPECT_EQ(w.returnable(), 2u);
}

TEST(rdmaSlotPoolTest, ExhaustionCountsWaitsAndRecovers) {
  std::vector<std::byte> region(4 * 1024 + 100);  // 4 slots and a remainder
  SlotPool pool(region, 1024, 77);
  EXPECT_EQ(pool.slot_count(), 4u);
  EXPECT_EQ(pool.lkey(), 77u);
  std::set<uint32_t> got;
  for (int i = 0; i < 4; ++i) {
    std::optional<uint32_t> s = pool.Acquire();
    ASSERT_TRUE(s.has_value());
    got.insert(*s);
  }
  EXPECT_EQ(got.size(), 4u);
  EXPECT_EQ(pool.in_use(), 4u);
  EXPECT_EQ(pool.free_slots(), 0u);
  EXPECT_FALSE(pool.Acquire().has_value());
  EXPECT_FALSE(pool.Acquire().has_value());
  EXPECT_EQ(pool.waits(), 2u);
  pool.Release(*got.begin());
  EXPECT_EQ(pool.in_use(), 3u);
  std::optional<uint32_t> again = pool.Acquire();
  ASSERT_TRUE(again.has_value());
  EXPECT_EQ(*again, *got.begin());
  EXPECT_EQ(pool.high_water(), 4u);
  EXPECT_EQ(pool.acquires(), 5u);
}

TEST(rdmaSlotPoolTest, SlotsAreDisjointPiecesOfTheRegion) {
  std::vector<std::byte> region(8 * 512);
  SlotPool pool(region, 512, 1);
  for (uint32_t i = 0; i < pool.slot_count(); ++i) {
    std::span<std::byte> m = pool.Memory(i);
    EXPECT_EQ(m.size(), 512u);
    EXPECT_EQ(m.data(), region.data() + i * 512);
    EXPECT_EQ(pool.Address(i), reinterpret_cast<uint64_t>(region.data() + i * 512));
  }
}

TEST(rdmaSlotPoolTest, DoubleReleaseAborts) {
  std::vector<std::byte> region(2048);
  SlotPool pool(region, 1024, 1);
  const uint32_t s = *pool.Acquire();
  pool.Release(s);
  EXPECT_DEATH(pool.Release(s), "invariant failed");
}

TEST(rdmaDestinationPoolTest, BlocksComeBackOnlyWhenEveryCopyIsGone) {
  DestinationPool pool;
  DestinationPool::Destination a = pool.Get(10000);
  EXPECT_EQ(a.buffer.size(), 10000u);
  EXPECT_EQ(a.block_bytes, 16384u);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(a.block_address) % 4096, 0u);
  const void* block = a.block_address;
  Buffer slice = a.buffer.Slice(100, 10);
  a.buffer = Buffer();
  // A slice still holds the block: a new Get of the same class gets another one.
  DestinationPool::Destination b = pool.Get(9000);
  EXPECT_NE(b.block_address, block);
  EXPECT_EQ(pool.allocations(), 2u);
  slice = Buffer();
  DestinationPool::Destination c = pool.Get(12000);
  EXPECT_EQ(c.block_address, block);
  EXPECT_EQ(pool.reuses(), 1u);
  // The owner identifies the block across lendings.
  EXPECT_EQ(c.owner.get(), a.owner.get());
}

TEST(rdmaDestinationPoolTest, HandBackFromAnotherThread) {
  DestinationPool pool;
  DestinationPool::Destination a = pool.Get(5000);
  const void* block = a.block_address;
  std::thread t([buffer = std::move(a.buffer)]() mutable { buffer = Buffer(); });
  t.join();
  EXPECT_EQ(pool.Get(5000).block_address, block);
}

TEST(rdmaDestinationPoolTest, IdleBytesAreBounded) {
  DestinationPool pool(DestinationPool::Options{.min_block_bytes = 4096, .max_idle_bytes = 64 * 1024});
  std::vector<DestinationPool::Destination> held;
  for (int i = 0; i < 8; ++i) held.push_back(pool.Get(32 * 1024));
  held.clear();  // 8 x 32 KiB idle
  EXPECT_EQ(pool.idle_bytes(), 8u * 32 * 1024);
  // A Get of a class with no idle block trims the idle ones down to the bound.
  DestinationPool::Destination big = pool.Get(100 * 1024);
  EXPECT_LE(pool.idle_bytes(), 64u * 1024);
}

}  // namespace
}  // namespace tessera::rdma

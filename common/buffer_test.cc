#include "common/buffer.h"

#include <atomic>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <string>
#include <thread>
#include <vector>

#include "gtest/gtest.h"

namespace tessera {
namespace {

bool AlignedTo(const void* p, uintptr_t alignment) { return reinterpret_cast<uintptr_t>(p) % alignment == 0; }

TEST(BufferTest, DefaultIsEmpty) {
  Buffer b;
  EXPECT_TRUE(b.empty());
  EXPECT_EQ(b.size(), 0u);
  EXPECT_EQ(b.data(), nullptr);
  EXPECT_EQ(b.owner(), nullptr);
}

TEST(BufferTest, TheTransientMarkIsKeptBySlicesAndCopiesOnly) {
  Buffer b = Buffer::Allocate(64);
  EXPECT_FALSE(b.transient());
  Buffer t = Buffer(b).MarkTransient();
  EXPECT_TRUE(t.transient());
  EXPECT_FALSE(b.transient()) << "marking a copy leaves the original as it was";
  EXPECT_TRUE(t.Slice(8, 16).transient());
  const Buffer copy = t;
  EXPECT_TRUE(copy.transient());
  EXPECT_EQ(t.data(), b.data());
}

TEST(BufferTest, AllocateGivesAlignedOwnedStorage) {
  for (size_t size : {1u, 7u, 64u, 100u, 4096u, 1u << 20}) {
    Buffer b = Buffer::Allocate(size);
    EXPECT_EQ(b.size(), size);
    EXPECT_NE(b.owner(), nullptr);
    EXPECT_TRUE(AlignedTo(b.data(), 64)) << size;
    std::memset(b.mutable_data(), 0xab, size);  // writable over its whole length
  }
  EXPECT_TRUE(Buffer::Allocate(0).empty());
}

TEST(BufferTest, CopyOfCopiesTheBytes) {
  std::vector<uint8_t> source(1000);
  std::iota(source.begin(), source.end(), 0);
  Buffer b = Buffer::CopyOf(source.data(), source.size());
  source.assign(source.size(), 0);  // the copy must not change
  ASSERT_EQ(b.size(), 1000u);
  for (size_t i = 0; i < b.size(); ++i) ASSERT_EQ(static_cast<uint8_t>(b.data()[i]), static_cast<uint8_t>(i));
  EXPECT_TRUE(Buffer::CopyOf(nullptr, 0).empty());
}

TEST(BufferTest, BorrowDoesNotOwnOrCopy) {
  std::vector<float> values = {1.0f, 2.0f, 3.0f};
  Buffer b = Buffer::Borrow(values.data(), values.size() * sizeof(float));
  EXPECT_EQ(b.owner(), nullptr);
  EXPECT_EQ(static_cast<const void*>(b.data()), static_cast<const void*>(values.data()));
  values[1] = 5.0f;
  EXPECT_EQ(b.As<float>()[1], 5.0f);
}

TEST(BufferTest, CopiesShareBytesAndKeepThemAlive) {
  auto released = std::make_shared<std::atomic<bool>>(false);
  std::vector<uint64_t>* storage = new std::vector<uint64_t>{10, 20, 30, 40};
  std::shared_ptr<void> owner(storage, [released](void* p) {
    delete static_cast<std::vector<uint64_t>*>(p);
    released->store(true);
  });
  Buffer slice;
  {
    Buffer a = Buffer::Adopt(std::move(owner), storage->data(), storage->size() * sizeof(uint64_t));
    Buffer copy = a;
    EXPECT_EQ(copy.data(), a.data());  // shared, not copied
    slice = a.Slice(sizeof(uint64_t), 2 * sizeof(uint64_t));
    EXPECT_FALSE(released->load());
  }
  EXPECT_FALSE(released->load()) << "a slice must keep the owner alive";
  ASSERT_EQ(slice.As<uint64_t>().size(), 2u);
  EXPECT_EQ(slice.As<uint64_t>()[0], 20u);
  EXPECT_EQ(slice.As<uint64_t>()[1], 30u);
  slice = Buffer();
  EXPECT_TRUE(released->load());
}

// Remote bytes for the test: a local vector read through the interface,
// recording the reads and failing on demand.
class FakeRemote final : public RemoteBytes {
 public:
  explicit FakeRemote(std::vector<uint8_t> bytes, std::shared_ptr<int> reads, std::shared_ptr<bool> released)
      : bytes_(std::move(bytes)), reads_(std::move(reads)), released_(std::move(released)) {}
  ~FakeRemote() override { *released_ = true; }
  absl::Status Read(std::span<const CopyRange> ranges) const override {
    ++*reads_;
    if (fail) return absl::UnavailableError("lender gone");
    for (const CopyRange& r : ranges) std::memcpy(r.dst, bytes_.data() + r.offset, r.length);
    return absl::OkStatus();
  }
  bool fail = false;

 private:
  std::vector<uint8_t> bytes_;
  std::shared_ptr<int> reads_;
  std::shared_ptr<bool> released_;
};

TEST(BufferTest, RemoteBuffersReadThroughCopyOutWithSliceOffsets) {
  auto reads = std::make_shared<int>(0);
  auto released = std::make_shared<bool>(false);
  std::vector<uint8_t> bytes(100);
  for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<uint8_t>(i);
  auto remote = std::make_shared<FakeRemote>(bytes, reads, released);
  FakeRemote* raw = remote.get();
  Buffer slice;
  {
    Buffer b = Buffer::Remote(std::move(remote), bytes.size());
    EXPECT_TRUE(b.remote());
    EXPECT_EQ(b.data(), nullptr);
    EXPECT_EQ(b.size(), 100u);
    slice = b.Slice(10, 50).Slice(5, 20);  // bytes 15..34
  }
  EXPECT_FALSE(*released) << "a slice keeps the lent bytes";
  EXPECT_TRUE(slice.remote());
  EXPECT_EQ(slice.size(), 20u);
  uint8_t a[4] = {}, c[3] = {};
  const CopyRange ranges[] = {{0, a, 4}, {17, c, 3}};
  ASSERT_TRUE(slice.CopyOut(ranges).ok());
  EXPECT_EQ(*reads, 1) << "all ranges in one read";
  EXPECT_EQ(a[0], 15);
  EXPECT_EQ(a[3], 18);
  EXPECT_EQ(c[0], 32);
  EXPECT_EQ(c[2], 34);
  raw->fail = true;
  EXPECT_EQ(slice.CopyOut(ranges).code(), absl::StatusCode::kUnavailable);
  slice = Buffer();
  EXPECT_TRUE(*released);
}

TEST(BufferTest, LocalBuffersCopyOutByMemcpy) {
  Buffer b = Buffer::CopyOf("abcdefgh", 8);
  EXPECT_FALSE(b.remote());
  char x[3] = {}, y[2] = {};
  const CopyRange ranges[] = {{1, x, 3}, {6, y, 2}};
  ASSERT_TRUE(b.Slice(0, 8).CopyOut(ranges).ok());
  EXPECT_EQ(std::string(x, 3), "bcd");
  EXPECT_EQ(std::string(y, 2), "gh");
}

TEST(BufferTest, TypedViews) {
  Buffer b = Buffer::Allocate(4 * sizeof(float));
  auto values = b.AsMutable<float>();
  ASSERT_EQ(values.size(), 4u);
  for (size_t i = 0; i < 4; ++i) values[i] = static_cast<float>(i) * 0.5f;
  EXPECT_EQ(b.As<float>()[3], 1.5f);
  EXPECT_EQ(b.As<uint8_t>().size(), 16u);
}

TEST(BufferPoolTest, GetReturnsExactSizeAligned) {
  BufferPool pool;
  for (size_t size : {size_t{1}, size_t{100}, size_t{64 * 1024}, size_t{100'000}, size_t{1} << 20}) {
    Buffer b = pool.Get(size);
    EXPECT_EQ(b.size(), size);
    EXPECT_TRUE(AlignedTo(b.data(), 64)) << size;
    std::memset(b.mutable_data(), 1, size);
  }
}

TEST(BufferPoolTest, ReleasedBlocksAreReused) {
  BufferPool pool;
  const std::byte* first_data = nullptr;
  {
    Buffer b = pool.Get(100'000);
    first_data = b.data();
    EXPECT_EQ(pool.misses(), 1u);
    EXPECT_EQ(pool.hits(), 0u);
    EXPECT_EQ(pool.cached_bytes(), 0u);
  }
  EXPECT_EQ(pool.cached_bytes(), 128u * 1024);  // the power-of-two class of 100'000
  Buffer again = pool.Get(120'000);              // same size class
  EXPECT_EQ(pool.hits(), 1u);
  EXPECT_EQ(again.data(), first_data);
  EXPECT_EQ(pool.cached_bytes(), 0u);
  Buffer other_class = pool.Get(300'000);
  EXPECT_EQ(pool.misses(), 2u);
}

TEST(BufferPoolTest, SmallRequestsAreNotPooled) {
  BufferPool pool(BufferPool::Options{.min_pooled_bytes = 4096, .max_cached_bytes = 1 << 20});
  { Buffer b = pool.Get(100); }
  EXPECT_EQ(pool.cached_bytes(), 0u);
  EXPECT_EQ(pool.hits() + pool.misses(), 0u);
}

TEST(BufferPoolTest, CacheIsBounded) {
  BufferPool pool(BufferPool::Options{.min_pooled_bytes = 1024, .max_cached_bytes = 64 * 1024});
  {
    std::vector<Buffer> held;
    for (int i = 0; i < 10; ++i) held.push_back(pool.Get(16 * 1024));
  }
  EXPECT_EQ(pool.cached_bytes(), 64u * 1024);  // four of the ten 16 KiB blocks kept
}

TEST(BufferPoolTest, BuffersMayOutliveThePool) {
  Buffer survivor;
  {
    BufferPool pool;
    survivor = pool.Get(1 << 17);
    std::memset(survivor.mutable_data(), 7, survivor.size());
  }
  EXPECT_EQ(static_cast<int>(survivor.data()[survivor.size() - 1]), 7);
  survivor = Buffer();  // freed without the pool (checked by ASan builds)
}

TEST(BufferPoolTest, ConcurrentUse) {
  BufferPool pool(BufferPool::Options{.min_pooled_bytes = 1024, .max_cached_bytes = 1 << 22});
  std::vector<std::thread> threads;
  std::atomic<int> corrupt{0};
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 2000; ++i) {
        size_t size = 1024u << (i % 5);
        Buffer b = pool.Get(size);
        std::memset(b.mutable_data(), t, size);
        Buffer shared = b;  // copies may be dropped in any order
        b = Buffer();
        for (size_t k = 0; k < size; k += 257) {
          if (static_cast<int>(shared.data()[k]) != t) corrupt++;
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(corrupt.load(), 0);
  EXPECT_GT(pool.hits(), 0u);
}

}  // namespace
}  // namespace tessera

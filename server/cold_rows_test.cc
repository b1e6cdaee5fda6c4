// The ColdRows contract (server/cold_rows.h), checked against both stores:
// the in-memory stand-in and RocksDB on disk.
#include "server/cold_rows.h"

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <set>

#include "server/bucket_file_cold_rows.h"
#include "server/disk_tier.h"
#include "server/log_cold_rows.h"
#include "server/log_index.h"
#include "server/rocks_cold_rows.h"
#include "server/test_stores.h"

namespace tessera {
namespace {

namespace fs = std::filesystem;

// A fresh scratch directory, removed at the end.
class ScratchDir {
 public:
  ScratchDir() {
    std::string t = (fs::temp_directory_path() / "tessera-cold-rows-XXXXXX").string();
    path_ = mkdtemp(t.data());
  }
  ~ScratchDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  const fs::path& path() const { return path_; }

 private:
  fs::path path_;
};

using Kind = StoreKind;

class ColdRowsTest : public ::testing::TestWithParam<Kind> {
 protected:
  std::unique_ptr<ColdRows> Make(uint32_t row_floats) {
    return OpenTestStore(GetParam(), (dir_.path() / "store").string(), row_floats);
  }
  ScratchDir dir_;
};

// Floats whose bits matter: NaN payloads, signed zeros, denormals.
std::vector<float> OddRow(uint32_t n, uint64_t seed) {
  std::vector<float> row(n);
  std::mt19937_64 rng(seed);
  for (uint32_t i = 0; i < n; ++i) {
    const uint32_t bits = static_cast<uint32_t>(rng());
    std::memcpy(&row[i], &bits, sizeof(bits));
  }
  return row;
}

bool SameBits(std::span<const float> a, std::span<const float> b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size_bytes()) == 0;
}

TEST_P(ColdRowsTest, WhatGetReturnsIsBitForBitTheLastPut) {
  auto store = Make(5);
  ASSERT_NE(store, nullptr);
  EXPECT_EQ(store->row_floats(), 5u);
  const Key zero = 0, top = ~Key{0}, mid = 12345;
  store->Put(zero, OddRow(5, 1));
  store->Put(top, OddRow(5, 2));
  store->Put(mid, OddRow(5, 3));
  store->Put(mid, OddRow(5, 4));  // replaces
  const std::vector<Key> keys = {mid, 777, top, zero, mid};
  std::vector<float> out(keys.size() * 5, 42.0f);
  std::vector<uint8_t> found(keys.size(), 9);
  EXPECT_EQ(store->Get(keys, out, found), 4u);
  EXPECT_EQ(found, (std::vector<uint8_t>{1, 0, 1, 1, 1}));
  auto part = [&](size_t i) { return std::span<const float>(out).subspan(i * 5, 5); };
  EXPECT_TRUE(SameBits(part(0), OddRow(5, 4)));
  EXPECT_TRUE(SameBits(part(2), OddRow(5, 2)));
  EXPECT_TRUE(SameBits(part(3), OddRow(5, 1)));
  EXPECT_TRUE(SameBits(part(4), OddRow(5, 4)));
  for (float f : part(1)) EXPECT_EQ(f, 42.0f);  // an absent key's part is left alone
  EXPECT_TRUE(store->Contains(top));
  EXPECT_FALSE(store->Contains(777));
  const ColdRowStats s = store->stats();
  EXPECT_EQ(s.rows_written, 4u);
  EXPECT_EQ(s.rows_read, 4u);
  EXPECT_EQ(s.lookups_absent, 1u);
}

TEST_P(ColdRowsTest, TakeGetsAndForgetsAndFindsAKeyListedTwiceOnce) {
  auto store = Make(3);
  ASSERT_NE(store, nullptr);
  store->Add(10, OddRow(3, 10));
  store->Add(20, OddRow(3, 20));
  store->Add(30, OddRow(3, 30));
  const std::vector<Key> keys = {20, 99, 10, 20};
  std::vector<float> out(keys.size() * 3, 7.0f);
  std::vector<uint8_t> found(keys.size());
  EXPECT_EQ(store->Take(keys, out, found), 2u);
  EXPECT_EQ(found, (std::vector<uint8_t>{1, 0, 1, 0}));
  EXPECT_TRUE(SameBits(std::span<const float>(out).subspan(0, 3), OddRow(3, 20)));
  EXPECT_TRUE(SameBits(std::span<const float>(out).subspan(6, 3), OddRow(3, 10)));
  EXPECT_FALSE(store->Contains(10));
  EXPECT_FALSE(store->Contains(20));
  EXPECT_TRUE(store->Contains(30));
  size_t left = 0;
  store->ForEach([&](Key k, std::span<const float> row) {
    ++left;
    EXPECT_EQ(k, 30u);
    EXPECT_TRUE(SameBits(row, OddRow(3, 30)));
  });
  EXPECT_EQ(left, 1u);
}

TEST_P(ColdRowsTest, EraseForgetsAndForEachVisitsEveryRowOnce) {
  auto store = Make(3);
  ASSERT_NE(store, nullptr);
  std::map<Key, std::vector<float>> expected;
  for (Key k = 0; k < 5000; ++k) {
    const Key key = k * 0x9e3779b97f4a7c15ULL;
    expected[key] = OddRow(3, k);
    store->Put(key, expected[key]);
  }
  for (Key k = 0; k < 5000; k += 3) {
    const Key key = k * 0x9e3779b97f4a7c15ULL;
    store->Erase(key);
    expected.erase(key);
  }
  store->Erase(4242);  // not held: nothing happens
  std::map<Key, std::vector<float>> seen;
  store->ForEach([&](Key k, std::span<const float> row) {
    EXPECT_FALSE(seen.contains(k)) << k;
    seen[k].assign(row.begin(), row.end());
  });
  ASSERT_EQ(seen.size(), expected.size());
  for (const auto& [k, row] : expected) {
    ASSERT_TRUE(seen.contains(k));
    EXPECT_TRUE(SameBits(seen[k], row)) << k;
  }
  EXPECT_FALSE(store->Contains(0));
  EXPECT_TRUE(store->Contains(1 * 0x9e3779b97f4a7c15ULL));
  std::set<Key> keys;
  store->ForEachKey([&](Key k) { EXPECT_TRUE(keys.insert(k).second) << "twice: " << k; });
  EXPECT_EQ(keys.size(), expected.size());
  for (const auto& [k, row] : expected) EXPECT_TRUE(keys.contains(k)) << k;
}

INSTANTIATE_TEST_SUITE_P(Stores, ColdRowsTest,
                         ::testing::Values(Kind::kMemory, Kind::kRocks, Kind::kBucketFile, Kind::kLog),
                         [](const auto& info) { return StoreName(info.param); });

// The bucket file grows one bucket at a time (splits) and through overflow
// buckets, and gives emptied overflow buckets back; whatever its geometry,
// every row stays findable and bit for bit.
TEST(BucketFileColdRowsTest, SplitsOverflowsAndErasuresKeepEveryRow) {
  ScratchDir dir;
  for (const uint32_t floats : {1u, 32u, 2000u}) {  // 2000 floats: a bucket of several pages
    SCOPED_TRACE(floats);
    auto store = BucketFileColdRows::Open((dir.path() / ("s" + std::to_string(floats))).string(), floats);
    ASSERT_TRUE(store.ok()) << store.status();
    BucketFileColdRows& s = **store;
    EXPECT_GE(s.records_per_bucket(), 16u);
    EXPECT_EQ(s.bucket_bytes() % 4096, 0u);
    const uint64_t n = floats == 2000 ? 3000 : 40000;
    std::map<Key, uint64_t> held;  // key -> seed of its row
    std::mt19937_64 rng(floats);
    for (uint64_t i = 0; i < n; ++i) {
      const Key k = rng();
      held[k] = i;
      s.Put(k, OddRow(floats, i));
    }
    EXPECT_GT(s.primary_buckets(), BucketFileColdRows::kInitialBuckets);  // it split
    EXPECT_EQ(s.size(), held.size());
    // Replace some, erase most, in an order unrelated to the buckets.
    uint64_t i = 0;
    for (auto it = held.begin(); it != held.end(); ++i) {
      if (i % 5 == 0) {
        it->second += n;
        s.Put(it->first, OddRow(floats, it->second));
        ++it;
      } else if (i % 5 != 4) {
        s.Erase(it->first);
        it = held.erase(it);
      } else {
        ++it;
      }
    }
    EXPECT_EQ(s.size(), held.size());
    std::vector<Key> keys;
    for (const auto& [k, seed] : held) keys.push_back(k);
    keys.push_back(12345);  // not held (with this seed)
    std::vector<float> out(keys.size() * floats);
    std::vector<uint8_t> found(keys.size());
    ASSERT_EQ(s.Get(keys, out, found), held.size());
    size_t j = 0;
    for (const auto& [k, seed] : held) {
      ASSERT_TRUE(found[j]) << k;
      ASSERT_TRUE(SameBits(std::span<const float>(out).subspan(j * floats, floats), OddRow(floats, seed))) << k;
      ++j;
    }
    EXPECT_FALSE(found.back());
    size_t visited = 0;
    s.ForEach([&](Key k, std::span<const float> row) {
      ++visited;
      ASSERT_TRUE(held.contains(k));
      EXPECT_TRUE(SameBits(row, OddRow(floats, held[k])));
    });
    EXPECT_EQ(visited, held.size());
    for (const auto& [k, seed] : held) s.Erase(k);
    EXPECT_EQ(s.size(), 0u);
    EXPECT_EQ(s.overflow_buckets_in_use(), 0u);  // every emptied overflow bucket came back
  }
}

TEST(RocksColdRowsTest, RowsReachTheFilesAndTheDirectoryGoesWithTheStore) {
  ScratchDir dir;
  RocksColdRowsOptions o;
  o.directory = (dir.path() / "t1").string();
  o.write_buffer_bytes = 256 << 10;
  o.block_cache_bytes = 1 << 20;
  {
    auto store = RocksColdRows::Open(o, 64);
    ASSERT_TRUE(store.ok()) << store.status();
    for (Key k = 0; k < 20000; ++k) (*store)->Put(k, OddRow(64, k));  // 5 MiB: several memtable flushes
    EXPECT_GT((*store)->stats().bytes_on_disk, 1u << 20);
    std::vector<float> out(64);
    uint8_t found = 0;
    const Key k = 17;
    ASSERT_EQ((*store)->Get(std::span<const Key>(&k, 1), out, std::span<uint8_t>(&found, 1)), 1u);
    EXPECT_TRUE(SameBits(out, OddRow(64, 17)));
    EXPECT_EQ((*store)->memory_bytes(0), 2 * o.write_buffer_bytes + o.block_cache_bytes +
                                             RocksColdRows::kFixedOverheadBytes);
    EXPECT_EQ((*store)->memory_bytes(1000) - (*store)->memory_bytes(0), 1000 * RocksColdRows::kBytesPerRow);
  }
  EXPECT_FALSE(fs::exists(o.directory));  // scratch: gone with the store
}

// The log compacts: rows taken back, erased and replaced at random leave
// the file within twice the live rows plus two segments, freed segments are
// reused, and every live row stays bit for bit (read from the write buffer,
// the file, and after being moved by compaction).
TEST(LogColdRowsTest, CompactionBoundsTheFileAndKeepsEveryLiveRow) {
  ScratchDir dir;
  for (const uint32_t floats : {1u, 48u, 3000u}) {  // 3000 floats: a record over a page, a segment of few
    SCOPED_TRACE(floats);
    auto store = LogColdRows::Open((dir.path() / ("s" + std::to_string(floats))).string(), floats, 64 << 10);
    ASSERT_TRUE(store.ok()) << store.status();
    LogColdRows& s = **store;
    const size_t segment_bytes = (s.records_per_segment() * (8 + 4 * floats) + 4095) / 4096 * 4096;
    std::map<Key, uint64_t> held;  // key -> seed of its row
    std::mt19937_64 rng(floats);
    uint64_t seed = 0, most_segments = 0;
    std::vector<float> out(floats);
    uint8_t found = 0;
    const int rounds = floats == 3000 ? 600 : 20000;
    for (int r = 0; r < rounds; ++r) {
      const uint64_t what = rng() % 10;
      if (what < 5 || held.size() < 8) {  // a new row
        const Key k = rng();
        if (held.contains(k)) continue;
        held[k] = ++seed;
        s.Add(k, OddRow(floats, seed));
      } else {
        auto it = held.lower_bound(rng());
        if (it == held.end()) it = held.begin();
        if (what < 7) {  // taken back
          ASSERT_EQ(s.Take(std::span<const Key>(&it->first, 1), out, std::span<uint8_t>(&found, 1)), 1u);
          EXPECT_EQ(std::memcmp(out.data(), OddRow(floats, it->second).data(), 4 * floats), 0);
          held.erase(it);
        } else if (what < 8) {
          s.Erase(it->first);
          held.erase(it);
        } else {  // replaced
          it->second = ++seed;
          s.Put(it->first, OddRow(floats, seed));
        }
      }
      most_segments = std::max(most_segments, s.segments_in_use());
      // Within twice the live rows, plus the open segment and the one being filled by compaction.
      ASSERT_LE(s.stats().bytes_on_disk, (2 * held.size() * (8 + 4 * floats) / segment_bytes + 3) * segment_bytes)
          << "round " << r << ", " << held.size() << " live rows";
    }
    EXPECT_GT(s.segments_compacted(), 0u);
    EXPECT_EQ(s.size(), held.size());
    for (const auto& [k, row_seed] : held) {
      ASSERT_EQ(s.Get(std::span<const Key>(&k, 1), out, std::span<uint8_t>(&found, 1)), 1u);
      ASSERT_EQ(std::memcmp(out.data(), OddRow(floats, row_seed).data(), 4 * floats), 0) << k;
    }
    size_t visited = 0;
    s.ForEach([&](Key k, std::span<const float> row) {
      ++visited;
      ASSERT_TRUE(held.contains(k));
      EXPECT_EQ(std::memcmp(row.data(), OddRow(floats, held[k]).data(), 4 * floats), 0);
    });
    EXPECT_EQ(visited, held.size());
    // Memory: the index's own and a fixed part; more for rows it does not hold yet.
    EXPECT_GE(s.memory_bytes(held.size()), LogColdRows::kFixedMemoryBytes + 8 * held.size());
    EXPECT_EQ(s.memory_bytes(held.size() + 1000),
              s.memory_bytes(held.size()) + LogIndex::MemoryFor(1000));
  }
}

// The log's index finds, replaces and erases keys through its pages' splits
// and the directory's doublings; keys whose hashes share their top 32 bits
// are told apart by the record's key; it stays within MemoryFor.
TEST(LogIndexTest, KeysThroughSplitsCollisionsAndErasures) {
  std::vector<Key> key_of_slot;
  LogIndex index([&](uint32_t slot) { return key_of_slot.at(slot); });
  std::map<Key, uint32_t> held;
  std::mt19937_64 rng(5);
  auto add = [&](Key k) {
    if (held.contains(k)) return;
    const uint32_t slot = static_cast<uint32_t>(key_of_slot.size());
    key_of_slot.push_back(k);
    index.Insert(k, LogIndex::Hash(k), slot);
    held[k] = slot;
  };
  for (int i = 0; i < 200000; ++i) add(rng());
  EXPECT_GT(index.pages(), 16u);  // it split (and the directory doubled)
  EXPECT_LE(index.memory_bytes(), LogIndex::MemoryFor(held.size()));
  for (const auto& [k, slot] : held) ASSERT_EQ(index.Find(k, LogIndex::Hash(k)), slot);
  // Replace every third, erase every other.
  uint64_t i = 0;
  for (auto it = held.begin(); it != held.end(); ++i) {
    if (i % 3 == 0) {
      const uint32_t slot = static_cast<uint32_t>(key_of_slot.size());
      key_of_slot.push_back(it->first);
      index.Replace(it->first, LogIndex::Hash(it->first), slot);
      it->second = slot;
      ++it;
    } else if (i % 2 == 0) {
      ASSERT_TRUE(index.Erase(it->first, LogIndex::Hash(it->first)));
      it = held.erase(it);
    } else {
      ++it;
    }
  }
  EXPECT_EQ(index.size(), held.size());
  for (const auto& [k, slot] : held) ASSERT_EQ(index.Find(k, LogIndex::Hash(k)), slot) << k;
  for (int j = 0; j < 1000; ++j) {
    const Key absent = rng();
    if (!held.contains(absent)) {
      ASSERT_EQ(index.Find(absent, LogIndex::Hash(absent)), LogIndex::kNoSlot);
    }
  }
  size_t visited = 0;
  index.ForEach([&](uint32_t slot) {
    ++visited;
    ASSERT_EQ(held.at(key_of_slot.at(slot)), slot);
  });
  EXPECT_EQ(visited, held.size());
  // A record that no longer holds the key it was indexed under: the key is
  // not found (the index asks the record, not only the hash).
  const Key some = held.begin()->first;
  key_of_slot[held.begin()->second] = some + 1;
  EXPECT_EQ(index.Find(some, LogIndex::Hash(some)), LogIndex::kNoSlot);
}

TEST(RocksColdRowsTest, OpenStartsEmptyOverAnEarlierStoreButNeverRemovesOtherFiles) {
  ScratchDir dir;
  RocksColdRowsOptions o;
  o.directory = (dir.path() / "t2").string();
  // An earlier process's store (left behind by a crash: here, kept by
  // copying its files before the store removes them).
  {
    auto store = RocksColdRows::Open(o, 2);
    ASSERT_TRUE(store.ok()) << store.status();
    (*store)->Put(1, std::vector<float>{1, 2});
    // File by file: the open store's background work may remove or rename
    // a file (an old log, a temporary) between listing and copying it.
    fs::create_directories(dir.path() / "copy");
    for (const auto& entry : fs::directory_iterator(o.directory)) {
      std::error_code gone;
      if (entry.is_regular_file(gone))
        fs::copy_file(entry.path(), dir.path() / "copy" / entry.path().filename(), gone);
    }
  }
  fs::rename(dir.path() / "copy", o.directory);
  ASSERT_TRUE(fs::exists(fs::path(o.directory) / "CURRENT"));
  {
    auto store = RocksColdRows::Open(o, 2);
    ASSERT_TRUE(store.ok()) << store.status();
    EXPECT_FALSE((*store)->Contains(1));
  }
  // A directory with something else in it is refused, and left as it was.
  fs::create_directories(o.directory);
  std::ofstream(fs::path(o.directory) / "notes.txt") << "mine";
  auto refused = RocksColdRows::Open(o, 2);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("not a disk tier"), std::string::npos) << refused.status();
  EXPECT_TRUE(fs::exists(fs::path(o.directory) / "notes.txt"));
  // And bad arguments.
  EXPECT_FALSE(RocksColdRows::Open(RocksColdRowsOptions{}, 2).ok());
  RocksColdRowsOptions fresh;
  fresh.directory = (dir.path() / "t3").string();
  EXPECT_FALSE(RocksColdRows::Open(fresh, 0).ok());
}

TEST(DiskTierFactoryTest, OneDirectoryPerProcessAndStoreWhatDeadProcessesLeftIsRemoved) {
  ScratchDir dir;
  const fs::path root = dir.path() / "disk";
  // A dead process of this host left its directory; a live one (this
  // test's parent) has one too; and a user's own directory sits beside.
  char host[256] = {};
  gethostname(host, sizeof(host) - 1);
  std::string h = host;
  for (char& c : h)
    if (c == '/' || c == '-') c = '_';
  pid_t dead = fork();
  if (dead == 0) _exit(0);
  ASSERT_GT(dead, 0);
  int status = 0;
  waitpid(dead, &status, 0);
  const fs::path stale = root / ("tessera-" + h + "-" + std::to_string(dead));
  const fs::path live = root / ("tessera-" + h + "-" + std::to_string(getppid()));
  fs::create_directories(stale / "table-1-0");
  fs::create_directories(live / "table-1-0");
  fs::create_directories(root / "mine");
  fs::path mine_dir;
  std::unique_ptr<ColdRows> outliving;
  {
    auto factory = MakeDiskTierFactory(root.string(), DiskStore::kRocks,
                                       RocksColdRowsOptions{.write_buffer_bytes = 1 << 20, .block_cache_bytes = 1 << 20});
    ASSERT_TRUE(factory.ok()) << factory.status();
    EXPECT_FALSE(fs::exists(stale));
    EXPECT_TRUE(fs::exists(live));
    EXPECT_TRUE(fs::exists(root / "mine"));
    mine_dir = root / ("tessera-" + h + "-" + std::to_string(getpid()));
    EXPECT_FALSE(fs::exists(mine_dir));  // made with the first store
    auto a = (*factory)(7, 4);
    EXPECT_TRUE(fs::is_directory(mine_dir));
    auto b = (*factory)(7, 4);  // the same table again: a store of its own
    ASSERT_TRUE(a.ok()) << a.status();
    ASSERT_TRUE(b.ok()) << b.status();
    (*a)->Put(1, std::vector<float>{1, 2, 3, 4});
    EXPECT_FALSE((*b)->Contains(1));
    EXPECT_TRUE(fs::exists(mine_dir / "table-7-0" / "CURRENT"));
    EXPECT_TRUE(fs::exists(mine_dir / "table-7-1" / "CURRENT"));
    auto c = (*factory)(8, 2);
    ASSERT_TRUE(c.ok()) << c.status();
    outliving = std::move(*c);
  }
  // A store keeps the process's directory while it lives, factory gone or not.
  EXPECT_TRUE(fs::exists(mine_dir / "table-8-2" / "CURRENT"));
  outliving->Put(5, std::vector<float>{1, 2});
  EXPECT_TRUE(outliving->Contains(5));
  EXPECT_FALSE(fs::exists(mine_dir / "table-7-0"));
  outliving.reset();
  EXPECT_FALSE(fs::exists(mine_dir));  // gone with the factory and its stores
  // A disk_dir that cannot be made is an error naming it.
  std::ofstream(dir.path() / "file") << "x";
  auto bad = MakeDiskTierFactory((dir.path() / "file" / "sub").string(), DiskStore::kBucketFile);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("--disk_dir"), std::string::npos) << bad.status();
  // The bucket store through the same factory.
  auto buckets = MakeDiskTierFactory((dir.path() / "b").string(), DiskStore::kBucketFile);
  ASSERT_TRUE(buckets.ok()) << buckets.status();
  auto s1 = (*buckets)(3, 2);
  ASSERT_TRUE(s1.ok()) << s1.status();
  EXPECT_NE(dynamic_cast<BucketFileColdRows*>(s1->get()), nullptr);
  EXPECT_TRUE(ParseDiskStore("rocks").ok());
  EXPECT_TRUE(ParseDiskStore("bucket").ok());
  EXPECT_FALSE(ParseDiskStore("lmdb").ok());
}

}  // namespace
}  // namespace tessera

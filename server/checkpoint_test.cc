#include "server/checkpoint.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <map>
#include <new>
#include <random>
#include <string>
#include <vector>

// ---- allocation tracking: the largest single allocation while enabled ----
//
// Replaces the global operator new so that a test can show that reading a
// file with a corrupt length never asks for more memory than the file holds.
namespace {
std::atomic<bool> g_track_allocations{false};
std::atomic<size_t> g_largest_allocation{0};

void* TrackedAllocate(size_t size) {
  if (g_track_allocations.load(std::memory_order_relaxed)) {
    size_t seen = g_largest_allocation.load(std::memory_order_relaxed);
    while (size > seen && !g_largest_allocation.compare_exchange_weak(seen, size)) {
    }
  }
  if (void* p = std::malloc(size == 0 ? 1 : size)) return p;
  throw std::bad_alloc();
}
}  // namespace

void* operator new(size_t size) { return TrackedAllocate(size); }
void* operator new[](size_t size) { return TrackedAllocate(size); }
void operator delete(void* p) noexcept { std::free(p); }
void operator delete[](void* p) noexcept { std::free(p); }
void operator delete(void* p, size_t) noexcept { std::free(p); }
void operator delete[](void* p, size_t) noexcept { std::free(p); }

namespace tessera {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

proto::TableConfig Config(uint32_t id, proto::TableKind kind, uint32_t width, uint64_t dense_rows = 0) {
  proto::TableConfig c;
  c.set_table_id(id);
  c.set_width(width);
  c.set_kind(kind);
  if (kind == proto::DENSE) c.set_dense_rows(dense_rows);
  c.set_optimizer(proto::SGD);
  c.set_learning_rate(0.5f);
  c.set_init(proto::NORMAL);
  c.set_init_scale(0.1f);
  c.set_init_seed(42);
  c.set_name("table-" + std::to_string(id));
  return c;
}

// Values that must come back bit for bit: NaN, infinities, -0, denormals.
float Value(uint64_t key, size_t j) {
  switch ((key * 7 + j) % 11) {
    case 0: return std::numeric_limits<float>::quiet_NaN();
    case 1: return -std::numeric_limits<float>::infinity();
    case 2: return -0.0f;
    case 3: return std::numeric_limits<float>::denorm_min();
    default: return static_cast<float>(key) * 0.25f - static_cast<float>(j);
  }
}

TableSnapshot MakeTable(proto::TableConfig config, std::vector<Key> keys) {
  TableSnapshot t;
  t.config = std::move(config);
  t.keys = std::move(keys);
  const size_t w = t.config.width();
  t.values.resize(t.keys.size() * w);
  for (size_t i = 0; i < t.keys.size(); ++i)
    for (size_t j = 0; j < w; ++j) t.values[i * w + j] = Value(t.keys[i], j);
  return t;
}

// Dense and sparse tables of several widths (one of them with rows large
// enough to get chunks of their own in a Table, one empty) and a core state
// holding every byte value.
ShardSnapshot SampleSnapshot(uint32_t rank = 2, uint64_t epoch = 7) {
  ShardSnapshot s;
  s.server_rank = rank;
  s.epoch = epoch;
  s.vshards = {1, 4, 9, 200};
  s.applied_pushes_by_vshard = {{1, 10}, {4, 0}, {9, 123456789012ull}, {300, 5}};
  s.tables.push_back(MakeTable(Config(1, proto::DENSE, 1, 10), {0, 2, 3, 9}));
  s.tables.push_back(MakeTable(Config(2, proto::SPARSE, 3), {5, 17, 1ull << 40, ~0ull}));
  std::vector<Key> many;
  for (Key k = 0; k < 50; ++k) many.push_back(k * k * 1000003);
  s.tables.push_back(MakeTable(Config(3, proto::SPARSE, 17), many));
  s.tables.push_back(MakeTable(Config(4, proto::DENSE, 5, 100), {}));
  s.tables.push_back(MakeTable(Config(5, proto::SPARSE, 1 << 15), {7, 8}));
  for (int rep = 0; rep < 3; ++rep)
    for (int b = 0; b < 256; ++b) s.core_state.push_back(static_cast<char>(b));
  return s;
}

// A few-KB snapshot, for tests that read the file once per byte.
ShardSnapshot SmallSnapshot() {
  ShardSnapshot s;
  s.server_rank = 1;
  s.epoch = 3;
  s.vshards = {0, 2};
  s.applied_pushes_by_vshard = {{0, 4}, {2, 9}};
  s.tables.push_back(MakeTable(Config(1, proto::DENSE, 2, 6), {0, 1, 4}));
  s.tables.push_back(MakeTable(Config(2, proto::SPARSE, 3), {10, 20, 30, 40, 50}));
  s.core_state = std::string("dedup\0clocks", 12);
  return s;
}

bool SameBits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
}

void ExpectSameSnapshot(const ShardSnapshot& a, const ShardSnapshot& b) {
  EXPECT_EQ(a.server_rank, b.server_rank);
  EXPECT_EQ(a.epoch, b.epoch);
  EXPECT_EQ(a.vshards, b.vshards);
  EXPECT_EQ(a.applied_pushes_by_vshard, b.applied_pushes_by_vshard);
  EXPECT_EQ(a.core_state, b.core_state);
  ASSERT_EQ(a.tables.size(), b.tables.size());
  for (size_t i = 0; i < a.tables.size(); ++i) {
    SCOPED_TRACE("table " + std::to_string(a.tables[i].config.table_id()));
    EXPECT_EQ(a.tables[i].config.SerializeAsString(), b.tables[i].config.SerializeAsString());
    EXPECT_EQ(a.tables[i].keys, b.tables[i].keys);
    EXPECT_TRUE(SameBits(a.tables[i].values, b.tables[i].values));
  }
}

std::string ReadBytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

void WriteBytes(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  ASSERT_TRUE(out.good()) << path;
}

uint32_t U32At(const std::string& b, size_t at) {
  uint32_t v;
  std::memcpy(&v, b.data() + at, 4);
  return v;
}
void PutU32At(std::string& b, size_t at, uint32_t v) { std::memcpy(b.data() + at, &v, 4); }
void PutU64At(std::string& b, size_t at, uint64_t v) { std::memcpy(b.data() + at, &v, 8); }

// Recomputes a section's payload and header checksums after a test changed
// its payload (and, when the length was changed too, only the header's).
void Reseal(std::string& b, const SectionInfo& s, bool payload_too = true) {
  const size_t h = s.offset;
  if (payload_too) {
    uint64_t length;
    std::memcpy(&length, b.data() + h + 8, 8);
    PutU32At(b, h + 16, Crc32c(b.data() + h + 24, length));
  }
  PutU32At(b, h + 20, Crc32c(b.data() + h, 20));
}

class CheckpointTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string pattern = (fs::temp_directory_path() / "checkpoint_test-XXXXXX").string();
    ASSERT_NE(::mkdtemp(pattern.data()), nullptr);
    dir_ = pattern;
  }
  void TearDown() override {
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }

  std::vector<std::string> FileNames(const std::string& dir) const {
    std::vector<std::string> names;
    for (const auto& e : fs::directory_iterator(dir)) names.push_back(e.path().filename().string());
    std::sort(names.begin(), names.end());
    return names;
  }

  // Writes `snapshot` and returns its path.
  std::string Write(const ShardSnapshot& snapshot, CheckpointWriteOptions options = {}, std::string dir = "") {
    auto info = WriteCheckpoint(dir.empty() ? dir_ : dir, snapshot, options);
    EXPECT_TRUE(info.ok()) << info.status();
    return info.ok() ? info->path : "";
  }

  std::string dir_;
};

// ---- CRC32C ----

TEST(Crc32cTest, KnownVectors) {
  // RFC 3720 (iSCSI) appendix B.4 and the classic check value.
  std::string zeros(32, '\0'), ones(32, '\xff'), ascending, descending;
  for (int i = 0; i < 32; ++i) {
    ascending.push_back(static_cast<char>(i));
    descending.push_back(static_cast<char>(31 - i));
  }
  struct Case {
    std::string data;
    uint32_t crc;
  };
  const std::vector<Case> cases = {{"123456789", 0xE3069283u},
                                   {zeros, 0x8A9136AAu},
                                   {ones, 0x62A8AB43u},
                                   {ascending, 0x46DD794Eu},
                                   {descending, 0x113FDB5Cu},
                                   {"", 0u}};
  for (const Case& c : cases) {
    EXPECT_EQ(checkpoint_internal::Crc32cPortable(0, c.data.data(), c.data.size()), c.crc);
    EXPECT_EQ(Crc32c(c.data.data(), c.data.size()), c.crc);
    if (checkpoint_internal::Crc32cHardwareAvailable()) {
      EXPECT_EQ(checkpoint_internal::Crc32cHardware(0, c.data.data(), c.data.size()), c.crc);
    }
  }
}

TEST(Crc32cTest, ExtendingEqualsOnePassAndBothImplementationsAgree) {
  std::mt19937_64 rng(5);
  std::string data(1000, '\0');
  for (char& c : data) c = static_cast<char>(rng());
  const uint32_t whole = checkpoint_internal::Crc32cPortable(0, data.data(), data.size());
  for (size_t split = 0; split <= data.size(); split += 7) {
    const uint32_t first = Crc32c(data.data(), split);
    EXPECT_EQ(Crc32cExtend(first, data.data() + split, data.size() - split), whole) << split;
  }
  if (!checkpoint_internal::Crc32cHardwareAvailable()) GTEST_SKIP() << "no SSE4.2 here";
  for (size_t start = 0; start < 9; ++start) {
    for (size_t n = 0; n + start <= 300; ++n) {
      ASSERT_EQ(checkpoint_internal::Crc32cHardware(17, data.data() + start, n),
                checkpoint_internal::Crc32cPortable(17, data.data() + start, n))
          << start << " " << n;
    }
  }
}

// ---- Table accessors ----

TEST(TableRestoreTest, ForEachRowVisitsEveryRowOnceAndCreatesNothing) {
  Table t(Config(3, proto::DENSE, 2, 10), [](Key k) { return k % 3 == 0; });  // 0, 3, 6, 9
  ASSERT_TRUE(t.ApplyPush(std::vector<Key>{3}, std::vector<float>{2, 4}).ok());
  std::map<Key, std::vector<float>> seen;
  t.ForEachRow([&](Key k, std::span<const float> row) {
    EXPECT_TRUE(seen.emplace(k, std::vector<float>(row.begin(), row.end())).second) << "key " << k << " twice";
  });
  ASSERT_EQ(seen.size(), 4u);
  for (Key k : {0, 3, 6, 9}) {
    std::vector<float> expected(2);
    ASSERT_TRUE(t.ReadRows(std::vector<Key>{k}, expected).ok());
    EXPECT_EQ(seen[k], expected) << k;
  }
  EXPECT_EQ(t.num_rows(), 4u);
}

TEST(TableRestoreTest, RestoreSetsExactValuesCreatesSparseRowsAndLeavesOthers) {
  Table t(Config(3, proto::SPARSE, 2), [](Key) { return true; });
  std::vector<float> untouched(2);
  ASSERT_TRUE(t.ReadRows(std::vector<Key>{1}, untouched).ok());  // creates row 1 from the initializer
  ASSERT_TRUE(t.ApplyPush(std::vector<Key>{2}, std::vector<float>{1, 1}).ok());
  // Row 2 exists, row 8 does not; neither the optimizer nor the initializer applies.
  ASSERT_TRUE(t.RestoreRows(std::vector<Key>{2, 8}, std::vector<float>{10, 20, 30, 40}).ok());
  EXPECT_EQ(t.num_rows(), 3u);
  std::vector<float> out(6);
  ASSERT_TRUE(t.ReadRows(std::vector<Key>{2, 8, 1}, out).ok());
  EXPECT_EQ(out, (std::vector<float>{10, 20, 30, 40, untouched[0], untouched[1]}));
}

TEST(TableRestoreTest, RestoreRefusesKeysADenseTableDoesNotHoldAndChangesNothing) {
  Table t(Config(3, proto::DENSE, 1, 10), [](Key k) { return k % 2 == 0; });
  auto s = t.RestoreRows(std::vector<Key>{4, 3}, std::vector<float>{1, 1});
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("not held")) << s;
  s = t.RestoreRows(std::vector<Key>{4, 12}, std::vector<float>{1, 1});
  EXPECT_THAT(s.message(), HasSubstr("out of range")) << s;
  s = t.RestoreRows(std::vector<Key>{4, 6}, std::vector<float>{1, 1, 1});
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("needs 2 values, got 3")) << s;
  std::vector<float> out(1);
  ASSERT_TRUE(t.ReadRows(std::vector<Key>{4}, out).ok());
  EXPECT_NE(out[0], 1.0f);  // the initializer's value, not the refused one
  EXPECT_EQ(t.num_rows(), 5u);
}

TEST(TableRestoreTest, SparseRestoreWithWrongValueCountCreatesNothing) {
  Table t(Config(3, proto::SPARSE, 4), [](Key) { return true; });
  EXPECT_FALSE(t.RestoreRows(std::vector<Key>{1, 2}, std::vector<float>(7)).ok());
  EXPECT_EQ(t.num_rows(), 0u);
}

TEST(TableRestoreTest, AKeyListedTwiceGetsItsLastRow) {
  Table t(Config(3, proto::SPARSE, 1), [](Key) { return true; });
  ASSERT_TRUE(t.RestoreRows(std::vector<Key>{5, 5}, std::vector<float>{1, 2}).ok());
  std::vector<float> out(1);
  ASSERT_TRUE(t.ReadRows(std::vector<Key>{5}, out).ok());
  EXPECT_EQ(out[0], 2.0f);
  EXPECT_EQ(t.num_rows(), 1u);
}

TEST(TableRestoreTest, RestoreLeavesLentRowsAsTheirReadersSawThem) {
  constexpr uint32_t kWidth = 1 << 15;  // a chunk of its own, so a read lends it
  Table t(Config(3, proto::DENSE, kWidth, 2), [](Key) { return true; });
  auto lent = t.ReadRowsShared(std::vector<Key>{1}, nullptr);
  ASSERT_TRUE(lent.ok()) << lent.status();
  const std::vector<float> before(lent->As<float>().begin(), lent->As<float>().end());
  ASSERT_TRUE(t.RestoreRows(std::vector<Key>{1}, std::vector<float>(kWidth, 9.0f)).ok());
  EXPECT_TRUE(std::equal(before.begin(), before.end(), lent->As<float>().begin()));
  EXPECT_EQ(t.copies_on_write(), 1u);
  std::vector<float> now(kWidth);
  ASSERT_TRUE(t.ReadRows(std::vector<Key>{1}, now).ok());
  EXPECT_EQ(now, std::vector<float>(kWidth, 9.0f));
}

// ---- snapshot helpers ----

TEST(SnapshotTableTest, RowsSortedByKeyFilteredAndRestoredIntoAFreshTable) {
  const auto config = Config(7, proto::SPARSE, 3);
  Table t(config, [](Key) { return true; });
  std::vector<Key> keys = {900, 5, 77, 12, 300000};
  ASSERT_TRUE(t.ApplyPush(keys, std::vector<float>(keys.size() * 3, 1.0f)).ok());

  TableSnapshot all = SnapshotTable(t);
  EXPECT_EQ(all.keys, (std::vector<Key>{5, 12, 77, 900, 300000}));
  ASSERT_EQ(all.values.size(), 15u);
  EXPECT_EQ(all.config.SerializeAsString(), config.SerializeAsString());
  EXPECT_TRUE(ValidateSnapshot(ShardSnapshot{.tables = {all}}).ok());

  // Keys of some vshards only: exactly those whose shard is listed.
  const std::vector<uint32_t> vshards = {0, 3, 5};
  auto mine = KeysOfVShards(7, 8, vshards);
  TableSnapshot part = SnapshotTable(t, mine);
  std::vector<Key> expected;
  for (Key k : all.keys) {
    const uint32_t v = VirtualShardOf(7, k, 8);
    if (v == 0 || v == 3 || v == 5) expected.push_back(k);
  }
  EXPECT_EQ(part.keys, expected);

  Table fresh(config, [](Key) { return true; });
  ASSERT_TRUE(RestoreTableSnapshot(all, fresh).ok());
  EXPECT_EQ(fresh.num_rows(), 5u);
  std::vector<float> a(15), b(15);
  ASSERT_TRUE(t.ReadRows(all.keys, a).ok());
  ASSERT_TRUE(fresh.ReadRows(all.keys, b).ok());
  EXPECT_EQ(a, b);

  Table filtered(config, [](Key) { return true; });
  ASSERT_TRUE(RestoreTableSnapshot(all, filtered, [](Key k) { return k < 100; }).ok());
  EXPECT_EQ(filtered.num_rows(), 3u);
}

TEST(SnapshotTableTest, RestoreIntoADifferentTableIsRefused) {
  Table source(Config(7, proto::SPARSE, 3), [](Key) { return true; });
  ASSERT_TRUE(source.ApplyPush(std::vector<Key>{1}, std::vector<float>{1, 2, 3}).ok());
  TableSnapshot snap = SnapshotTable(source);
  Table wider(Config(7, proto::SPARSE, 4), [](Key) { return true; });
  auto s = RestoreTableSnapshot(snap, wider);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("width 3")) << s;
  EXPECT_EQ(wider.num_rows(), 0u);
  Table other(Config(8, proto::SPARSE, 3), [](Key) { return true; });
  EXPECT_FALSE(RestoreTableSnapshot(snap, other).ok());
}

TEST(SnapshotTableTest, ValidateSnapshotNamesWhatIsWrong) {
  auto expect_invalid = [](const ShardSnapshot& s, const std::string& what) {
    auto status = ValidateSnapshot(s);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << what;
    EXPECT_THAT(status.message(), HasSubstr(what)) << status;
  };
  EXPECT_TRUE(ValidateSnapshot(SampleSnapshot()).ok());
  ShardSnapshot s = SmallSnapshot();
  s.tables[1].keys = {10, 30, 20, 40, 50};
  expect_invalid(s, "strictly increasing");
  s = SmallSnapshot();
  s.tables[1].values.pop_back();
  expect_invalid(s, "need 15 values, got 14");
  s = SmallSnapshot();
  s.tables[0].keys.back() = 6;
  expect_invalid(s, "out of range");
  s = SmallSnapshot();
  s.tables[1].config.set_table_id(1);
  expect_invalid(s, "table 1 appears more than once");
  s = SmallSnapshot();
  s.vshards = {2, 0};
  expect_invalid(s, "vshards must be strictly increasing");
  s = SmallSnapshot();
  s.tables[0].config.set_width(0);
  expect_invalid(s, "width must be");
}

// ---- files ----

TEST_F(CheckpointTest, RoundTripOfDenseAndSparseTablesInManySections) {
  const ShardSnapshot snapshot = SampleSnapshot();
  for (uint64_t section_bytes : {uint64_t{1}, uint64_t{300}, uint64_t{64} << 20}) {
    SCOPED_TRACE("max_section_bytes " + std::to_string(section_bytes));
    auto info = WriteCheckpoint(dir_, snapshot, CheckpointWriteOptions{.max_section_bytes = section_bytes});
    ASSERT_TRUE(info.ok()) << info.status();
    auto file = ReadCheckpointFile(info->path);
    ASSERT_TRUE(file.ok()) << file.status();
    ExpectSameSnapshot(file->snapshot, snapshot);
    EXPECT_EQ(file->version, kCheckpointVersion);
    EXPECT_EQ(file->sequence, info->sequence);
    EXPECT_EQ(file->file_bytes, fs::file_size(info->path));
    size_t row_sections = 0;
    for (const SectionInfo& s : file->sections) row_sections += s.type == SectionType::kRows;
    // 4 + 4 + 50 + 0 + 2 rows: one per section at 1 byte; fewer, larger ones otherwise.
    if (section_bytes == 1) {
      EXPECT_EQ(row_sections, 60u);
    }
    if (section_bytes == (uint64_t{64} << 20)) {
      EXPECT_EQ(row_sections, 4u);
    }
    EXPECT_EQ(file->sections.front().type, SectionType::kMeta);
    EXPECT_EQ(file->sections.back().type, SectionType::kEnd);
  }
  auto list = ListCheckpoints(dir_);
  ASSERT_TRUE(list.ok());
  ASSERT_EQ(list->size(), 3u);
  EXPECT_EQ((*list)[0].path, (fs::path(dir_) / "server-2-0000000003.tckpt").string());
  EXPECT_EQ((*list)[0].sequence, 3u);
  EXPECT_EQ((*list)[2].sequence, 1u);
}

TEST_F(CheckpointTest, EmptySnapshotRoundTrips) {
  ShardSnapshot empty;
  auto s = WriteCheckpoint(dir_, empty);
  ASSERT_TRUE(s.ok()) << s;
  auto latest = LatestCheckpoint(dir_, 0);
  ASSERT_TRUE(latest.ok()) << latest.status();
  auto back = ReadCheckpoint(latest->path);
  ASSERT_TRUE(back.ok()) << back.status();
  ExpectSameSnapshot(*back, empty);
}

TEST_F(CheckpointTest, TableToFileToTableKeepsEveryRow) {
  Table dense(Config(1, proto::DENSE, 4, 20), [](Key k) { return k % 2 == 1; });
  Table sparse(Config(2, proto::SPARSE, 6), [](Key) { return true; });
  std::vector<Key> keys = {3, 5, 19};
  ASSERT_TRUE(dense.ApplyPush(keys, std::vector<float>(12, 0.5f)).ok());
  std::vector<Key> skeys = {1ull << 50, 17, 4};
  ASSERT_TRUE(sparse.ApplyPush(skeys, std::vector<float>(18, -2.0f)).ok());
  ShardSnapshot snap{.server_rank = 0, .epoch = 1, .tables = {SnapshotTable(dense), SnapshotTable(sparse)}};
  ASSERT_TRUE(WriteCheckpoint(dir_, snap).ok());
  auto back = ReadCheckpoint(LatestCheckpoint(dir_, 0)->path);
  ASSERT_TRUE(back.ok()) << back.status();

  Table dense2(back->tables[0].config, [](Key k) { return k % 2 == 1; });
  Table sparse2(back->tables[1].config, [](Key) { return true; });
  ASSERT_TRUE(RestoreTableSnapshot(back->tables[0], dense2).ok());
  ASSERT_TRUE(RestoreTableSnapshot(back->tables[1], sparse2).ok());
  EXPECT_EQ(sparse2.num_rows(), 3u);
  std::vector<Key> all_dense;
  for (Key k = 1; k < 20; k += 2) all_dense.push_back(k);
  std::vector<float> a(all_dense.size() * 4), b(all_dense.size() * 4);
  ASSERT_TRUE(dense.ReadRows(all_dense, a).ok());
  ASSERT_TRUE(dense2.ReadRows(all_dense, b).ok());
  EXPECT_EQ(a, b);
  std::vector<float> c(18), d(18);
  ASSERT_TRUE(sparse.ReadRows(skeys, c).ok());
  ASSERT_TRUE(sparse2.ReadRows(skeys, d).ok());
  EXPECT_EQ(c, d);
}

TEST_F(CheckpointTest, InvalidSnapshotIsNotWritten) {
  ShardSnapshot s = SmallSnapshot();
  s.tables[1].keys = {50, 40, 30, 20, 10};
  auto info = WriteCheckpoint(dir_, s, CheckpointWriteOptions{});
  EXPECT_EQ(info.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(info.status().message(), HasSubstr("checkpoint not written"));
  EXPECT_TRUE(FileNames(dir_).empty());
}

TEST_F(CheckpointTest, EveryByteFlipIsDetected) {
  const std::string path = Write(SmallSnapshot());
  const std::string good = ReadBytes(path);
  ASSERT_GT(good.size(), 200u);
  const std::string copy = dir_ + "/flipped";
  WriteBytes(copy, good);
  ASSERT_TRUE(ReadCheckpoint(copy).ok()) << "the unchanged copy must read";
  size_t checked = 0;
  for (size_t at = 0; at < good.size(); ++at) {
    for (uint8_t mask : {uint8_t{0x01}, uint8_t{0x80}, uint8_t{0xff}}) {
      std::string bad = good;
      bad[at] = static_cast<char>(bad[at] ^ mask);
      WriteBytes(copy, bad);
      auto r = ReadCheckpoint(copy);
      ASSERT_FALSE(r.ok()) << "flip of byte " << at << " with mask " << int{mask} << " went unnoticed";
      EXPECT_TRUE(r.status().code() == absl::StatusCode::kDataLoss ||
                  r.status().code() == absl::StatusCode::kFailedPrecondition)
          << r.status();
      EXPECT_THAT(r.status().message(), HasSubstr(copy));
      EXPECT_THAT(r.status().message(), HasSubstr("byte offset"));
      ++checked;
    }
  }
  EXPECT_EQ(checked, good.size() * 3);
}

TEST_F(CheckpointTest, ErrorsNameTheSectionAndItsOffset) {
  const std::string path = Write(SmallSnapshot());
  auto file = ReadCheckpointFile(path);
  ASSERT_TRUE(file.ok());
  const SectionInfo* rows = nullptr;
  size_t index = 0;
  for (size_t i = 0; i < file->sections.size(); ++i) {
    if (file->sections[i].type == SectionType::kRows && file->sections[i].table_id == 2) {
      rows = &file->sections[i];
      index = i;
    }
  }
  ASSERT_NE(rows, nullptr);
  std::string bad = ReadBytes(path);
  bad[rows->offset + 24 + 20] ^= 0x10;  // inside its payload
  WriteBytes(path, bad);
  auto r = ReadCheckpoint(path);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(r.status().message(), HasSubstr("section " + std::to_string(index) + " (ROWS of table 2) at byte offset " +
                                              std::to_string(rows->offset)));
  EXPECT_THAT(r.status().message(), HasSubstr("payload checksum mismatch"));
}

TEST_F(CheckpointTest, TruncationAnywhereIsDetected) {
  const std::string path = Write(SmallSnapshot());
  const std::string good = ReadBytes(path);
  auto file = ReadCheckpointFile(path);
  ASSERT_TRUE(file.ok());
  const std::string copy = dir_ + "/truncated";
  WriteBytes(copy, good);
  ASSERT_TRUE(ReadCheckpoint(copy).ok()) << "the whole copy must read";
  // Every section boundary, and the boundary between each section's header and payload.
  std::vector<uint64_t> cuts = {0, 48};
  for (const SectionInfo& s : file->sections) {
    cuts.push_back(s.offset);
    cuts.push_back(s.offset + 24);
  }
  for (uint64_t cut : cuts) {
    WriteBytes(copy, good.substr(0, cut));
    auto r = ReadCheckpoint(copy);
    ASSERT_FALSE(r.ok()) << "cut at " << cut;
    EXPECT_EQ(r.status().code(), absl::StatusCode::kDataLoss) << r.status();
    EXPECT_THAT(r.status().message(), HasSubstr("truncated")) << r.status();
  }
  for (size_t cut = 0; cut < good.size(); ++cut) {
    WriteBytes(copy, good.substr(0, cut));
    ASSERT_FALSE(ReadCheckpoint(copy).ok()) << "cut at " << cut;
  }
  WriteBytes(copy, good + "x");
  auto r = ReadCheckpoint(copy);
  EXPECT_THAT(r.status().message(), HasSubstr("trailing")) << r.status();
}

TEST_F(CheckpointTest, HugeLengthsAreRejectedWithoutHugeAllocations) {
  const std::string path = Write(SmallSnapshot());
  const std::string good = ReadBytes(path);
  auto file = ReadCheckpointFile(path);
  ASSERT_TRUE(file.ok());
  const auto& sections = file->sections;
  auto find = [&](SectionType type) {
    for (const SectionInfo& s : sections)
      if (s.type == type) return s;
    ADD_FAILURE() << "no section " << SectionTypeName(type);
    return SectionInfo{};
  };
  const SectionInfo meta = find(SectionType::kMeta), table = find(SectionType::kTable), rows = find(SectionType::kRows);
  const uint32_t config_bytes = U32At(good, table.offset + 24);
  struct Case {
    std::string name;
    std::function<void(std::string&)> corrupt;
    std::string message;
  };
  // Each case is sealed with valid checksums, so only the length checks stand in the way.
  const std::vector<Case> cases = {
      {"section length", [&](std::string& b) { PutU64At(b, rows.offset + 8, uint64_t{1} << 62); Reseal(b, rows, false); },
       "runs past the end of the file"},
      {"vshard count", [&](std::string& b) { PutU32At(b, meta.offset + 24, 0xffffffffu); Reseal(b, meta); },
       "vshard count 4294967295 does not fit"},
      {"applied count",
       [&](std::string& b) { PutU32At(b, meta.offset + 24 + 4 + 2 * 4, 0xfffffff0u); Reseal(b, meta); },
       "applied-push count"},
      {"table count",
       [&](std::string& b) { PutU32At(b, meta.offset + 24 + meta.payload_bytes - 4, 0xffffffffu); Reseal(b, meta); },
       "table count 4294967295 cannot fit"},
      {"config length", [&](std::string& b) { PutU32At(b, table.offset + 24, 0xfffffff0u); Reseal(b, table); },
       "does not fit in the payload"},
      {"table rows",
       [&](std::string& b) { PutU64At(b, table.offset + 24 + 4 + config_bytes, uint64_t{1} << 60); Reseal(b, table); },
       "cannot fit in the"},
      {"row sections",
       [&](std::string& b) { PutU32At(b, table.offset + 24 + 4 + config_bytes + 8, 0xffffffffu); Reseal(b, table); },
       "row sections"},
      {"rows count", [&](std::string& b) { PutU64At(b, rows.offset + 24, uint64_t{1} << 61); Reseal(b, rows); },
       "do not match the payload"},
  };
  const std::string copy = dir_ + "/huge";
  WriteBytes(copy, good);
  ASSERT_TRUE(ReadCheckpoint(copy).ok()) << "the unchanged copy must read";
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    std::string bad = good;
    c.corrupt(bad);
    WriteBytes(copy, bad);
    g_largest_allocation = 0;
    g_track_allocations = true;
    auto r = ReadCheckpoint(copy);
    g_track_allocations = false;
    EXPECT_EQ(r.status().code(), absl::StatusCode::kDataLoss) << r.status();
    EXPECT_THAT(r.status().message(), HasSubstr(c.message)) << r.status();
    EXPECT_LE(g_largest_allocation.load(), good.size() + 1024) << "an allocation larger than the file";
  }
  // The tracker works: a good read does allocate (its payload buffers).
  g_largest_allocation = 0;
  g_track_allocations = true;
  auto ok = ReadCheckpoint(path);
  g_track_allocations = false;
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_GT(g_largest_allocation.load(), 100u);
}

TEST_F(CheckpointTest, StructuralDamageWithValidChecksumsIsDetected) {
  // What a buggy writer could produce: every checksum right, the content wrong.
  const std::string path = Write(SmallSnapshot());
  const std::string good = ReadBytes(path);
  auto file = ReadCheckpointFile(path);
  ASSERT_TRUE(file.ok());
  const auto& sec = file->sections;  // META, CORE_STATE, TABLE 1, ROWS 1, TABLE 2, ROWS 2, END
  ASSERT_EQ(sec.size(), 7u);
  const SectionInfo rows1 = sec[3], rows2 = sec[5], end = sec[6];
  struct Case {
    std::string name;
    std::function<void(std::string&)> corrupt;
    std::string message;
  };
  const std::vector<Case> cases = {
      {"END count", [&](std::string& b) { PutU32At(b, end.offset + 24, 5); Reseal(b, end); }, "END records 5 sections"},
      {"END offset", [&](std::string& b) { PutU64At(b, end.offset + 28, 7); Reseal(b, end); }, "its offset as 7"},
      {"rows of another table", [&](std::string& b) { PutU32At(b, rows2.offset + 4, 1); Reseal(b, rows2, false); },
       "rows of table 2 expected here"},
      {"section type", [&](std::string& b) { PutU32At(b, rows1.offset, 3); Reseal(b, rows1, false); },
       "ROWS expected here, found TABLE"},
      {"unknown type", [&](std::string& b) { PutU32At(b, rows1.offset, 77); Reseal(b, rows1, false); },
       "unknown section type 77"},
      {"keys out of order",  // rows 2 keys: 10 20 30 40 50 -> 10 20 20 40 50
       [&](std::string& b) { PutU64At(b, rows2.offset + 24 + 8 + 2 * 8, 20); Reseal(b, rows2); },
       "key 20 follows key 20"},
      {"dense key out of range",  // rows 1 keys: 0 1 4 of a 6-row dense table
       [&](std::string& b) { PutU64At(b, rows1.offset + 24 + 8 + 2 * 8, 6); Reseal(b, rows1); }, "out of range"},
  };
  const std::string copy = dir_ + "/damaged";
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    std::string bad = good;
    c.corrupt(bad);
    WriteBytes(copy, bad);
    auto r = ReadCheckpoint(copy);
    EXPECT_EQ(r.status().code(), absl::StatusCode::kDataLoss) << r.status();
    EXPECT_THAT(r.status().message(), HasSubstr(c.message)) << r.status();
  }
}

TEST_F(CheckpointTest, NewerVersionIsFailedPreconditionAndGarbageIsNotACheckpoint) {
  const std::string path = Write(SmallSnapshot());
  std::string b = ReadBytes(path);
  PutU32At(b, 8, 2);
  PutU32At(b, 44, Crc32c(b.data(), 44));
  WriteBytes(path, b);
  auto r = ReadCheckpoint(path);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition) << r.status();
  EXPECT_THAT(r.status().message(), HasSubstr("format version 2; this build reads version 1"));

  WriteBytes(path, std::string(100, 'x'));
  r = ReadCheckpoint(path);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(r.status().message(), HasSubstr("bad magic number"));

  r = ReadCheckpoint(dir_ + "/absent.tckpt");
  EXPECT_EQ(r.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(r.status().message(), HasSubstr("absent.tckpt"));
}

TEST_F(CheckpointTest, ACrashBeforeTheRenameLeavesThePreviousCheckpointLatest) {
  ShardSnapshot first = SmallSnapshot(), second = SmallSnapshot(), third = SmallSnapshot();
  second.epoch = 4;
  third.epoch = 5;
  Write(first);
  const std::string second_path = Write(second);
  // A crashed writer of sequence 3 left its temporary behind: once complete
  // but not renamed, once cut short mid-write.
  const std::string elsewhere = dir_ + "/other";
  const std::string complete = ReadBytes(Write(third, {}, elsewhere));
  fs::remove_all(elsewhere);
  const std::string temporary = CheckpointTemporaryPath(dir_, 1, 3);
  EXPECT_EQ(temporary, CheckpointPath(dir_, 1, 3) + ".tmp");
  for (const std::string& left_behind : {complete, complete.substr(0, complete.size() / 2)}) {
    WriteBytes(temporary, left_behind);
    auto list = ListCheckpoints(dir_);
    ASSERT_TRUE(list.ok());
    ASSERT_EQ(list->size(), 2u);
    auto latest = LatestCheckpoint(dir_, 1);
    ASSERT_TRUE(latest.ok());
    EXPECT_EQ(latest->path, second_path);
    EXPECT_EQ(latest->sequence, 2u);
    auto loaded = LoadLatestCheckpoint(dir_, 1);
    ASSERT_TRUE(loaded.ok()) << loaded.status();
    EXPECT_TRUE(loaded->skipped.empty());
    ExpectSameSnapshot(loaded->snapshot, second);
  }
  // The next write takes sequence 3 and replaces the leftover.
  auto info = WriteCheckpoint(dir_, third, CheckpointWriteOptions{});
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->sequence, 3u);
  EXPECT_FALSE(fs::exists(temporary));
  auto loaded = LoadLatestCheckpoint(dir_, 1);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  ExpectSameSnapshot(loaded->snapshot, third);
}

TEST_F(CheckpointTest, LoadLatestFallsBackPastADamagedNewestAndSaysSo) {
  ShardSnapshot older = SmallSnapshot(), newer = SmallSnapshot();
  newer.epoch = 99;
  Write(older);
  const std::string newest = Write(newer);
  std::string b = ReadBytes(newest);
  b[b.size() - 30] ^= 1;
  WriteBytes(newest, b);
  auto loaded = LoadLatestCheckpoint(dir_, 1);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ(loaded->info.sequence, 1u);
  ExpectSameSnapshot(loaded->snapshot, older);
  ASSERT_EQ(loaded->skipped.size(), 1u);
  EXPECT_THAT(loaded->skipped[0].message(), HasSubstr(newest));

  // Every one damaged: DataLoss naming each; none at all: NotFound.
  fs::remove(newest);
  WriteBytes(CheckpointPath(dir_, 1, 1), "garbage");
  auto none = LoadLatestCheckpoint(dir_, 1);
  EXPECT_EQ(none.status().code(), absl::StatusCode::kDataLoss) << none.status();
  EXPECT_EQ(LoadLatestCheckpoint(dir_, 5).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(LatestCheckpoint(dir_, 5).status().code(), absl::StatusCode::kNotFound);
}

TEST_F(CheckpointTest, ARankMismatchBetweenNameAndHeaderIsNotLoaded) {
  const std::string path = Write(SmallSnapshot());  // rank 1
  fs::rename(path, CheckpointPath(dir_, 0, 1));
  auto loaded = LoadLatestCheckpoint(dir_, 0);
  EXPECT_EQ(loaded.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(loaded.status().message(), HasSubstr("header says server rank 1"));
}

TEST_F(CheckpointTest, ListingIgnoresTemporariesAndOtherNamesAndSortsNewestFirst) {
  for (const char* name : {"server-0-0000000001.tckpt", "server-1-3.tckpt", "server-0-2.tckpt", "server-0-4.tckpt.tmp",
                           "server-x-1.tckpt", "server-0-1.tckptx", "server-0-.tckpt", "server--1.tckpt", "notes.txt",
                           "server-0-99999999999999999999999.tckpt", "server-4294967296-1.tckpt", "xserver-0-5.tckpt"})
    WriteBytes(dir_ + "/" + name, "x");
  fs::create_directory(dir_ + "/server-0-9.tckpt");  // not a file
  auto list = ListCheckpoints(dir_);
  ASSERT_TRUE(list.ok()) << list.status();
  std::vector<std::string> names;
  for (const CheckpointInfo& c : *list) names.push_back(fs::path(c.path).filename().string());
  EXPECT_EQ(names, (std::vector<std::string>{"server-1-3.tckpt", "server-0-2.tckpt", "server-0-0000000001.tckpt"}));
  EXPECT_EQ((*list)[0].server_rank, 1u);
  EXPECT_EQ((*list)[2].sequence, 1u);

  auto missing = ListCheckpoints(dir_ + "/no-such-dir");
  ASSERT_TRUE(missing.ok()) << missing.status();
  EXPECT_TRUE(missing->empty());
  EXPECT_EQ(LatestCheckpoint(dir_ + "/no-such-dir", 0).status().code(), absl::StatusCode::kNotFound);
}

TEST_F(CheckpointTest, PruningKeepsTheNewestNOfOneRankOnly) {
  ShardSnapshot zero = SmallSnapshot(), one = SmallSnapshot();
  zero.server_rank = 0;
  for (int i = 0; i < 5; ++i) Write(zero);
  for (int i = 0; i < 2; ++i) Write(one);
  WriteBytes(CheckpointTemporaryPath(dir_, 0, 6), "crashed");
  WriteBytes(CheckpointTemporaryPath(dir_, 1, 3), "in progress elsewhere");
  WriteBytes(dir_ + "/notes.txt", "mine");
  EXPECT_EQ(PruneCheckpoints(dir_, 0, 0).code(), absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(PruneCheckpoints(dir_, 0, 2).ok());
  EXPECT_EQ(FileNames(dir_), (std::vector<std::string>{"notes.txt", "server-0-0000000004.tckpt",
                                                       "server-0-0000000005.tckpt", "server-1-0000000001.tckpt",
                                                       "server-1-0000000002.tckpt", "server-1-0000000003.tckpt.tmp"}));
  // Through the write option: each write keeps the newest three.
  for (int i = 0; i < 4; ++i) Write(one, CheckpointWriteOptions{.keep_last = 3});
  auto list = ListCheckpoints(dir_);
  ASSERT_TRUE(list.ok());
  std::vector<uint64_t> ones;
  for (const CheckpointInfo& c : *list)
    if (c.server_rank == 1) ones.push_back(c.sequence);
  EXPECT_EQ(ones, (std::vector<uint64_t>{6, 5, 4}));
  EXPECT_FALSE(fs::exists(CheckpointTemporaryPath(dir_, 1, 3)));
  EXPECT_TRUE(fs::exists(CheckpointPath(dir_, 0, 5)));
}

TEST_F(CheckpointTest, AFailedWriteLeavesNoTemporaryAndThePreviousCheckpointLatest) {
  const std::string previous = Write(SmallSnapshot());
  // A child process whose files may not grow past 4 KiB: the write of a
  // larger checkpoint fails part-way (EFBIG) and must clean up after itself.
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    std::signal(SIGXFSZ, SIG_IGN);
    struct rlimit limit = {4096, 4096};
    ::setrlimit(RLIMIT_FSIZE, &limit);
    ShardSnapshot big = SampleSnapshot();
    big.server_rank = 1;
    auto info = WriteCheckpoint(dir_, big, CheckpointWriteOptions{});
    const bool as_expected = !info.ok() && std::string(info.status().message()).find("cannot write") != std::string::npos;
    ::_exit(as_expected ? 0 : 1);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0) << "the write did not fail with \"cannot write\"";
  EXPECT_EQ(FileNames(dir_), std::vector<std::string>{fs::path(previous).filename().string()});
  auto latest = LatestCheckpoint(dir_, 1);
  ASSERT_TRUE(latest.ok());
  EXPECT_EQ(latest->path, previous);

  // A directory that cannot be made is an error naming it.
  WriteBytes(dir_ + "/a-file", "x");
  auto info = WriteCheckpoint(dir_ + "/a-file/sub", SmallSnapshot(), CheckpointWriteOptions{});
  EXPECT_FALSE(info.ok());
  EXPECT_THAT(info.status().message(), HasSubstr("cannot create checkpoint directory"));
}

// ---- the tool ----

#ifdef TESSERA_CHECKPOINT_TOOL
struct ToolRun {
  int exit_code;
  std::string output;
};

ToolRun RunTool(const std::string& args) {
  const std::string command = std::string(TESSERA_CHECKPOINT_TOOL) + " " + args + " 2>&1";
  FILE* pipe = ::popen(command.c_str(), "r");
  if (pipe == nullptr) return {-1, "popen failed"};
  std::string out;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof(buf), pipe)) > 0) out.append(buf, n);
  const int status = ::pclose(pipe);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, out};
}

TEST_F(CheckpointTest, ToolInspectsVerifiesAndLists) {
  const std::string path = Write(SmallSnapshot());
  ToolRun inspect = RunTool("inspect " + path);
  EXPECT_EQ(inspect.exit_code, 0) << inspect.output;
  for (const char* text : {"server rank 1, epoch 3, sequence 1", "vshards (2): 0 2", "applied pushes by vshard (2): 0=4 2=9",
                           "core state: 12 bytes", "table 2 \"table-2\": 5 rows; SPARSE, width 3", "key 10: [",
                           "... 2 more rows", "ROWS", "END", "checksums OK"})
    EXPECT_THAT(inspect.output, HasSubstr(text));

  ToolRun verify = RunTool("verify " + path);
  EXPECT_EQ(verify.exit_code, 0) << verify.output;
  EXPECT_THAT(verify.output, HasSubstr("OK"));

  std::string b = ReadBytes(path);
  b[100] ^= 4;
  const std::string bad = dir_ + "/bad.tckpt";
  WriteBytes(bad, b);
  verify = RunTool("verify " + path + " " + bad);
  EXPECT_EQ(verify.exit_code, 1) << verify.output;
  EXPECT_THAT(verify.output, HasSubstr(bad));
  EXPECT_THAT(verify.output, HasSubstr("checksum mismatch"));
  EXPECT_EQ(RunTool("inspect " + bad).exit_code, 1);

  ToolRun list = RunTool("list " + dir_);
  EXPECT_EQ(list.exit_code, 0) << list.output;
  EXPECT_THAT(list.output, HasSubstr("rank 1  sequence 1"));

  ToolRun help = RunTool("--help");
  EXPECT_EQ(help.exit_code, 0);
  EXPECT_THAT(help.output, HasSubstr("verify"));
  EXPECT_EQ(RunTool("").exit_code, 2);
  EXPECT_EQ(RunTool("inspect").exit_code, 2);
}
#endif

}  // namespace
}  // namespace tessera

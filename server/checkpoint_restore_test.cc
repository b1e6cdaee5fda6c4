#include "server/checkpoint_restore.h"

#include <gtest/gtest.h>

#include <map>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "common/keys.h"

namespace tessera {
namespace {

constexpr uint32_t kTable = 1;
constexpr uint32_t kVShards = 8;

proto::TableConfig Config() {
  proto::TableConfig c;
  c.set_table_id(kTable);
  c.set_width(2);
  c.set_kind(proto::SPARSE);
  c.set_optimizer(proto::ACCUMULATE);
  return c;
}

// The first key of kTable in shard v.
Key KeyIn(uint32_t v) {
  for (Key k = 0;; ++k)
    if (VirtualShardOf(kTable, k, kVShards) == v) return k;
}

// A checkpoint of `vshards` (ascending) holding one row per shard, each
// row's values `value`, and the applied counts given.
ShardSnapshot Snapshot(uint64_t epoch, std::vector<uint32_t> vshards, float value,
                       std::map<uint32_t, uint64_t> applied = {}) {
  ShardSnapshot s;
  s.epoch = epoch;
  s.vshards = vshards;
  s.applied_pushes_by_vshard = std::move(applied);
  TableSnapshot t;
  t.config = Config();
  std::vector<Key> keys;
  for (uint32_t v : vshards) keys.push_back(KeyIn(v));
  std::sort(keys.begin(), keys.end());
  for (Key k : keys) {
    t.keys.push_back(k);
    t.values.insert(t.values.end(), {value, value});
  }
  s.tables.push_back(std::move(t));
  return s;
}

struct Fixture {
  Fixture() : core(ServerCoreOptions{.node_id = 1}) {
    proto::NodeInfo n;
    n.set_rank(0);
    n.set_node_id(1);
    n.set_role(proto::SERVER);
    n.set_address("sim://server-0");
    EXPECT_TRUE(core.InstallShardMap(RoundRobinShardMap(1, kVShards, std::vector<proto::NodeInfo>{n}), 0).ok());
  }
  // The row of `key` (empty when the core has no such row).
  std::vector<float> Row(Key key) const {
    std::vector<float> out;
    const Table* t = core.table(kTable);
    if (t == nullptr) return out;
    t->ForEachRow([&](Key k, std::span<const float> row) {
      if (k == key) out.assign(row.begin(), row.end());
    });
    return out;
  }
  ServerCore core;
};

TEST(CheckpointRestoreTest, EachShardComesFromItsNewestCopyAndAShardNoCheckpointHoldsIsNamed) {
  // Shard 1 is in A (epoch 1) and B (epoch 2, a lower sequence): B wins.
  // Shard 2 is in A and C, both epoch 1: C's higher sequence wins. No
  // checkpoint holds shard 3.
  const ShardSnapshot a = Snapshot(1, {1, 2}, 1.0f), b = Snapshot(2, {1}, 2.0f), c = Snapshot(1, {2}, 3.0f);
  const std::vector<CheckpointCopy> copies = {
      {&a, 5, "A"}, {&b, 1, "B"}, {&c, 6, "C"}};
  Fixture f;
  const std::vector<uint32_t> wanted = {3, 2, 1};
  const CheckpointRestore r = RestoreNewestCopies(f.core, copies, wanted, /*with_windows=*/false, {});
  EXPECT_EQ(r.restored, (std::vector<uint32_t>{1, 2}));
  EXPECT_EQ(r.none, std::vector<uint32_t>{3});
  EXPECT_EQ(r.rows, 2u);
  EXPECT_TRUE(r.problems.empty());
  EXPECT_EQ(f.Row(KeyIn(1)), (std::vector<float>{2.0f, 2.0f}));
  EXPECT_EQ(f.Row(KeyIn(2)), (std::vector<float>{3.0f, 3.0f}));
  EXPECT_TRUE(f.Row(KeyIn(3)).empty()) << "shard 3 starts from its initial values";
  EXPECT_EQ(r.line,
            "restored 2 of 3 shards (2 rows) from checkpoints: shards 1 from B; shards 2 from C; no checkpoint holds "
            "shards 3: they start from their initial values");
}

TEST(CheckpointRestoreTest, WithWindowsTheAppliedCountsComeBackAndTheMissedApplicationsAreCounted) {
  const ShardSnapshot a = Snapshot(1, {1, 2}, 1.0f, {{1, 10}, {2, 20}});
  const std::vector<CheckpointCopy> copies = {{&a, 1, "A"}};
  Fixture f;
  const std::vector<uint32_t> wanted = {1, 2};
  // Shard 1's primary last reported 14 applied (4 missed); shard 2's 18
  // (below the checkpoint's 20: none missed).
  const CheckpointRestore r = RestoreNewestCopies(f.core, copies, wanted, /*with_windows=*/true, {{1, 14}, {2, 18}});
  EXPECT_EQ(r.restored, wanted);
  EXPECT_EQ(r.missed, 4u);
  EXPECT_EQ(f.core.applied(1), 10u);
  EXPECT_EQ(f.core.applied(2), 20u);
  EXPECT_TRUE(absl::StrContains(r.line, "restored 2 of 2 shards (2 rows) from checkpoints: shards 1,2 from A; the "
                                        "checkpoints miss at least 4 push applications"))
      << r.line;
  // Without windows (a new job) nothing is said of missed applications.
  Fixture g;
  EXPECT_FALSE(absl::StrContains(RestoreNewestCopies(g.core, copies, wanted, false, {{1, 14}}).line, "miss"));
}

TEST(CheckpointRestoreTest, ACheckpointThatCannotBeRestoredIsAProblemAndChangesNothing) {
  ShardSnapshot bad = Snapshot(3, {1}, 9.0f);
  bad.core_state = "\xff\xff\xff garbage";  // windows that do not parse
  const ShardSnapshot good = Snapshot(1, {2}, 1.0f);
  const std::vector<CheckpointCopy> copies = {{&bad, 1, "bad"}, {&good, 1, "good"}};
  Fixture f;
  const std::vector<uint32_t> wanted = {1, 2};
  const CheckpointRestore r =
      RestoreNewestCopies(f.core, copies, wanted, /*with_windows=*/true, {}, {"unreadable-file: checksum mismatch"});
  EXPECT_EQ(r.restored, std::vector<uint32_t>{2});
  EXPECT_TRUE(r.none.empty());
  ASSERT_EQ(r.problems.size(), 2u);
  EXPECT_EQ(r.problems[0], "unreadable-file: checksum mismatch");
  EXPECT_TRUE(absl::StartsWith(r.problems[1], "bad: ")) << r.problems[1];
  EXPECT_TRUE(f.Row(KeyIn(1)).empty()) << "the failed checkpoint changed nothing";
  EXPECT_EQ(f.Row(KeyIn(2)), (std::vector<float>{1.0f, 1.0f}));
  EXPECT_TRUE(absl::StartsWith(r.line, "restored 1 of 2 shards (1 rows) from checkpoints: shards 2 from good;"))
      << r.line;
  EXPECT_TRUE(absl::StrContains(r.line, "; unreadable: unreadable-file: checksum mismatch; bad: ")) << r.line;
}

TEST(CheckpointRestoreTest, NoCheckpointAtAllRestoresNothing) {
  Fixture f;
  const std::vector<uint32_t> wanted = {4};
  const CheckpointRestore r = RestoreNewestCopies(f.core, {}, wanted, /*with_windows=*/true, {{4, 7}});
  EXPECT_TRUE(r.restored.empty());
  EXPECT_EQ(r.none, wanted);
  EXPECT_EQ(r.missed, 0u);
  EXPECT_TRUE(absl::StartsWith(r.line, "restored 0 of 1 shards (0 rows) from checkpoints: none;")) << r.line;
}

TEST(RestoreChoiceTest, EachShardComesFromItsNewestCopyByEpochThenSequence) {
  auto snap = [](uint64_t epoch, std::vector<uint32_t> vshards) {
    ShardSnapshot s;
    s.epoch = epoch;
    s.vshards = std::move(vshards);
    return s;
  };
  // Shard 1 is in all three: epoch 3 wins over epoch 2 even at a lower
  // sequence; shard 2 is in two of epoch 3: the higher sequence wins.
  const std::vector<ShardSnapshot> snaps = {snap(2, {1, 4}), snap(3, {1, 2}), snap(3, {2})};
  const std::vector<uint64_t> sequences = {9, 1, 2};
  std::vector<uint32_t> none;
  const std::vector<uint32_t> wanted = {7, 2, 1, 4};
  auto chosen = ChooseNewestCopies(snaps, sequences, wanted, &none);
  ASSERT_EQ(chosen.size(), 3u);
  EXPECT_EQ(chosen[0], (std::pair<size_t, std::vector<uint32_t>>{0, {4}}));
  EXPECT_EQ(chosen[1], (std::pair<size_t, std::vector<uint32_t>>{1, {1}}));
  EXPECT_EQ(chosen[2], (std::pair<size_t, std::vector<uint32_t>>{2, {2}}));
  EXPECT_EQ(none, std::vector<uint32_t>{7});
}

TEST(RestoreChoiceTest, MissedApplicationsAreWhatTheLastReportHasBeyondTheSnapshot) {
  ShardSnapshot s;
  s.vshards = {1, 2, 3};
  s.applied_pushes_by_vshard = {{1, 10}, {2, 20}, {3, 30}};
  const std::map<uint32_t, uint64_t> last = {{1, 15}, {2, 20}, {3, 25}};  // shard 3 reported less: counts 0
  const std::vector<uint32_t> vs = {1, 2, 3, 4};                           // shard 4: neither knows it
  EXPECT_EQ(MissedApplications(s, vs, last), 5u);
  EXPECT_EQ(MissedApplications(s, vs, {}), 0u);
}

}  // namespace
}  // namespace tessera

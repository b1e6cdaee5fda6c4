// Replication in the server core: three ServerCores wired by a hand-driven
// message queue, so each test decides what is delivered, dropped, repeated
// or cut off by a failure.
#include <gtest/gtest.h>

#include <limits>

#include <algorithm>
#include <deque>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "server/server_core.h"
#include "server/table.h"

namespace tessera {
namespace {

constexpr uint32_t kTable = 1;
constexpr uint32_t kWorkerNode = 50;
const char* const kWorker = "inproc://worker";

std::string ServerAddress(uint32_t rank) { return "inproc://server-" + std::to_string(rank); }

class ReplicationTest : public ::testing::Test {
 protected:
  static constexpr uint32_t kServers = 3;

  void SetUp() override {
    std::vector<proto::NodeInfo> servers;
    for (uint32_t r = 0; r < kServers; ++r) {
      proto::NodeInfo n;
      n.set_node_id(r + 1);
      n.set_rank(r);
      n.set_role(proto::SERVER);
      n.set_address(ServerAddress(r));
      servers.push_back(n);
    }
    map_ = RoundRobinShardMap(1, 12, servers, replication_);
    for (uint32_t r = 0; r < kServers; ++r) {
      cores_.push_back(std::make_unique<ServerCore>(
          ServerCoreOptions{.node_id = r + 1, .max_message_bytes = max_message_bytes_, .forward_resend = resend_,
                            .audit = audit_, .disk_tiers = disk_tiers_}));
      ASSERT_TRUE(cores_[r]->InstallShardMap(map_, r).ok());
      cores_[r]->SetWorkers({{kWorkerNode, 0}});
      Message create = Request(1000 + r);
      auto* c = create.header.mutable_create_table()->mutable_config();
      c->set_table_id(kTable);
      c->set_width(2);
      c->set_kind(proto::SPARSE);
      c->set_optimizer(proto::ACCUMULATE);
      Send(ServerAddress(r), std::move(create));
    }
    DeliverAll();
    ASSERT_EQ(inbox_.size(), kServers);
    for (const Message& m : inbox_) ASSERT_TRUE(m.header.has_ack()) << m.header.ShortDebugString();
    inbox_.clear();
  }

  Message Request(uint64_t id) {
    Message m;
    m.header.set_request_id(id);
    m.header.set_sender_id(kWorkerNode);
    m.header.set_sender_address(kWorker);
    return m;
  }

  // Keys of the table whose shard has `primary` as primary.
  std::vector<Key> KeysOf(uint32_t primary, size_t n, const proto::ShardMap& map) {
    ShardMapView view = *ShardMapView::Create(map);
    std::vector<Key> keys;
    for (Key k = 0; keys.size() < n; ++k)
      if (view.ServerRankOfKey(kTable, k) == primary) keys.push_back(k);
    return keys;
  }

  Message Push(uint64_t id, const std::vector<Key>& keys, float value, uint64_t seq, bool resend = false,
               uint32_t incarnation = 0) {
    Message m = Request(id);
    auto* p = m.header.mutable_push();
    p->set_table_id(kTable);
    p->set_num_keys(keys.size());
    p->set_seq(seq);
    p->set_incarnation(incarnation);
    p->set_resend(resend);
    if (resend) m.header.set_epoch(map_.epoch());  // as workers stamp their resends
    std::vector<float> values(keys.size() * 2, value);
    m.frames.push_back(Buffer::CopyOf(keys.data(), keys.size() * sizeof(Key)));
    m.frames.push_back(Buffer::CopyOf(values.data(), values.size() * sizeof(float)));
    return m;
  }

  void Send(const std::string& to, Message m) {
    m.header.set_sender_address(m.header.sender_address().empty() ? kWorker : m.header.sender_address());
    net_.push_back(Outgoing{to, std::move(m)});
  }

  // Delivers one queued message (to a server core, or to the worker's inbox).
  void DeliverOne() {
    Outgoing o = std::move(net_.front());
    net_.pop_front();
    if (o.to == kWorker) {
      inbox_.push_back(std::move(o.message));
      return;
    }
    const uint32_t rank = static_cast<uint32_t>(std::stoul(o.to.substr(std::string("inproc://server-").size())));
    if (dead_[rank]) return;
    if (o.message.header.sender_address().empty()) o.message.header.set_sender_address("?");
    if (o.message.header.has_replicate() || o.message.header.has_replicate_ack()) {
      // Server-to-server messages carry the sender's address (as a transport stamps it).
      for (uint32_t r = 0; r < kServers; ++r)
        if (o.message.header.sender_id() == r + 1) o.message.header.set_sender_address(ServerAddress(r));
    }
    for (Outgoing& next : cores_[rank]->Step(std::move(o.message), now_)) net_.push_back(std::move(next));
  }
  void DeliverAll() {
    while (!net_.empty()) DeliverOne();
  }

  // Server `rank` dies; the others get the next map (with lost copies
  // recruited on the survivors when `refill`).
  void Fail(uint32_t rank, bool refill = false) {
    dead_[rank] = true;
    auto next = WithoutServer(map_, rank);
    ASSERT_TRUE(next.ok()) << next.status();
    Publish(refill ? WithBackupsFilled(*next) : *next);
  }
  void Publish(const proto::ShardMap& map) {
    map_ = map;
    for (uint32_t r = 0; r < kServers; ++r) {
      if (dead_[r]) continue;
      auto out = cores_[r]->UpdateShardMap(map_, now_);
      ASSERT_TRUE(out.ok()) << out.status();
      for (Outgoing& o : *out) net_.push_back(std::move(o));
    }
  }
  std::vector<Key> AllKeys(size_t n) {
    std::vector<Key> keys(n);
    for (size_t i = 0; i < n; ++i) keys[i] = i;
    return keys;
  }
  // Pushes `value` to each key, one push per key, to its primary; delivers all.
  void PushEach(const std::vector<Key>& keys, float value, uint64_t* seq) {
    ShardMapView view = *ShardMapView::Create(map_);
    for (Key k : keys) {
      ++*seq;
      Send(ServerAddress(view.ServerRankOfKey(kTable, k)), Push(1000 + *seq, {k}, value, *seq));
    }
    DeliverAll();
    ASSERT_EQ(inbox_.size(), keys.size());
    for (const Message& m : inbox_) ASSERT_TRUE(m.header.has_ack()) << m.header.ShortDebugString();
    inbox_.clear();
  }
  // Pulls every key from its primary.
  std::vector<float> PullEach(const std::vector<Key>& keys) {
    ShardMapView view = *ShardMapView::Create(map_);
    std::vector<float> all;
    for (Key k : keys) {
      auto v = PullFrom(view.ServerRankOfKey(kTable, k), {k});
      all.insert(all.end(), v.begin(), v.end());
    }
    return all;
  }

  std::vector<float> PullFrom(uint32_t rank, const std::vector<Key>& keys) {
    Message m = Request(9999);
    m.header.mutable_pull()->set_table_id(kTable);
    m.header.mutable_pull()->set_num_keys(keys.size());
    m.frames.push_back(Buffer::CopyOf(keys.data(), keys.size() * sizeof(Key)));
    auto out = cores_[rank]->Step(std::move(m), now_);
    EXPECT_EQ(out.size(), 1u);
    if (out.size() != 1 || !out[0].message.header.has_pull_reply()) {
      ADD_FAILURE() << (out.empty() ? "no reply" : out[0].message.header.ShortDebugString());
      return {};
    }
    auto v = out[0].message.frames[0].As<float>();
    return {v.begin(), v.end()};
  }

  // The rows of table kTable that server `rank` holds (stored floats), by key.
  std::map<Key, std::vector<float>> RowsAt(uint32_t rank) const {
    std::map<Key, std::vector<float>> rows;
    const Table* t = cores_[rank]->table(kTable);
    if (t == nullptr) return rows;
    t->ForEachRow([&](Key k, std::span<const float> row) { rows[k] = {row.begin(), row.end()}; });
    return rows;
  }
  // The "row" lines of server `rank`'s AuditDump without their role (primary
  // or backup), so two copies of the same shards compare equal.
  std::vector<std::string> AuditRows(uint32_t rank) const {
    std::vector<std::string> rows;
    std::istringstream dump(cores_[rank]->AuditDump());
    for (std::string line; std::getline(dump, line);) {
      if (line.rfind("row ", 0) != 0) continue;
      std::istringstream words(line);
      std::string row, word;
      for (int i = 0; words >> word; ++i)
        if (i != 3) row += (row.empty() ? "" : " ") + word;
      rows.push_back(row);
    }
    return rows;
  }

  size_t Count(bool (proto::Envelope::*has)() const) const {
    size_t n = 0;
    for (const Outgoing& o : net_) n += (o.message.header.*has)();
    return n;
  }

  // Pushes 1..n of keys (whose primary is server 1) reach it and are
  // applied; their n forwards to the backup are left on the network.
  void PushToServerOne(const std::vector<Key>& keys, uint64_t n) {
    for (uint64_t i = 1; i <= n; ++i) Send(ServerAddress(1), Push(i, keys, 1.0f, i));
    for (uint64_t i = 0; i < n; ++i) DeliverOne();
    ASSERT_EQ(Count(&proto::Envelope::has_replicate), n);
  }

  // Exactly n replies reached the worker, each an Ack.
  void ExpectAcks(size_t n) const {
    ASSERT_EQ(inbox_.size(), n);
    for (const Message& m : inbox_) EXPECT_TRUE(m.header.has_ack()) << m.header.ShortDebugString();
  }

  // Copies per shard and audit mode, for SetUp (a derived fixture sets them
  // in its constructor).
  uint32_t replication_ = 2;
  bool audit_ = false;
  ColdRowsFactory disk_tiers_;  // none unless a test sets one
  size_t max_message_bytes_ = kDefaultMaxMessageBytes;
  proto::ShardMap map_;
  std::vector<std::unique_ptr<ServerCore>> cores_;
  std::deque<Outgoing> net_;
  std::vector<Message> inbox_;
  bool dead_[kServers] = {false, false, false};
  Nanos now_ = 0;
  // The forwards' resend timer: a fixed 100 ms unless a test learns.
  RetransmitOptions resend_{.initial = 100 * kMillis, .floor = 100 * kMillis, .ceiling = 100 * kMillis};
};

TEST_F(ReplicationTest, TheAckWaitsUntilTheBackupHasThePush) {
  const auto keys = KeysOf(0, 4, map_);
  Send(ServerAddress(0), Push(1, keys, 1.0f, 1));
  DeliverOne();  // the primary takes the push
  ASSERT_EQ(net_.size(), 1u);
  EXPECT_EQ(net_.front().to, ServerAddress(1));  // backup of server 0's shards: server 1
  EXPECT_TRUE(net_.front().message.header.has_replicate());
  EXPECT_EQ(net_.front().message.header.epoch(), 1u);
  EXPECT_TRUE(inbox_.empty()) << "acknowledged before the backup had it";
  EXPECT_EQ(cores_[0]->waiting_acks(), 1u);
  DeliverOne();  // the backup applies it and acknowledges
  EXPECT_TRUE(inbox_.empty());
  DeliverAll();  // the primary releases the Ack
  ASSERT_EQ(inbox_.size(), 1u);
  EXPECT_TRUE(inbox_[0].header.has_ack()) << inbox_[0].header.ShortDebugString();
  EXPECT_EQ(inbox_[0].header.request_id(), 1u);
  EXPECT_EQ(cores_[0]->waiting_acks(), 0u);
  EXPECT_EQ(cores_[0]->unacked_forwards(), 0u);
  EXPECT_EQ(cores_[1]->stats().forwards_applied, 1u);
  EXPECT_EQ(PullFrom(0, keys), std::vector<float>(8, 1.0f));
}

// Found by the simulator (seed 38233): a server that joined the running job
// got its copies by state transfer before the primary had a table (the
// primary's CreateTable arrived late), so forwards of that table's pushes
// were refused there ("no table") and the pushes failed. A primary that
// creates a table sends its config to every server backing up its shards.
TEST_F(ReplicationTest, ATableCreatedOnlyAtThePrimaryReachesItsBackupsBeforeAnyForward) {
  constexpr uint32_t kLate = kTable + 1;
  Message create = Request(2000);
  auto* c = create.header.mutable_create_table()->mutable_config();
  c->set_table_id(kLate);
  c->set_width(2);
  c->set_kind(proto::SPARSE);
  c->set_optimizer(proto::ACCUMULATE);
  Send(ServerAddress(0), std::move(create));  // only server 0 hears of it
  DeliverAll();
  ASSERT_EQ(inbox_.size(), 1u);
  ASSERT_TRUE(inbox_[0].header.has_ack()) << inbox_[0].header.ShortDebugString();
  inbox_.clear();
  ShardMapView view = *ShardMapView::Create(map_);
  Key key = 0;
  while (view.ServerRankOfKey(kLate, key) != 0) ++key;
  const uint32_t backup = view.BackupsOf(view.VShardOfKey(kLate, key))[0];
  ASSERT_NE(cores_[backup]->table(kLate), nullptr) << "the backup got the table with no shards";

  Message push = Push(2001, {key}, 3.0f, 1);
  push.header.mutable_push()->set_table_id(kLate);
  Send(ServerAddress(0), std::move(push));
  DeliverAll();
  ASSERT_EQ(inbox_.size(), 1u);
  EXPECT_TRUE(inbox_[0].header.has_ack()) << inbox_[0].header.ShortDebugString();
  std::vector<float> row;
  cores_[backup]->table(kLate)->ForEachRow([&](Key k, std::span<const float> r) {
    if (k == key) row.assign(r.begin(), r.end());
  });
  EXPECT_EQ(row, (std::vector<float>{3.0f, 3.0f})) << "the backup applied the forward";
}

TEST_F(ReplicationTest, BackupsDoNotServePullsOrTakePushes) {
  const auto keys = KeysOf(0, 2, map_);
  Send(ServerAddress(1), Push(1, keys, 1.0f, 1));
  DeliverAll();
  ASSERT_EQ(inbox_.size(), 1u);
  EXPECT_EQ(inbox_[0].header.error().code(), static_cast<int>(absl::StatusCode::kAborted))
      << inbox_[0].header.ShortDebugString();
  EXPECT_EQ(cores_[1]->stats().bad_requests, 0u) << "a misdirected push is a stale map, not bad input";
}

TEST_F(ReplicationTest, APrimaryLostBeforeItsAckLosesNothingAndAppliesNothingTwice) {
  const auto keys = KeysOf(0, 5, map_);
  Send(ServerAddress(0), Push(1, keys, 2.0f, 1));
  DeliverOne();  // primary applied and forwarded
  DeliverOne();  // backup applied; its ack is queued for the primary
  Fail(0);       // ... which dies before it reads it
  DeliverAll();
  EXPECT_TRUE(inbox_.empty()) << "a dead server answered";
  // The worker resends the unacknowledged push, same sequence number, to the
  // new primary of those keys.
  for (Key k : keys) EXPECT_EQ(ShardMapView::Create(map_)->ServerRankOfKey(kTable, k), 1u);
  Send(ServerAddress(1), Push(2, keys, 2.0f, 1, /*resend=*/true));
  DeliverAll();
  ASSERT_EQ(inbox_.size(), 1u);
  EXPECT_TRUE(inbox_[0].header.has_ack()) << inbox_[0].header.ShortDebugString();
  EXPECT_EQ(PullFrom(1, keys), std::vector<float>(10, 2.0f)) << "applied twice or lost";
  EXPECT_EQ(cores_[1]->stats().duplicate_pushes, 1u);
}

TEST_F(ReplicationTest, APushTheBackupNeverGotIsAppliedOnceAfterFailover) {
  const auto keys = KeysOf(0, 3, map_);
  Send(ServerAddress(0), Push(1, keys, 3.0f, 1));
  DeliverOne();  // primary applied; the forward is on the wire
  Fail(0);
  net_.clear();  // ... and died with it
  Send(ServerAddress(1), Push(2, keys, 3.0f, 1, /*resend=*/true));
  DeliverAll();
  ASSERT_EQ(inbox_.size(), 1u);
  EXPECT_TRUE(inbox_[0].header.has_ack());
  EXPECT_EQ(PullFrom(1, keys), std::vector<float>(6, 3.0f));
  EXPECT_EQ(cores_[1]->stats().duplicate_pushes, 0u);
}

TEST_F(ReplicationTest, ARepeatedSequenceNumberIsAcknowledgedButAppliedOnce) {
  const auto keys = KeysOf(2, 3, map_);
  for (uint64_t id : {1, 2, 3}) Send(ServerAddress(2), Push(id, keys, 1.0f, 7));
  Send(ServerAddress(2), Push(4, keys, 1.0f, 8));
  DeliverAll();
  ASSERT_EQ(inbox_.size(), 4u);
  for (const Message& m : inbox_) EXPECT_TRUE(m.header.has_ack()) << m.header.ShortDebugString();
  EXPECT_EQ(PullFrom(2, keys), std::vector<float>(6, 2.0f));
  // The backup (server 0) de-duplicated the forwards of the repeats too.
  Fail(2);
  DeliverAll();
  EXPECT_EQ(PullFrom(0, keys), std::vector<float>(6, 2.0f));
  // Unsequenced pushes (seq 0) are never de-duplicated.
  Send(ServerAddress(0), Push(5, keys, 1.0f, 0));
  Send(ServerAddress(0), Push(6, keys, 1.0f, 0));
  DeliverAll();
  EXPECT_EQ(PullFrom(0, keys), std::vector<float>(6, 4.0f));
}

// A push of a piece of each row (Push.columns) is forwarded as that piece
// and de-duplicated like any push: after failover the backup serves exactly
// the primary's rows.
TEST_F(ReplicationTest, APieceOfEachRowIsForwardedAsThatPieceAndAppliedOnce) {
  const auto keys = KeysOf(0, 3, map_);
  auto piece = [&](uint64_t id, float value, uint64_t seq, uint32_t first) {  // column `first` of each row
    Message m = Push(id, keys, value, seq);
    m.header.mutable_push()->set_first_column(first);
    m.header.mutable_push()->set_columns(1);
    const std::vector<float> values(keys.size(), value);
    m.frames[1] = Buffer::CopyOf(values.data(), values.size() * sizeof(float));
    return m;
  };
  Send(ServerAddress(0), piece(1, 5.0f, 1, /*first=*/1));
  DeliverOne();  // the primary applies it and forwards it
  ASSERT_EQ(net_.size(), 1u);
  ASSERT_TRUE(net_.front().message.header.has_replicate());
  EXPECT_EQ(net_.front().message.header.replicate().first_column(), 1u);
  EXPECT_EQ(net_.front().message.header.replicate().columns(), 1u);
  Send(ServerAddress(0), piece(2, 7.0f, 2, /*first=*/0));
  Send(ServerAddress(0), piece(3, 5.0f, 1, /*first=*/1));  // a repeat of the first piece
  DeliverAll();
  ASSERT_EQ(inbox_.size(), 3u);
  for (const Message& m : inbox_) EXPECT_TRUE(m.header.has_ack()) << m.header.ShortDebugString();
  const std::vector<float> want = {7, 5, 7, 5, 7, 5};
  EXPECT_EQ(PullFrom(0, keys), want);
  EXPECT_EQ(cores_[1]->stats().forwards_applied, 3u);
  EXPECT_EQ(cores_[1]->stats().forwards_rejected, 0u);
  Fail(0);
  DeliverAll();
  EXPECT_EQ(PullFrom(1, keys), want) << "the backup's rows differ from the primary's";
}

TEST_F(ReplicationTest, LostAndRepeatedForwardsAreResentAndAppliedOnce) {
  const auto keys = KeysOf(1, 2, map_);
  Send(ServerAddress(1), Push(1, keys, 1.0f, 1));
  Send(ServerAddress(1), Push(2, keys, 1.0f, 2));
  DeliverOne();
  DeliverOne();
  ASSERT_EQ(Count(&proto::Envelope::has_replicate), 2u);
  Outgoing first = net_.front();
  net_.pop_front();  // the first forward is lost: the second arrives with a gap
  DeliverOne();
  ASSERT_EQ(net_.size(), 1u);
  EXPECT_TRUE(net_.front().message.header.replicate_ack().gap());
  net_.pop_front();  // ... and the backup's gap notice is lost too: the timer must do it
  DeliverAll();
  EXPECT_TRUE(inbox_.empty());
  EXPECT_EQ(cores_[1]->unacked_forwards(), 2u);
  // Not yet time to resend.
  now_ += 50 * kMillis;
  for (Outgoing& o : cores_[1]->Tick(now_)) net_.push_back(std::move(o));
  EXPECT_TRUE(net_.empty());
  now_ += 100 * kMillis;
  for (Outgoing& o : cores_[1]->Tick(now_)) net_.push_back(std::move(o));
  ASSERT_EQ(Count(&proto::Envelope::has_replicate), 2u);
  net_.push_back(first);  // ... and the lost one turns up late, too
  DeliverAll();
  ASSERT_EQ(inbox_.size(), 2u);
  for (const Message& m : inbox_) EXPECT_TRUE(m.header.has_ack());
  EXPECT_EQ(cores_[2]->stats().forwards_applied, 2u);
  Fail(1);
  DeliverAll();
  EXPECT_EQ(PullFrom(2, keys), std::vector<float>(4, 2.0f));
}

// Forwards to a backup are resent on a timer learned from their round trips.
// Every store of these servers counts the walks over the rows it holds.
class WalkCountingReplicationTest : public ReplicationTest {
 protected:
  WalkCountingReplicationTest() {
    disk_tiers_ = [this](uint32_t, uint32_t floats) -> absl::StatusOr<std::unique_ptr<ColdRows>> {
      struct Counting final : MemoryColdRows {
        Counting(uint32_t f, int* w) : MemoryColdRows(f), walks(w) {}
        void ForEach(absl::FunctionRef<void(Key, std::span<const float>)> fn) override {
          ++*walks;
          MemoryColdRows::ForEach(fn);
        }
        int* walks;
      };
      return std::unique_ptr<ColdRows>(std::make_unique<Counting>(floats, &walks_));
    };
  }
  int walks_ = 0;
};

// A table created at its primary reaches its backups as a transfer of
// configs alone, and neither side walks the rows it holds to make or take
// it: both did, over every row on disk too, and with 10^8 rows that held
// the servers past the job's 60 s request timeout.
TEST_F(WalkCountingReplicationTest, ANewTableWalksNoRowsAtThePrimaryOrItsBackups) {
  constexpr uint32_t kTiered = kTable + 2, kLate = kTable + 3;
  for (uint32_t r = 0; r < kServers; ++r) {
    Message create = Request(3000 + r);
    auto* c = create.header.mutable_create_table()->mutable_config();
    c->set_table_id(kTiered);
    c->set_width(2);
    c->set_kind(proto::SPARSE);
    c->set_optimizer(proto::ACCUMULATE);
    c->set_memory_budget_bytes(1);
    c->set_memory_budget_bytes(4 * Table::RowBytes(*c));
    c->set_disk_tier(true);
    Send(ServerAddress(r), std::move(create));
  }
  DeliverAll();
  inbox_.clear();
  ShardMapView view = *ShardMapView::Create(map_);
  for (uint32_t p = 0; p < kServers; ++p) {
    std::vector<Key> keys;
    for (Key k = 0; keys.size() < 20; ++k)
      if (view.ServerRankOfKey(kTiered, k) == p) keys.push_back(k);
    Message push = Push(3100 + p, keys, 1.0f, 1);
    push.header.mutable_push()->set_table_id(kTiered);
    Send(ServerAddress(p), std::move(push));
  }
  DeliverAll();
  for (const Message& m : inbox_) ASSERT_TRUE(m.header.has_ack()) << m.header.ShortDebugString();
  inbox_.clear();
  for (uint32_t r = 0; r < kServers; ++r) ASSERT_GT(cores_[r]->table(kTiered)->rows_on_disk(), 0u) << r;
  walks_ = 0;
  Message create = Request(3200);
  auto* c = create.header.mutable_create_table()->mutable_config();
  c->set_table_id(kLate);
  c->set_width(2);
  c->set_kind(proto::SPARSE);
  c->set_optimizer(proto::ACCUMULATE);
  Send(ServerAddress(0), std::move(create));  // only server 0 hears of it: it tells its backups
  DeliverAll();
  ASSERT_EQ(inbox_.size(), 1u);
  ASSERT_TRUE(inbox_[0].header.has_ack()) << inbox_[0].header.ShortDebugString();
  EXPECT_NE(cores_[1]->table(kLate), nullptr);  // server 0's backup (replication 2: the next server)
  EXPECT_EQ(walks_, 0);
}

class LearningReplicationTest : public ReplicationTest {
 protected:
  LearningReplicationTest() { resend_ = {.initial = 200 * kMillis, .floor = 1 * kMillis, .ceiling = 1 * kSeconds}; }
};

TEST_F(LearningReplicationTest, ALostForwardGoesAgainAfterAFewRoundTripsNotAFixedWait) {
  const auto keys = KeysOf(1, 2, map_);
  Send(ServerAddress(1), Push(1, keys, 1.0f, 1));
  DeliverOne();  // the primary applies it and forwards it
  now_ += 3 * kMillis;
  DeliverAll();  // the backup acknowledges 3 ms later: a 3 ms round trip
  ASSERT_EQ(inbox_.size(), 1u);
  // (Earlier round trips, of the table's config in SetUp, took no time.)
  const Nanos rto = cores_[1]->ShortestForwardTimer();
  EXPECT_GE(rto, 3 * kMillis / 8) << "learned from the round trips";
  EXPECT_LE(rto, 9 * kMillis) << "far below the 200 ms it starts from";
  EXPECT_EQ(cores_[1]->NextForwardDue(), std::numeric_limits<Nanos>::max());
  now_ = 10 * kMillis;
  Send(ServerAddress(1), Push(2, keys, 1.0f, 2));
  DeliverOne();
  ASSERT_EQ(Count(&proto::Envelope::has_replicate), 1u);
  net_.pop_front();  // lost
  const Nanos due = cores_[1]->NextForwardDue();
  EXPECT_GE(due, now_ + rto);
  EXPECT_LT(due, now_ + rto + kMillis / 1000) << "(its 32 bytes' allowance)";
  EXPECT_TRUE(cores_[1]->Tick(due - 1).empty());
  auto again = cores_[1]->Tick(due);
  ASSERT_EQ(again.size(), 1u);
  EXPECT_TRUE(again[0].message.header.has_replicate());
  // Lost again: the next wait is twice as long.
  EXPECT_GE(cores_[1]->NextForwardDue(), due + 2 * rto);
  EXPECT_TRUE(cores_[1]->Tick(due + 2 * rto - 1).empty());
  now_ = due + 2 * rto + kMillis / 1000;
  again = cores_[1]->Tick(now_);
  ASSERT_EQ(again.size(), 1u);
  for (Outgoing& o : again) net_.push_back(std::move(o));
  DeliverAll();
  ASSERT_EQ(inbox_.size(), 2u);
  EXPECT_TRUE(inbox_[1].header.has_ack());
  EXPECT_EQ(cores_[1]->stats().forwards_resent, 2u);
  EXPECT_EQ(cores_[2]->stats().forwards_applied, 2u);
}

TEST_F(LearningReplicationTest, ABackupsLinkMadeAgainGetsItsUnacknowledgedForwardsAtOnce) {
  ASSERT_NO_FATAL_FAILURE(PushToServerOne(KeysOf(1, 2, map_), 2));
  net_.clear();  // both were on the connection that broke
  EXPECT_TRUE(cores_[1]->OnLinkRestored(ServerAddress(0), now_).empty()) << "not a backup with forwards owed";
  EXPECT_TRUE(cores_[1]->OnLinkRestored("tcp://elsewhere:1", now_).empty());
  auto again = cores_[1]->OnLinkRestored(ServerAddress(2), now_);  // no Tick, no timer
  ASSERT_EQ(again.size(), 2u);
  EXPECT_EQ(again[0].message.header.replicate().position() + 1, again[1].message.header.replicate().position())
      << "in order";
  EXPECT_EQ(cores_[1]->stats().forwards_link_resent, 2u);
  for (Outgoing& o : again) net_.push_back(std::move(o));
  DeliverAll();
  ExpectAcks(2);
  EXPECT_EQ(cores_[2]->stats().forwards_applied, 2u);
}

TEST_F(ReplicationTest, ReorderedForwardsAreAppliedInOrderWithoutWaitingForAResend) {
  ASSERT_NO_FATAL_FAILURE(PushToServerOne(KeysOf(1, 2, map_), 3));
  std::reverse(net_.begin(), net_.end());  // positions 3, 2, 1
  DeliverAll();                            // no Tick
  ExpectAcks(3);
  EXPECT_EQ(cores_[2]->stats().forwards_applied, 3u);
  // Position 3 arrived while 1 was missing: one gap notice, and position 1
  // went once more (it was only overtaken: acknowledged again, applied once).
  EXPECT_EQ(cores_[2]->stats().forward_gaps_reported, 1u);
  EXPECT_EQ(cores_[1]->stats().forwards_gap_resent, 1u);
  EXPECT_EQ(cores_[1]->stats().forwards_sent, 4u);
}

TEST_F(LearningReplicationTest, ALostForwardThatALaterOneOvertakesGoesAgainAtOnce) {
  ASSERT_NO_FATAL_FAILURE(PushToServerOne(KeysOf(1, 2, map_), 3));
  net_.pop_front();  // position 1 is lost
  // Position 2 reaches the backup: it says 1 is missing, and the primary
  // sends 1 again at once: no Tick, no timer.
  DeliverOne();
  EXPECT_EQ(cores_[2]->stats().forward_gaps_reported, 1u);
  DeliverOne();  // position 3: kept, and no second notice for the same gap
  EXPECT_EQ(cores_[2]->stats().forward_gaps_reported, 1u);
  DeliverOne();  // the gap notice
  EXPECT_EQ(cores_[1]->stats().forwards_gap_resent, 1u);
  ASSERT_EQ(Count(&proto::Envelope::has_replicate), 1u);
  // That resend is lost too: the notice is not repeated; the timer takes over.
  net_.pop_front();
  EXPECT_LT(cores_[1]->NextForwardDue(), std::numeric_limits<Nanos>::max());
  EXPECT_TRUE(net_.empty());
  // (Position 1 went twice already: its wait is doubled; by then all three are due.)
  auto again = cores_[1]->Tick(now_ + 2 * cores_[1]->ShortestForwardTimer() + kMillis);
  ASSERT_EQ(again.size(), 3u) << "the timer resends the unacknowledged stream in order";
  for (Outgoing& o : again) net_.push_back(std::move(o));
  DeliverAll();
  ExpectAcks(3);
  EXPECT_EQ(cores_[2]->stats().forwards_applied, 3u);
  EXPECT_EQ(cores_[1]->stats().forwards_gap_resent, 1u);
}

TEST_F(ReplicationTest, ALostBackupReleasesTheAcksThatWaitedOnIt) {
  const auto keys = KeysOf(0, 2, map_);
  Send(ServerAddress(0), Push(1, keys, 1.0f, 1));
  DeliverOne();
  Fail(1);  // the backup dies with the forward unread
  DeliverAll();
  ASSERT_EQ(inbox_.size(), 1u);
  EXPECT_TRUE(inbox_[0].header.has_ack()) << "every live replica has it";
  // With no backup left for these shards the next push is acknowledged at once.
  Send(ServerAddress(0), Push(2, keys, 1.0f, 2));
  DeliverOne();
  ASSERT_EQ(net_.size(), 1u);
  EXPECT_EQ(net_.front().to, kWorker);
}

TEST_F(ReplicationTest, ADeposedPrimaryIsRefusedByEpochAndAcknowledgesNothing) {
  const auto keys = KeysOf(0, 2, map_);
  // Server 0 is paused: the others move on to a map without it.
  auto next = WithoutServer(map_, 0);
  ASSERT_TRUE(next.ok());
  for (uint32_t r : {1u, 2u}) ASSERT_TRUE(cores_[r]->UpdateShardMap(*next, now_).ok());
  // It wakes up and takes a push from a worker that has not heard either.
  Send(ServerAddress(0), Push(1, keys, 1.0f, 1));
  DeliverAll();
  EXPECT_TRUE(inbox_.empty()) << "a deposed primary acknowledged a push";
  EXPECT_EQ(cores_[1]->stats().forwards_rejected, 1u);
  EXPECT_EQ(cores_[1]->stats().forwards_applied, 0u);
  // Then it learns the new map: the push is answered Aborted (send it again).
  auto out = cores_[0]->UpdateShardMap(*next, now_);
  ASSERT_TRUE(out.ok());
  ASSERT_EQ(out->size(), 1u);
  EXPECT_EQ((*out)[0].message.header.error().code(), static_cast<int>(absl::StatusCode::kAborted));
  EXPECT_TRUE(cores_[0]->deposed());
  Send(ServerAddress(0), Push(2, keys, 1.0f, 2));
  DeliverAll();
  ASSERT_EQ(inbox_.size(), 1u);
  EXPECT_EQ(inbox_[0].header.error().code(), static_cast<int>(absl::StatusCode::kAborted));
  EXPECT_EQ(PullFrom(1, keys), std::vector<float>(4, 0.0f)) << "the deposed primary's push leaked";
}

TEST_F(ReplicationTest, AForwardRefusedForAnOlderEpochIsSentAgainNotFailed) {
  const auto keys = KeysOf(2, 2, map_);  // primary 2, backup 0
  Send(ServerAddress(2), Push(1, keys, 1.0f, 1));
  DeliverOne();  // forwarded at epoch 1
  dead_[1] = true;
  auto next = WithoutServer(map_, 1);
  ASSERT_TRUE(next.ok());
  map_ = *next;
  ASSERT_TRUE(cores_[0]->UpdateShardMap(map_, now_).ok());  // the backup has the new map first
  DeliverOne();  // ... so it refuses the epoch-1 forward
  ASSERT_EQ(net_.size(), 1u);
  EXPECT_TRUE(net_.front().message.header.replicate_ack().stale_epoch());
  auto out = cores_[2]->UpdateShardMap(map_, now_);  // the primary gets it before the refusal
  ASSERT_TRUE(out.ok());
  for (Outgoing& o : *out) net_.push_back(std::move(o));
  DeliverAll();
  ASSERT_EQ(inbox_.size(), 1u);
  EXPECT_TRUE(inbox_[0].header.has_ack()) << inbox_[0].header.ShortDebugString();
  EXPECT_EQ(cores_[0]->stats().forwards_applied, 1u);
  EXPECT_EQ(cores_[0]->stats().forwards_rejected, 1u);
}

TEST_F(ReplicationTest, ACheckpointRestoresRowsWindowsAndAppliedCounts) {
  const auto keys = KeysOf(0, 6, map_);
  uint64_t seq = 0;
  PushEach(keys, 2.0f, &seq);
  const ShardSnapshot snap = cores_[0]->SnapshotPrimaryShards();
  ASSERT_FALSE(snap.vshards.empty());
  for (uint32_t v : snap.vshards) EXPECT_EQ(ShardMapView::Create(map_)->ServerRankOf(v), 0u);
  uint64_t applied = 0;
  for (const auto& [v, n] : snap.applied_pushes_by_vshard) applied += n;
  EXPECT_EQ(applied, keys.size());
  // A fresh core at rank 0 (no tables) takes the shards back.
  ServerCore fresh(ServerCoreOptions{.node_id = 30});
  ASSERT_TRUE(fresh.InstallShardMap(map_, 0).ok());
  fresh.SetWorkers({{kWorkerNode, 0}});
  auto rows = fresh.RestoreShards(snap, snap.vshards, /*with_windows=*/true);
  ASSERT_TRUE(rows.ok()) << rows.status();
  EXPECT_EQ(*rows, keys.size());
  for (uint32_t v : snap.vshards) EXPECT_EQ(fresh.applied(v), snap.applied_pushes_by_vshard.at(v));
  // Its rows are back, and the windows too: a resend of an applied push is not applied again.
  auto pull = [&](Key k) {
    Message m = Request(9999);
    m.header.mutable_pull()->set_table_id(kTable);
    m.header.mutable_pull()->set_num_keys(1);
    m.frames.push_back(Buffer::CopyOf(&k, sizeof(k)));
    auto out = fresh.Step(std::move(m), now_);
    EXPECT_EQ(out.size(), 1u);
    return out.empty() ? -1.0f : out[0].message.frames[0].As<float>()[0];
  };
  EXPECT_EQ(pull(keys[0]), 2.0f);
  fresh.Step(Push(1, {keys[0]}, 2.0f, 1, /*resend=*/true), now_);
  EXPECT_EQ(pull(keys[0]), 2.0f);
  EXPECT_EQ(fresh.stats().duplicate_pushes, 1u);
  // Without windows (a new job), the same number is a new push.
  ServerCore job(ServerCoreOptions{.node_id = 31});
  ASSERT_TRUE(job.InstallShardMap(map_, 0).ok());
  ASSERT_TRUE(job.RestoreShards(snap, snap.vshards, /*with_windows=*/false).ok());
  job.Step(Push(1, {keys[0]}, 2.0f, 1), now_);
  EXPECT_EQ(job.stats().duplicate_pushes, 0u);
}

TEST_F(ReplicationTest, ARestoreInsideTheJobReplacesTheCopyTheServerHad) {
  // Two keys of one shard of server 0; the checkpoint holds only the first
  // push. Two more pushes reach the shard's backup as forwards; then the
  // backup leads the shard and restores it from the checkpoint (the
  // simulator found this: a move's destination held part of a shard the
  // coordinator counted as lost). The restore must replace that copy: its
  // rows and its windows, or a resend of a push the checkpoint lacks is
  // taken for a duplicate, acknowledged and never applied.
  const ShardMapView view = *ShardMapView::Create(map_);
  std::vector<Key> keys = KeysOf(0, 40, map_);
  Key k1 = keys[0], k2 = keys[0];
  for (Key k : keys)
    if (k != k1 && view.VShardOfKey(kTable, k) == view.VShardOfKey(kTable, k1)) k2 = k;
  ASSERT_NE(k1, k2);
  const uint32_t v = view.VShardOfKey(kTable, k1);
  uint64_t seq = 0;
  PushEach({k1}, 1.0f, &seq);  // seq 1
  const ShardSnapshot snap = cores_[0]->SnapshotPrimaryShards();
  PushEach({k1, k2}, 1.0f, &seq);  // seqs 2 and 3, forwarded to the backup
  Fail(0);
  DeliverAll();
  const uint32_t b = ShardMapView::Create(map_)->ServerRankOf(v);
  ASSERT_NE(b, 0u);
  ASSERT_EQ(RowsAt(b)[k1], (std::vector<float>{2.0f, 2.0f}));
  const std::vector<uint32_t> vs = {v};
  ASSERT_TRUE(cores_[b]->RestoreShards(snap, vs, /*with_windows=*/true).ok());
  EXPECT_EQ(RowsAt(b)[k1], (std::vector<float>{1.0f, 1.0f}));
  EXPECT_FALSE(RowsAt(b).contains(k2)) << "a row the checkpoint lacks goes";
  // The worker sends the pushes the checkpoint lacks again: both are applied.
  Send(ServerAddress(b), Push(2000, {k1}, 1.0f, 2, /*resend=*/true));
  Send(ServerAddress(b), Push(2001, {k2}, 1.0f, 3, /*resend=*/true));
  DeliverAll();
  ASSERT_EQ(inbox_.size(), 2u);
  for (const Message& m : inbox_) EXPECT_TRUE(m.header.has_ack()) << m.header.ShortDebugString();
  EXPECT_EQ(RowsAt(b)[k1], (std::vector<float>{2.0f, 2.0f}));
  EXPECT_EQ(RowsAt(b)[k2], (std::vector<float>{1.0f, 1.0f}));
  EXPECT_EQ(cores_[b]->stats().duplicate_pushes, 0u);
}

TEST_F(ReplicationTest, AnAuditedRestoreListsThePushesTheCheckpointHeldByWriterAndSequence) {
  const auto keys = KeysOf(0, 6, map_);
  uint64_t seq = 0;
  PushEach(keys, 1.0f, &seq);  // seqs 1..6, one key each
  const ShardSnapshot snap = cores_[0]->SnapshotPrimaryShards();
  ServerCore fresh(ServerCoreOptions{.node_id = 30, .audit = true});
  ASSERT_TRUE(fresh.InstallShardMap(map_, 0).ok());
  fresh.SetWorkers({{kWorkerNode, 0}});
  ASSERT_TRUE(fresh.RestoreShards(snap, snap.vshards, /*with_windows=*/true).ok());
  // One "restored" line per shard; each push is held (below its writer's
  // floor or listed) by exactly the line of its key's shard.
  std::map<uint32_t, std::string> lines;
  for (absl::string_view line : absl::StrSplit(fresh.AuditDump(), '\n')) {
    if (!absl::StartsWith(line, "restored ")) continue;
    std::vector<std::string> parts = absl::StrSplit(line, ' ');
    ASSERT_GE(parts.size(), 4u) << line;
    EXPECT_EQ(parts[3], absl::StrCat(map_.num_vshards())) << line;
    lines[static_cast<uint32_t>(std::stoul(parts[1]))] = std::string(line);
  }
  ASSERT_EQ(lines.size(), snap.vshards.size());
  auto holds = [&](uint32_t v, uint64_t s) {
    std::vector<std::string> parts = absl::StrSplit(lines.at(v), ' ');
    for (size_t i = 4; i < parts.size(); ++i) {
      std::vector<std::string> w = absl::StrSplit(parts[i], ':');
      EXPECT_TRUE(w.size() == 3 || w.size() == 4) << parts[i];
      if (w.size() < 3 || std::stoul(w[0]) != kWorkerNode || std::stoul(w[1]) != 0) continue;
      if (s < std::stoull(w[2])) return true;
      if (w.size() == 4)
        for (absl::string_view x : absl::StrSplit(w[3], '/'))
          if (std::stoull(std::string(x)) == s) return true;
    }
    return false;
  };
  for (size_t i = 0; i < keys.size(); ++i) {
    const uint32_t own = VirtualShardOf(kTable, keys[i], map_.num_vshards());
    for (uint32_t v : snap.vshards) EXPECT_EQ(holds(v, i + 1), v == own) << "push " << i + 1 << ", shard " << v;
  }
  EXPECT_FALSE(holds(VirtualShardOf(kTable, keys[0], map_.num_vshards()), 7)) << "a later push is not held";
  // Outside audit mode, and without windows, nothing is listed.
  ServerCore job(ServerCoreOptions{.node_id = 31, .audit = true});
  ASSERT_TRUE(job.InstallShardMap(map_, 0).ok());
  ASSERT_TRUE(job.RestoreShards(snap, snap.vshards, /*with_windows=*/false).ok());
  EXPECT_FALSE(absl::StrContains(job.AuditDump(), "restored ")) << job.AuditDump();
}

TEST_F(ReplicationTest, AResendSpanningServersIsSplitByTheNewMap) {
  auto keys = KeysOf(0, 3, map_);
  auto other = KeysOf(2, 3, map_);
  Send(ServerAddress(0), Push(1, keys, 1.0f, 1));
  Send(ServerAddress(2), Push(2, other, 1.0f, 1));  // the same worker push, split over two servers
  DeliverOne();
  DeliverOne();
  Fail(0);
  DeliverAll();
  ASSERT_EQ(inbox_.size(), 1u);  // server 2's part; server 0's part died with it
  inbox_.clear();
  // The worker resends the whole push to every server that is primary of
  // some of its keys now; each takes its own keys, and server 2 knows its
  // part already.
  std::vector<Key> all = keys;
  all.insert(all.end(), other.begin(), other.end());
  Send(ServerAddress(1), Push(3, all, 1.0f, 1, true));
  Send(ServerAddress(2), Push(4, all, 1.0f, 1, true));
  DeliverAll();
  ASSERT_EQ(inbox_.size(), 2u);
  for (const Message& m : inbox_) EXPECT_TRUE(m.header.has_ack()) << m.header.ShortDebugString();
  EXPECT_EQ(PullFrom(1, keys), std::vector<float>(6, 1.0f));
  EXPECT_EQ(PullFrom(2, other), std::vector<float>(6, 1.0f));
}

TEST_F(ReplicationTest, AResendOfAnOlderMapWithAKeyThatMovedIsAbortedWhole) {
  auto keys = KeysOf(0, 2, map_);
  auto other = KeysOf(2, 2, map_);
  std::vector<Key> all = keys;
  all.insert(all.end(), other.begin(), other.end());
  Message stale = Push(1, all, 1.0f, 1, true);  // stamped with this map: server 0 is primary of `keys`
  // A shard of `keys` moves to server 2 (the map of the next epoch).
  const uint32_t v = VirtualShardOf(kTable, keys[0], map_.num_vshards());
  auto next = WithMoveStarted(map_, v, 2);
  ASSERT_TRUE(next.ok()) << next.status();
  next = WithMoveFinished(*next, v);
  ASSERT_TRUE(next.ok()) << next.status();
  Publish(*next);
  DeliverAll();
  inbox_.clear();
  // Server 2 gets the resend of the older map: by its map keys[0] is its own
  // now, but by the worker's it was server 0's, and server 0 was sent the same
  // push; it must not take part of it.
  Send(ServerAddress(2), stale);
  DeliverAll();
  ASSERT_EQ(inbox_.size(), 1u);
  EXPECT_EQ(inbox_[0].header.error().code(), static_cast<int>(absl::StatusCode::kAborted))
      << inbox_[0].header.ShortDebugString();
  EXPECT_EQ(inbox_[0].header.epoch(), next->epoch()) << "the worker resends once it has this map";
  EXPECT_EQ(PullFrom(2, other), std::vector<float>(4, 0.0f)) << "nothing applied";
}

// Moves (common/keys.h, "Moving a shard").
class MoveTest : public ReplicationTest {
 protected:
  // The keys of shard `v` among 0..n-1.
  std::vector<Key> KeysOfShard(uint32_t v, size_t n) {
    std::vector<Key> keys;
    for (Key k = 0; keys.size() < n; ++k)
      if (VirtualShardOf(kTable, k, map_.num_vshards()) == v) keys.push_back(k);
    return keys;
  }
  // Moves kShard to server 2 (the transfer delivered), then has server 0
  // apply a push to `keys` whose forwards stay queued, and answer a pull of
  // them (held: its reply queued behind the forwards).
  void PushAndPullDuringTheMove(const std::vector<Key>& keys) {
    auto started = WithMoveStarted(map_, kShard, 2);
    ASSERT_TRUE(started.ok());
    Publish(*started);
    DeliverAll();
    Send(ServerAddress(0), Push(1, keys, 1.0f, 1));
    DeliverOne();  // the push: forwards to 1 and 2 queued
    ASSERT_EQ(net_.size(), 2u);
    Message pull = Request(2);
    pull.header.mutable_pull()->set_table_id(kTable);
    pull.header.mutable_pull()->set_num_keys(keys.size());
    pull.frames.push_back(Buffer::CopyOf(keys.data(), keys.size() * sizeof(Key)));
    for (Outgoing& o : cores_[0]->Step(std::move(pull), now_)) net_.push_back(std::move(o));
  }
  std::vector<uint32_t> MovesInSync(uint32_t rank) {
    proto::Heartbeat hb;
    cores_[rank]->FillHeartbeat(&hb);
    return {hb.moves_in_sync().begin(), hb.moves_in_sync().end()};
  }
  // Shard 0: primary 0, backup 1 (round robin); moved to server 2.
  static constexpr uint32_t kShard = 0;
};

TEST_F(MoveTest, AShardIsCopiedReportedInSyncThenLetGoBySource) {
  const std::vector<Key> keys = KeysOfShard(kShard, 3);
  uint64_t seq = 0;
  PushEach(keys, 1.0f, &seq);
  auto started = WithMoveStarted(map_, kShard, 2);
  ASSERT_TRUE(started.ok()) << started.status();
  Publish(*started);
  EXPECT_TRUE(MovesInSync(0).empty()) << "the transfer is not acknowledged yet";
  DeliverAll();
  EXPECT_EQ(MovesInSync(0), std::vector<uint32_t>{kShard});
  EXPECT_TRUE(MovesInSync(1).empty());
  // A push during the move reaches the destination before it is acknowledged.
  PushEach(keys, 1.0f, &seq);
  const size_t rows_before = RowsAt(0).size();
  auto finished = WithMoveFinished(map_, kShard);
  ASSERT_TRUE(finished.ok()) << finished.status();
  Publish(*finished);
  DeliverAll();
  EXPECT_EQ(PullFrom(2, keys), std::vector<float>(6, 2.0f)) << "the new primary has every acknowledged push";
  EXPECT_EQ(PullFrom(1, {}), std::vector<float>{}) << "(server 1 is alive)";
  EXPECT_EQ(RowsAt(0).size(), rows_before - keys.size()) << "the source drops the shard's rows";
  EXPECT_EQ(cores_[0]->stats().shards_released, 1u);
  EXPECT_EQ(RowsAt(1), RowsAt(2)) << "the backup was sent the new primary's state";
}

TEST_F(MoveTest, APullOfAMovingShardWaitsUntilTheDestinationHasWhatItRead) {
  const std::vector<Key> keys = KeysOfShard(kShard, 2);
  PushAndPullDuringTheMove(keys);
  EXPECT_EQ(net_.size(), 2u) << "the reply is held";
  EXPECT_EQ(cores_[0]->stats().replies_held_for_moves, 1u);
  DeliverAll();  // forwards, their acks, then the push's ack and the pull reply
  ASSERT_EQ(inbox_.size(), 2u);
  const Message* reply = inbox_[0].header.has_pull_reply() ? &inbox_[0] : &inbox_[1];
  ASSERT_TRUE(reply->header.has_pull_reply()) << reply->header.ShortDebugString();
  EXPECT_EQ(reply->frames[0].As<float>()[0], 1.0f) << "read when it was answered";
  EXPECT_EQ(PullFrom(2, {}), std::vector<float>{});
}

TEST_F(MoveTest, WhatWaitsAtTheSourceWhenTheMoveFinishesIsAbortedForTheWorkerToResend) {
  const std::vector<Key> keys = KeysOfShard(kShard, 2);
  PushAndPullDuringTheMove(keys);
  // The switch comes before the forwards are acknowledged (the coordinator
  // may switch once what was sent before the move began is in).
  std::deque<Outgoing> held = std::move(net_);
  net_.clear();
  auto finished = WithMoveFinished(map_, kShard);
  ASSERT_TRUE(finished.ok());
  Publish(*finished);
  std::vector<Message> to_worker;
  std::deque<Outgoing> rest;
  for (Outgoing& o : net_) {
    if (o.to == kWorker) {
      to_worker.push_back(o.message);
    } else {
      rest.push_back(std::move(o));
    }
  }
  ASSERT_EQ(to_worker.size(), 2u) << "the push and the held pull";
  for (const Message& m : to_worker) {
    EXPECT_EQ(m.header.error().code(), static_cast<int>(absl::StatusCode::kAborted)) << m.header.ShortDebugString();
    EXPECT_EQ(m.header.epoch(), finished->epoch()) << "so the worker sends it again with this map";
  }
  net_ = std::move(held);
  for (Outgoing& o : rest) net_.push_back(std::move(o));
  DeliverAll();  // the old forwards: refused or re-scoped, nothing acknowledged
  inbox_.clear();
  // The worker's resend to the new primary is applied once.
  Send(ServerAddress(2), Push(3, keys, 1.0f, 1, true));
  DeliverAll();
  ASSERT_EQ(inbox_.size(), 1u);
  EXPECT_TRUE(inbox_[0].header.has_ack()) << inbox_[0].header.ShortDebugString();
  EXPECT_EQ(PullFrom(2, keys), std::vector<float>(4, 1.0f));
  EXPECT_EQ(RowsAt(1), RowsAt(2));
}

TEST_F(MoveTest, AStreamThatEndsAndBeginsAgainIsAppliedAfresh) {
  // Server 2 backs up nothing of server 0's but the moving shard: when a
  // cancelled move ends that stream and a new move begins another, the new
  // transfer must be applied, not taken for an old position.
  const std::vector<Key> keys = KeysOfShard(kShard, 2);
  uint64_t seq = 0;
  auto started = WithMoveStarted(map_, kShard, 2);
  ASSERT_TRUE(started.ok());
  Publish(*started);
  DeliverAll();
  PushEach(keys, 1.0f, &seq);  // positions 2.. of the first stream
  auto cancelled = WithMoveCancelled(map_, kShard);
  ASSERT_TRUE(cancelled.ok());
  Publish(*cancelled);
  DeliverAll();
  PushEach(keys, 1.0f, &seq);  // server 2 does not get these
  auto again = WithMoveStarted(map_, kShard, 2);
  ASSERT_TRUE(again.ok());
  Publish(*again);
  DeliverAll();
  EXPECT_EQ(MovesInSync(0), std::vector<uint32_t>{kShard});
  auto finished = WithMoveFinished(map_, kShard);
  ASSERT_TRUE(finished.ok());
  Publish(*finished);
  DeliverAll();
  EXPECT_EQ(PullFrom(2, keys), std::vector<float>(4, 2.0f)) << "the second transfer was applied";
}

TEST_F(ReplicationTest, AnOlderIncarnationOfAWorkerIsRefused) {
  const auto keys = KeysOf(1, 2, map_);
  Send(ServerAddress(1), Push(1, keys, 1.0f, 1, false, /*incarnation=*/1));
  Send(ServerAddress(1), Push(2, keys, 1.0f, 2, false, /*incarnation=*/0));
  // A new incarnation starts its numbers again: seq 1 is not a duplicate.
  Send(ServerAddress(1), Push(3, keys, 1.0f, 1, false, /*incarnation=*/2));
  DeliverAll();
  ASSERT_EQ(inbox_.size(), 3u);
  std::sort(inbox_.begin(), inbox_.end(),
            [](const Message& a, const Message& b) { return a.header.request_id() < b.header.request_id(); });
  EXPECT_TRUE(inbox_[0].header.has_ack());
  EXPECT_EQ(inbox_[1].header.error().code(), static_cast<int>(absl::StatusCode::kFailedPrecondition))
      << inbox_[1].header.ShortDebugString();
  EXPECT_TRUE(inbox_[2].header.has_ack());
  EXPECT_EQ(PullFrom(1, keys), std::vector<float>(4, 2.0f));
}

TEST_F(ReplicationTest, LostCopiesAreRebuiltByStateTransferSoASecondLossLosesNothing) {
  const auto keys = AllKeys(40);
  uint64_t seq = 0;
  PushEach(keys, 1.0f, &seq);
  Fail(1, /*refill=*/true);  // every shard gets its second copy back on the survivors
  size_t transfers = 0;
  for (const Outgoing& o : net_) transfers += o.message.header.replicate().has_transfer();
  EXPECT_GT(transfers, 0u);
  DeliverAll();
  EXPECT_EQ(cores_[0]->stats().transfers_applied + cores_[2]->stats().transfers_applied, transfers);
  EXPECT_EQ(cores_[0]->stats().forwards_rejected + cores_[2]->stats().forwards_rejected, 0u);
  PushEach(keys, 2.0f, &seq);  // training goes on, replicated to the new copies
  Fail(0);                     // server 2 is left with a copy of everything
  DeliverAll();
  for (uint32_t v = 0; v < 12; ++v) EXPECT_EQ(ShardMapView::Create(map_)->ServerRankOf(v), 2u);
  EXPECT_EQ(PullEach(keys), std::vector<float>(80, 3.0f));
  // The de-duplication windows came along: a resend of an old push is not applied again.
  Send(ServerAddress(2), Push(1, {keys[0]}, 1.0f, 1, /*resend=*/true));
  DeliverAll();
  ASSERT_EQ(inbox_.size(), 1u);
  EXPECT_TRUE(inbox_[0].header.has_ack());
  EXPECT_EQ(PullFrom(2, {keys[0]}), std::vector<float>(2, 3.0f));
}

TEST_F(ReplicationTest, ARestartedServerIsRecruitedAsAFreshBackupAndCanTakeOver) {
  const auto keys = AllKeys(30);
  uint64_t seq = 0;
  PushEach(keys, 1.0f, &seq);
  Fail(0, true);
  DeliverAll();
  // A new process takes rank 0: new node id, empty, no tables.
  proto::ShardMap map = map_;
  proto::NodeInfo back = map.servers(0);
  back.set_node_id(10);
  back.set_address(ServerAddress(0));
  auto returned = WithServerBack(map, back);
  ASSERT_TRUE(returned.ok()) << returned.status();
  proto::ShardMap next = WithBackupsFilled(*returned);  // nothing is missing: rank 0 holds nothing yet
  next.set_epoch(map.epoch() + 1);
  cores_[0] = std::make_unique<ServerCore>(ServerCoreOptions{.node_id = 10});
  dead_[0] = false;
  ASSERT_TRUE(cores_[0]->InstallShardMap(next, 0).ok());
  cores_[0]->SetWorkers({{kWorkerNode, 0}});
  Publish(next);
  DeliverAll();
  EXPECT_EQ(cores_[0]->num_tables(), 0u);
  // Server 2 dies: rank 0 is recruited for every shard and gets the state.
  Fail(2, true);
  DeliverAll();
  EXPECT_EQ(cores_[0]->num_tables(), 1u);
  EXPECT_GT(cores_[0]->stats().transfers_applied, 0u);
  PushEach(keys, 5.0f, &seq);
  // And server 1 dies: the restarted process has everything.
  Fail(1);
  DeliverAll();
  EXPECT_EQ(PullEach(keys), std::vector<float>(60, 6.0f));
}

TEST_F(ReplicationTest, PushesWaitingOnAReplacedBackupProcessWaitForItsTransfer) {
  const auto keys = KeysOf(0, 2, map_);
  Send(ServerAddress(0), Push(1, keys, 1.0f, 1));
  DeliverOne();  // forwarded to server 1 ...
  net_.clear();  // ... which dies before it reads it, and is restarted at once
  proto::ShardMap next = map_;
  next.set_epoch(map_.epoch() + 1);
  next.mutable_servers(1)->set_node_id(20);
  cores_[1] = std::make_unique<ServerCore>(ServerCoreOptions{.node_id = 20});
  ASSERT_TRUE(cores_[1]->InstallShardMap(next, 1).ok());
  cores_[1]->SetWorkers({{kWorkerNode, 0}});
  Publish(next);
  EXPECT_TRUE(inbox_.empty());
  ASSERT_EQ(net_.size(), 1u) << "the transfer from server 0 to the new server 1";
  EXPECT_TRUE(net_.front().message.header.replicate().has_transfer());
  DeliverAll();
  ASSERT_EQ(inbox_.size(), 1u);
  EXPECT_TRUE(inbox_[0].header.has_ack()) << "acknowledged once the new process has the push";
  Fail(0);
  DeliverAll();
  EXPECT_EQ(PullFrom(1, keys), std::vector<float>(4, 1.0f));
}

}  // namespace
}  // namespace tessera

namespace tessera {
namespace {

// A stateful optimizer with eviction by age: the backup applies the
// forwarded pushes at the same clocks, so after a failover it holds what
// the primary held, optimizer state and evictions included.
TEST_F(ReplicationTest, BackupsKeepOptimizerStateAndEvictAtTheSameClocks) {
  constexpr uint32_t kAdam = 2;
  proto::TableConfig config;
  config.set_table_id(kAdam);
  config.set_width(2);
  config.set_kind(proto::SPARSE);
  config.set_optimizer(proto::ADAM);
  config.set_learning_rate(0.1f);
  config.set_init(proto::UNIFORM);
  config.set_init_scale(0.1f);
  auto* p = config.mutable_optimizer_params();
  p->set_beta1(0.9f);
  p->set_beta2(0.999f);
  p->set_epsilon(1e-8f);
  config.set_evict_after_clocks(2);
  for (uint32_t r = 0; r < kServers; ++r) {
    Message create = Request(2000 + r);
    *create.header.mutable_create_table()->mutable_config() = config;
    Send(ServerAddress(r), std::move(create));
  }
  DeliverAll();
  inbox_.clear();

  ShardMapView view = *ShardMapView::Create(map_);
  std::vector<Key> keys;  // keys of table kAdam whose primary is server 0
  for (Key k = 0; keys.size() < 6; ++k)
    if (view.ServerRankOfKey(kAdam, k) == 0) keys.push_back(k);
  Table reference(config, [](Key) { return true; });
  uint64_t seq = 0;
  for (uint64_t clock = 0; clock < 8; ++clock) {
    // The worker announces each clock before it stamps pushes with it, as
    // Clock() does (a push moves its table's clock at most one past the
    // clocks announced: "Push clocks" in server_core.h).
    for (uint32_t r = 0; clock > 0 && r < kServers; ++r) {
      Message notice = Request(0);
      notice.header.mutable_clock_advance()->set_clock(clock);
      Send(ServerAddress(r), std::move(notice));
    }
    // Key i is pushed at clocks where clock % (i + 1) == 0: the rarer ones
    // grow old and are evicted in between.
    std::vector<Key> pushed;
    std::vector<float> values;
    for (size_t i = 0; i < keys.size(); ++i) {
      if (clock % (i + 1) != 0) continue;
      pushed.push_back(keys[i]);
      values.push_back(0.5f - static_cast<float>(i) * 0.1f);
      values.push_back(static_cast<float>(clock) * 0.2f - 0.4f);
    }
    Message m = Request(3000 + ++seq);
    auto* push = m.header.mutable_push();
    push->set_table_id(kAdam);
    push->set_num_keys(pushed.size());
    push->set_clock(clock);
    push->set_seq(seq);
    m.frames.push_back(Buffer::CopyOf(pushed.data(), pushed.size() * sizeof(Key)));
    m.frames.push_back(Buffer::CopyOf(values.data(), values.size() * sizeof(float)));
    Send(ServerAddress(0), std::move(m));
    DeliverAll();
    ASSERT_EQ(inbox_.size(), 1u);
    ASSERT_TRUE(inbox_[0].header.has_ack()) << inbox_[0].header.ShortDebugString();
    inbox_.clear();
    ASSERT_TRUE(reference.ApplyPush(pushed, values, clock).ok());
  }
  ASSERT_GT(reference.counters().evicted_by_age, 0u);
  Fail(0);
  DeliverAll();
  const uint32_t successor = ShardMapView::Create(map_)->ServerRankOfKey(kAdam, keys[0]);
  ASSERT_NE(successor, 0u);
  Message pull = Request(9000);
  pull.header.mutable_pull()->set_table_id(kAdam);
  pull.header.mutable_pull()->set_num_keys(keys.size());
  pull.frames.push_back(Buffer::CopyOf(keys.data(), keys.size() * sizeof(Key)));
  auto out = cores_[successor]->Step(std::move(pull), now_);
  ASSERT_EQ(out.size(), 1u);
  ASSERT_TRUE(out[0].message.header.has_pull_reply()) << out[0].message.header.ShortDebugString();
  auto got = out[0].message.frames[0].As<float>();
  std::vector<float> want(keys.size() * 2);
  ASSERT_TRUE(reference.ReadRows(keys, want).ok());
  EXPECT_EQ(std::vector<float>(got.begin(), got.end()), want);
  // The metrics' view: the backup counted the same evictions as the reference.
  bool seen = false;
  for (const ServerCore::TableSummary& t : cores_[successor]->table_summaries()) {
    if (t.id != kAdam) continue;
    seen = true;
    EXPECT_EQ(t.counters.evicted_by_age, reference.counters().evicted_by_age);
    EXPECT_EQ(t.bytes, t.rows * Table::RowBytes(config));
  }
  EXPECT_TRUE(seen);
}

// A push stamped far past every announced clock moves the primary's table
// clock one past the highest announced clock, and the primary forwards that
// clock, not the stamp: its backups' tables move exactly as far (replicas
// agree, evictions included), whatever clocks the backups have heard.
TEST_F(ReplicationTest, AFarAheadStampIsForwardedAsTheClockThePrimaryGaveIt) {
  const std::vector<Key> keys = KeysOf(0, 3, map_);
  Message notice = Request(0);  // the worker announced clock 4 to server 0 only
  notice.header.mutable_clock_advance()->set_clock(4);
  Send(ServerAddress(0), std::move(notice));
  Message push = Push(2000, keys, 1.0f, /*seq=*/1);
  push.header.mutable_push()->set_clock(uint64_t{1} << 40);
  Send(ServerAddress(0), std::move(push));
  DeliverOne();  // the notice
  DeliverOne();  // the push: applied, forwarded
  std::vector<uint64_t> forwarded;
  for (const Outgoing& o : net_)
    if (o.message.header.has_replicate()) forwarded.push_back(o.message.header.replicate().clock());
  ASSERT_FALSE(forwarded.empty());
  for (uint64_t c : forwarded) EXPECT_EQ(c, 5u);
  DeliverAll();
  ASSERT_EQ(inbox_.size(), 1u);
  ASSERT_TRUE(inbox_[0].header.has_ack()) << inbox_[0].header.ShortDebugString();
  EXPECT_EQ(cores_[0]->table(kTable)->clock(), 5u);
  EXPECT_EQ(cores_[0]->stats().push_clocks_bounded, 1u);
  ShardMapView view = *ShardMapView::Create(map_);
  for (uint32_t b : view.BackupsOf(view.VShardOfKey(kTable, keys[0]))) {
    EXPECT_EQ(cores_[b]->table(kTable)->clock(), 5u) << "backup " << b;
    EXPECT_EQ(cores_[b]->stats().push_clocks_bounded, 0u) << "backups apply the forwarded clock as it is";
  }
}

}  // namespace
}  // namespace tessera

namespace tessera {
namespace {

// A server behind the request's map epoch answers by no map. The case the
// cluster simulator found: server 0 is lost, and at epoch 2 server 1 is
// primary of server 0's shards too. A worker that already has epoch 2
// resends a push spanning both servers' old shards to server 1 before
// server 1 has that map. By its epoch-1 map server 1 would take its own
// keys, skip server 0's as another server's (a resend may span servers) and
// acknowledge the push: server 0's keys would be lost.
TEST_F(ReplicationTest, ARequestFromANewerMapIsAbortedAndChangesNothingUntilTheServerHasThatMap) {
  const auto own = KeysOf(1, 2, map_);    // server 1's at both epochs (backup: server 2)
  const auto moved = KeysOf(0, 2, map_);  // server 0's at epoch 1, server 1's at epoch 2
  auto next = WithoutServer(map_, 0);
  ASSERT_TRUE(next.ok()) << next.status();
  ASSERT_EQ(next->epoch(), 2u);
  const ShardMapView next_view = *ShardMapView::Create(*next);
  for (Key k : own) ASSERT_EQ(next_view.ServerRankOfKey(kTable, k), 1u);
  for (Key k : moved) ASSERT_EQ(next_view.ServerRankOfKey(kTable, k), 1u);
  dead_[0] = true;  // the worker's first sends died with server 0 (or on the wire)
  std::vector<Key> all = own;
  all.insert(all.end(), moved.begin(), moved.end());
  auto resend = [&](uint64_t id) {
    Message m = Push(id, all, 1.0f, 1, /*resend=*/true);
    m.header.set_epoch(next->epoch());
    return m;
  };
  Send(ServerAddress(1), resend(1));
  DeliverOne();
  EXPECT_EQ(Count(&proto::Envelope::has_replicate), 0u) << "a push from a newer map was forwarded";
  DeliverAll();
  ASSERT_EQ(inbox_.size(), 1u);
  EXPECT_EQ(inbox_[0].header.error().code(), static_cast<int>(absl::StatusCode::kAborted))
      << "the push was answered by the older map: " << inbox_[0].header.ShortDebugString();
  EXPECT_EQ(inbox_[0].header.epoch(), 1u) << "the reply carries the server's own epoch";
  EXPECT_EQ(cores_[1]->stats().behind_epoch, 1u);
  EXPECT_EQ(cores_[1]->stats().bad_requests, 0u);
  EXPECT_EQ(cores_[1]->stats().forwards_sent, 0u);
  EXPECT_EQ(cores_[1]->waiting_acks(), 0u);
  EXPECT_EQ(cores_[1]->table(kTable)->num_rows(), 0u) << "applied";
  EXPECT_EQ(cores_[2]->table(kTable)->num_rows(), 0u) << "replicated";
  for (uint32_t v = 0; v < 12; ++v) EXPECT_EQ(cores_[1]->applied(v), 0u) << "shard " << v;
  inbox_.clear();
  // A pull from the newer map too, even of keys the server's own map gives it
  // (it would create their rows).
  Message pull = Request(2);
  pull.header.set_epoch(next->epoch());
  pull.header.mutable_pull()->set_table_id(kTable);
  pull.header.mutable_pull()->set_num_keys(own.size());
  pull.frames.push_back(Buffer::CopyOf(own.data(), own.size() * sizeof(Key)));
  auto out = cores_[1]->Step(std::move(pull), now_);
  ASSERT_EQ(out.size(), 1u);
  EXPECT_FALSE(out[0].message.header.has_pull_reply());
  EXPECT_EQ(out[0].message.header.error().code(), static_cast<int>(absl::StatusCode::kAborted))
      << out[0].message.header.ShortDebugString();
  EXPECT_EQ(out[0].message.header.epoch(), 1u);
  EXPECT_EQ(cores_[1]->stats().behind_epoch, 2u);
  EXPECT_EQ(cores_[1]->table(kTable)->num_rows(), 0u);
  // Once it has the map, the same resend is applied, all of it, and acknowledged.
  Publish(*next);
  DeliverAll();
  Send(ServerAddress(1), resend(3));
  DeliverAll();
  ASSERT_EQ(inbox_.size(), 1u);
  EXPECT_TRUE(inbox_[0].header.has_ack()) << inbox_[0].header.ShortDebugString();
  EXPECT_EQ(PullFrom(1, all), std::vector<float>(2 * all.size(), 1.0f)) << "lost or applied twice";
  EXPECT_EQ(cores_[1]->stats().duplicate_pushes, 0u);
  EXPECT_EQ(cores_[2]->stats().forwards_applied, 1u);  // server 1's own keys, still backed up on server 2
  EXPECT_EQ(cores_[1]->stats().behind_epoch, 2u);
}

// Three copies of every shard: shard v has primary v % 3 and backups
// v + 1, v + 2 (mod 3); audit mode, so copies can be compared push by push.
TEST_F(MoveTest, ABackupsCopyMovesWithoutHoldingReadsAndTheBackupLetsItGo) {
  // Shard 0: primary 0, backup 1. Server 1's copy moves to server 2 (server 1 drains).
  const std::vector<Key> keys = KeysOfShard(kShard, 2);
  uint64_t seq = 0;
  PushEach(keys, 1.0f, &seq);
  auto started = WithMoveStarted(map_, kShard, 2, /*from=*/1);
  ASSERT_TRUE(started.ok()) << started.status();
  Publish(*started);
  DeliverAll();
  EXPECT_EQ(MovesInSync(0), std::vector<uint32_t>{kShard}) << "the primary reports the copy in sync";
  // A push whose forwards are still queued, and a pull: the primary stays
  // primary, so the pull is answered at once.
  ++seq;
  Send(ServerAddress(0), Push(1000 + seq, keys, 1.0f, seq));
  DeliverOne();
  ASSERT_EQ(net_.size(), 2u) << "forwards to servers 1 and 2";
  Message pull = Request(2);
  pull.header.mutable_pull()->set_table_id(kTable);
  pull.header.mutable_pull()->set_num_keys(keys.size());
  pull.frames.push_back(Buffer::CopyOf(keys.data(), keys.size() * sizeof(Key)));
  std::vector<Outgoing> answered = cores_[0]->Step(std::move(pull), now_);
  ASSERT_EQ(answered.size(), 1u);
  EXPECT_TRUE(answered[0].message.header.has_pull_reply()) << answered[0].message.header.ShortDebugString();
  EXPECT_EQ(cores_[0]->stats().replies_held_for_moves, 0u);
  DeliverAll();
  inbox_.clear();
  auto finished = WithMoveFinished(map_, kShard);
  ASSERT_TRUE(finished.ok()) << finished.status();
  Publish(*finished);
  DeliverAll();
  EXPECT_EQ(cores_[1]->stats().shards_released, 1u);
  for (Key k : keys) EXPECT_FALSE(RowsAt(1).contains(k)) << "server 1 let the shard go: " << k;
  EXPECT_EQ(cores_[0]->stats().shards_released, 0u) << "the primary keeps it";
  // Later pushes are acknowledged once server 2 has them; server 1 gets none.
  PushEach(keys, 1.0f, &seq);
  EXPECT_EQ(PullFrom(0, keys), std::vector<float>(4, 3.0f));
  for (Key k : keys) {
    EXPECT_EQ(RowsAt(2)[k], std::vector<float>(2, 3.0f)) << k;
    EXPECT_FALSE(RowsAt(1).contains(k)) << k;
  }
}

// A transfer larger than half the message limit goes in several messages
// (ShardTransfer.continued), each within it; the backup ends with every
// row, the window and the applied count, and the shards are in sync only
// once the last message is acknowledged.
class SmallMessagesTest : public ReplicationTest {
 protected:
  SmallMessagesTest() {
    replication_ = 3;
    max_message_bytes_ = 1024;  // 512 bytes of keys and rows a message: 32 rows of width 2
  }
};

TEST_F(SmallMessagesTest, ALargeTransferGoesInMessagesThatFitAndIsInSyncAtItsLast) {
  const auto keys = KeysOf(0, 150, map_);
  uint64_t seq = 0;
  PushEach(keys, 1.0f, &seq);  // on servers 0, 1 and 2 (replication 3)
  ASSERT_EQ(RowsAt(1).size(), keys.size());
  ASSERT_EQ(RowsAt(2).size(), keys.size());
  inbox_.clear();
  Fail(0);  // server 1 leads server 0's shards; server 2, their co-backup, gets their state again
  // Hold the transfer's messages back to count them.
  std::vector<Outgoing> transfer;
  for (const Outgoing& o : net_)
    if (o.message.header.has_replicate() && o.message.header.replicate().has_transfer()) transfer.push_back(o);
  ASSERT_GE(transfer.size(), 5u) << "150 rows of 16 bytes with their keys, 32 a message";
  size_t rows = 0;
  for (size_t i = 0; i < transfer.size(); ++i) {
    const Message& m = transfer[i].message;
    size_t bytes = m.header.ByteSizeLong();
    for (const Buffer& f : m.frames) bytes += f.size();
    EXPECT_LE(bytes, 1024u) << "message " << i;
    EXPECT_EQ(m.header.replicate().transfer().continued(), i > 0) << i;
    for (size_t f = 0; f < m.frames.size(); f += 2) rows += m.frames[f].size() / sizeof(Key);
  }
  EXPECT_EQ(rows, keys.size());
  // Everything but the transfer's last message, and the acks: nothing is in sync yet.
  cores_[1]->TakeShardsInSync();
  const uint64_t last_position = transfer.back().message.header.replicate().position();
  auto last = std::find_if(net_.begin(), net_.end(), [&](const Outgoing& o) {
    return o.message.header.has_replicate() && o.message.header.replicate().has_transfer() &&
           o.message.header.replicate().position() == last_position;
  });
  ASSERT_NE(last, net_.end());
  Outgoing held = *last;
  net_.erase(last);
  DeliverAll();
  EXPECT_EQ(cores_[2]->stats().transfers_applied, 1u);  // counted at its first message
  EXPECT_TRUE(cores_[1]->TakeShardsInSync().empty()) << "in sync before the transfer's last message";
  EXPECT_GT(cores_[1]->unacked_forwards(), 0u);
  net_.push_back(std::move(held));
  DeliverAll();
  EXPECT_FALSE(cores_[1]->TakeShardsInSync().empty());
  EXPECT_EQ(cores_[2]->stats().transfers_applied, 1u);
  EXPECT_EQ(cores_[1]->stats().transfers_sent, 1u);
  EXPECT_EQ(cores_[1]->unacked_forwards(), 0u);
  EXPECT_EQ(RowsAt(2), RowsAt(1));
  EXPECT_EQ(RowsAt(2).size(), keys.size());
  // Server 2 can take over with the windows: a resend of an applied push is not applied again.
  Fail(1);
  DeliverAll();
  inbox_.clear();
  Send(ServerAddress(2), Push(2, {keys[0]}, 1.0f, 1, /*resend=*/true));
  DeliverAll();
  ASSERT_EQ(inbox_.size(), 1u);
  EXPECT_TRUE(inbox_[0].header.has_ack()) << inbox_[0].header.ShortDebugString();
  EXPECT_EQ(PullFrom(2, {keys[0]}), std::vector<float>(2, 1.0f));
}

class ThreeCopiesTest : public ReplicationTest {
 protected:
  ThreeCopiesTest() {
    replication_ = 3;
    audit_ = true;
  }
};

// Server 0's push reaches one of its two backups; server 0 is lost. The
// backup that has it is promoted, and the co-backup that missed it (it held
// the shard already, under server 0) must get the promoted server's state,
// or the two copies differ for good.
TEST_F(ThreeCopiesTest, APromotedBackupTransfersItsShardsToACoBackupThatMissedAForward) {
  const auto keys = KeysOf(0, 3, map_);
  {
    const ShardMapView view = *ShardMapView::Create(map_);
    for (Key k : keys) {
      auto bs = view.BackupsOf(view.VShardOfKey(kTable, k));
      ASSERT_EQ(std::vector<uint32_t>(bs.begin(), bs.end()), (std::vector<uint32_t>{1, 2}));
    }
  }
  Send(ServerAddress(0), Push(1, keys, 1.0f, 1));
  DeliverOne();  // server 0 applies and forwards to servers 1 and 2
  ASSERT_EQ(net_.size(), 2u);
  ASSERT_EQ(net_[0].to, ServerAddress(1));
  ASSERT_EQ(net_[1].to, ServerAddress(2));
  DeliverOne();  // server 1 applies it
  net_.clear();  // the forward to server 2 is lost, and server 0 dies
  ASSERT_EQ(RowsAt(1).size(), keys.size());
  ASSERT_TRUE(RowsAt(2).empty());
  Fail(0);
  {
    const ShardMapView view = *ShardMapView::Create(map_);
    for (Key k : keys) {
      const uint32_t v = view.VShardOfKey(kTable, k);
      ASSERT_EQ(view.ServerRankOf(v), 1u);
      auto bs = view.BackupsOf(v);
      ASSERT_EQ(std::vector<uint32_t>(bs.begin(), bs.end()), std::vector<uint32_t>{2});
    }
  }
  ASSERT_EQ(net_.size(), 1u) << "the promoted server 1 sent server 2 nothing";
  EXPECT_EQ(net_.front().to, ServerAddress(2));
  EXPECT_EQ(net_.front().message.header.sender_id(), 2u);  // server 1's node
  ASSERT_TRUE(net_.front().message.header.replicate().has_transfer());
  const auto& shipped = net_.front().message.header.replicate().transfer().vshards();
  for (Key k : keys) {
    const uint32_t v = ShardMapView::Create(map_)->VShardOfKey(kTable, k);
    EXPECT_NE(std::find(shipped.begin(), shipped.end(), v), shipped.end()) << "shard " << v << " not transferred";
  }
  DeliverAll();
  EXPECT_EQ(cores_[2]->stats().transfers_applied, 1u);
  EXPECT_EQ(cores_[1]->stats().transfers_sent, 1u);
  EXPECT_EQ(cores_[1]->unacked_forwards(), 0u);
  EXPECT_EQ(RowsAt(2).size(), keys.size());
  EXPECT_EQ(RowsAt(2), RowsAt(1));
  EXPECT_EQ(AuditRows(2), AuditRows(1));
  EXPECT_FALSE(AuditRows(2).empty());
  // Server 2 can take over: it has the push, once, and its window too.
  Fail(1);
  DeliverAll();
  Send(ServerAddress(2), Push(2, keys, 1.0f, 1, /*resend=*/true));
  DeliverAll();
  ASSERT_EQ(inbox_.size(), 1u);
  EXPECT_TRUE(inbox_[0].header.has_ack()) << inbox_[0].header.ShortDebugString();
  EXPECT_EQ(PullFrom(2, keys), std::vector<float>(2 * keys.size(), 1.0f));
  EXPECT_EQ(cores_[2]->stats().duplicate_pushes, 1u);
}

// The other way round: server 0's push reaches only the backup that is not
// promoted. The new primary (server 1) lacks it, and its transfer replaces
// server 2's copy: the row, the de-duplication window and the audit record
// of that never-acknowledged push go, so the worker's resend is applied on
// both copies alike.
TEST_F(ThreeCopiesTest, ATransferReplacesTheBackupsRowsWindowsAndAuditRecordsOfItsShards) {
  const auto keys = KeysOf(0, 3, map_);
  Send(ServerAddress(0), Push(1, keys, 1.0f, 1));
  DeliverOne();  // server 0 applies and forwards to servers 1 and 2
  ASSERT_EQ(net_.size(), 2u);
  ASSERT_EQ(net_.front().to, ServerAddress(1));
  net_.pop_front();  // the forward to server 1 is lost
  DeliverOne();      // server 2 applies it
  net_.clear();      // its ack dies with server 0: the push is never acknowledged
  EXPECT_TRUE(inbox_.empty());
  ASSERT_EQ(RowsAt(2).size(), keys.size());
  ASSERT_TRUE(RowsAt(1).empty());
  ASSERT_FALSE(AuditRows(2).empty());
  Fail(0);  // server 1 primary of server 0's shards, server 2 their backup
  ASSERT_EQ(net_.size(), 1u);
  ASSERT_TRUE(net_.front().message.header.replicate().has_transfer());
  DeliverAll();
  EXPECT_EQ(cores_[2]->stats().transfers_applied, 1u);
  EXPECT_EQ(cores_[2]->table(kTable)->num_rows(), 0u) << "the deposed primary's push outlived the transfer";
  EXPECT_EQ(RowsAt(2), RowsAt(1));
  EXPECT_EQ(AuditRows(2), AuditRows(1));
  // The worker resends the push to the new primary: applied there, and on
  // server 2 as a new push (not a duplicate of the one the transfer dropped).
  Send(ServerAddress(1), Push(2, keys, 1.0f, 1, /*resend=*/true));
  DeliverAll();
  ASSERT_EQ(inbox_.size(), 1u);
  EXPECT_TRUE(inbox_[0].header.has_ack()) << inbox_[0].header.ShortDebugString();
  EXPECT_EQ(cores_[1]->stats().duplicate_pushes, 0u);
  EXPECT_EQ(cores_[2]->stats().duplicate_pushes, 0u) << "server 2 kept the window of a push the transfer lacks";
  EXPECT_EQ(RowsAt(1).size(), keys.size());
  EXPECT_EQ(RowsAt(2), RowsAt(1));
  EXPECT_EQ(AuditRows(2), AuditRows(1)) << "server 2 kept the audit record of a push the transfer lacks";
  // Server 1 is lost too: server 2 has the push once.
  Fail(1);
  DeliverAll();
  EXPECT_EQ(PullFrom(2, keys), std::vector<float>(2 * keys.size(), 1.0f));
}

}  // namespace
}  // namespace tessera

#include "coordinator/etcd_leadership.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <future>
#include <thread>

#include "etcd/local_etcd.h"

namespace tessera {
namespace {

using ::testing::HasSubstr;

class EtcdLeadershipTest : public ::testing::Test {
 protected:
  void SetUp() override {
    etcd_ = std::make_unique<LocalEtcd>();
    if (!etcd_->available()) GTEST_SKIP() << etcd_->why();
  }
  std::unique_ptr<EtcdLeadership> Candidate(const std::string& address) {
    auto c = EtcdLeadership::Create({.endpoints = etcd_->endpoint(),
                                     .job = "job-a",
                                     .address = address,
                                     .lease_ttl = 2 * kSeconds,
                                     .poll = 50 * kMillis,
                                     .patience = 3 * kSeconds});
    EXPECT_TRUE(c.ok()) << c.status();
    return c.ok() ? std::move(*c) : nullptr;
  }
  std::unique_ptr<LocalEtcd> etcd_;
};

proto::CoordinatorState StateAtEpoch(uint64_t epoch) {
  proto::CoordinatorState s;
  s.set_address("tcp://leader:1");
  s.mutable_shard_map()->set_epoch(epoch);
  return s;
}

TEST_F(EtcdLeadershipTest, OneLeadsTheOtherStandsByAndTakesOverWithTheStateWhenItResigns) {
  auto a = Candidate("tcp://a:1");
  auto b = Candidate("tcp://b:1");
  auto won = a->Campaign([](const std::string&) { ADD_FAILURE() << "a new job has no leader to wait on"; });
  ASSERT_TRUE(won.ok()) << won.status();
  EXPECT_FALSE(won->has_value()) << "a new job has no state";
  EXPECT_TRUE(a->Holds());
  ASSERT_TRUE(a->Save(StateAtEpoch(7).SerializeAsString()));

  std::promise<std::string> waited_on;
  auto standby = std::async(std::launch::async, [&] {
    return b->Campaign([&](const std::string& leader) { waited_on.set_value(leader); });
  });
  auto leader = waited_on.get_future();
  ASSERT_EQ(leader.wait_for(std::chrono::seconds(10)), std::future_status::ready);
  EXPECT_EQ(leader.get(), "tcp://a:1");
  EXPECT_EQ(standby.wait_for(std::chrono::milliseconds(300)), std::future_status::timeout) << "two leaders";
  ASSERT_TRUE(a->Save(StateAtEpoch(8).SerializeAsString())) << "the leader writes while the standby waits";

  a->Resign();
  EXPECT_FALSE(a->Holds());
  ASSERT_EQ(standby.wait_for(std::chrono::seconds(10)), std::future_status::ready);
  auto taken = standby.get();
  ASSERT_TRUE(taken.ok()) << taken.status();
  ASSERT_TRUE(taken->has_value());
  EXPECT_EQ((*taken)->shard_map().epoch(), 8u) << "the state the last leader wrote";
  EXPECT_TRUE(b->Holds());
  EXPECT_FALSE(a->Save(StateAtEpoch(99).SerializeAsString())) << "a deposed leader cannot write";
  ASSERT_TRUE(b->Save(StateAtEpoch(9).SerializeAsString()));
}

TEST_F(EtcdLeadershipTest, ALeaderCutOffFromEtcdStopsHolding) {
  auto a = Candidate("tcp://a:1");
  auto won = a->Campaign([](const std::string&) {});
  ASSERT_TRUE(won.ok()) << won.status();
  ASSERT_TRUE(a->Holds());
  etcd_.reset();  // etcd is gone: no keep-alive answers
  const Nanos cut = MonotonicNow();
  while (a->Holds() && MonotonicNow() - cut < 10 * kSeconds) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EXPECT_FALSE(a->Holds());
  EXPECT_FALSE(a->Save("x"));
  EXPECT_THAT(a->lost_reason(), HasSubstr("paused or cut off from etcd"));
}

TEST_F(EtcdLeadershipTest, BadJobNamesAreRefused) {
  EXPECT_FALSE(EtcdLeadership::Create({.endpoints = etcd_->endpoint(), .job = "a/b", .address = "x"}).ok());
  EXPECT_FALSE(EtcdLeadership::Create({.endpoints = etcd_->endpoint(), .job = "", .address = "x"}).ok());
  EXPECT_FALSE(EtcdLeadership::Create({.endpoints = "https://x:1", .job = "j", .address = "x"}).ok());
}

}  // namespace
}  // namespace tessera

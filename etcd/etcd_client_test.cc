#include "etcd/etcd_client.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <memory>

#include "etcd/local_etcd.h"

namespace tessera {
namespace {

using ::testing::HasSubstr;

TEST(EtcdEndpoints, ParsesOneOrSeveralAndRefusesWhatItCannotUse) {
  auto one = EtcdClient::ParseEndpoints("http://127.0.0.1:2379");
  ASSERT_TRUE(one.ok()) << one.status();
  ASSERT_EQ(one->size(), 1u);
  EXPECT_EQ((*one)[0].host, "127.0.0.1");
  EXPECT_EQ((*one)[0].port, 2379);
  auto two = EtcdClient::ParseEndpoints("http://a:1/, b:2");
  ASSERT_TRUE(two.ok()) << two.status();
  ASSERT_EQ(two->size(), 2u);
  EXPECT_EQ((*two)[1].host, "b");
  EXPECT_EQ((*two)[1].port, 2);
  EXPECT_THAT(EtcdClient::ParseEndpoints("https://a:1").status().message(), HasSubstr("https is not supported"));
  EXPECT_THAT(EtcdClient::ParseEndpoints("http://a").status().message(), HasSubstr("is not http://HOST:PORT"));
  EXPECT_THAT(EtcdClient::ParseEndpoints("http://a:99999").status().message(), HasSubstr("is not http://HOST:PORT"));
  EXPECT_THAT(EtcdClient::ParseEndpoints(" , ").status().message(), HasSubstr("no etcd endpoint"));
}

TEST(EtcdCoordinatorAddress, NamesEndpointsAndJob) {
  EXPECT_TRUE(IsEtcdAddress("etcd://h:1/j"));
  EXPECT_FALSE(IsEtcdAddress("tcp://h:1"));
  auto a = ParseEtcdCoordinatorAddress("etcd://127.0.0.1:2379,127.0.0.2:2379/my-job");
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->endpoints, "http://127.0.0.1:2379,http://127.0.0.2:2379");
  EXPECT_EQ(a->job, "my-job");
  EXPECT_THAT(ParseEtcdCoordinatorAddress("etcd://h:1").status().message(), HasSubstr("no job name"));
  EXPECT_THAT(ParseEtcdCoordinatorAddress("etcd://h:1/").status().message(), HasSubstr("no job name"));
  EXPECT_THAT(ParseEtcdCoordinatorAddress("etcd://h/j").status().message(), HasSubstr("HOST:PORT"));
  EXPECT_THAT(ParseEtcdCoordinatorAddress("etcd://h:1/a/b").status().message(), HasSubstr("has a '/'"));
  EXPECT_EQ(EtcdLeaderKey("j"), "/tessera/j/leader");
  EXPECT_EQ(EtcdStateKey("j"), "/tessera/j/state");
}

TEST(HttpResponse, ReadsLengthChunkedAndUntilClose) {
  auto plain = EtcdClient::ParseHttpResponse("HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello-extra");
  ASSERT_TRUE(plain.ok()) << plain.status();
  EXPECT_EQ(plain->status, 200);
  EXPECT_EQ(plain->body, "hello");
  auto chunked = EtcdClient::ParseHttpResponse(
      "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\nb;x=y\r\n, chunked!!\r\n0\r\n\r\n");
  ASSERT_TRUE(chunked.ok()) << chunked.status();
  EXPECT_EQ(chunked->body, "hello, chunked!!");
  auto until_close = EtcdClient::ParseHttpResponse("HTTP/1.0 404 Not Found\r\nX: y\r\n\r\nnope");
  ASSERT_TRUE(until_close.ok()) << until_close.status();
  EXPECT_EQ(until_close->status, 404);
  EXPECT_EQ(until_close->body, "nope");
}

TEST(HttpResponse, RefusesTruncatedOrForeignAnswers) {
  EXPECT_FALSE(EtcdClient::ParseHttpResponse("HTTP/1.1 200 OK\r\nContent-Length: 5").ok());
  EXPECT_FALSE(EtcdClient::ParseHttpResponse("HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhi").ok());
  EXPECT_FALSE(EtcdClient::ParseHttpResponse("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhel").ok());
  EXPECT_FALSE(EtcdClient::ParseHttpResponse("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n").ok());
  EXPECT_FALSE(EtcdClient::ParseHttpResponse("SSH-2.0-OpenSSH\r\n\r\n").ok());
}

TEST(EtcdClientUnreachable, FailsNamingTheEndpoint) {
  // Port 1 on loopback: nothing listens, the connection is refused.
  auto client = EtcdClient::Create("http://127.0.0.1:1", 500 * kMillis);
  ASSERT_TRUE(client.ok());
  auto got = (*client)->Get("k");
  ASSERT_FALSE(got.ok());
  EXPECT_EQ(got.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(got.status().message(), HasSubstr("http://127.0.0.1:1"));
}

class EtcdClientLive : public ::testing::Test {
 protected:
  void SetUp() override {
    etcd_ = std::make_unique<LocalEtcd>();
    if (!etcd_->available()) GTEST_SKIP() << etcd_->why();
    auto c = EtcdClient::Create(etcd_->endpoint());
    ASSERT_TRUE(c.ok()) << c.status();
    client_ = std::move(*c);
  }
  std::unique_ptr<LocalEtcd> etcd_;
  std::unique_ptr<EtcdClient> client_;
};

TEST_F(EtcdClientLive, PutGetDeleteKeepArbitraryBytes) {
  const std::string key("k\0\xff/x", 5), value("\x00\x01\x80\xfe{\"}", 7);
  auto missing = client_->Get(key);
  ASSERT_TRUE(missing.ok()) << missing.status();
  EXPECT_FALSE(missing->has_value());
  ASSERT_TRUE(client_->Put(key, value).ok());
  auto got = client_->Get(key);
  ASSERT_TRUE(got.ok()) << got.status();
  ASSERT_TRUE(got->has_value());
  EXPECT_EQ((*got)->key, key);
  EXPECT_EQ((*got)->value, value);
  EXPECT_GT((*got)->mod_revision, 0);
  ASSERT_TRUE(client_->Delete(key).ok());
  EXPECT_FALSE(client_->Get(key)->has_value());
}

TEST_F(EtcdClientLive, OnlyOneCandidateCreatesTheKeyAndOnlyItsLeaseMayWriteUnderIt) {
  auto a = client_->GrantLease(2 * kSeconds);
  auto b = client_->GrantLease(2 * kSeconds);
  ASSERT_TRUE(a.ok() && b.ok()) << a.status() << b.status();
  EXPECT_NE(a->id, b->id);
  EXPECT_GE(a->ttl, 2 * kSeconds);
  auto won = client_->CreateIfAbsent("/j/leader", "addr-a", a->id);
  ASSERT_TRUE(won.ok()) << won.status();
  EXPECT_FALSE(won->has_value());
  auto lost = client_->CreateIfAbsent("/j/leader", "addr-b", b->id);
  ASSERT_TRUE(lost.ok()) << lost.status();
  ASSERT_TRUE(lost->has_value());
  EXPECT_EQ((*lost)->value, "addr-a");
  EXPECT_EQ((*lost)->lease, a->id);

  auto by_a = client_->PutIfHeld("/j/leader", a->id, "/j/state", "from a");
  auto by_b = client_->PutIfHeld("/j/leader", b->id, "/j/state", "from b");
  ASSERT_TRUE(by_a.ok() && by_b.ok());
  EXPECT_TRUE(*by_a);
  EXPECT_FALSE(*by_b);
  EXPECT_EQ((*client_->Get("/j/state"))->value, "from a");

  // A's lease goes: its key goes with it, it can no longer write, B can take over.
  auto alive = client_->KeepAlive(a->id);
  ASSERT_TRUE(alive.ok()) << alive.status();
  EXPECT_GT(*alive, 0);
  ASSERT_TRUE(client_->RevokeLease(a->id).ok());
  EXPECT_FALSE(client_->Get("/j/leader")->has_value());
  EXPECT_EQ(*client_->KeepAlive(a->id), 0);
  EXPECT_FALSE(*client_->PutIfHeld("/j/leader", a->id, "/j/state", "late a"));
  auto b_wins = client_->CreateIfAbsent("/j/leader", "addr-b", b->id);
  ASSERT_TRUE(b_wins.ok());
  EXPECT_FALSE(b_wins->has_value());
  EXPECT_TRUE(*client_->PutIfHeld("/j/leader", b->id, "/j/state", "from b"));
  EXPECT_EQ((*client_->Get("/j/state"))->value, "from b");
}

TEST_F(EtcdClientLive, AnswersEtcdRefusesAreErrorsWithEtcdsMessage) {
  auto s = client_->RevokeLease(12345);
  ASSERT_FALSE(s.ok());
  EXPECT_THAT(s.message(), HasSubstr("lease not found"));
}

TEST_F(EtcdClientLive, AnUnreachableEndpointIsSkippedForTheNext) {
  auto c = EtcdClient::Create("http://127.0.0.1:1," + etcd_->endpoint(), 500 * kMillis);
  ASSERT_TRUE(c.ok());
  ASSERT_TRUE((*c)->Put("k", "v").ok());
  auto got = (*c)->Get("k");
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ((*got)->value, "v");
}

}  // namespace
}  // namespace tessera

// CURVE authentication of the ZeroMQ transport (transport/zmq_transport.h,
// transport/job_keys.h): holders of the job key talk; anyone else is kept out.
#include <sys/stat.h>
#include <unistd.h>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <thread>
#include <vector>
#include <zmq.hpp>

#include "transport/job_keys.h"
#include "transport/transport_factory.h"
#include "transport/zmq_transport.h"

namespace tessera {
namespace {

using ::testing::HasSubstr;

JobKeys NewPair() {
  char pub[41], sec[41];
  EXPECT_EQ(zmq_curve_keypair(pub, sec), 0);
  return {pub, sec};
}

struct Received {
  std::mutex mu;
  std::vector<uint64_t> ids;
  Transport::Handler handler() {
    return [this](Message m) {
      std::lock_guard lock(mu);
      ids.push_back(m.header.request_id());
    };
  }
  bool Has(uint64_t id) {
    std::lock_guard lock(mu);
    return std::find(ids.begin(), ids.end(), id) != ids.end();
  }
};

Message Numbered(uint64_t id) {
  Message m;
  m.header.set_request_id(id);
  m.header.mutable_heartbeat();
  return m;
}

std::unique_ptr<ZmqTransport> Node(const JobKeys& keys) {
  ZmqTransport::Options o;
  o.curve_public_key = keys.public_key;
  o.curve_secret_key = keys.secret_key;
  return std::make_unique<ZmqTransport>(o);
}

template <typename F>
bool Eventually(F f) {
  for (int i = 0; i < 200; ++i) {
    if (f()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(25));
  }
  return f();
}

TEST(Curve, HoldersOfTheJobKeyTalkBothWays) {
  const JobKeys job = NewPair();
  Received at_a, at_b;
  auto a = Node(job), b = Node(job);
  ASSERT_TRUE(a->Start(at_a.handler()).ok());
  ASSERT_TRUE(b->Start(at_b.handler()).ok());
  ASSERT_TRUE(a->Send(b->address(), Numbered(1)).ok());
  ASSERT_TRUE(b->Send(a->address(), Numbered(2)).ok());
  EXPECT_TRUE(Eventually([&] { return at_b.Has(1) && at_a.Has(2); }));
  EXPECT_EQ(a->stats().auth_rejected + b->stats().auth_rejected, 0u);
}

TEST(Curve, StrangersAreKeptOutAndCounted) {
  const JobKeys job = NewPair();
  Received at_server;
  auto server = Node(job);
  ASSERT_TRUE(server->Start(at_server.handler()).ok());

  // Knows the server's public key, but holds a pair of its own: the
  // handshake would succeed but for the key check (a raw ZeroMQ socket: the
  // transport itself always presents its own pair as the server key).
  zmq::context_t ctx;
  zmq::socket_t impostor(ctx, zmq::socket_type::dealer);
  const JobKeys own = NewPair();
  impostor.set(zmq::sockopt::curve_serverkey, job.public_key);
  impostor.set(zmq::sockopt::curve_publickey, own.public_key);
  impostor.set(zmq::sockopt::curve_secretkey, own.secret_key);
  impostor.set(zmq::sockopt::linger, 0);
  impostor.connect(server->address());
  const std::string header = Numbered(66).header.SerializeAsString();
  impostor.send(zmq::buffer(header), zmq::send_flags::dontwait);
  // A transport of another job: its pair is not the job's, so it cannot even
  // prove the server's key; and one with no CURVE at all.
  auto other_job = Node(NewPair());
  ASSERT_TRUE(other_job->Start([](Message) {}).ok());
  auto plain = std::make_unique<ZmqTransport>(ZmqTransport::Options{});
  ASSERT_TRUE(plain->Start([](Message) {}).ok());
  ASSERT_TRUE(other_job->Send(server->address(), Numbered(55)).ok());
  ASSERT_TRUE(plain->Send(server->address(), Numbered(77)).ok());
  EXPECT_TRUE(Eventually([&] { return server->stats().auth_rejected >= 1; }));
  // A job member's message after them arrives; theirs never do.
  auto member = Node(job);
  ASSERT_TRUE(member->Start([](Message) {}).ok());
  ASSERT_TRUE(member->Send(server->address(), Numbered(1)).ok());
  ASSERT_TRUE(Eventually([&] { return at_server.Has(1); }));
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  EXPECT_FALSE(at_server.Has(66));
  EXPECT_FALSE(at_server.Has(55));
  EXPECT_FALSE(at_server.Has(77));
  impostor.close();
  EXPECT_EQ(server->stats().messages_received, 1u);
}

TEST(Curve, KeysThatAreNotOnePairAreRefusedAtStart) {
  const JobKeys a = NewPair(), b = NewPair();
  ZmqTransport::Options mixed;
  mixed.curve_public_key = a.public_key;
  mixed.curve_secret_key = b.secret_key;
  EXPECT_THAT(ZmqTransport(mixed).Start([](Message) {}).message(), HasSubstr("not one pair"));
  ZmqTransport::Options half;
  half.curve_public_key = a.public_key;
  EXPECT_THAT(ZmqTransport(half).Start([](Message) {}).message(), HasSubstr("both keys"));
  ZmqTransport::Options garbage;
  garbage.curve_public_key = garbage.curve_secret_key = "short";
  EXPECT_THAT(ZmqTransport(garbage).Start([](Message) {}).message(), HasSubstr("Z85"));
}

class JobKeyFile : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/tessera-keys-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::string dir_;
};

TEST_F(JobKeyFile, ANewFileIsPrivateAndReadsBack) {
  const std::string path = dir_ + "/job.keys";
  auto written = WriteNewJobKeys(path);
  ASSERT_TRUE(written.ok()) << written.status();
  struct stat st {};
  ASSERT_EQ(::stat(path.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  auto read = ReadJobKeys(path);
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(read->public_key, written->public_key);
  EXPECT_EQ(read->secret_key, written->secret_key);
  EXPECT_EQ(WriteNewJobKeys(path).status().code(), absl::StatusCode::kAlreadyExists) << "never overwritten";
}

TEST_F(JobKeyFile, OpenOrBrokenFilesAreRefusedWithTheReason) {
  const std::string path = dir_ + "/job.keys";
  ASSERT_TRUE(WriteNewJobKeys(path).ok());
  ::chmod(path.c_str(), 0644);
  EXPECT_THAT(ReadJobKeys(path).status().message(), HasSubstr("chmod 600"));
  const std::string broken = dir_ + "/broken.keys";
  std::ofstream(broken) << "public abc\nsecret def\n";
  ::chmod(broken.c_str(), 0600);
  EXPECT_THAT(ReadJobKeys(broken).status().message(), HasSubstr("40 Z85 characters"));
  const JobKeys a = NewPair(), b = NewPair();
  const std::string mixed = dir_ + "/mixed.keys";
  std::ofstream(mixed) << "public " << a.public_key << "\nsecret " << b.secret_key << "\n";
  ::chmod(mixed.c_str(), 0600);
  EXPECT_THAT(ReadJobKeys(mixed).status().message(), HasSubstr("not one pair"));
  EXPECT_EQ(ReadJobKeys(dir_ + "/none").status().code(), absl::StatusCode::kNotFound);
}

TEST_F(JobKeyFile, MakeTransportTakesTheKeysFromTheJobKeysSetting) {
  const std::string path = dir_ + "/job.keys";
  ASSERT_TRUE(WriteNewJobKeys(path).ok());
  TransportChoice keyed;
  keyed.job_keys = path;  // --job_keys
  Received at_a;
  auto a = MakeTransport(ZmqTransport::Options{.bind = "tcp://127.0.0.1:0"}, keyed);
  auto b = MakeTransport(ZmqTransport::Options{.bind = "tcp://127.0.0.1:0"}, keyed);
  TransportChoice none;
  none.job_keys = dir_ + "/none";
  auto missing = MakeTransport(ZmqTransport::Options{.bind = "tcp://127.0.0.1:0"}, none);
  auto open = MakeTransport("tcp://127.0.0.1:0");
  ASSERT_TRUE(a.ok() && b.ok() && open.ok());
  EXPECT_THAT(missing.status().message(), HasSubstr("--job_keys"));
  ASSERT_TRUE((*a)->Start(at_a.handler()).ok());
  ASSERT_TRUE((*b)->Start([](Message) {}).ok());
  ASSERT_TRUE((*open)->Start([](Message) {}).ok());
  ASSERT_TRUE((*open)->Send((*a)->address(), Numbered(5)).ok());
  ASSERT_TRUE((*b)->Send((*a)->address(), Numbered(6)).ok());
  ASSERT_TRUE(Eventually([&] { return at_a.Has(6); }));
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  EXPECT_FALSE(at_a.Has(5)) << "a transport without the keys got in";
}

}  // namespace
}  // namespace tessera

// Authentication end to end (issue: security): a job of one coordinator and
// one server over ZeroMQ tcp on loopback, every node given the job's key
// through its key file (TransportChoice::job_keys, the --job_keys flag the
// launcher passes). The job's own client
// writes known values; then strangers try to register, push and pull, as
// the client (its node id) and on their own: a process with no CURVE, one of
// another job, and a raw socket that knows the job's public key but holds a
// pair of its own. None gets an answer, the values stay exactly as written,
// and the job ends normally.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <future>
#include <thread>
#include <zmq.hpp>

#include "common/logging.h"
#include "coordinator/coordinator_node.h"
#include "server/server_node.h"
#include "tests/cluster/raw_client.h"
#include "transport/job_keys.h"
#include "transport/transport_factory.h"
#include "transport/zmq_transport.h"

namespace tessera {
namespace {

// A process outside the job: sends what it likes, records what comes back.
class Stranger {
 public:
  explicit Stranger(ZmqTransport::Options options) : transport_(options) {
    EXPECT_TRUE(transport_.Start([this](Message) { answers_.fetch_add(1); }).ok());
  }
  void Send(const std::string& to, Message m) { EXPECT_TRUE(transport_.Send(to, std::move(m)).ok()); }
  int answers() const { return answers_.load(); }

 private:
  std::atomic<int> answers_{0};
  ZmqTransport transport_;
};

Message Register() {
  Message m;
  m.header.set_request_id(1);
  m.header.mutable_register_request()->set_role(proto::WORKER);
  m.header.mutable_register_request()->set_rank(-1);
  return m;
}

TEST(AuthTest, OnlyHoldersOfTheJobKeyGetAnAnswer) {
  spdlog::default_logger()->set_level(spdlog::level::warn);
  char dir[] = "/tmp/tessera-auth-XXXXXX";
  ASSERT_NE(::mkdtemp(dir), nullptr);
  const std::string key_file = std::string(dir) + "/job.keys";
  auto job = WriteNewJobKeys(key_file);
  ASSERT_TRUE(job.ok()) << job.status();
  TransportChoice keyed;
  keyed.job_keys = key_file;

  OneServerJob job_processes({}, keyed);
  const std::string coordinator_address = job_processes.coordinator_address();

  // The strangers knock first: nobody registers in the job's only worker place.
  std::vector<std::unique_ptr<Stranger>> strangers;
  strangers.push_back(std::make_unique<Stranger>(ZmqTransport::Options{}));  // no CURVE at all
  char other_pub[41], other_sec[41];
  ASSERT_EQ(zmq_curve_keypair(other_pub, other_sec), 0);
  ZmqTransport::Options other_job;
  other_job.curve_public_key = other_pub;
  other_job.curve_secret_key = other_sec;
  strangers.push_back(std::make_unique<Stranger>(other_job));  // another job's key
  for (auto& s : strangers) s->Send(coordinator_address, Register());

  auto client_transport = MakeTransport(ZmqTransport::Options{.bind = "tcp://127.0.0.1:0"}, keyed);
  ASSERT_TRUE(client_transport.ok()) << client_transport.status();
  RawClient client(coordinator_address, std::move(*client_transport));
  ASSERT_TRUE(client.Join().ok()) << "the job's own worker gets in";
  ASSERT_TRUE(client.Call(Create(kWidth, "", "", kTable)).header.has_ack());
  const std::vector<Key> keys = {11, 12, 13};
  std::vector<float> values(keys.size() * kWidth);
  for (size_t i = 0; i < values.size(); ++i) values[i] = 0.25f * static_cast<float>(i) + 1.0f;
  ASSERT_TRUE(client.Call(Push(kTable, keys.size(), {Of(keys), Of(values)})).header.has_ack());

  // Now at the server: pushes and pulls in the client's name and their own.
  const std::string server_address = client.server();
  ASSERT_FALSE(server_address.empty());
  std::vector<float> poison(values.size(), 1000.0f);
  for (auto& s : strangers) {
    for (uint32_t as : {client.session().self().node_id(), 99u}) {
      Message push = Push(kTable, keys.size(), {Of(keys), Of(poison)});
      push.header.set_request_id(2);
      push.header.set_sender_id(as);
      s->Send(server_address, std::move(push));
      Message pull = Pull(kTable, keys.size(), {Of(keys)});
      pull.header.set_request_id(3);
      pull.header.set_sender_id(as);
      s->Send(server_address, std::move(pull));
    }
  }
  // A raw socket that knows the job's public key but holds its own pair.
  zmq::context_t ctx;
  zmq::socket_t impostor(ctx, zmq::socket_type::dealer);
  impostor.set(zmq::sockopt::curve_serverkey, job->public_key);
  impostor.set(zmq::sockopt::curve_publickey, std::string(other_pub));
  impostor.set(zmq::sockopt::curve_secretkey, std::string(other_sec));
  impostor.set(zmq::sockopt::linger, 0);
  impostor.connect(server_address);
  Message forged = Push(kTable, keys.size(), {Of(keys), Of(poison)});
  forged.header.set_request_id(4);
  forged.header.set_sender_id(client.session().self().node_id());
  forged.header.set_sender_address("tcp://127.0.0.1:1");
  const std::string header = forged.header.SerializeAsString();
  std::vector<zmq::const_buffer> frames = {zmq::buffer(header), zmq::buffer(keys), zmq::buffer(poison)};
  for (size_t i = 0; i < frames.size(); ++i) {
    impostor.send(frames[i], i + 1 < frames.size() ? zmq::send_flags::sndmore : zmq::send_flags::none);
  }

  // The job's client, after all that: its values are exactly as written.
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  Message after = client.Call(Pull(kTable, keys.size(), {Of(keys)}));
  ASSERT_TRUE(after.header.has_pull_reply()) << after.header.ShortDebugString();
  const std::vector<float> now(after.frames[0].As<float>().begin(), after.frames[0].As<float>().end());
  EXPECT_EQ(now, values) << "a stranger's push was applied";
  for (auto& s : strangers) EXPECT_EQ(s->answers(), 0) << "a stranger got an answer";
  EXPECT_EQ(job_processes.server().stats().push_requests, 1u) << "only the client's push reached the server";

  ASSERT_TRUE(client.session().ReportDone({}, 10 * kSeconds).ok());
  EXPECT_TRUE(client.session().WaitForEnd().ok());
  job_processes.ExpectOrderlyEnd();
  impostor.close();
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace tessera

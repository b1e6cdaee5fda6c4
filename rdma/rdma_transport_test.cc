// The verbs shell's entry points. On a machine without an RDMA device (the
// usual case here) they must fail cleanly and say why; where a device exists
// the loopback test exercises the shell end to end.
#include "rdma/rdma_transport.h"

#include <chrono>
#include <cstring>
#include <condition_variable>
#include <mutex>
#include <thread>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "rdma/rdma_devices.h"

namespace tessera::rdma {
namespace {

using ::testing::HasSubstr;

constexpr char kSecret[] = "Ra]8Hb}#}Kz4!FS!*2I]/=Av#aiLKw7ETIsnJ-LG";  // a job's secret key (Z85)

TEST(rdmaTransportTest, UsableSaysWhyInOneLine) {
  const absl::Status s = Usable();
  if (s.ok()) GTEST_SKIP() << "this machine can use RDMA";
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable);
  EXPECT_FALSE(s.message().empty());
  EXPECT_EQ(s.message().find('\n'), absl::string_view::npos);
  if (!BuiltWithVerbs()) {
    EXPECT_EQ(s.message(), "built without libibverbs");
  } else if (!ListRdmaDevices().ok()) {
    // No device at all: the reason names the call that said so, with errno's text.
    EXPECT_THAT(std::string(s.message()), HasSubstr("no RDMA device (ibv_get_device_list: "));
  }
  EXPECT_EQ(Usable(), s) << "Usable() must be repeatable";
}

TEST(rdmaTransportTest, BadOptionsAreInvalidArgumentEvenWithoutADevice) {
  Options o;
  o.bind = "ipc:///tmp/x";
  EXPECT_EQ(MakeRdmaTransport(o).status().code(), absl::StatusCode::kInvalidArgument);
  o.bind = "rdma://127.0.0.1";
  EXPECT_THAT(std::string(MakeRdmaTransport(o).status().message()), HasSubstr("bind"));
  o.bind = "rdma://127.0.0.1:0";
  o.credits = 0;
  EXPECT_THAT(std::string(MakeRdmaTransport(o).status().message()), HasSubstr("credits"));
  o.credits = 64;
  o.pool_bytes = 1 << 16;  // 8 slots: not even one connection's receives
  absl::Status s = MakeRdmaTransport(o).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr("one connection needs 66 receive slots"));
  o.pool_bytes = 64 << 20;
  o.rendezvous_threshold = 0;
  EXPECT_EQ(MakeRdmaTransport(o).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(rdmaTransportTest, GoodOptionsValidate) {
  for (const char* bind : {"rdma://127.0.0.1:0", "tcp://127.0.0.1:4000", "rdma://0.0.0.0:0", "rdma://[::1]:0"}) {
    Options o;
    o.bind = bind;
    EXPECT_TRUE(ValidateOptions(o).ok()) << bind << ": " << ValidateOptions(o);
  }
}

TEST(rdmaTransportTest, AuthSecretKeyIsValidatedWithoutEchoingIt) {
  Options o;
  o.bind = "rdma://127.0.0.1:0";
  o.auth_secret_key = "Ra]8Hb}#}Kz4!FS!*2I]/=Av#aiLKw7ETIsnJ-LG";
  EXPECT_TRUE(ValidateOptions(o).ok()) << ValidateOptions(o);
  o.auth_secret_key = "secret-that-is-not-z85";
  const absl::Status s = MakeRdmaTransport(o).status();  // checked before any device is looked for
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr("auth_secret_key"));
  EXPECT_THAT(std::string(s.message()), ::testing::Not(HasSubstr("secret-that")));
}

TEST(rdmaTransportTest, WithoutADeviceMakeSaysExactlyWhatUsableSays) {
  const absl::Status usable = Usable();
  if (usable.ok()) GTEST_SKIP() << "this machine can use RDMA";
  Options o;
  o.bind = "rdma://127.0.0.1:0";
  absl::StatusOr<std::unique_ptr<Transport>> t = MakeRdmaTransport(o);
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(t.status(), usable);
}

// End to end over a real device: two transports on this host, small and
// large messages both ways. Needs an RDMA device (soft-RoCE will do) whose
// interface this host's name resolves to; skipped elsewhere.
TEST(rdmaTransportTest, LoopbackEndToEndWhenADeviceExists) {
  if (!Usable().ok()) GTEST_SKIP() << Usable().message();
  std::mutex mu;
  std::condition_variable cv;
  std::vector<Message> got_a, got_b;
  auto make = [](std::vector<Message>& sink, std::mutex& m, std::condition_variable& c) {
    return [&sink, &m, &c](Message msg) {
      std::lock_guard lock(m);
      sink.push_back(std::move(msg));
      c.notify_all();
    };
  };
  Options o;
  o.bind = "rdma://0.0.0.0:0";
  o.auth_secret_key = kSecret;  // both hold the job key
  auto a = MakeRdmaTransport(o);
  auto b = MakeRdmaTransport(o);
  ASSERT_TRUE(a.ok() && b.ok());
  ASSERT_TRUE((*a)->Start(make(got_a, mu, cv)).ok());
  ASSERT_TRUE((*b)->Start(make(got_b, mu, cv)).ok());
  for (int i = 0; i < 20; ++i) {
    Message m;
    m.header.set_request_id(i);
    Buffer big = Buffer::Allocate(i % 2 == 0 ? 1 << 20 : 100);
    std::memset(big.mutable_data(), i, big.size());
    m.frames.push_back(big);
    ASSERT_TRUE((*a)->Send((*b)->address(), m).ok());
  }
  std::unique_lock lock(mu);
  ASSERT_TRUE(cv.wait_for(lock, std::chrono::seconds(20), [&] { return got_b.size() == 20; }));
  for (int i = 0; i < 20; ++i) {
    ASSERT_EQ(got_b[i].header.request_id(), static_cast<uint64_t>(i));
    ASSERT_EQ(got_b[i].frames[0].size(), i % 2 == 0 ? size_t{1} << 20 : size_t{100});
    EXPECT_EQ(got_b[i].frames[0].data()[got_b[i].frames[0].size() - 1], static_cast<std::byte>(i));
    EXPECT_EQ(got_b[i].header.sender_address(), (*a)->address());
  }
  lock.unlock();
  (*a)->Stop();
  (*b)->Stop();
  (*a)->Stop();  // idempotent
  EXPECT_EQ((*a)->Send((*b)->address(), Message{}).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ((*b)->stats().auth_rejected, 0u);
}

// Over a real device: a transport with another job's key, and one without a
// key, get nothing through to a keyed one, and are counted there.
TEST(rdmaTransportTest, LoopbackStrangersAreRefusedWhenADeviceExists) {
  if (!Usable().ok()) GTEST_SKIP() << Usable().message();
  std::mutex mu;
  std::vector<Message> got;
  Options o;
  o.bind = "rdma://0.0.0.0:0";
  o.auth_secret_key = kSecret;
  auto keyed = MakeRdmaTransport(o);
  ASSERT_TRUE(keyed.ok());
  ASSERT_TRUE((*keyed)->Start([&](Message m) {
    std::lock_guard lock(mu);
    got.push_back(std::move(m));
  }).ok());
  Options other = o;
  other.auth_secret_key = "g*[3LarCm@*mW($XTv}LD)$GZUJp@]jL0Gnp5rDQ";
  Options none = o;
  none.auth_secret_key.clear();
  for (const Options& stranger_options : {other, none}) {
    auto stranger = MakeRdmaTransport(stranger_options);
    ASSERT_TRUE(stranger.ok());
    ASSERT_TRUE((*stranger)->Start([](Message) {}).ok());
    for (int i = 0; i < 3; ++i) {
      Message m;
      m.header.set_request_id(i);
      m.frames.push_back(Buffer::Allocate(i == 0 ? 1 << 20 : 10));
      ASSERT_TRUE((*stranger)->Send((*keyed)->address(), m).ok());
    }
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    const uint64_t before = (*keyed)->stats().auth_rejected;
    while ((*keyed)->stats().auth_rejected == before && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    EXPECT_GT((*keyed)->stats().auth_rejected, before);
    (*stranger)->Stop();
  }
  std::lock_guard lock(mu);
  EXPECT_TRUE(got.empty());
  (*keyed)->Stop();
}

}  // namespace
}  // namespace tessera::rdma

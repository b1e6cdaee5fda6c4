// Malformed requests over a real socket to a live server: a job of one
// coordinator, one server and one raw client, all over ZeroMQ tcp on
// loopback. The client registers as the job's worker, writes known values,
// then sends one bad request after another (each field wrong in turn,
// truncated and garbage frames, huge lengths, bad codec parts). Every one must
// get an Error reply naming the problem, the server must stay up, and a pull
// afterwards must return exactly the values from before.
#include <gtest/gtest.h>

#include <condition_variable>
#include <deque>
#include <future>
#include <limits>
#include <mutex>
#include <thread>

#include <zmq.hpp>
#include <zmq_addon.hpp>

#include "common/logging.h"
#include "compress/row_compressor.h"
#include "coordinator/coordinator_node.h"
#include "node/coordinator_session.h"
#include "server/server_node.h"
#include "tests/cluster/raw_client.h"
#include "transport/transport_factory.h"

namespace tessera {
namespace {

TEST(BadRequestsTest, EveryBadRequestGetsItsErrorAndChangesNothing) {
  spdlog::default_logger()->set_level(spdlog::level::warn);
  OneServerJob job;
  RawClient client(job.coordinator_address());
  ASSERT_TRUE(client.Join().ok());

  ASSERT_TRUE(client.Call(Create(kWidth, "", "", kTable)).header.has_ack());

  const std::vector<Key> keys = {11, 12, 13};
  std::vector<float> values(keys.size() * kWidth);
  for (size_t i = 0; i < values.size(); ++i) values[i] = 0.5f * static_cast<float>(i) - 2.0f;
  ASSERT_TRUE(client.Call(Push(kTable, keys.size(), {Of(keys), Of(values)})).header.has_ack());
  auto pull_all = [&] { return client.Call(Pull(kTable, keys.size(), {Of(keys)})); };
  Message before = pull_all();
  ASSERT_TRUE(before.header.has_pull_reply()) << before.header.ShortDebugString();
  const std::vector<float> expected(before.frames[0].As<float>().begin(), before.frames[0].As<float>().end());
  ASSERT_EQ(expected, values);

  // A valid encoded part of 8 values (the push below needs 12).
  auto codec = compress::Codec::Create(*compress::ParseCodecSpec("fp16:raw_below=1"));
  ASSERT_TRUE(codec.ok());
  auto short_part = compress::EncodeValues(*codec, std::span<const float>(values).first(8), 1);
  ASSERT_TRUE(short_part.ok() && !short_part->raw);
  std::vector<uint8_t> garbage(100, 0xAB);

  struct Case {
    const char* what;
    Message request;
    const char* expected_words;  // a piece of the error message
    bool bad = true;             // counted as bad input (not a retryable refusal)
  };
  std::vector<Case> cases;
  cases.push_back({"push without values", Push(kTable, 3, {Of(keys)}), "frames"});
  cases.push_back({"push with an extra frame", Push(kTable, 3, {Of(keys), Of(values), Of(values)}), "frames"});
  cases.push_back({"push whose key count disagrees", Push(kTable, 4, {Of(keys), Of(values)}), "key"});
  cases.push_back({"push with short values", Push(kTable, 3, {Of(keys), Buffer::CopyOf(values.data(), 20)}), "values"});
  cases.push_back({"push to an unknown table", Push(99, 3, {Of(keys), Of(values)}), "table 99"});
  cases.push_back({"push with a ragged keys frame", Push(kTable, 3, {Buffer::CopyOf(keys.data(), 23), Of(values)}),
                   "key"});
  cases.push_back({"push of a huge key count", Push(kTable, uint64_t{1} << 40, {Of(keys), Of(values)}), "key"});
  cases.push_back({"push with a garbage part", Push(kTable, 3, {Of(keys), Of(garbage)}, 1), "compressed part"});
  cases.push_back({"push announcing two parts, sending one", Push(kTable, 3, {Of(keys), Of(garbage)}, 2), "frames"});
  cases.push_back({"push whose parts do not cover the values",
                   Push(kTable, 3, {Of(keys), short_part->parts[0]}, 1), "cover"});
  // Would ask for 512 MiB of decoded values if the keys frame went unchecked.
  cases.push_back({"compressed push claiming 2^25 keys",
                   Push(kTable, uint64_t{1} << 25, {Of(keys), short_part->parts[0]}, 1), "keys frame"});
  // Over the server's limit of keys per request (64 Mi by default): refused before anything else.
  cases.push_back({"compressed push claiming 2^30 keys",
                   Push(kTable, uint64_t{1} << 30, {Of(keys), short_part->parts[0]}, 1), "--max-keys-per-request"});
  cases.push_back({"pull without keys", Pull(kTable, 3, {}), "frame"});
  cases.push_back({"pull whose key count disagrees", Pull(kTable, 2, {Of(keys)}), "key"});
  cases.push_back({"pull of an unknown table", Pull(99, 3, {Of(keys)}), "table 99"});
  cases.push_back({"table of width 0", Create(0), "width"});
  cases.push_back({"table with an unknown codec", Create(4, "zip"), "zip"});
  cases.push_back({"table with top-k pulls", Create(4, "", "topk"), "pulls return weights"});
  cases.push_back({"a message with no body", Message{}, "does not handle"});

  // Clocks: out of range, or asking to be held longer than a server allows.
  auto with = [](Message m, auto&& set) {
    set(m.header);
    return m;
  };
  constexpr uint64_t kHuge = std::numeric_limits<uint64_t>::max();
  cases.push_back({"push stamped with clock 2^64-1",
                   with(Push(kTable, 3, {Of(keys), Of(values)}), [&](auto& h) { h.mutable_push()->set_clock(kHuge); }),
                   "clock 18446744073709551615 is out of range"});
  cases.push_back({"pull at clock 2^63",
                   with(Pull(kTable, 3, {Of(keys)}), [&](auto& h) { h.mutable_pull()->set_clock(uint64_t{1} << 63); }),
                   "out of range"});
  cases.push_back({"clock advance to 2^64-1",
                   with(Message{}, [&](auto& h) { h.mutable_clock_advance()->set_clock(kHuge); }), "out of range"});
  cases.push_back({"pull held for 2^64-1 ms", with(Pull(kTable, 3, {Of(keys)}), [&](auto& h) {
                     h.mutable_pull()->set_clock(1000);  // ahead of the only worker: it would be held
                     h.mutable_pull()->set_hold_timeout_ms(kHuge);
                   }),
                   "--max-hold-ms"});
  cases.push_back({"clock advance held for 2^64-1 ms", with(Message{}, [&](auto& h) {
                     h.mutable_clock_advance()->set_clock(5);
                     h.mutable_clock_advance()->set_hold_timeout_ms(kHuge);
                   }),
                   "--max-hold-ms"});
  // Sequence numbers: a push may not say that it, or pushes after it, were
  // acknowledged (every later push of this worker would be dropped as seen).
  cases.push_back({"push whose acked_below passes its own seq",
                   with(Push(kTable, 3, {Of(keys), Of(values)}),
                        [&](auto& h) {
                          h.mutable_push()->set_seq(5);
                          h.mutable_push()->set_acked_below(kHuge);
                        }),
                   "acked_below"});
  // Epochs: a request from a newer shard map than the server's is sent
  // again later (Aborted, not counted as bad input).
  cases.push_back({"push from shard map epoch 2^64-1",
                   with(Push(kTable, 3, {Of(keys), Of(values)}), [&](auto& h) { h.set_epoch(kHuge); }),
                   "send it again", /*bad=*/false});
  // Table kinds.
  auto table = [](auto&& set) {
    Message m = Create(4);
    set(*m.header.mutable_create_table()->mutable_config());
    return m;
  };
  cases.push_back({"table of an unknown kind",
                   table([](proto::TableConfig& c) { c.set_kind(static_cast<proto::TableKind>(99)); }),
                   "unknown kind 99"});
  cases.push_back({"dense table without rows", table([](proto::TableConfig& c) { c.set_kind(proto::DENSE); }),
                   "dense_rows"});
  cases.push_back({"sparse table with dense rows", table([](proto::TableConfig& c) { c.set_dense_rows(8); }),
                   "must not set dense_rows"});
  cases.push_back({"table of an unknown consistency",
                   table([](proto::TableConfig& c) { c.set_consistency(static_cast<proto::ConsistencyKind>(7)); }),
                   "consistency"});
  for (Case& k : cases) {
    Message reply = client.Call(std::move(k.request));
    ASSERT_TRUE(reply.header.has_error()) << k.what << ": " << reply.header.ShortDebugString();
    EXPECT_NE(reply.header.error().message().find(k.expected_words), std::string::npos)
        << k.what << ": " << reply.header.error().message();
  }

  Message after = pull_all();
  ASSERT_TRUE(after.header.has_pull_reply()) << after.header.ShortDebugString();
  const std::vector<float> now(after.frames[0].As<float>().begin(), after.frames[0].As<float>().end());
  EXPECT_EQ(now, expected) << "a bad request changed the table";

  ASSERT_TRUE(client.session().ReportDone({}, 10 * kSeconds).ok());
  EXPECT_TRUE(client.session().WaitForEnd().ok());
  job.ExpectOrderlyEnd();
  EXPECT_EQ(job.server().stats().bad_requests,
            static_cast<uint64_t>(std::count_if(cases.begin(), cases.end(), [](const Case& k) { return k.bad; })))
      << "every bad request is counted";
}

// A peer (here one with the job's access, sending by hand) that asks for big
// rows and never reads the answers: without a bound, the server's transport
// would queue every answer for it. The server keeps at most
// --max-mb-in-flight-per-peer of answers waiting for it, refuses the rest
// as busy (and changes nothing), and serves everyone else meanwhile; the
// answers it kept and the refusals arrive once the peer reads.
TEST(BadRequestsTest, APeerThatDoesNotReadItsAnswersGetsBusyAndTheServerStaysBounded) {
  spdlog::default_logger()->set_level(spdlog::level::warn);
  constexpr uint64_t kLimit = 8 << 20;
  OneServerJob job(ServerCoreOptions{.max_bytes_in_flight_per_peer = kLimit});
  RawClient client(job.coordinator_address());
  ASSERT_TRUE(client.Join().ok());
  constexpr uint32_t kWide = 2, kRowFloats = 1 << 18;  // rows of 1 MiB
  ASSERT_TRUE(client.Call(Create(kRowFloats, "", "", kWide)).header.has_ack());
  const std::vector<Key> key = {5};
  std::vector<float> row(kRowFloats, 0.25f);
  ASSERT_TRUE(client.Call(Push(kWide, 1, {Of(key), Of(row)})).header.has_ack());

  zmq::context_t ctx(1);
  zmq::socket_t slow(ctx, zmq::socket_type::router);  // where the answers go: never read until the end
  slow.set(zmq::sockopt::linger, 0);
  slow.set(zmq::sockopt::rcvhwm, 1);
  slow.set(zmq::sockopt::rcvbuf, 64 * 1024);
  slow.bind("tcp://127.0.0.1:0");
  const std::string slow_address = slow.get(zmq::sockopt::last_endpoint);
  zmq::socket_t asker(ctx, zmq::socket_type::dealer);
  asker.set(zmq::sockopt::linger, 0);
  asker.connect(client.server());
  constexpr int kAsks = 200;
  for (int i = 0; i < kAsks; ++i) {
    Message pull = Pull(kWide, 1, {Of(key)});
    pull.header.set_request_id(static_cast<uint64_t>(i + 1));
    pull.header.set_sender_id(client.session().self().node_id());
    pull.header.set_sender_address(slow_address);
    const std::string header = pull.header.SerializeAsString();
    asker.send(zmq::buffer(header), zmq::send_flags::sndmore);
    asker.send(zmq::buffer(key.data(), sizeof(Key)), zmq::send_flags::none);
  }
  auto answered = [&] {
    const ServerStats st = job.server().stats();
    return st.pull_requests + st.busy_refused;
  };
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (answered() < kAsks && std::chrono::steady_clock::now() < until) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  const ServerStats st = job.server().stats();
  ASSERT_EQ(st.pull_requests + st.busy_refused, static_cast<uint64_t>(kAsks)) << "every request was answered or refused";
  // Answers left the server only while fewer than kLimit bytes waited, plus
  // what the kernel's socket buffers took: far fewer than were asked for.
  EXPECT_GE(st.busy_refused, kAsks / 2u);
  EXPECT_EQ(st.busy_dropped, 0u);
  EXPECT_EQ(st.bad_requests, 0u) << "busy is not bad input";

  // Another peer is served meanwhile.
  Message mine = client.Call(Pull(kWide, 1, {Of(key)}));
  ASSERT_TRUE(mine.header.has_pull_reply()) << mine.header.ShortDebugString();

  // The slow peer reads: the kept answers, then a refusal for each other ask.
  slow.set(zmq::sockopt::rcvtimeo, 10000);  // a lost answer fails the test instead of hanging it
  int rows = 0, busy = 0;
  for (int i = 0; i < kAsks; ++i) {
    std::vector<zmq::message_t> parts;
    ASSERT_TRUE(zmq::recv_multipart(slow, std::back_inserter(parts))) << i;
    proto::Envelope h;
    ASSERT_TRUE(h.ParseFromArray(parts[1].data(), static_cast<int>(parts[1].size())));
    if (h.has_pull_reply()) {
      ++rows;
      continue;
    }
    ASSERT_TRUE(h.has_error()) << h.ShortDebugString();
    EXPECT_EQ(h.error().code(), static_cast<int>(absl::StatusCode::kUnavailable));
    EXPECT_NE(h.error().message().find("--max-mb-in-flight-per-peer"), std::string::npos) << h.error().message();
    ++busy;
  }
  EXPECT_EQ(static_cast<uint64_t>(busy), st.busy_refused);
  EXPECT_EQ(rows + busy, kAsks);
  EXPECT_LE(rows, 40) << "answers kept for a peer that does not read are bounded by the limit (8 MiB of 1 MiB rows) "
                         "and the kernel's buffers";

  ASSERT_TRUE(client.session().ReportDone({}, 10 * kSeconds).ok());
  EXPECT_TRUE(client.session().WaitForEnd().ok());
  job.ExpectOrderlyEnd();
}

}  // namespace
}  // namespace tessera

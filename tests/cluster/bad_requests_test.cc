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
#include <mutex>

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
  EXPECT_EQ(job.server().stats().bad_requests, cases.size()) << "every bad request is counted";
}

}  // namespace
}  // namespace tessera

// CoalescingTransport (transport/coalescing_transport.h): the batch wire
// format, what is held and when it goes, replies made in the handler going
// together, order, bounds, the timer, Stop, byte accounting and malformed
// batches. Over the in-process transport, so that what each side's inner
// transport carried is known exactly; the ZeroMQ and shared-memory stacks
// run the conformance suite with it (transport_conformance_test.cc).
// Every wait polls with a deadline; the only fixed sleeps check that a held
// message was not delivered early (they can only make a test pass wrongly,
// never fail wrongly).
#include "transport/coalescing_transport.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "gtest/gtest.h"
#include "transport/inproc_transport.h"

namespace tessera {
namespace {

using std::chrono::milliseconds;

constexpr auto kDeadline = std::chrono::seconds(60);

#define ASSERT_OK(expr)                              \
  do {                                               \
    const absl::Status _st = (expr);                 \
    ASSERT_TRUE(_st.ok()) << #expr << " -> " << _st; \
  } while (0)

bool WaitUntil(const std::function<bool()>& done) {
  const auto deadline = std::chrono::steady_clock::now() + kDeadline;
  while (!done()) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(milliseconds(1));
  }
  return true;
}

Buffer Bytes(size_t n, uint8_t seed) {
  Buffer b = Buffer::Allocate(n);
  auto out = b.AsMutable<uint8_t>();
  for (size_t i = 0; i < n; ++i) out[i] = static_cast<uint8_t>(seed + i * 7);
  return b;
}

bool SameBytes(const Buffer& a, const Buffer& b) {
  return a.size() == b.size() && (a.size() == 0 || std::memcmp(a.data(), b.data(), a.size()) == 0);
}

Message Request(uint64_t id, std::vector<Buffer> frames = {}) {
  Message m;
  m.header.set_request_id(id);
  m.header.mutable_ack();
  m.frames = std::move(frames);
  return m;
}

// Records what a handler got.
class Inbox {
 public:
  Transport::Handler handler() {
    return [this](Message m) {
      std::lock_guard lock(mu_);
      got_.push_back(std::move(m));
    };
  }
  size_t size() const {
    std::lock_guard lock(mu_);
    return got_.size();
  }
  std::vector<Message> Snapshot() const {
    std::lock_guard lock(mu_);
    return got_;
  }
  bool WaitForCount(size_t n) const {
    return WaitUntil([&] { return size() >= n; });
  }

 private:
  mutable std::mutex mu_;
  std::vector<Message> got_;
};

CoalescingTransport::Options Client(std::chrono::microseconds max_delay = std::chrono::seconds(100)) {
  CoalescingTransport::Options o;
  o.hold_requests = true;
  o.max_delay = max_delay;
  return o;
}

class CoalescingTransportTest : public ::testing::Test {
 protected:
  std::unique_ptr<CoalescingTransport> Wrap(const std::string& name, CoalescingTransport::Options o = {}) {
    auto inner = network_.Create(name);
    inners_.push_back(inner.get());
    return std::make_unique<CoalescingTransport>(std::move(inner), o);
  }
  // A started "server" (plain options) and "client" (`client`), wrapped in
  // that order (InnerSent(0) and (1)); null pointers, with the failure
  // recorded, if either did not start.
  std::pair<std::unique_ptr<CoalescingTransport>, std::unique_ptr<CoalescingTransport>> StartPair(
      CoalescingTransport::Options client, Transport::Handler at_server, Transport::Handler at_client) {
    auto server = Wrap("server");
    auto c = Wrap("client", client);
    absl::Status s = server->Start(std::move(at_server));
    if (s.ok()) s = c->Start(std::move(at_client));
    if (!s.ok()) {
      ADD_FAILURE() << "starting the pair: " << s;
      return {};
    }
    return {std::move(server), std::move(c)};
  }
  // Messages the i-th wrapped transport's inner transport sent.
  uint64_t InnerSent(size_t i) const { return inners_[i]->stats().messages_sent; }

  InProcNetwork network_;
  std::vector<Transport*> inners_;
};

TEST(BatchFormatTest, MessagesComeBackWithTheirHeadersFramesAndAlignment) {
  std::vector<Message> in;
  in.push_back(Request(1, {Bytes(13, 1), Buffer(), Bytes(4096, 2)}));
  in.push_back(Request(2));  // no frames
  in.push_back(Request(3, {Bytes(1, 3)}));
  in[2].header.set_first_request_id(77);
  in[0].header.set_sender_address("tcp://stamped-by-the-caller:1");
  std::vector<Message> copy = in;
  Message batch = CoalescingTransport::PackBatch(in);
  ASSERT_TRUE(batch.header.has_batch());
  ASSERT_EQ(batch.frames.size(), 1u);
  batch.header.set_sender_address("inproc://sender");
  absl::StatusOr<std::vector<Message>> out = CoalescingTransport::UnpackBatch(batch);
  ASSERT_TRUE(out.ok()) << out.status();
  ASSERT_EQ(out->size(), 3u);
  for (size_t i = 0; i < 3; ++i) {
    const Message& m = (*out)[i];
    EXPECT_EQ(m.header.request_id(), copy[i].header.request_id());
    EXPECT_TRUE(m.header.has_ack());
    EXPECT_EQ(m.header.sender_address(), "inproc://sender") << "the batch's address stands for every message";
    ASSERT_EQ(m.frames.size(), copy[i].frames.size());
    uint64_t bytes = 0;
    for (size_t k = 0; k < m.frames.size(); ++k) {
      EXPECT_TRUE(SameBytes(m.frames[k], copy[i].frames[k])) << "message " << i << " frame " << k;
      if (!m.frames[k].empty()) {
        EXPECT_EQ(reinterpret_cast<uintptr_t>(m.frames[k].data()) % 8, 0u) << "message " << i << " frame " << k;
      }
      bytes += m.frames[k].size();
    }
    proto::Envelope h = copy[i].header;
    h.clear_sender_address();
    EXPECT_EQ(m.received_bytes, bytes + h.ByteSizeLong()) << "message " << i;
  }
  EXPECT_EQ((*out)[2].header.first_request_id(), 77u);
}

// Messages with no header bytes and only empty frames pack into a batch
// with no payload bytes at all (found by fuzzing: the packer wrote through a
// null payload, which UBSan in scripts/sanitize.sh's ci tier reports), and
// come back as they went.
TEST(BatchFormatTest, MessagesOfNoBytesMakeABatchWithAnEmptyPayload) {
  std::vector<Message> in(3);
  in[1].frames.push_back(Buffer());
  in[2].frames.push_back(Buffer());
  in[2].frames.push_back(Buffer());
  for (const Message& m : in) ASSERT_EQ(m.header.ByteSizeLong(), 0u);
  Message batch = CoalescingTransport::PackBatch(in);
  ASSERT_EQ(batch.frames.size(), 1u);
  EXPECT_EQ(batch.frames[0].size(), 0u);
  absl::StatusOr<std::vector<Message>> out = CoalescingTransport::UnpackBatch(batch);
  ASSERT_TRUE(out.ok()) << out.status();
  ASSERT_EQ(out->size(), 3u);
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_EQ((*out)[i].frames.size(), i) << "message " << i;
    for (const Buffer& f : (*out)[i].frames) EXPECT_TRUE(f.empty());
  }
}

TEST(BatchFormatTest, LayoutsThatDoNotAddUpAreRefused) {
  std::vector<Message> in;
  in.push_back(Request(1, {Bytes(100, 1)}));
  in.push_back(Request(2, {Bytes(8, 2), Bytes(3, 3)}));
  const Message good = CoalescingTransport::PackBatch(in);
  ASSERT_TRUE(CoalescingTransport::UnpackBatch(good).ok());

  auto refused = [](const Message& m, const std::string& what) {
    absl::StatusOr<std::vector<Message>> out = CoalescingTransport::UnpackBatch(m);
    EXPECT_FALSE(out.ok()) << what;
    if (!out.ok()) {
      EXPECT_EQ(out.status().code(), absl::StatusCode::kInvalidArgument) << what;
    }
  };
  {
    Message m = good;
    m.header.mutable_batch()->set_frame_bytes(0, 1 << 20);
    refused(m, "a frame past the end");
  }
  {
    Message m = good;
    m.header.mutable_batch()->set_header_bytes(1, 1 << 20);
    refused(m, "a header past the end");
  }
  {
    Message m = good;
    m.header.mutable_batch()->add_frame_bytes(0);
    refused(m, "more frame sizes than frames");
  }
  {
    Message m = good;
    m.header.mutable_batch()->set_frame_counts(0, 5);
    refused(m, "counts that do not add up");
  }
  {
    Message m = good;
    m.header.mutable_batch()->add_header_bytes(0);
    refused(m, "fewer frame counts than headers");
  }
  {
    Message m = good;
    m.frames[0] = m.frames[0].Slice(0, m.frames[0].size() - 8);
    refused(m, "a payload too short");
  }
  {
    Message m = good;
    Buffer longer = Buffer::Allocate(m.frames[0].size() + 8);
    std::memcpy(longer.AsMutable<std::byte>().data(), m.frames[0].data(), m.frames[0].size());
    m.frames[0] = longer;
    refused(m, "bytes left over");
  }
  {
    Message m = good;
    m.frames.push_back(Bytes(8, 9));
    refused(m, "two payload frames");
  }
  {
    Message m = good;
    m.header.mutable_batch()->clear_header_bytes();
    m.header.mutable_batch()->clear_frame_counts();
    m.header.mutable_batch()->clear_frame_bytes();
    refused(m, "no messages");
  }
  {
    Message m = good;
    Buffer garbage = Bytes(m.frames[0].size(), 200);
    m.frames[0] = garbage;
    refused(m, "headers that do not parse");
  }
  {
    std::vector<Message> nested;
    nested.push_back(good);
    nested.push_back(Request(3));
    refused(CoalescingTransport::PackBatch(nested), "a batch inside a batch");
  }
}

// A client's requests to a server that owes an answer wait for Flush; the
// first goes at once.
TEST_F(CoalescingTransportTest, RequestsToAPeerThatOwesAnAnswerWaitForFlush) {
  Inbox inbox;
  auto [server, client] = StartPair(Client(), inbox.handler(), [](Message) {});
  ASSERT_TRUE(server && client);
  for (uint64_t id = 1; id <= 8; ++id) ASSERT_OK(client->Send(server->address(), Request(id, {Bytes(64, id)})));
  ASSERT_TRUE(inbox.WaitForCount(1));
  std::this_thread::sleep_for(milliseconds(50));
  EXPECT_EQ(inbox.size(), 1u) << "requests 2-8 should be held: the server has not answered 1";
  EXPECT_EQ(client->Backlog(server->address()).messages, 7u);
  client->Flush();
  ASSERT_TRUE(inbox.WaitForCount(8));
  std::vector<Message> got = inbox.Snapshot();
  for (uint64_t id = 1; id <= 8; ++id) {
    EXPECT_EQ(got[id - 1].header.request_id(), id);
    EXPECT_EQ(got[id - 1].header.sender_address(), client->address());
    ASSERT_EQ(got[id - 1].frames.size(), 1u);
    EXPECT_TRUE(SameBytes(got[id - 1].frames[0], Bytes(64, id)));
  }
  EXPECT_EQ(InnerSent(1), 2u) << "one alone, then one batch";
  EXPECT_EQ(client->coalesce_stats().batches_sent, 1u);
  EXPECT_EQ(client->coalesce_stats().messages_batched, 7u);
  EXPECT_EQ(server->coalesce_stats().batches_received, 1u);
  EXPECT_EQ(server->coalesce_stats().messages_unbatched, 7u);
  EXPECT_EQ(client->Backlog(server->address()).messages, 0u);
}

// A message marked at_once (control messages) is not held even where the
// peer owes an answer, and what was held for that peer goes before it.
TEST_F(CoalescingTransportTest, AnAtOnceMessageIsNotHeldAndGoesAfterWhatWasHeld) {
  Inbox inbox;
  auto [server, client] = StartPair(Client(), inbox.handler(), [](Message) {});
  ASSERT_TRUE(server && client);
  for (uint64_t id = 1; id <= 3; ++id) ASSERT_OK(client->Send(server->address(), Request(id, {Bytes(64, id)})));
  ASSERT_TRUE(inbox.WaitForCount(1));
  EXPECT_EQ(client->Backlog(server->address()).messages, 2u) << "requests 2 and 3 should be held";
  Message control = Request(4, {Bytes(16, 4)});
  control.at_once = true;
  ASSERT_OK(client->Send(server->address(), std::move(control)));
  EXPECT_EQ(client->Backlog(server->address()).messages, 0u) << "the at_once message was held, or kept others held";
  ASSERT_TRUE(inbox.WaitForCount(4));
  std::vector<Message> got = inbox.Snapshot();
  for (uint64_t id = 1; id <= 4; ++id) EXPECT_EQ(got[id - 1].header.request_id(), id);
  EXPECT_EQ(client->coalesce_stats().messages_held, 2u) << "only requests 2 and 3 were held";
  // And it did not wait for Flush: nothing more to send.
  client->Flush();
  std::this_thread::sleep_for(milliseconds(20));
  EXPECT_EQ(inbox.size(), 4u);
}

// Anything arriving from the peer is its answer: what was held for it goes.
TEST_F(CoalescingTransportTest, AMessageFromThePeerReleasesWhatWasHeldForIt) {
  Inbox at_server, at_client;
  auto [server, client] = StartPair(Client(), at_server.handler(), at_client.handler());
  ASSERT_TRUE(server && client);
  for (uint64_t id = 1; id <= 4; ++id) ASSERT_OK(client->Send(server->address(), Request(id)));
  ASSERT_TRUE(at_server.WaitForCount(1));
  std::this_thread::sleep_for(milliseconds(20));
  ASSERT_EQ(at_server.size(), 1u);
  // The server answers from outside its handler: servers send such at once.
  ASSERT_OK(server->Send(client->address(), Request(100)));
  ASSERT_TRUE(at_server.WaitForCount(4));
  ASSERT_TRUE(at_client.WaitForCount(1));
  EXPECT_EQ(client->coalesce_stats().batches_sent, 1u);
  EXPECT_EQ(client->coalesce_stats().timer_flushes, 0u);
  EXPECT_EQ(server->coalesce_stats().batches_sent, 0u);
}

// Requests to a server whose answers are large (wide pulls) are not held:
// they would gain nothing and leave the server idle.
TEST_F(CoalescingTransportTest, RequestsToAPeerWhoseAnswersAreLargeGoAtOnce) {
  for (const size_t answer : {size_t{1000}, size_t{100000}}) {
    InProcNetwork network;
    Inbox at_server, at_client;
    auto server = std::make_unique<CoalescingTransport>(network.Create("server"), CoalescingTransport::Options{});
    auto client = std::make_unique<CoalescingTransport>(network.Create("client"), Client());
    ASSERT_OK(server->Start(at_server.handler()));
    ASSERT_OK(client->Start(at_client.handler()));
    ASSERT_OK(client->Send(server->address(), Request(1)));
    ASSERT_TRUE(at_server.WaitForCount(1));
    ASSERT_OK(server->Send(client->address(), Request(100, {Bytes(answer, 1)})));
    ASSERT_TRUE(at_client.WaitForCount(1));
    for (uint64_t id = 2; id <= 4; ++id) ASSERT_OK(client->Send(server->address(), Request(id)));
    if (answer > client->options().max_message_bytes) {
      ASSERT_TRUE(at_server.WaitForCount(4)) << "answers of " << answer << " bytes";
      EXPECT_EQ(client->coalesce_stats().batches_sent, 0u);
    } else {
      ASSERT_TRUE(at_server.WaitForCount(2));
      std::this_thread::sleep_for(milliseconds(20));
      EXPECT_EQ(at_server.size(), 2u) << "answers of " << answer << " bytes: 3 and 4 wait for 2's answer";
      client->Flush();
      ASSERT_TRUE(at_server.WaitForCount(4));
      EXPECT_EQ(client->coalesce_stats().batches_sent, 1u);
    }
    client->Stop();
    server->Stop();
  }
}

// Replies the handler makes for the messages of one batch go as one batch.
TEST_F(CoalescingTransportTest, RepliesMadeInTheHandlerGoTogether) {
  Transport* server_ptr = nullptr;
  auto server = Wrap("server");
  server_ptr = server.get();
  ASSERT_OK(server->Start([&](Message m) {
    Message reply = Request(m.header.request_id(), {Bytes(32, static_cast<uint8_t>(m.header.request_id()))});
    reply.header.mutable_pull_reply();
    ASSERT_OK(server_ptr->Send(m.header.sender_address(), std::move(reply)));
  }));
  // A plain in-process client that sends a batch and reads the raw answer.
  Inbox raw;
  auto client = network_.Create("client");
  ASSERT_OK(client->Start(raw.handler()));
  std::vector<Message> requests;
  for (uint64_t id = 1; id <= 5; ++id) requests.push_back(Request(id));
  ASSERT_OK(client->Send(server->address(), CoalescingTransport::PackBatch(requests)));
  ASSERT_TRUE(raw.WaitForCount(1));
  std::this_thread::sleep_for(milliseconds(20));
  ASSERT_EQ(raw.size(), 1u) << "five replies, one message";
  Message batch = raw.Snapshot()[0];
  absl::StatusOr<std::vector<Message>> replies = CoalescingTransport::UnpackBatch(batch);
  ASSERT_TRUE(replies.ok()) << replies.status();
  ASSERT_EQ(replies->size(), 5u);
  for (uint64_t id = 1; id <= 5; ++id) {
    EXPECT_EQ((*replies)[id - 1].header.request_id(), id);
    EXPECT_TRUE((*replies)[id - 1].header.has_pull_reply());
    EXPECT_TRUE(SameBytes((*replies)[id - 1].frames[0], Bytes(32, static_cast<uint8_t>(id))));
  }
  // A single request gets its reply alone, not as a batch of one.
  ASSERT_OK(client->Send(server->address(), Request(9)));
  ASSERT_TRUE(raw.WaitForCount(2));
  EXPECT_FALSE(raw.Snapshot()[1].header.has_batch());
  EXPECT_EQ(raw.Snapshot()[1].header.request_id(), 9u);
}

// A message too big to hold sends what is held first; order is kept
// whatever the sizes, and batches stay within their bounds.
TEST_F(CoalescingTransportTest, OrderIsKeptAcrossSizesAndBatchBounds) {
  Inbox inbox;
  CoalescingTransport::Options o = Client();
  o.max_message_bytes = 1000;
  o.max_batch_bytes = 4096;
  o.max_batch_messages = 5;
  auto [server, client] = StartPair(o, inbox.handler(), [](Message) {});
  ASSERT_TRUE(server && client);
  std::vector<size_t> sizes;
  for (int i = 0; i < 60; ++i) sizes.push_back(i % 11 == 10 ? 5000 : static_cast<size_t>((i * 97) % 900));
  for (size_t i = 0; i < sizes.size(); ++i) {
    ASSERT_OK(client->Send(server->address(), Request(i + 1, {Bytes(sizes[i], static_cast<uint8_t>(i))})));
  }
  client->Flush();
  ASSERT_TRUE(inbox.WaitForCount(sizes.size()));
  std::vector<Message> got = inbox.Snapshot();
  ASSERT_EQ(got.size(), sizes.size());
  for (size_t i = 0; i < sizes.size(); ++i) {
    ASSERT_EQ(got[i].header.request_id(), i + 1) << "out of order at " << i;
    EXPECT_TRUE(SameBytes(got[i].frames[0], Bytes(sizes[i], static_cast<uint8_t>(i))));
  }
  const CoalesceStats s = client->coalesce_stats();
  EXPECT_GT(s.batches_sent, 0u);
  EXPECT_LE(s.messages_batched, s.batches_sent * 5) << "max_batch_messages";
  // Every message over max_message_bytes went alone: 5 of them, plus the
  // first, plus the batches (a batch of one goes alone too).
  EXPECT_GE(InnerSent(1), s.batches_sent + 6);
}

TEST_F(CoalescingTransportTest, MaxDelaySendsWhatNobodyFlushes) {
  Inbox inbox;
  auto [server, client] = StartPair(Client(std::chrono::microseconds(2000)), inbox.handler(), [](Message) {});
  ASSERT_TRUE(server && client);
  for (int round = 0; round < 3; ++round) {
    for (uint64_t id = 1; id <= 3; ++id) ASSERT_OK(client->Send(server->address(), Request(round * 10 + id)));
    ASSERT_TRUE(inbox.WaitForCount(3 * (round + 1))) << "round " << round;
    // Past the timer's linger, so that the next round has to wake it.
    std::this_thread::sleep_for(milliseconds(round == 1 ? 50 : 0));
  }
  EXPECT_GE(client->coalesce_stats().timer_flushes, 3u);
}

TEST_F(CoalescingTransportTest, StopSendsWhatIsHeld) {
  Inbox inbox;
  auto [server, client] = StartPair(Client(), inbox.handler(), [](Message) {});
  ASSERT_TRUE(server && client);
  for (uint64_t id = 1; id <= 6; ++id) ASSERT_OK(client->Send(server->address(), Request(id)));
  client->Stop();
  ASSERT_TRUE(inbox.WaitForCount(6));
  EXPECT_EQ(client->Send(server->address(), Request(7)).code(), absl::StatusCode::kFailedPrecondition);
}

// Forget drops what is held for the peer (a held message may view a
// caller's borrowed memory: it must not go later), lets its frames go, and
// forgets that the peer owes an answer: the next request goes at once.
TEST_F(CoalescingTransportTest, ForgetDropsWhatIsHeldForThePeer) {
  Inbox inbox;
  auto [server, client] = StartPair(Client(), inbox.handler(), [](Message) {});
  ASSERT_TRUE(server && client);
  ASSERT_OK(client->Send(server->address(), Request(1)));
  auto owned = std::make_shared<std::vector<std::byte>>(64, std::byte{0x5a});
  std::vector<std::byte> borrowed(64, std::byte{0x11});
  ASSERT_OK(client->Send(server->address(), Request(2, {Buffer::Adopt(owned, owned->data(), owned->size())})));
  for (uint64_t id = 3; id <= 4; ++id) {
    ASSERT_OK(client->Send(server->address(), Request(id, {Buffer::Borrow(borrowed.data(), borrowed.size())})));
  }
  ASSERT_EQ(client->Backlog(server->address()).messages, 3u) << "requests 2-4 should be held";
  const ForgetResult forgot = client->Forget(server->address(), kDeadline);
  EXPECT_EQ(forgot.messages_dropped, 3u);
  EXPECT_EQ(forgot.frames_pending, 3u);
  EXPECT_EQ(forgot.frames_still_held, 0u);
  EXPECT_EQ(owned.use_count(), 1) << "a dropped message's frame is still referenced";
  EXPECT_EQ(client->Backlog(server->address()).messages, 0u);
  std::fill(borrowed.begin(), borrowed.end(), std::byte{0xee});  // the caller reuses its memory
  client->Flush();
  // Nothing owed any more: request 5 goes at once (no Flush, and the timer
  // waits 100 s); an at_once 6 would go after anything still held.
  ASSERT_OK(client->Send(server->address(), Request(5)));
  ASSERT_TRUE(inbox.WaitForCount(2)) << "request 5 was held";
  Message last = Request(6);
  last.at_once = true;
  ASSERT_OK(client->Send(server->address(), std::move(last)));
  ASSERT_TRUE(inbox.WaitForCount(3));
  std::vector<uint64_t> ids;
  for (const Message& m : inbox.Snapshot()) ids.push_back(m.header.request_id());
  EXPECT_EQ(ids, (std::vector<uint64_t>{1, 5, 6})) << "a dropped request was sent";
  EXPECT_EQ(client->Forget("inproc://nobody", kDeadline).messages_dropped, 0u);
}

TEST_F(CoalescingTransportTest, HeldMessagesAreCountedInTheirSentBytes) {
  Inbox inbox;
  auto [server, client] = StartPair(Client(), inbox.handler(), [](Message) {});
  ASSERT_TRUE(server && client);
  auto counter = std::make_shared<std::atomic<uint64_t>>(0);
  uint64_t expected = 0;
  for (uint64_t id = 1; id <= 4; ++id) {
    Message m = Request(id, {Bytes(100 * id, 1)});
    m.sent_bytes = counter;
    if (id > 1) {  // the first goes alone; the inner transport counts it with its stamped address
      proto::Envelope h = m.header;
      expected += h.ByteSizeLong() + 100 * id;
    }
    ASSERT_OK(client->Send(server->address(), std::move(m)));
  }
  ASSERT_TRUE(inbox.WaitForCount(1));
  const uint64_t first = counter->load();
  EXPECT_GT(first, 100u);
  client->Flush();
  ASSERT_TRUE(inbox.WaitForCount(4));
  EXPECT_EQ(counter->load() - first, expected);
  uint64_t received = 0;
  for (const Message& m : inbox.Snapshot()) {
    if (m.header.request_id() > 1) received += m.received_bytes;
  }
  EXPECT_EQ(received, expected) << "each side counts a batched message's header and frames";
}

TEST_F(CoalescingTransportTest, AMalformedBatchIsDroppedAndCounted) {
  Inbox inbox;
  auto server = Wrap("server");
  ASSERT_OK(server->Start(inbox.handler()));
  auto client = network_.Create("client");
  ASSERT_OK(client->Start([](Message) {}));
  std::vector<Message> two;
  two.push_back(Request(1));
  two.push_back(Request(2));
  Message bad = CoalescingTransport::PackBatch(two);
  bad.header.mutable_batch()->set_header_bytes(0, 1 << 30);
  ASSERT_OK(client->Send(server->address(), std::move(bad)));
  ASSERT_OK(client->Send(server->address(), Request(3)));
  ASSERT_TRUE(inbox.WaitForCount(1));
  std::this_thread::sleep_for(milliseconds(20));
  ASSERT_EQ(inbox.size(), 1u);
  EXPECT_EQ(inbox.Snapshot()[0].header.request_id(), 3u);
  EXPECT_EQ(server->stats().malformed_received, 1u);
}

TEST_F(CoalescingTransportTest, DisabledHoldsNothingButStillTakesBatchesApart) {
  Inbox inbox, at_client;
  CoalescingTransport::Options off = Client();
  off.enabled = false;
  auto [server, client] = StartPair(off, inbox.handler(), at_client.handler());
  ASSERT_TRUE(server && client);
  for (uint64_t id = 1; id <= 5; ++id) ASSERT_OK(client->Send(server->address(), Request(id)));
  ASSERT_TRUE(inbox.WaitForCount(5));
  EXPECT_EQ(InnerSent(1), 5u);
  EXPECT_EQ(client->coalesce_stats().batches_sent, 0u);
  std::vector<Message> two;
  two.push_back(Request(10));
  two.push_back(Request(11));
  auto raw = network_.Create("raw");
  ASSERT_OK(raw->Start([](Message) {}));
  ASSERT_OK(raw->Send(client->address(), CoalescingTransport::PackBatch(two)));
  ASSERT_TRUE(at_client.WaitForCount(2));
  EXPECT_EQ(at_client.Snapshot()[1].header.request_id(), 11u);
}

TEST_F(CoalescingTransportTest, SendBeforeStartAndBadOptionsAreRefused) {
  auto client = Wrap("client", Client());
  EXPECT_EQ(client->Send("inproc://nobody", Request(1)).code(), absl::StatusCode::kFailedPrecondition);
  auto zero = Wrap("zero", Client(std::chrono::microseconds(0)));
  EXPECT_EQ(zero->Start([](Message) {}).code(), absl::StatusCode::kInvalidArgument);
}

// Many threads sending to one peer: every message arrives once, each
// thread's in its order.
TEST_F(CoalescingTransportTest, ConcurrentSendersKeepEachThreadsOrder) {
  Inbox inbox;
  auto [server, client] = StartPair(Client(std::chrono::microseconds(500)), inbox.handler(), [](Message) {});
  ASSERT_TRUE(server && client);
  constexpr int kThreads = 4, kEach = 2000;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kEach; ++i) {
        (void)client->Send(server->address(), Request(static_cast<uint64_t>(t) << 32 | i, {Bytes(i % 300, t)}));
        if (i % 97 == 0) client->Flush();
      }
    });
  }
  for (auto& th : threads) th.join();
  ASSERT_TRUE(inbox.WaitForCount(kThreads * kEach));
  std::vector<int> next(kThreads, 0);
  for (const Message& m : inbox.Snapshot()) {
    const int t = static_cast<int>(m.header.request_id() >> 32);
    const int i = static_cast<int>(m.header.request_id() & 0xffffffff);
    ASSERT_EQ(i, next[t]) << "thread " << t;
    ++next[t];
  }
}

}  // namespace
}  // namespace tessera

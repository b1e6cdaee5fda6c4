#include "server/pull_reply_pieces.h"

#include <gtest/gtest.h>

#include <cstring>
#include <numeric>

namespace tessera {
namespace {

Message PullReply(uint64_t id, size_t value_bytes) {
  Message m;
  m.header.set_request_id(id);
  m.header.mutable_pull_reply()->set_num_keys(1);
  std::vector<uint8_t> bytes(value_bytes);
  std::iota(bytes.begin(), bytes.end(), uint8_t{0});
  m.frames.push_back(Buffer::CopyOf(bytes.data(), bytes.size()));
  return m;
}

std::pair<uint64_t, uint64_t> Descriptor(const Message& m) {
  uint64_t words[2];
  EXPECT_EQ(m.frames[1].size(), kPullPieceDescriptorBytes);
  std::memcpy(words, m.frames[1].data(), sizeof(words));
  return {words[0], words[1]};
}

TEST(PullReplyPiecesTest, SplitsLargePlainRepliesIntoContiguousPieces) {
  std::vector<Outgoing> out;
  AppendReply(out, "w", PullReply(9, 10), ReplyPieceRules{.piece_bytes = 4, .sender_id = 3, .epoch = 7});
  ASSERT_EQ(out.size(), 3u);
  EXPECT_TRUE(out[0].message.header.has_pull_reply());  // the full header first
  for (size_t i = 0; i < out.size(); ++i) {
    const Message& m = out[i].message;
    EXPECT_EQ(out[i].to, "w");
    EXPECT_EQ(m.header.request_id(), 9u);
    EXPECT_TRUE(m.lendable);
    EXPECT_EQ(Descriptor(m), std::make_pair(uint64_t{4 * i}, uint64_t{10}));
    EXPECT_EQ(m.frames[0].size(), i < 2 ? 4u : 2u);
    EXPECT_EQ(static_cast<uint8_t>(m.frames[0].data()[0]), 4 * i);  // its slice of the values
    if (i > 0) {
      EXPECT_FALSE(m.header.has_pull_reply());
      EXPECT_EQ(m.header.sender_id(), 3u);
      EXPECT_EQ(m.header.epoch(), 7u);
    }
  }
}

TEST(PullReplyPiecesTest, KeepsWholeWhatMustNotOrNeedNotBeSplit) {
  auto whole = [](Message m, const ReplyPieceRules& rules) {
    std::vector<Outgoing> out;
    AppendReply(out, "w", std::move(m), rules);
    return out.size() == 1 && out[0].message.frames.size() == 1;
  };
  EXPECT_TRUE(whole(PullReply(1, 10), ReplyPieceRules{.piece_bytes = 0}));   // splitting off
  EXPECT_TRUE(whole(PullReply(1, 4), ReplyPieceRules{.piece_bytes = 4}));    // small enough
  Message asked_whole = PullReply(1, 10);
  asked_whole.unsplit = true;
  EXPECT_TRUE(whole(asked_whole, ReplyPieceRules{.piece_bytes = 4, .max_whole_bytes = 10}));
  EXPECT_FALSE(whole(asked_whole, ReplyPieceRules{.piece_bytes = 4, .max_whole_bytes = 9}));  // too large whole
  const std::function<bool(const std::string&, size_t)> in_place = [](const std::string& to, size_t) {
    return to == "w";
  };
  EXPECT_TRUE(whole(PullReply(1, 10), ReplyPieceRules{.piece_bytes = 4, .reads_in_place = &in_place}));
  Message encoded = PullReply(1, 10);  // compressed values are never split
  encoded.header.mutable_pull_reply()->set_value_parts(1);
  EXPECT_TRUE(whole(encoded, ReplyPieceRules{.piece_bytes = 4}));
  Message ack;
  ack.header.mutable_ack();
  std::vector<Outgoing> out;
  AppendReply(out, "w", ack, ReplyPieceRules{.piece_bytes = 4});
  ASSERT_EQ(out.size(), 1u);
  EXPECT_FALSE(out[0].message.lendable);  // only pull replies are lent
}

}  // namespace
}  // namespace tessera

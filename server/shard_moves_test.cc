#include "server/shard_moves.h"

#include <gtest/gtest.h>

namespace tessera {
namespace {

constexpr RetransmitOptions kResend = {.initial = 100 * kMillis, .floor = 1 * kMillis, .ceiling = 1 * kSeconds};

// 4 shards on 3 servers, each shard on all three; shard 0 (rank 0's) moves
// to rank 2, and so does rank 1's copy of shard 3 (rank 0's too): a move of
// a backup's copy.
ShardMapView MovingMap(bool with_moves) {
  std::vector<proto::NodeInfo> nodes(3);
  for (uint32_t i = 0; i < 3; ++i) nodes[i].set_node_id(100 + i);
  proto::ShardMap map = RoundRobinShardMap(1, 4, nodes, 3);
  if (with_moves) {
    map.add_moving_vshards(0);
    map.add_moving_to(2);
    map.add_moving_vshards(3);
    map.add_moving_to(2);
    map.add_moving_from(0);
    map.add_moving_from(1);
  }
  auto view = ShardMapView::Create(map);
  EXPECT_TRUE(view.ok()) << view.status();
  return *view;
}

Outgoing Piece(const std::string& to, uint64_t id) {
  Message m;
  m.header.set_request_id(id);
  return Outgoing{to, std::move(m)};
}

TEST(ShardMovesTest, AMoveIsInSyncOnceTheDestinationHasWhatWasSentBeforeIt) {
  BackupStreams streams(kResend);
  BackupStream& to2 = streams.To(2, 102);
  streams.Append(to2, Message{}, 1, 0);
  streams.Append(to2, Message{}, 2, 0);
  ShardMoves moves;
  const ShardMapView map = MovingMap(true);
  moves.Note(map, 0, streams);
  EXPECT_FALSE(moves.none());
  EXPECT_TRUE(moves.InSync(map, 0, streams).empty());
  streams.Append(to2, Message{}, 3, 0);  // after the moves were noted: not waited for
  streams.Acked(2, to2.id, 1, false, 1);
  EXPECT_TRUE(moves.InSync(map, 0, streams).empty());
  streams.Acked(2, to2.id, 2, false, 2);
  EXPECT_EQ(moves.InSync(map, 0, streams), (std::vector<uint32_t>{0, 3}));
  // As another rank, none of these moves is its own.
  ShardMoves other;
  other.Note(map, 1, streams);
  EXPECT_TRUE(other.none());
  // A stream that ended waits for nothing.
  ShardMoves ended;
  ended.Note(map, 0, streams);
  streams.End(2);
  EXPECT_EQ(ended.InSync(map, 0, streams), (std::vector<uint32_t>{0, 3}));
  // A map without the moves ends them.
  moves.Note(MovingMap(false), 0, streams);
  EXPECT_TRUE(moves.none());
}

TEST(ShardMovesTest, AReplyThatReadAMovingShardWaitsForItsDestination) {
  BackupStreams streams(kResend);
  BackupStream& to2 = streams.To(2, 102);
  streams.Append(to2, Message{}, 1, 0);
  ShardMoves moves;
  const ShardMapView map = MovingMap(true);
  moves.Note(map, 0, streams);
  // Shard 3 moves a backup's copy: reads of it do not wait. Shard 1 is not moving.
  EXPECT_TRUE(moves.WaitsFor(std::vector<uint32_t>{1, 3}, streams).waits.empty());
  ShardMoves::HeldReply held = moves.WaitsFor(std::vector<uint32_t>{0, 1, 0}, streams);
  ASSERT_EQ(held.waits.size(), 1u);  // shard 0 once
  EXPECT_EQ(held.vshards, std::vector<uint32_t>{0});
  EXPECT_EQ(held.waits[0].rank, 2u);
  EXPECT_EQ(held.waits[0].position, 1u);
  held.pieces.push_back(Piece("w", 7));
  held.pieces.push_back(Piece("w", 7));
  moves.Hold(std::move(held));
  std::vector<Outgoing> out;
  moves.Release(streams, out);
  EXPECT_TRUE(out.empty());
  EXPECT_EQ(moves.held(), 1u);
  streams.Acked(2, to2.id, 1, false, 1);
  moves.Release(streams, out);
  ASSERT_EQ(out.size(), 2u);  // every piece, in order
  EXPECT_EQ(out[0].to, "w");
  EXPECT_EQ(moves.held(), 0u);
  EXPECT_TRUE(moves.WaitsFor(std::vector<uint32_t>{0}, streams).waits.empty());  // all acknowledged now
}

TEST(ShardMovesTest, RepliesThatReadAShardThatLeftAreHandedBack) {
  BackupStreams streams(kResend);
  BackupStream& to2 = streams.To(2, 102);
  streams.Append(to2, Message{}, 1, 0);
  ShardMoves moves;
  moves.Note(MovingMap(true), 0, streams);
  for (uint64_t id : {5, 6}) {
    ShardMoves::HeldReply held = moves.WaitsFor(std::vector<uint32_t>{0}, streams);
    held.to = "w" + std::to_string(id);
    held.pieces.push_back(Piece(held.to, id));
    moves.Hold(std::move(held));
  }
  EXPECT_TRUE(moves.TakeReadersOf([](uint32_t v) { return v == 1; }).empty());
  auto taken = moves.TakeReadersOf([](uint32_t v) { return v == 0; });
  ASSERT_EQ(taken.size(), 2u);
  EXPECT_EQ(taken[0].first.to, "w5");
  EXPECT_EQ(taken[0].second, 0u);
  EXPECT_EQ(moves.held(), 0u);
}

}  // namespace
}  // namespace tessera

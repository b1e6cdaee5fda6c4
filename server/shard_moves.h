#pragma once
// ShardMoves: a primary's side of moving a shard to another server
// (common/keys.h, "Moving a shard"; coordinator/rebalancer.h): which of its
// shards move where, when each move is in sync, and the pull replies that
// wait for a move's destination. A part of ServerCore (docs/design.md,
// "Server parts"); it reads the replication streams (BackupStreams) to the
// destinations and never changes them.
//
// Contract:
// - Note(map, my_rank, streams), after every new map: a move of a shard
//   this server is primary of (map.moving()) is recorded once, with the
//   stream to its destination and that stream's last position at that
//   moment (0, 0 without a stream); a recorded move whose shard is no
//   longer this server's, or that goes elsewhere now, is dropped. A move of
//   this server's own copy (MovingFrom == my_rank) holds reads; a move of a
//   backup's copy does not.
// - InSync(map, my_rank, streams) lists, ascending, the moving shards this
//   server is primary of whose destination acknowledged the position
//   recorded (it has everything this server had applied when it learned of
//   the move), or whose stream ended.
// - WaitsFor(shards, streams): for a pull reply that read `shards`, the
//   moving shards that hold reads and whose destination has not yet
//   acknowledged everything sent to it, each once, with (rank, stream,
//   last position sent); empty: the reply may go now.
// - Hold(reply) keeps a reply (its pieces, ready to send) with its waits;
//   Release(streams, out) appends, in the order held, the pieces of every
//   held reply whose waits are all acknowledged (or whose streams ended).
// - TakeReadersOf(moved) removes and returns the held replies that read a
//   shard `moved` accepts, with the first such shard: the core answers them
//   Aborted (the worker pulls again from the new primary).
// - Clear() forgets every move and returns nothing held (a deposed server
//   answers them first with TakeReadersOf).
// Pure: no I/O, threads or clocks. Thread safety: none; the caller serializes.
#include <cstdint>
#include <deque>
#include <functional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "common/keys.h"
#include "common/message.h"
#include "server/backup_streams.h"

namespace tessera {

class ShardMoves {
 public:
  struct StreamWait {
    uint32_t rank;
    uint64_t stream, position;
  };
  struct HeldReply {
    std::string to;
    proto::Envelope header;         // the reply's (for an Aborted answer instead)
    std::vector<Outgoing> pieces;   // the reply, as it goes out
    std::vector<uint32_t> vshards;  // the moving shards it read
    std::vector<StreamWait> waits;
  };

  void Note(const ShardMapView& map, uint32_t my_rank, const BackupStreams& streams);
  std::vector<uint32_t> InSync(const ShardMapView& map, uint32_t my_rank, const BackupStreams& streams) const;
  // HeldReply with vshards and waits filled (no waits: send now).
  HeldReply WaitsFor(std::span<const uint32_t> shards, const BackupStreams& streams) const;
  void Hold(HeldReply reply) { held_.push_back(std::move(reply)); }
  void Release(const BackupStreams& streams, std::vector<Outgoing>& out);
  std::vector<std::pair<HeldReply, uint32_t>> TakeReadersOf(const std::function<bool(uint32_t)>& moved);
  void Clear() { moving_out_.clear(); }

  bool none() const { return moving_out_.empty(); }  // no move recorded
  size_t held() const { return held_.size(); }

 private:
  // A shard this server is primary of that moves: its destination, and the
  // stream to it and its last position when this server learned of the move.
  struct MoveOut {
    uint32_t to = 0;
    uint64_t stream = 0, position = 0;
    // A move of this server's copy (not a backup's): reads wait for the
    // destination, which answers them after the switch.
    bool hold_reads = true;
  };
  absl::flat_hash_map<uint32_t, MoveOut> moving_out_;
  std::deque<HeldReply> held_;  // order held
};

}  // namespace tessera

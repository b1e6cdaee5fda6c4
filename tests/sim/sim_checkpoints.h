#pragma once
// The simulator's checkpoints (Scenario::checkpoint_every_ns): what a shared
// checkpoint directory is to tessera-server, kept in memory by the World.
// Every server writes its checkpoints here (ServerCore::SnapshotPrimaryShards,
// taken as ServerNode::WriteCheckpointNow takes it); they survive crashes;
// a server restoring shards that lost every copy reads them all through the
// same pure function the shell calls (RestoreNewestCopies,
// server/checkpoint_restore.h).
//
// Promises:
// - Write stores a checkpoint as the next sequence number of its server
//   rank (1 + the largest that rank wrote; increasing, as in a directory)
//   and keeps only the newest keep_last of that rank.
// - Restore restores the shards asked for from every stored checkpoint
//   (with `oldest`, the negative control kRestoreOldest: from the oldest
//   one kept of each rank only), and records, per shard asked for, the
//   time and the de-duplication windows that the newest stored checkpoint
//   holding it (by map epoch, then sequence) had for it: what the restore
//   should have brought back, judged from the store and not from what the
//   restore did.
// - RestoreHeld restores the shards asked for as a new job's servers do at
//   their start (ServerNodeCore's restore_held, as tessera-server
//   --restore-from): without windows, from every stored checkpoint (with
//   `oldest`, the negative control kRestoreHeldOldest: from the oldest one
//   kept of each rank only). NewestHolding names the newest stored
//   checkpoint holding a shard (by map epoch, then sequence: the rule
//   ChooseNewestCopies follows), judged from the store, for the checks.
// - NoteSend sees every message sent: for each sequenced push (or part of
//   one, each with its own number) and each key it carried, when a server
//   first sent an acknowledgement of a message of it that carried the key.
// - MayHaveLost(vshard, key, push) says whether a restore may have lost an
//   acknowledged push to `key` (of `vshard`): a part of the push carried the
//   key and was first acknowledged for it before some restore of that
//   shard, and the newest checkpoint holding the shard at that restore did
//   not hold that part: its number is neither below its writer's window
//   floor for the shard nor in that window (no window of that writer and
//   incarnation: not held). So a push that checkpoint held, or one first
//   acknowledged after the restore, must be in the rows.
// Not thread-safe (the simulator has one thread).
#include <cstdint>
#include <map>
#include <set>
#include <span>
#include <string>
#include <tuple>
#include <vector>

#include "common/clock.h"
#include "common/keys.h"
#include "common/message.h"
#include "server/checkpoint_restore.h"
#include "server/server_core.h"
#include "server/shard_snapshot.h"

namespace tessera::sim {

class CheckpointStore {
 public:
  explicit CheckpointStore(uint32_t keep_last = 3) : keep_last_(keep_last) {}

  // Stores `snapshot` (of snapshot.server_rank) taken at `now`; returns its name.
  std::string Write(ShardSnapshot snapshot, Nanos now);
  CheckpointRestore Restore(ServerCore& core, const std::vector<uint32_t>& vshards, bool with_windows,
                            const std::map<uint32_t, uint64_t>& last_applied, Nanos now, bool oldest);
  CheckpointRestore RestoreHeld(ServerCore& core, const std::vector<uint32_t>& vshards, bool oldest);
  // The newest stored checkpoint holding `vshard` and its name (null: none).
  const ShardSnapshot* NewestHolding(uint32_t vshard, std::string* name) const {
    const Stored* c = Newest(vshard);
    if (c != nullptr && name != nullptr) *name = Name(c->snapshot.server_rank, c->sequence);
    return c == nullptr ? nullptr : &c->snapshot;
  }
  void NoteSend(const std::string& from, const std::string& to, const Message& m, Nanos now);

  // A push as the checkers know it: its writer and its numbers (first..last
  // with parts).
  struct Push {
    uint32_t worker = 0, incarnation = 0;
    uint64_t first = 0, last = 0;
  };
  bool MayHaveLost(uint32_t vshard, Key key, const Push& p) const;
  // Whether some server restored `vshard` (for a violation's text).
  bool WasRestored(uint32_t vshard) const {
    for (const Restored& r : restored_)
      if (r.vshard == vshard) return true;
    return false;
  }

  uint64_t written() const { return written_; }
  uint64_t shards_lost() const { return shards_lost_; }          // shards given to a server to restore
  uint64_t shards_restored() const { return shards_restored_; }  // of those, restored from a checkpoint
  uint64_t missed_reported() const { return missed_reported_; }  // the restore lines' "miss at least" sums
  uint64_t held_asked() const { return held_asked_; }            // shards new jobs' servers held at their start
  uint64_t held_restored() const { return held_restored_; }      // of those, restored from a checkpoint

 private:
  struct Stored {
    uint64_t sequence;
    Nanos taken;
    ShardSnapshot snapshot;
  };
  // One writer's window of one shard in a checkpoint.
  struct Window {
    uint64_t floor = 0;
    std::set<uint64_t> seqs;
  };
  // A shard restored, and what the newest stored checkpoint holding it held.
  struct Restored {
    uint32_t vshard;
    Nanos at;
    std::map<std::pair<uint32_t, uint32_t>, Window> windows;  // (worker node, incarnation) -> window
  };
  static std::string Name(uint32_t rank, uint64_t sequence) {
    return "checkpoint server-" + std::to_string(rank) + "-" + std::to_string(sequence);
  }
  // The newest stored checkpoint holding `vshard` (null: none).
  const Stored* Newest(uint32_t vshard) const;
  // Every stored checkpoint (oldest: the oldest kept of each rank only), for RestoreNewestCopies.
  std::vector<CheckpointCopy> Copies(bool oldest) const;
  // A push message sent: its writer, number and keys.
  struct Sent {
    uint32_t worker, incarnation;
    uint64_t seq;
    std::vector<Key> keys;
  };

  const uint32_t keep_last_;
  std::map<uint32_t, std::vector<Stored>> by_rank_;  // oldest first
  std::map<uint32_t, uint64_t> last_sequence_;       // per rank
  std::vector<Restored> restored_;
  std::map<std::pair<std::string, uint64_t>, Sent> sent_;  // (worker address, request id) -> the push message
  // (worker node, incarnation, seq, key) -> when a server first acknowledged it
  std::map<std::tuple<uint32_t, uint32_t, uint64_t, Key>, Nanos> first_ack_;
  uint64_t written_ = 0, shards_lost_ = 0, shards_restored_ = 0, missed_reported_ = 0;
  uint64_t held_asked_ = 0, held_restored_ = 0;
};

}  // namespace tessera::sim

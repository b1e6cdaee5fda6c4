#pragma once
// Request checks: whether a request may be served at all, and whether its
// frames, keys and values are what its header says, as pure functions. A
// part of ServerCore (docs/design.md, "Server parts"): Step runs the
// refusals before it routes a request; pushes, pulls and a backup's
// forwards run the frame and key checks before they change anything.
//
// Contract (every error names the problem; none changes anything):
// - SetError(reply, status) makes `reply` an Error reply with the status's
//   code and message, and drops its frames.
// - CheckNotLent(m): InvalidArgument if a frame is lent (Buffer::remote());
//   only pull replies may be lent.
// - IsWorkerRequest(h): a push, pull, clock advance, table creation, stats
//   request or clock query (what the per-peer limits apply to).
// - BusyError(backlog, to, max_requests, max_bytes): the Unavailable a
//   worker request gets while `to`'s answers in flight are at a limit,
//   naming the backlog and both limits. IsBusy(backlog, ...) says whether
//   they are.
// - RefuseBeforeRouting(h, map, my_rank, clocks, max_hold), in this order:
//   a data request (push, pull, forward, table creation) to a server the
//   map names dead: Aborted (a forward's refusal says rejected); a push or
//   pull stamped with a newer map epoch: Aborted at this server's epoch
//   (counted as behind_epoch); bad clock fields (CheckClockFields):
//   InvalidArgument; a push or pull of a worker that left: FailedPrecondition.
//   No refusal: nullopt.
// - RankOfNode(map, node): the map's rank of a server node, or kNoRank.
// - CheckForwardSender(h, map, accept_old_epoch): at a backup, a forward
//   (or transfer) of an older map epoch is rejected as stale
//   (FailedPrecondition; with accept_old_epoch, a test switch, it is taken
//   and old_epoch_accepted says so); one of a newer epoch is ignored (this
//   server's map is behind; the primary sends it again); one from a node
//   that is not a server of the map is rejected (FailedPrecondition).
//   Otherwise it is taken, from the sender's rank.
// - FindTable(tables, id): the table, or NotFound.
// - CheckKeysFrame(frame, num_keys, max_keys): ResourceExhausted past
//   max_keys, InvalidArgument unless the frame holds exactly num_keys keys;
//   else the keys (a view of the frame).
// - CheckPrimaryOf(keys, table_id, map, my_rank, shards): Aborted
//   (NotPrimaryError) at the first key whose shard's primary is not
//   my_rank; each key's shard goes to *shards (if not null; resized to the
//   keys, its contents unspecified on error).
// - NotPrimaryError(...): the Aborted that tells a worker to send again by
//   the map of the reply's epoch or newer.
// - CheckGrowth(table, keys, max_table_bytes): ResourceExhausted when the
//   keys' new rows would take the table past max_table_bytes (0: no
//   limit); looks the keys up only when every key being new could pass it.
// - CheckSameTable(existing, config): OK when a table creation asks for the
//   config of the table that exists (the creation is then a no-op), else
//   AlreadyExists naming both configs.
// - MakeDiskTier(config, disk_tiers): the disk tier's store of a table that
//   asks for one (null for a table that does not): FailedPrecondition
//   naming tessera-server --disk_dir when there is no factory, the
//   factory's error, or Table::CheckDiskTier's when the table's memory
//   budget leaves no room beside the store's memory.
// - CheckDenseShare(config, holds, max_table_bytes): ResourceExhausted
//   when the rows of a dense table this server holds (holds(key)) pass
//   max_table_bytes (0: no limit; sparse tables: OK).
// - PieceOf(first_column, columns, table): the piece of each row a push or
//   forward carries (Table::CheckColumns' errors).
// - CheckPush(req, m, tables, map, my_rank, limits, sender_live,
//   sender_clock), in this order: InvalidArgument unless the push has 2
//   frames, acked_below is at most its own number, and (not a resend) its
//   clock is not below the clock its live sender announced; the table
//   (FindTable), the keys frame (CheckKeysFrame), the piece (PieceOf); the
//   values frame must hold the piece's bytes per key (InvalidArgument);
//   CheckGrowth; then every key's shard must be one my_rank is primary of
//   (NotPrimaryError at the first that is not), except in a resend of the
//   map's epoch (Push.resend), where such keys are only noted (all_mine
//   false). Returns the table, keys, piece, bytes per key and each key's
//   shard.
// - CheckForward(m, tables, map, my_rank, from, check_keys, max_keys): a
//   backup's check of a forward from primary rank `from`: 2 frames, the
//   table, keys frame, piece and values frame as a push's; with
//   check_keys, FailedPrecondition at the first key whose shard is not led
//   by `from` and backed up by my_rank. Returns as CheckPush.
// - DecodePushValues(req, frames, tables, max_keys, pool): a compressed
//   push (value_parts > 0): its frames (keys, then parts) checked (count,
//   table, keys frame, piece, the parts tile exactly the push's values)
//   before anything is allocated; returns the decoded fp32 values frame
//   (from `pool` when not null).
// Pure: no I/O, threads or clocks. Thread safety: none needed (no state).
#include <cstdint>
#include <functional>
#include <limits>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/buffer.h"
#include "common/clock.h"
#include "common/keys.h"
#include "common/message.h"
#include "proto/tessera.pb.h"
#include "server/clock_table.h"
#include "server/cold_rows.h"
#include "server/state_transfer.h"
#include "server/table.h"

namespace tessera {

void SetError(Message& reply, const absl::Status& status);
absl::Status CheckNotLent(const Message& m);

bool IsWorkerRequest(const proto::Envelope& h);
inline bool IsBusy(const PeerBacklog& backlog, uint64_t max_requests, uint64_t max_bytes) {
  return backlog.bytes >= max_bytes || backlog.messages >= max_requests;
}
absl::Status BusyError(const PeerBacklog& backlog, const std::string& to, uint64_t max_requests, uint64_t max_bytes);

// A request refused before it is routed, and how it counts.
struct Refusal {
  absl::Status status;
  bool bad_request = false;         // counts in ServerStats::bad_requests
  bool behind_epoch = false;        // counts in ServerStats::behind_epoch
  bool replicate_rejected = false;  // a forward: its ReplicateAck says rejected
};
std::optional<Refusal> RefuseBeforeRouting(const proto::Envelope& h, const ShardMapView& map, uint32_t my_rank,
                                           const ClockTable& clocks, Nanos max_hold);

inline constexpr uint32_t kNoRank = std::numeric_limits<uint32_t>::max();
uint32_t RankOfNode(const ShardMapView& map, uint32_t node_id);
struct ForwardSender {
  enum class Verdict { kTake, kIgnore, kReject };
  Verdict verdict = Verdict::kTake;
  uint32_t from = kNoRank;          // kTake: the primary's rank
  bool old_epoch_accepted = false;  // kTake: of an older epoch, by the test switch
  absl::Status rejection;           // kReject: why
  bool stale = false;               // kReject: for an older epoch
};
ForwardSender CheckForwardSender(const proto::Envelope& h, const ShardMapView& map, bool accept_old_epoch);

absl::StatusOr<Table*> FindTable(const TableMap& tables, uint32_t id);

absl::StatusOr<std::span<const Key>> CheckKeysFrame(const Buffer& frame, uint64_t num_keys, uint64_t max_keys);
absl::Status CheckPrimaryOf(std::span<const Key> keys, uint32_t table_id, const ShardMapView& map, uint32_t my_rank,
                            std::vector<uint32_t>* shards);
absl::Status NotPrimaryError(uint32_t table_id, Key key, uint32_t owner, uint32_t my_rank, uint64_t epoch);

absl::Status CheckGrowth(const Table& table, std::span<const Key> keys, uint64_t max_table_bytes);
absl::Status CheckSameTable(const proto::TableConfig& existing, const proto::TableConfig& c);
absl::StatusOr<std::unique_ptr<ColdRows>> MakeDiskTier(const proto::TableConfig& c, const ColdRowsFactory& disk_tiers);
absl::Status CheckDenseShare(const proto::TableConfig& c, const std::function<bool(Key)>& holds,
                             uint64_t max_table_bytes);

absl::StatusOr<Columns> PieceOf(uint32_t first_column, uint32_t columns, const Table& table);

// The limits of ServerCoreOptions a push or pull is checked against.
struct RequestLimits {
  uint64_t max_keys_per_request = 0;
  uint64_t max_table_bytes = 0;  // 0: none
};
// A push or forward that passed its checks.
struct CheckedRows {
  Table* table = nullptr;
  std::span<const Key> keys;     // a view of the keys frame
  Columns piece;                 // the columns of each row it carries
  size_t row_bytes = 0;          // value bytes per key
  std::vector<uint32_t> vshard;  // each key's shard
  bool all_mine = true;          // a push: every key's shard is this server's
};
absl::StatusOr<CheckedRows> CheckPush(const proto::Push& req, const Message& m, const TableMap& tables,
                                      const ShardMapView& map, uint32_t my_rank, const RequestLimits& limits,
                                      bool sender_live, uint64_t sender_clock);
absl::StatusOr<CheckedRows> CheckForward(const Message& m, const TableMap& tables, const ShardMapView& map,
                                         uint32_t my_rank, uint32_t from, bool check_keys, uint64_t max_keys);
absl::StatusOr<Buffer> DecodePushValues(const proto::Push& req, std::span<const Buffer> frames,
                                        const TableMap& tables, uint64_t max_keys, BufferPool* pool);

}  // namespace tessera

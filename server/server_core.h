#pragma once
// ServerCore: everything a server does with a request, as a pure state
// machine: Step(request) -> replies. No sockets, threads or clocks; the
// tessera-server binary is a thin shell that feeds it messages.
//
// It routes each request to named pure parts, each with its contract in its
// own header and its own tests (docs/design.md, "Server parts"):
// hold_queue.h (requests waiting for slower workers), push_dedup.h,
// push_acks.h (Acks waiting for backups), backup_streams.h (a primary's
// forwards), forward_inbox.h (a backup's intake), state_transfer.h,
// backup_plan.h (what a new map owes each backup), shard_moves.h,
// pull_reply_pieces.h, request_clocks.h, snapshot_restore.h,
// shard_traffic.h, audit_log.h, request_checks.h (refusals and the checks
// of frames, keys and values), push_rows.h (the rows a push or forward
// applies and forwards), map_change.h (what a newer map ends), answers.h
// (reply bodies) and load_summary.h.
//
// Contract:
// - Before InstallShardMap() every data request is answered with
//   Unavailable ("server has no shard map yet").
// - Every request with a request_id gets exactly one reply, to the request's
//   sender_address: Ack, PullReply (+ one values frame) or Error. Requests
//   without request_id get no reply.
// - Bad input (wrong frame count or sizes, unknown table, a key this server
//   does not hold, a conflicting table config) gets an Error reply naming the
//   problem and changes nothing.
// - Requests are applied in the order Step is called; so a pull that follows
//   a push from the same sender sees it.
// - Pushes (options.apply_after_ack): a push is validated completely in Step
//   and its Ack returned at once; the update itself is made by ApplyPending(),
//   which the shell calls after it has handed the Ack to the transport, so
//   that the update overlaps the Ack's trip and the sender's next request.
//   Step and Tick apply whatever is pending before anything else, so every
//   request handled after a push, from any sender, sees it: an Ack still
//   means "accepted, ordered, and visible to everything handled later". A
//   push that fails validation gets its Error as before and is never pending.
//   A push with a borrowed frame (Buffer::owner() null, e.g. an in-process
//   sender's own memory, which it may reuse once it sees the Ack) is applied
//   before its Ack, as without the option.
//   Without the option, Step applies a push before it returns its Ack.
// - Pieces of rows: a push (and its forward) may carry columns
//   [first_column, first_column + columns) of each key's row instead of
//   whole rows (columns > 0). The piece must lie inside the row and the
//   table's optimizer must update pieces (not ADAM), else the push gets an
//   InvalidArgument Error and changes nothing; it updates those columns
//   (and their optimizer state) only, is forwarded as the same piece, and
//   is de-duplicated and audited (with its columns) like any push.
// - Consistency (../shared/DESIGN.md section 5): a Pull stamped clock c of a
//   table with staleness s is answered only once every live worker has
//   announced clock >= c - s (BSP: s = 0; ASP: never held), so it reflects
//   every push stamped <= c - s - 1. A ClockAdvance is acknowledged only once
//   the slowest live worker is within the strictest staleness of any table.
//   A request sent again (Envelope.first_request_id) while an earlier send
//   of it from the same sender is held is not held twice: the held one is
//   answered under the newer request id, its held_us counted from the
//   newer arrival (the sender times its round trip from there).
//   Held requests are answered, in arrival order, as soon as the clock table
//   allows, or with DeadlineExceeded naming the workers still behind after
//   their hold timeout (Tick). Workers that left (WorkersLeft) are not waited for.
//   A ClockQuery with `join` from a worker this server does not know (one
//   that joined the running job) starts tracking it at the fastest live
//   worker's clock (ClockTable::Join); the ClockAck says that clock.
// - Push clocks (eviction by age, server/table.h): a push moves its table's
//   clock to its stamp, but never past H + 1, where H is the highest clock
//   any worker has announced here (ClockTable::highest_clock(): by
//   ClockAdvance, notice or state transfer). A push stamped later is
//   applied and acknowledged as any other; only the clock it gives its
//   table (and its rows' recency) stops at H + 1, and stats() counts it
//   (push_clocks_bounded). So a wrong stamp (say 2^40) cannot age out every
//   row of a table at once, nor make every later push look far behind.
//   Why H + 1: under BSP and SSP a worker stamps clock c only after every
//   server acknowledged its clock c - 1; its ClockAdvance(c) may still be on
//   its way (lost and sent again) when a push stamped c arrives, so a
//   legitimate job's tables move exactly as their stamps say.
//   Why not refuse such a push instead: a server may rightly know less than
//   H + 1 of a healthy worker: an ASP job's clock notices are sent once and
//   never again, and a server new to a worker hears its clock from one
//   notice and the state transfer; a refused push would be retried until an
//   announcement that may never come. There, the table's clock lags until
//   an announcement arrives (rows touched meanwhile get the lagging clock,
//   and may be dropped up to that many clocks early), and nothing fails.
//   The primary decides the clock; backups apply the forwarded one
//   (Replicate.clock) as it is, so replicas still agree.
//   Pulls' and clock advances' clocks are not bounded: a pull's clock only
//   decides how long it is held (at most --max-hold-ms, at most
//   max_held_per_peer of them) and changes nothing; a clock advance moves
//   only its sender's own clock (a far one holds back nobody, and the
//   sender's later pushes stamped below it are refused), and a legitimate
//   one may jump any distance (an ASP worker runs ahead of the others
//   without bound; lost notices; a replacement worker, or a server that
//   missed many, hears a worker's clock late). A worker that announces a
//   far clock raises H: the bound stops wrong stamps, not wrong announcements.
// - Replication (../shared/DESIGN.md section 6; the map's backups):
//   * A push is taken only by the primary of the shard of each of its keys;
//     a key of a shard this server is not primary of gets Aborted ("not the
//     primary ... at map epoch E"), which tells the worker to retry with the
//     map of the reply's epoch or newer. A resend (Push.resend) may span
//     servers: its keys of shards this server is not primary of are ignored
//     (Aborted only if none is left), if it carries this server's map
//     epoch; a resend of an older map with such a key is Aborted whole (it
//     went to that map's servers, and a shard may have moved since).
//     Pulls: the same rule, no resend form.
//   * Sequenced pushes (seq > 0) are de-duplicated per (shard, worker,
//     incarnation, seq): the keys of a shard that already applied that push
//     are not applied again, and the push is acknowledged all the same. A
//     push from an incarnation older than one already seen is refused.
//   * The primary applies the push, then forwards to each backup the keys of
//     the shards it backs up (Replicate, numbered per backup from 1, in the
//     order applied) and sends the push's Ack only once every backup it
//     forwarded to acknowledged. A backup that rejects a forward for any
//     reason but an older epoch turns the Ack into an Error with its reason.
//     A forward unacknowledged for its backup's resend timer is sent again
//     (Tick), each on its own timer: common/retransmit_timer.h with
//     options.forward_resend, learned from the round trips of forwards that
//     were sent once and acknowledged alone, doubling per resend up to the
//     ceiling, with the bytes of the stream's unacknowledged forwards up to
//     it allowed for. (The backup keeps forwards that arrive ahead of a lost
//     one, so the lost one alone goes again.) A backup that receives a later
//     forward while the next position is missing says so at once, once per
//     missing position (ReplicateAck.gap); the primary then sends that
//     position again without waiting for its timer (the way TCP's duplicate
//     acknowledgements trigger a fast retransmit; a forward that was only
//     overtaken arrives twice and is acknowledged again). A lost forward is
//     so resent after about a round trip whenever a later one follows it.
//   * A push or pull stamped with a newer map epoch than this server's is
//     answered Aborted at this server's epoch and changes nothing (the
//     worker sends it again): by its older map this server could take or
//     skip the wrong keys.
//   * A backup applies a Replicate only if it carries the backup's own map
//     epoch, comes from the primary of the shard of each key, and is the
//     next position from that primary: an earlier position is acknowledged
//     again, a later one kept (up to kMaxEarlyForwards) until its turn comes
//     (the primary resends in order anyway), an older epoch rejected, a newer
//     one ignored until this server has that map.
//     Backups de-duplicate like primaries, so a resend that reaches a
//     promoted backup applies each push once.
//   * UpdateShardMap(newer map): forwards to servers that are no longer
//     backups are dropped (pushes that waited only on them are acknowledged:
//     every live replica has them). A server that the map names dead answers
//     every data request with Aborted and acknowledges nothing more.
//   * State transfer: when the new map gives a shard this server is primary
//     of a backup that did not hold it (recruited after a failover, or a
//     restarted server at its rank), the primary sends that backup, first in
//     its stream, a ShardTransfer: every table's config, the rows of those
//     shards, their de-duplication windows and the clock table, as they are
//     at that point of the order; the pushes after it follow as forwards. The
//     backup creates missing tables, sets the rows, windows and clocks, and
//     acknowledges like any forward; pushes acknowledged from then on wait
//     for it as for any backup.
//   * Forwards and transfers still unacknowledged when a newer map moves
//     shards keep only the keys (the shards) their backup still backs up
//     for this server (a backup refuses a forward with a key it does not),
//     and keep their positions. Each stream to a backup has an id
//     (Replicate.stream): one that ended and begins again starts at
//     position 1 under a new id, and the backup starts counting afresh.
// - Moves (common/keys.h, "Moving a shard"; coordinator/rebalancer.h):
//   * While a shard this server is primary of moves, a pull reply that
//     read it is held until the destination acknowledged every forward
//     sent before the reply was made; the heartbeat names the shard in
//     moves_in_sync once the destination acknowledged everything sent to it
//     before this server learned of the move.
//   * A newer map that takes a shard from this live server (a finished
//     move): pushes waiting for backups that touched it, and held pull
//     replies that read it, are answered Aborted at the new epoch (the
//     worker sends them to the new primary); a shard it no longer holds at
//     all is dropped (rows, windows, audit records, applied count).
// Thread safety: none; the shell serializes calls.
#include <cstdint>
#include <deque>
#include <map>
#include <functional>
#include <memory>
#include <optional>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "common/buffer.h"
#include "common/keys.h"
#include "common/message.h"
#include "common/clock.h"
#include "common/retransmit_timer.h"
#include "compress/codec.h"
#include "server/cold_rows.h"
#include "server/audit_log.h"
#include "server/backup_plan.h"
#include "server/backup_streams.h"
#include "server/clock_table.h"
#include "server/forward_inbox.h"
#include "server/hold_queue.h"
#include "server/load_summary.h"
#include "server/pull_reply_pieces.h"
#include "server/push_acks.h"
#include "server/push_dedup.h"
#include "server/request_clocks.h"
#include "server/shard_moves.h"
#include "server/shard_snapshot.h"
#include "server/shard_traffic.h"
#include "server/snapshot_restore.h"
#include "server/state_transfer.h"
#include "server/table.h"

namespace tessera {

// A refusal for a full backlog is answered while the peer has fewer than
// max_requests_in_flight_per_peer + this many messages waiting; past that,
// requests are dropped unanswered (ServerCoreOptions).
inline constexpr uint64_t kBusyAnswerSlack = 1024;

struct ServerCoreOptions {
  uint32_t node_id = 0;                     // stamped on replies
  BufferPool* pool = nullptr;               // reply buffers (not owned; may be null)
  Nanos default_hold_timeout = 60 * kSeconds;  // for held requests that name none
  // TEST ONLY: negative controls for tests and the cluster simulator
  // (tests/sim). Each breaks one rule of the contract, which the checkers
  // must then catch; none is set outside tests.
  struct Testing {
    bool answer_early = false;            // never hold pulls or clock acks
    bool apply_duplicates = false;        // apply a sequenced push again when it comes again
    bool ack_before_replication = false;  // acknowledge a push before the backups have it
    bool accept_old_epoch = false;        // installs older shard maps; a backup applies older forwards unchecked
    bool read_during_move = false;        // answers pulls of a moving shard without waiting for its destination
    bool join_at_zero = false;            // starts a worker that joins the running job at clock 0
  };
  Testing testing;
  bool apply_after_ack = false;             // leave accepted pushes to ApplyPending() (see the contract)
  // Pull replies with more value bytes than this go out in pieces of at most
  // this many bytes (0 = never split); see server/pull_reply_pieces.h.
  size_t pull_reply_piece_bytes = 0;
  // A pull that asks for its reply whole (Pull.whole) gets it whole only up
  // to this many value bytes, so that it fits the transport's message limit
  // (tessera-server sets it under --max-message-mb); past it, pieces.
  size_t max_whole_reply_bytes = size_t{1} << 30;
  // A state transfer to a backup (new copies, moves, restores) whose rows
  // pass half of this goes in several messages of at most that many row
  // bytes each (ShardTransfer.continued), so that each fits the receiver's
  // message limit (tessera-server --max-message-mb; the same on every server).
  size_t max_message_bytes = kDefaultMaxMessageBytes;
  // Whether the transport would lend values of this many bytes to this
  // address (Transport::LendsTo): such replies are not split, since the
  // receiver reads them in place and pieces would only add messages.
  // Null: split.
  std::function<bool(const std::string& to, size_t bytes)> reads_in_place;
  // The resend timer of forwards to each backup (see the contract).
  RetransmitOptions forward_resend = {.initial = 200 * kMillis, .floor = 2 * kMillis, .ceiling = 1 * kSeconds};
  // Audit mode (fault experiments): every row also keeps the list of pushes
  // applied to it, (worker node, incarnation, seq), replicated and
  // transferred with the row; AuditDump() writes them out.
  bool audit = false;
  // Limits (tessera-server --max-*; docs/security.md). A request over one is
  // refused with ResourceExhausted naming the limit, and changes nothing.
  uint64_t max_keys_per_request = uint64_t{1} << 26;  // keys in one push or pull (64 Mi)
  uint64_t max_table_bytes = 0;                       // rows x Table::RowBytes per table; 0 = no limit
  size_t max_held_per_peer = 1024;                    // requests held for slower workers, per sender
  // Requests in flight per peer: answered, with answers this server's
  // transport has not yet written out to that peer (backlog_of). A worker
  // request (push, pull, clock advance, table creation, query) from an
  // address whose backlog is at either limit is not served: it is answered
  // Unavailable, naming the limit (the worker sends it again after its
  // resend timer, so a worker that reads its answers late is slowed down,
  // not failed), or, once that address has max_requests_in_flight_per_peer
  // + kBusyAnswerSlack messages waiting, dropped unanswered (the worker's
  // resend timer covers it). Together with max_held_per_peer and the
  // transport's message limit this bounds the memory one peer can make a
  // server spend. Requests between servers (replication) are not limited.
  uint64_t max_bytes_in_flight_per_peer = uint64_t{1} << 30;  // 1 GiB
  uint64_t max_requests_in_flight_per_peer = 65536;            // messages (each piece of a pull reply counts)
  // What the transport still holds for an address (Transport::Backlog);
  // null: nothing is ever in flight (no limit applies).
  std::function<PeerBacklog(const std::string& to)> backlog_of;
  // The longest hold a request may ask for (Pull/ClockAdvance
  // hold_timeout_ms); a request asking for more is refused.
  Nanos max_hold = 24 * 3600 * kSeconds;
  // The disk tier (TableConfig.disk_tier; server/table.h, "Disk tier"):
  // makes the store of each table that asks for one. Null: such tables are
  // refused (FailedPrecondition naming tessera-server --disk_dir), as is a
  // table whose memory_budget_bytes leaves no room beside its store's memory.
  ColdRowsFactory disk_tiers;
};

// Pull replies in pieces (pull_reply_piece_bytes, max_whole_reply_bytes,
// reads_in_place): see server/pull_reply_pieces.h.

struct ServerStats {
  uint64_t held_requests = 0;  // pulls and clock advances that had to wait
  uint64_t held_resends = 0;   // requests sent again while their first send was held: held once, under the new id
  uint64_t push_requests = 0;
  uint64_t pull_requests = 0;
  uint64_t bad_requests = 0;
  uint64_t busy_refused = 0;  // worker requests answered Unavailable: that peer's answers in flight were at a limit
  uint64_t busy_dropped = 0;  // of those, dropped unanswered (too many answers waiting even for a refusal)
  uint64_t bytes_in = 0;   // data frame bytes received (keys + values or encoded parts), as on the wire
  uint64_t bytes_out = 0;  // data frame bytes sent (values or encoded parts), as on the wire
  uint64_t compressed_pushes = 0;  // pushes whose values arrived as encoded parts
  uint64_t duplicate_pushes = 0;   // sequenced pushes (or shards of them) already applied
  uint64_t push_clocks_bounded = 0;  // pushes stamped past what their table's clock may move to ("Push clocks")
  uint64_t forwards_sent = 0;      // Replicate messages to backups, resends included
  uint64_t forwards_resent = 0;    // of those, sent again (unacknowledged past the timer, a gap notice, or a new map)
  uint64_t forwards_gap_resent = 0;  // of those, sent again for a backup's gap notice
  uint64_t forwards_link_resent = 0;  // of those, sent again because the link to the backup was made again
  uint64_t forward_gaps_reported = 0;  // gap notices this server sent as a backup
  uint64_t forwards_applied = 0;   // Replicate messages this server applied as a backup
  uint64_t forwards_rejected = 0;  // Replicate messages this server refused (stale epoch, not a backup, bad)
  uint64_t transfers_sent = 0;     // state transfers to new backups (shards' rows, windows, clocks)
  uint64_t table_configs_sent = 0;  // transfers of no shards: a new table's config to the backups
  uint64_t transfers_applied = 0;  // state transfers this server took as a new backup
  uint64_t rows_transferred = 0;   // rows in the transfers sent
  uint64_t behind_epoch = 0;       // pushes and pulls sent back: stamped with a newer map than this server's
  uint64_t shards_released = 0;    // shards this server let go when a newer map moved them elsewhere
  uint64_t replies_held_for_moves = 0;  // pull replies that waited for a moving shard's destination
};

class ServerCore {
 public:
  explicit ServerCore(ServerCoreOptions options) : options_(options) {}
  // Shorthand for tests.
  explicit ServerCore(uint32_t node_id, BufferPool* pool = nullptr)
      : ServerCore(ServerCoreOptions{.node_id = node_id, .pool = pool}) {}
  ServerCore(const ServerCore&) = delete;
  ServerCore& operator=(const ServerCore&) = delete;

  // Sets which virtual shards this server (by rank in the map) holds. Once
  // there are tables, only UpdateShardMap may change the map.
  absl::Status InstallShardMap(const proto::ShardMap& map, uint32_t my_rank);
  // A newer map from the coordinator (failover): returns the replies it
  // releases. An older or equal epoch changes nothing; a bad map is an error.
  absl::StatusOr<std::vector<Outgoing>> UpdateShardMap(const proto::ShardMap& map, Nanos now = 0);
  uint64_t epoch() const { return map_ ? map_->epoch() : 0; }
  // Audit mode: the rows of every shard this server holds, with their
  // values and applied pushes, one line each, sorted:
  //   row TABLE KEY ROLE V1,V2,.. WORKER:INCARNATION:SEQ ...
  // ROLE is "primary" or "backup"; a push of a piece of the row adds
  // :FIRST:COUNT (its columns) to its entry. A first line "# tessera audit
  // server RANK epoch E" names the server. Every shard this server restored
  // from a checkpoint inside the running job (RestoreShards with windows)
  // adds, before the rows, the pushes that checkpoint held, by sequence
  // number, so that a checker can tell exactly which acknowledged pushes
  // the restore lost (those above a writer's window and not in it):
  //   restored VSHARD of NUM_VSHARDS WORKER:INCARNATION:FLOOR[:SEQ/SEQ/..] ...
  // (every push of that writer numbered below FLOOR, and the SEQs, were in
  // the checkpoint; a writer not listed had none). Empty outside audit mode.
  std::string AuditDump() const;

  // Checkpoints (server/checkpoint.h writes and reads ShardSnapshot,
  // server/shard_snapshot.h, as files): the shards this server is primary of
  // as they are now: their rows, de-duplication windows and applied counts.
  ShardSnapshot SnapshotPrimaryShards() const;
  // Sets `vshards` from `snapshot`: the rows of those shards (tables the
  // snapshot has and this server lacks are created); with_windows also their
  // de-duplication windows and applied counts (a shard restored inside a
  // running job; not for a new job, whose workers number pushes afresh).
  // With windows the checkpoint replaces whatever copy of those shards this
  // server had (rows, windows, audit records: e.g. a move's destination
  // holding part of a shard that lost every other copy), as a transfer does.
  // Returns the rows restored. Checks everything before changing anything.
  absl::StatusOr<uint64_t> RestoreShards(const ShardSnapshot& snapshot, std::span<const uint32_t> vshards,
                                         bool with_windows);
  // Sends each backup of `vshards` (those this server is primary of) their
  // state again, as a transfer in its stream (after a restore).
  std::vector<Outgoing> TransferShards(std::span<const uint32_t> vshards, Nanos now);
  // State transfers acknowledged since the last call: the coordinator may
  // promote those backups for those shards from now on (the shell tells it).
  std::vector<proto::ShardsInSync> TakeShardsInSync() { return std::exchange(in_sync_, {}); }
  // Pushes applied to each shard this server is primary of: (vshard, count).
  std::vector<std::pair<uint32_t, uint64_t>> AppliedByPrimaryShard() const;
  // What this server tells the coordinator in each heartbeat: the pushes
  // applied per primary shard, how many workers it knows have left, and
  // its load (traffic per primary shard, rows and memory of its tables;
  // the shell adds CPU and network).
  void FillHeartbeat(proto::Heartbeat* hb) const;
  // Traffic of each shard while this server was its primary, since the
  // core started: the pushes and pulls that touched it, bytes in (keys and
  // pushed values, as received) and out (pulled values, before any pull
  // compression). Indexed by vshard (empty before the first request).
  using ShardTraffic = tessera::ShardTraffic;
  const std::vector<ShardTraffic>& traffic() const { return traffic_.per_shard(); }
  uint64_t applied(uint32_t vshard) const {
    auto it = applied_.find(vshard);
    return it == applied_.end() ? 0 : it->second;
  }
  // Whether the current map names this server dead (it serves nothing).
  bool deposed() const { return map_ && map_->IsDead(my_rank_); }
  // Pushes accepted but waiting for backups, and forwards not yet acknowledged.
  size_t waiting_acks() const { return acks_.size(); }
  size_t unacked_forwards() const { return streams_.unacked(); }
  // When Tick next has a forward to send again (INT64_MAX: none), and the
  // shortest forward timer of any backup (a forward sent now is due no sooner).
  Nanos NextForwardDue() const { return streams_.NextDue(); }
  Nanos ShortestForwardTimer() const { return streams_.ShortestTimer(); }
  // Each backup's forward timer (rank order): for logs and metrics.
  std::vector<std::pair<uint32_t, RetransmitTimer>> ForwardTimers() const { return streams_.Timers(); }

  // The job's workers (node id -> rank), all at clock 0.
  void SetWorkers(const absl::flat_hash_map<uint32_t, uint32_t>& worker_rank_by_node);

  // Handles one request at time `now`; returns the replies to send (possibly
  // for earlier, held requests that this one released).
  std::vector<Outgoing> Step(Message request, Nanos now = 0);
  // Answers held requests whose hold timeout passed.
  std::vector<Outgoing> Tick(Nanos now);
  // The transport says the connection to `address` was made again (what was
  // on the old one may be lost): when that is a backup this server streams
  // to, every unacknowledged forward goes to it again now, in order, not at
  // its timer. Any other address: nothing.
  std::vector<Outgoing> OnLinkRestored(std::string_view address, Nanos now);
  // Applies the pushes Step accepted but left pending (apply_after_ack), in
  // arrival order. Cheap when nothing is pending.
  void ApplyPending();
  size_t pending_pushes() const { return pending_.size(); }

  const ClockTable& clocks() const { return clocks_; }
  size_t held() const { return held_.size(); }

  const ServerStats& stats() const { return stats_; }
  // The address of the last request refused as busy (stats().busy_refused).
  const std::string& last_busy_peer() const { return last_busy_peer_; }
  size_t held_now() const { return held_.size(); }  // requests waiting for slower workers
  uint64_t rows() const { return TotalRows(tables_); }  // rows over every table
  // Per table, for metrics: its rows, their bytes (Table::RowBytes) and
  // what admission and eviction did. Sorted by table id
  // (server/load_summary.h).
  using TableSummary = tessera::TableSummary;
  std::vector<TableSummary> table_summaries() const { return SummarizeTables(tables_); }
  uint64_t min_clock() const { return clocks_.min_clock(); }
  size_t num_tables() const { return tables_.size(); }
  const Table* table(uint32_t id) const;

 private:
  // Creates the table `c` (CreateTable requests, transfers, restores); OK
  // if it exists with that config.
  absl::Status CreateTable(const proto::TableConfig& c);
  // A worker's request (it wants a reply) from an address whose answers in
  // flight are at a limit: answered Unavailable, or dropped past
  // kBusyAnswerSlack (see ServerCoreOptions); true if so.
  bool RefusedAsBusy(const Message& request, std::vector<Outgoing>& out);
  // A push: validated, de-duplicated, applied (or left pending under
  // apply_after_ack), forwarded to backups. Appends its reply to `out` now,
  // or later (ForwardDone) when the Ack waits for backups.
  void HandlePush(Message request, Nanos now, std::vector<Outgoing>& out);
  // The validation and update part of HandlePush; adds the forwards of
  // push_id to the streams and returns how many there are.
  absl::StatusOr<uint32_t> AcceptPush(const proto::Push& req, Message& m, uint64_t push_id, Nanos now,
                                      std::vector<Outgoing>& out, std::vector<uint32_t>* shards_out);
  // A newer map moved shards away from this live server (a move, not a
  // failover): pushes waiting for backups that touched a shard it no longer
  // is primary of are answered Aborted; shards it no longer holds at all
  // are dropped (rows, windows, audit records, applied counts).
  void LetMovedShardsGo(const ShardMapView& old, std::vector<Outgoing>& out);
  // A backup's side: Replicate from a primary (reply in `out`), then any
  // forwards that came early and are next now.
  void HandleReplicate(const Message& m, std::vector<Outgoing>& out);
  void ReplicateOne(const Message& m, std::vector<Outgoing>& out);
  // A backup applies a forward (not a transfer) of primary rank `from`:
  // checked whole first (frames, table, piece, every key backed up here for
  // `from`, unless the test switch accepted an old epoch), de-duplicated,
  // applied at the primary's clock, recorded.
  absl::Status ApplyForward(const Message& m, uint32_t from, bool old_epoch_accepted);
  // A primary's side: a backup acknowledged (or rejected) forwards.
  void HandleReplicateAck(const Message& m, Nanos now, std::vector<Outgoing>& out);
  // One forward of push_id is done (acknowledged, or its backup left): the
  // push's Ack goes out once none is left.
  void ForwardDone(uint64_t push_id, const absl::Status& status, std::vector<Outgoing>& out);
  using Origin = PushOrigin;
  // Audit mode: records that the push `origin` was applied to these keys.
  void AuditApplied(uint32_t table_id, std::span<const Key> keys, const Origin& origin, Columns piece) {
    if (options_.audit) audit_.Applied(table_id, keys, origin, piece);
  }
  // A compressed push (value_parts > 0): replaces the parts by the decoded
  // fp32 values frame, so the rest handles it like any push.
  absl::Status DecodePushValues(const proto::Push& req, Message& m);
  absl::StatusOr<Buffer> HandlePull(const proto::Pull& req, const Message& m);
  // The min clock a request needs before it may be answered.
  absl::StatusOr<uint64_t> RequiredMinClock(const Message& m);
  // Builds the reply to an admitted request (never holds).
  Message Answer(Message request, Nanos held_for);
  void ReleaseHeld(Nanos now, std::vector<Outgoing>& out);
  // Holds `request` (a well-formed pull, or a clock advance that wants a
  // reply) when the clock table does not allow it yet, or renews its earlier
  // held send (kHeld; `request` may then be moved from), or refuses it past
  // max_held_per_peer (kRefused, its reply in `out`).
  enum class HoldOutcome { kNotHeld, kHeld, kRefused };
  HoldOutcome HoldIfBehind(Message& request, Nanos now, std::vector<Outgoing>& out);
  uint64_t StrictestStaleness() const;
  // The keys frame, checked against num_keys; with primary_only, every key
  // must be in a shard this server is primary of (else NotPrimaryError).
  // (With primary_only and `shards`, each key's shard goes to *shards.)
  absl::StatusOr<std::span<const Key>> KeysFrame(const Message& m, uint64_t num_keys, uint32_t table_id,
                                                 bool primary_only, std::vector<uint32_t>* shards = nullptr);
  Message Reply(const Message& request) const;
  // Appends `reply` to `out`, split into pieces when it is a large pull reply.
  void Emit(std::vector<Outgoing>& out, std::string to, Message reply) const;

  // A validated push whose update is still to be made (apply_after_ack).
  struct PendingPush {
    Table* table;  // tables are never removed
    Buffer keys;   // keep the frames alive
    Buffer values;
    uint64_t clock = 0;  // the push's clock stamp
    Columns columns;     // the piece of each row it updates
  };

  // Replication (see the contract). Sends the stream's unacknowledged forwards (BackupStreams::TakeDue),
  // stamped with the current epoch: all of them, or (due_only) those past
  // their resend timer. SendResent sends one forward again.
  void SendForwards(uint32_t rank, Nanos now, std::vector<Outgoing>& out, bool due_only = false);
  void SendResent(uint32_t rank, Message m, std::vector<Outgoing>& out);
  // Appends `m` to the stream to backup `rank` (waited on by push_id and
  // `carried`; `more`: a transfer that goes on in the next position) and
  // sends it, stamped with the current epoch.
  void SendInStream(uint32_t rank, Message m, uint64_t push_id, std::vector<uint64_t> carried, bool more, Nanos now,
                    std::vector<Outgoing>& out);
  // Every push that waits on `f` is one forward closer to its Ack.
  void ForwardsDone(const Forward& f, const absl::Status& status, std::vector<Outgoing>& out);
  // A table created here after this server's backups were filled (a server
  // that joined the running job got its copies by state transfer, before the
  // table existed): every server backing up a shard this server leads gets
  // the table's config by a transfer of no shards, ahead of any forward of
  // its pushes, so that no forward finds the table missing there.
  void SendTablesToBackups(Nanos now, std::vector<Outgoing>& out);
  // Queues and sends a ShardTransfer of `vshards` to backup `rank`; the
  // pushes in `carried` wait for it too.
  void SendTransfer(uint32_t rank, const std::vector<uint32_t>& vshards, std::vector<uint64_t> carried, Nanos now,
                    std::vector<Outgoing>& out);
  // The de-duplication windows (and, in audit mode, audit rows) of `shards`,
  // added to `t`; and the reverse, for the shards `keep` accepts.
  void ExportShardState(const absl::flat_hash_set<uint32_t>& shards, proto::ShardTransfer* t) const;
  void ImportShardState(const proto::ShardTransfer& t, const std::function<bool(uint32_t)>& keep);
  // A backup's side: applies a transfer (validated first).
  absl::Status ApplyTransfer(const Message& m, uint32_t from);

  const ServerCoreOptions options_;
  ClockTable clocks_;
  HoldQueue held_;  // requests waiting for slower workers, arrival order
  // Invariant: empty whenever Step or Tick handles a request (they apply it first).
  std::vector<PendingPush> pending_;  // arrival order
  std::optional<ShardMapView> map_;
  uint32_t my_rank_ = 0;
  // Invariant: every table here has a config that passed ValidateTableConfig.
  TableMap tables_;
  PushDedup dedup_;                                         // sequenced pushes applied, per (shard, worker)
  BackupStreams streams_{options_.forward_resend};           // as a primary: per backup, forwards and timers
  ForwardInbox inbox_;  // as a backup: each primary's stream, in order
  PushAcks acks_;                                           // pushes' Acks, held for backups
  AuditLog audit_;  // audit mode: pushes applied per row, checkpoint restores
  uint64_t next_push_id_ = 1;
  std::vector<proto::ShardsInSync> in_sync_;  // acknowledged transfers, for TakeShardsInSync
  // Moves (common/keys.h, "Moving a shard"): moves out of this server, and
  // pull replies that wait for a move's destination.
  ShardMoves moves_;
  // Sends an answer, or (a pull of a moving shard with forwards not yet
  // acknowledged by the destination) holds it.
  void SendAnswer(std::vector<Outgoing>& out, std::string to, Message reply, bool pull);
  // Drops this server's rows, dedup windows and audit records of `shards`.
  void ForgetShards(const absl::flat_hash_set<uint32_t>& shards);
  // Held replies that read a shard `moved` says this server lost are
  // answered Aborted instead (the worker pulls again from the new primary).
  void AbortHeldReplies(const std::function<bool(uint32_t)>& moved, std::vector<Outgoing>& out);
  absl::flat_hash_map<uint32_t, uint64_t> applied_;  // vshard -> pushes applied to it (here or, before, elsewhere)
  // Load accounting: counts the keys of one request against their shards
  // (`shards`, one per key; those this server is primary of count);
  // `value_bytes` per key in, or out for a pull.
  void NoteTraffic(std::span<const uint32_t> shards, size_t value_bytes, bool push);
  std::vector<uint32_t> shard_scratch_;  // a pull's shards, per key
  ShardTrafficCounts traffic_;
  absl::flat_hash_map<uint32_t, compress::Codec> pull_codecs_;  // tables with pull_compression
  uint64_t pull_encodes_ = 0;                                   // tensor ids of encoded pull replies
  ServerStats stats_;
  std::string last_busy_peer_;
};

}  // namespace tessera

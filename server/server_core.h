#pragma once
// ServerCore: everything a server does with a request, as a pure state
// machine: Step(request) -> replies. No sockets, threads or clocks; the
// tessera-server binary is a thin shell that feeds it messages.
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
// - Consistency (../shared/DESIGN.md section 5): a Pull stamped clock c of a
//   table with staleness s is answered only once every live worker has
//   announced clock >= c - s (BSP: s = 0; ASP: never held), so it reflects
//   every push stamped <= c - s - 1. A ClockAdvance is acknowledged only once
//   the slowest live worker is within the strictest staleness of any table.
//   Held requests are answered, in arrival order, as soon as the clock table
//   allows, or with DeadlineExceeded naming the workers still behind after
//   their hold timeout (Tick). Workers that left (WorkersLeft) are not waited for.
// Thread safety: none; the shell serializes calls.
#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "common/buffer.h"
#include "common/keys.h"
#include "common/message.h"
#include "common/clock.h"
#include "compress/codec.h"
#include "server/clock_table.h"
#include "server/table.h"

namespace tessera {

struct ServerCoreOptions {
  uint32_t node_id = 0;                     // stamped on replies
  BufferPool* pool = nullptr;               // reply buffers (not owned; may be null)
  Nanos default_hold_timeout = 60 * kSeconds;  // for held requests that name none
  bool answer_early = false;                // TEST ONLY: never hold pulls or clock acks (negative control)
  bool apply_after_ack = false;             // leave accepted pushes to ApplyPending() (see the contract)
  // Pull replies with more value bytes than this go out in pieces of at most
  // this many bytes (0 = never split); see "Pull replies in pieces" below.
  size_t pull_reply_piece_bytes = 0;
};

// Pull replies in pieces. A reply whose values frame is larger than
// options.pull_reply_piece_bytes is sent as several messages to the same
// address, in order, each a zero-copy slice of the values:
//   piece 0:    the full PullReply header, frames [values[0, n0), descriptor]
//   piece k>0:  request_id, sender_id and epoch only (no body),
//               frames [values[o_k, o_k + n_k), descriptor]
// where descriptor is 16 bytes: the piece's byte offset and the total value
// bytes, as two little-endian uint64. Pieces are contiguous and in offset
// order. An unsplit reply has one frame and no descriptor. The receiver can
// place each piece while the next is still on the wire.
inline constexpr size_t kPullPieceDescriptorBytes = 16;

struct ServerStats {
  uint64_t held_requests = 0;  // pulls and clock advances that had to wait
  uint64_t push_requests = 0;
  uint64_t pull_requests = 0;
  uint64_t bad_requests = 0;
  uint64_t bytes_in = 0;   // data frame bytes received (keys + values or encoded parts), as on the wire
  uint64_t bytes_out = 0;  // data frame bytes sent (values or encoded parts), as on the wire
  uint64_t compressed_pushes = 0;  // pushes whose values arrived as encoded parts
};

class ServerCore {
 public:
  explicit ServerCore(ServerCoreOptions options) : options_(options) {}
  // Shorthand for tests.
  explicit ServerCore(uint32_t node_id, BufferPool* pool = nullptr)
      : ServerCore(ServerCoreOptions{.node_id = node_id, .pool = pool}) {}
  ServerCore(const ServerCore&) = delete;
  ServerCore& operator=(const ServerCore&) = delete;

  // Sets which virtual shards this server (by rank in the map) holds.
  absl::Status InstallShardMap(const proto::ShardMap& map, uint32_t my_rank);

  // The job's workers (node id -> rank), all at clock 0.
  void SetWorkers(const absl::flat_hash_map<uint32_t, uint32_t>& worker_rank_by_node);

  // Handles one request at time `now`; returns the replies to send (possibly
  // for earlier, held requests that this one released).
  std::vector<Outgoing> Step(Message request, Nanos now = 0);
  // Answers held requests whose hold timeout passed.
  std::vector<Outgoing> Tick(Nanos now);
  // Applies the pushes Step accepted but left pending (apply_after_ack), in
  // arrival order. Cheap when nothing is pending.
  void ApplyPending();
  size_t pending_pushes() const { return pending_.size(); }

  const ClockTable& clocks() const { return clocks_; }
  size_t held() const { return held_.size(); }

  const ServerStats& stats() const { return stats_; }
  size_t held_now() const { return held_.size(); }  // requests waiting for slower workers
  uint64_t rows() const;                             // rows over every table
  uint64_t min_clock() const { return clocks_.min_clock(); }
  size_t num_tables() const { return tables_.size(); }
  const Table* table(uint32_t id) const;

 private:
  absl::Status HandleCreateTable(const proto::CreateTable& req);
  // Validates a push and applies it, or only validates it when check_only.
  absl::Status HandlePush(const proto::Push& req, const Message& m, bool check_only);
  // A compressed push (value_parts > 0): replaces the parts by the decoded
  // fp32 values frame, so the rest handles it like any push.
  absl::Status DecodePushValues(const proto::Push& req, Message& m);
  absl::StatusOr<Buffer> HandlePull(const proto::Pull& req, const Message& m);
  // The min clock a request needs before it may be answered.
  absl::StatusOr<uint64_t> RequiredMinClock(const Message& m);
  // Builds the reply to an admitted request (never holds).
  Message Answer(Message request, Nanos held_for);
  void ReleaseHeld(Nanos now, std::vector<Outgoing>& out);
  uint64_t StrictestStaleness() const;
  absl::StatusOr<Table*> FindTable(uint32_t id);
  absl::StatusOr<std::span<const Key>> KeysFrame(const Message& m, uint64_t num_keys, uint32_t table_id);
  Message Reply(const Message& request) const;
  // Appends `reply` to `out`, split into pieces when it is a large pull reply.
  void Emit(std::vector<Outgoing>& out, std::string to, Message reply) const;

  // A validated push whose update is still to be made (apply_after_ack).
  struct PendingPush {
    Table* table;     // tables are never removed
    Message request;  // keeps the keys and values frames alive
  };

  struct Held {
    Message request;
    uint64_t required_min_clock;
    Nanos arrived;
    Nanos deadline;
  };

  const ServerCoreOptions options_;
  ClockTable clocks_;
  std::deque<Held> held_;  // arrival order
  // Invariant: empty whenever Step or Tick handles a request (they apply it first).
  std::vector<PendingPush> pending_;  // arrival order
  std::optional<ShardMapView> map_;
  uint32_t my_rank_ = 0;
  // Invariant: every table here has a config that passed ValidateTableConfig.
  absl::flat_hash_map<uint32_t, std::unique_ptr<Table>> tables_;
  absl::flat_hash_map<uint32_t, compress::Codec> pull_codecs_;  // tables with pull_compression
  uint64_t pull_encodes_ = 0;                                   // tensor ids of encoded pull replies
  ServerStats stats_;
};

}  // namespace tessera

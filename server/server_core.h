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
// Thread safety: none; the shell serializes calls.
#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "common/buffer.h"
#include "common/keys.h"
#include "common/message.h"
#include "server/table.h"

namespace tessera {

struct ServerStats {
  uint64_t push_requests = 0;
  uint64_t pull_requests = 0;
  uint64_t bad_requests = 0;
  uint64_t bytes_in = 0;   // data frame bytes received (keys + values)
  uint64_t bytes_out = 0;  // data frame bytes sent (values)
};

class ServerCore {
 public:
  // `pool` (optional, not owned, must outlive the core) provides reply buffers.
  explicit ServerCore(uint32_t node_id, BufferPool* pool = nullptr) : node_id_(node_id), pool_(pool) {}
  ServerCore(const ServerCore&) = delete;
  ServerCore& operator=(const ServerCore&) = delete;

  // Sets which virtual shards this server (by rank in the map) holds.
  absl::Status InstallShardMap(const proto::ShardMap& map, uint32_t my_rank);

  // Handles one request; returns the replies to send.
  std::vector<Outgoing> Step(Message request);

  const ServerStats& stats() const { return stats_; }
  size_t num_tables() const { return tables_.size(); }
  const Table* table(uint32_t id) const;

 private:
  absl::Status HandleCreateTable(const proto::CreateTable& req);
  absl::Status HandlePush(const proto::Push& req, const Message& m);
  absl::StatusOr<Buffer> HandlePull(const proto::Pull& req, const Message& m);
  absl::StatusOr<Table*> FindTable(uint32_t id);
  absl::StatusOr<std::span<const Key>> KeysFrame(const Message& m, uint64_t num_keys, uint32_t table_id);
  Message Reply(const Message& request) const;

  const uint32_t node_id_;
  BufferPool* const pool_;
  std::optional<ShardMapView> map_;
  uint32_t my_rank_ = 0;
  // Invariant: every table here has a config that passed ValidateTableConfig.
  absl::flat_hash_map<uint32_t, std::unique_ptr<Table>> tables_;
  ServerStats stats_;
};

}  // namespace tessera

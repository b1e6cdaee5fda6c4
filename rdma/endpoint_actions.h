#pragma once
// What EndpointCore (rdma_protocol.h) tells its shell to do, and what it
// counts.
//
// Owns: nothing; value types only (no .cc). ConnectionId names one
// connection of one core; ids are never reused by that core.
// Promises: the shell executes the Actions of each call in order (see
// "Shell obligations" in rdma_protocol.h). EndpointStats counters only grow.
// Called by: EndpointCore fills them; the shell (rdma_transport.cc) executes
// the actions and exports the stats as metrics; tests read both.
// Thread safety: value types.
#include <cstdint>
#include <string>
#include <variant>
#include <vector>

#include "absl/status/status.h"
#include "common/message.h"

namespace tessera::rdma {

using ConnectionId = uint64_t;

// --- Actions: what the shell must do, in order. ---
struct ConnectAction {  // start connecting to `address` (resolve, create the queue pair)
  ConnectionId connection;
  std::string address;
};
struct PostReceiveAction {  // post a receive of [address, address + length) with lkey
  ConnectionId connection;
  uint64_t wr_id;
  uint64_t address;
  uint32_t length;
  uint32_t lkey;
};
struct PostSendAction {  // post a signaled IBV_WR_SEND of [address, address + length)
  ConnectionId connection;
  uint64_t wr_id;
  uint64_t address;
  uint32_t length;
  uint32_t lkey;
};
struct PostWriteAction {  // post a signaled IBV_WR_RDMA_WRITE[_WITH_IMM]
  ConnectionId connection;
  uint64_t wr_id;
  uint64_t local_address;
  uint32_t length;
  uint32_t lkey;
  uint64_t remote_address;
  uint32_t rkey;
  bool with_immediate;
  uint32_t immediate;  // the rendezvous tag (host order; the shell converts)
};
struct DeliverAction {  // hand to the Transport handler
  ConnectionId connection;
  Message message;
};
struct DisconnectAction {  // tear the connection down; then OnConnectionLost
  ConnectionId connection;
  absl::Status reason;
  bool log = true;  // false: a refusal the core chose not to log (rate limit)
};
struct ProblemAction {  // something went wrong that the user should see in the log
  ConnectionId connection;
  absl::Status status;
};
using Action = std::variant<ConnectAction, PostReceiveAction, PostSendAction, PostWriteAction, DeliverAction,
                            DisconnectAction, ProblemAction>;
using Actions = std::vector<Action>;

struct EndpointStats {
  uint64_t messages_sent = 0;  // accepted by Send
  uint64_t messages_received = 0;  // delivered
  uint64_t bytes_sent = 0;         // envelope + frames
  uint64_t bytes_received = 0;
  uint64_t malformed_received = 0;
  uint64_t messages_dropped = 0;  // queued for a connection that was lost, or failed in rendezvous
  uint64_t eager_sends = 0;       // SENDs carrying a message
  uint64_t control_sends = 0;     // clear-to-send, cancel, refuse, hello
  uint64_t credit_updates_sent = 0;
  uint64_t rendezvous_started = 0;  // parts sent by rendezvous
  uint64_t rendezvous_zero_copy = 0;
  uint64_t rendezvous_staged = 0;
  uint64_t rendezvous_received = 0;  // parts that arrived by rendezvous
  uint64_t rendezvous_failed = 0;    // both directions
  uint64_t writes_posted = 0;
  uint64_t preposted_hits = 0;
  uint64_t preposted_mismatches = 0;
  uint64_t registration_waits = 0;  // receiver waited for room in the registration cache
  uint64_t unknown_tags = 0;
  uint64_t duplicate_clear_to_send = 0;
  uint64_t length_mismatches = 0;
  uint64_t protocol_violations = 0;  // credit overruns and the like
  uint64_t connections_lost = 0;
  uint64_t connections_authenticated = 0;  // peers that proved they hold the job key
  uint64_t auth_rejected = 0;  // connections refused: no proof, a bad proof, or a key mismatch
};

}  // namespace tessera::rdma

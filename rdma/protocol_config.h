#pragma once
// ProtocolConfig: the options of one EndpointCore (rdma_protocol.h) and the
// rules they must satisfy.
//
// Owns: nothing but the option values; ValidateProtocolConfig is a pure
// function of them and the pool size.
// Promises: a config that ValidateProtocolConfig accepts for a pool of
// `pool_bytes` bytes is one EndpointCore can run with (its constructor checks
// that again and CHECK-fails otherwise: a broken caller, not bad input). A
// refusal is InvalidArgument naming the field ("RDMA options: ..."); the
// secret key itself never appears in the message.
// Called by: EndpointCore::Validate and its constructor; the shell
// (rdma_transport.cc) builds one from the transport options.
// Thread safety: a value type; ValidateProtocolConfig is safe from any thread.
#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>
#include <string>

#include "absl/status/status.h"

namespace tessera::rdma {

struct ProtocolConfig {
  // This endpoint's transport address ("rdma://HOST:PORT"): stamped as
  // sender_address on every outgoing message and sent in the handshake.
  std::string local_address;
  // Size of one pool slot: the largest eager SEND and the staging chunk.
  size_t slot_bytes = 8192;
  // Receive window granted to each peer (receive slots = credits + 2).
  uint32_t credits = 64;
  // Frames at least this large never go inline; they go zero-copy by rendezvous.
  size_t rendezvous_threshold = 64 << 10;
  // See the timeouts under "Promises" in rdma_protocol.h. In the caller's ticks.
  uint64_t rendezvous_timeout_ticks = 10'000;
  // A connection not established this long after it was started is dropped.
  uint64_t connect_timeout_ticks = 10'000;
  // Largest number of data frames in one message, both ways.
  size_t max_data_frames = 64;
  // Largest message (envelope + frames), both ways; also bounds one write.
  size_t max_message_bytes = size_t{1} << 31;
  // Pool slots one staged rendezvous may have in flight.
  uint32_t max_staged_chunks_in_flight = 8;
  // Send work requests (SEND and WRITE) one connection may have posted and
  // not yet completed: the depth of its queue pair's send queue.
  uint32_t send_queue_depth = 256;
  // Private data bytes the connection manager carries in a connect request.
  size_t handshake_capacity = 56;
  // Pool slots never given to receive queues (so sends always make progress).
  uint32_t min_send_slots = 16;
  // Registration cache bound.
  size_t max_pinned_bytes = size_t{1} << 30;
  size_t page_bytes = 4096;
  // Idle destination blocks kept for reuse.
  size_t max_idle_destination_bytes = 256u << 20;
  // The job's secret key (Z85, 40 characters: the `secret` line of the job
  // key file, transport/job_keys.h). Set: every connection must pass the
  // challenge-response ("Authentication" in rdma_protocol.h) before anything
  // else crosses it. Empty: no authentication (see the rule there).
  std::string auth_secret_key;
  // Where authentication nonces come from; empty = libsodium's CSPRNG
  // (FillRandomBytes). Tests inject their own.
  std::function<void(std::span<std::byte>)> random_bytes;
};

// Validates `config` for a pool of `pool_bytes` bytes (InvalidArgument naming
// the field). EndpointCore::Validate is this function.
absl::Status ValidateProtocolConfig(const ProtocolConfig& config, size_t pool_bytes);

}  // namespace tessera::rdma

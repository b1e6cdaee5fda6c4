#pragma once
// Rendezvous in EndpointCore (rdma_protocol.h): the parts that do not go
// inline, both directions, and the destinations a receiver names in advance.
// EndpointCore members defined in endpoint_rendezvous.cc: ArrangeDestination,
// TryRegisterDestination, HandleClearToSend, HandleCancel, HandleRefuse,
// HandleImmediate, FailInbound, FailOutbound, PostDestination,
// CancelDestination (both); and LastChunkBytes.
//
// Owns: the rendezvous records (below), per connection by tag: `outbound` (we
// send: waiting for clear-to-send, then writing) and `inbound` (we receive:
// waiting for room to register, then for the data); and the core's posted
// destinations and receivers waiting for room to register.
// Promises (the rules under "What travels" and "Memory" in rdma_protocol.h):
// - A receiver's destination is, in this order, the one posted for (request
//   id, frame index) when it has exactly the part's length (else it stays
//   posted: preposted_mismatches), or a DestinationPool block.
// - Clear-to-send leaves only once the destination is registered. Without room
//   in the registration cache the receiver waits, in arrival order; any other
//   registration failure refuses the part and fails its message.
// - The sender writes from the user's buffer (zero copy) when the part has at
//   least rendezvous_threshold bytes and the cache registers it, else staged
//   through pool slots; the last write carries the tag as its immediate.
// - Leases: a source's is held until its final write completed or the
//   connection is lost; a destination's from clear-to-send until the data
//   arrived, the sender cancelled, or the connection was lost.
// - Failing a message refuses (receiver) or cancels (sender) its parts the peer
//   was not yet told to write; parts already cleared stay until their data or
//   the sender's cancel arrives (the peer may be writing).
// - Unknown tags, duplicate clear-to-send, length mismatches and refusals are
//   counted and reported as ProblemActions naming the peer.
// Thread safety: none; the caller of EndpointCore serializes every call.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <utility>

#include "common/buffer.h"
#include "rdma/rdma_protocol.h"
#include "rdma/rdma_wire.h"
#include "rdma/registration_cache.h"

namespace tessera::rdma {

struct EndpointCore::OutboundRendezvous {
  enum class State { kWaitClearToSend, kWriting };
  uint32_t tag = 0;
  uint64_t message_seq = 0;
  Buffer data;
  State state = State::kWaitClearToSend;
  uint64_t deadline = 0;
  ClearToSend cts;
  std::optional<RegistrationCache::Lease> lease;  // zero copy
  uint64_t next_offset = 0;                       // staged: next byte to post
  uint32_t writes_in_flight = 0;
  bool final_posted = false;
};

struct EndpointCore::InboundRendezvous {
  enum class State { kWaitRegistration, kWaitData };
  uint32_t tag = 0;
  uint64_t message_seq = 0;
  size_t part = 0;
  uint64_t length = 0;
  State state = State::kWaitRegistration;
  uint64_t deadline = 0;
  Buffer destination;  // exactly `length` bytes
  // Set while `destination` is one posted for (request id, frame index).
  std::optional<std::pair<uint64_t, uint32_t>> posted_key;
  const void* register_address = nullptr;
  size_t register_bytes = 0;
  std::shared_ptr<void> register_owner;
  std::optional<RegistrationCache::Lease> lease;
};

}  // namespace tessera::rdma

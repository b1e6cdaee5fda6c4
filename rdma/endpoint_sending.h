#pragma once
// The send path of EndpointCore (rdma_protocol.h): how what is queued on a
// connection leaves it. EndpointCore members defined in endpoint_sending.cc:
// Send, Pump, SendControl, SendWrites, SendMessage, SendCreditUpdate,
// WaitForSlot, ServeWaiters, OnSendCompleted.
//
// Owns: the records queued for sending (OutgoingMessage and ControlMessage,
// below, in a connection's `messages` and `control` queues), the order in
// which a connection's queues go out, and the core's slot waiters.
// Promises:
// - Send decides once, in order, which parts go inline (they fit in one slot
//   and are under rendezvous_threshold) and which by rendezvous.
// - On a connection, control goes first (a clear-to-send unblocks the peer),
//   then rendezvous writes (they complete earlier messages), then new
//   messages, each queue in order. Before the peer's proof only control goes.
// - A SEND or WRITE_WITH_IMM is posted only with a credit (credit updates
//   need none); a connection never has more than send_queue_depth send work
//   requests in flight, nor a staged rendezvous more than
//   max_staged_chunks_in_flight chunks.
// - Nothing blocks and nothing is dropped: without a credit the queue waits;
//   without a free pool slot the connection joins the slot waiters (once) and
//   is pumped again when a slot frees (ServeWaiters, which first serves the
//   receivers waiting for room to register, in arrival order).
// - A pool slot posted for sending is held by its work request until the
//   completion (OnSendCompleted) or the connection's loss releases it.
// Thread safety: none; the caller of EndpointCore serializes every call.
#include <cstdint>
#include <vector>

#include "common/buffer.h"
#include "rdma/connection_auth.h"
#include "rdma/rdma_protocol.h"
#include "rdma/rdma_wire.h"

namespace tessera::rdma {

struct EndpointCore::OutgoingMessage {
  uint64_t request_id = 0;
  std::vector<Buffer> parts;  // [envelope, frames...]
  std::vector<PartDescriptor> descriptors;  // tag != 0 marks a rendezvous part (real tags set at transmit)
};

struct EndpointCore::ControlMessage {
  WireType type = WireType::kClearToSend;
  ClearToSend cts;        // kClearToSend
  uint32_t tag = 0;       // kCancel / kRefuse
  AbortReason reason = AbortReason::kTimeout;
  AuthMac mac{};          // kAuthProof (kAuthChallenge carries the connection's nonce)
};

}  // namespace tessera::rdma

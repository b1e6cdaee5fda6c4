#pragma once
// The receive path of EndpointCore (rdma_protocol.h): what a receive
// completion does. EndpointCore members defined in endpoint_receiving.cc:
// OnReceiveCompleted, HandleSend, HandleMessage, Deliver.
//
// Owns: InboundMessage (below): a message announced by a SEND, waiting in its
// connection's `delivery` queue for its rendezvous parts; the dispatch of
// every SEND to the part that handles its type.
// Promises:
// - Every receive slot is reposted once its bytes were taken out, whatever
//   they held.
// - Admission: until the peer's proof verified, only hello, challenge, proof
//   and credit updates are accepted; anything else (a malformed SEND and a
//   write with immediate included) refuses the connection, and the SENDs of a
//   connection being refused are not looked at.
// - Credits: every regular SEND and WRITE_WITH_IMM counts against the window
//   granted to the peer, and the credits every header returns are taken; an
//   overrun is a protocol violation (a ProblemAction; before the proof, a
//   refusal).
// - Delivery: the messages of one connection are delivered in the order they
//   were announced; one waiting for a rendezvous part holds back later ones; a
//   failed one is dropped in its place. A header that does not parse or names
//   no sender is counted in malformed_received and not delivered.
// - A message over max_message_bytes fails at once and its rendezvous parts
//   are refused, so the peer never writes them.
// Thread safety: none; the caller of EndpointCore serializes every call.
#include <cstddef>
#include <cstdint>
#include <vector>

#include "common/buffer.h"
#include "rdma/rdma_protocol.h"

namespace tessera::rdma {

struct EndpointCore::InboundMessage {
  uint64_t seq = 0;
  std::vector<Buffer> parts;
  size_t pending = 0;  // rendezvous parts not yet arrived
  bool failed = false;
  uint64_t bytes = 0;
};

}  // namespace tessera::rdma

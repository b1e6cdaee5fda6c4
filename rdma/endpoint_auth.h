#pragma once
// Authentication in EndpointCore: the rule and the challenge-response under
// "Authentication" in rdma_protocol.h. EndpointCore members defined in
// endpoint_auth.cc: CheckPeerAuthFlag, WarnUnauthenticatedOnce, Transcript,
// HandleAuthChallenge, HandleAuthProof, MarkAuthenticated,
// RefuseAuthentication; and the functions below.
//
// Owns: the decisions on a connection's authentication fields (Connection's
// authenticated, auth_refused, local_nonce, peer_nonce) and the core's key
// and "authentication off" warning. The cryptography is connection_auth.h's;
// which SENDs are admitted before the proof is the receive path's
// (endpoint_receiving.h).
// Promises:
// - A connection becomes authenticated only when the peer's proof over this
//   connection's transcript (both nonces, both addresses, the prover's role)
//   verified under the job key.
// - Every refusal is counted in stats().auth_rejected and ends the connection
//   (a connect request rejected, or a DisconnectAction); it is logged only for
//   the 1st, 2nd, 4th, 8th, ... refusal of the core (LogRefusal), and not
//   reported again when the connection is lost.
// - Without a key, "authentication off" is said once per core, at its first
//   established connection.
// Thread safety: none for the members (the caller of EndpointCore serializes
// every call); the functions below are pure.
#include <cstdint>
#include <optional>
#include <string>

#include "rdma/connection_auth.h"

namespace tessera::rdma {

// Authentication refusals logged: the 1st, 2nd, 4th, 8th, ...
bool LogRefusal(uint64_t n);

// The connection key derived from the job's secret key; nullopt for an empty
// one. The secret must be one ProtocolConfig validation accepted.
std::optional<ConnectionAuthKey> AuthKeyFrom(const std::string& secret);

}  // namespace tessera::rdma

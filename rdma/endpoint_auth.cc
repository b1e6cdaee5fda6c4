#include "rdma/endpoint_auth.h"

#include <bit>
#include <string>

#include <sodium.h>

#include "absl/strings/str_cat.h"
#include "rdma/endpoint_connection.h"
#include "rdma/invariant.h"

namespace tessera::rdma {

bool LogRefusal(uint64_t n) { return std::bit_width(n) != std::bit_width(n - 1); }

std::optional<ConnectionAuthKey> AuthKeyFrom(const std::string& secret) {
  if (secret.empty()) return std::nullopt;
  absl::StatusOr<ConnectionAuthKey> key = DeriveConnectionAuthKey(secret);
  RDMA_CHECK(key.ok());  // Validate accepted the config
  return *key;
}

absl::Status EndpointCore::CheckPeerAuthFlag(bool peer_requires_auth) const {
  if (auth_key_ && !peer_requires_auth) {
    return absl::PermissionDeniedError(
        "it has no job key (authentication is off there) and this endpoint admits only holders of the job key");
  }
  if (!auth_key_ && peer_requires_auth) {
    return absl::PermissionDeniedError(
        "it admits only holders of the job key and this endpoint has none (authentication is off here)");
  }
  return absl::OkStatus();
}

void EndpointCore::WarnUnauthenticatedOnce(const Connection& c, Actions& out) {
  if (auth_key_ || warned_unauthenticated_) return;
  warned_unauthenticated_ = true;
  out.push_back(ProblemAction{
      c.id, absl::UnauthenticatedError(absl::StrCat(
                "authentication off: the RDMA connection with ", c.Name(),
                " and every later one are not authenticated; any process that can reach this endpoint can connect "
                "and read or write what it serves (no job key; docs/security.md)"))});
}

AuthTranscript EndpointCore::Transcript(const Connection& c, AuthRole prover) const {
  RDMA_CHECK(c.peer_nonce.has_value());
  AuthTranscript t;
  t.prover = prover;
  if (c.active) {
    t.initiator_nonce = c.local_nonce;
    t.acceptor_nonce = *c.peer_nonce;
    t.initiator_address = config_.local_address;
    t.acceptor_address = c.peer_address;
  } else {
    t.initiator_nonce = *c.peer_nonce;
    t.acceptor_nonce = c.local_nonce;
    t.initiator_address = c.peer_address;
    t.acceptor_address = config_.local_address;
  }
  return t;
}

void EndpointCore::HandleAuthChallenge(Connection& c, const WireFrame& frame, Actions& out) {
  if (!auth_key_ || c.authenticated) {
    ++stats_.protocol_violations;
    Problem(c, PeerError(c, absl::StatusCode::kFailedPrecondition, "unexpected authentication challenge (ignored)"),
            out);
    return;
  }
  if (c.peer_nonce) return RefuseAuthentication(c, "it sent a second authentication challenge", out);
  if (c.peer_address.empty()) {
    return RefuseAuthentication(c, "it sent its challenge before naming its address", out);
  }
  if (frame.auth_address != c.peer_address) {
    return RefuseAuthentication(
        c,
        absl::StrCat("its challenge names it ", Printable(frame.auth_address), ", not the address this connection ",
                     c.active ? "dialed" : "was opened from"),
        out);
  }
  if (sodium_memcmp(frame.auth_nonce.data(), c.local_nonce.data(), kAuthNonceBytes) == 0) {
    return RefuseAuthentication(c, "its challenge echoes this endpoint's nonce", out);
  }
  c.peer_nonce = frame.auth_nonce;
  ControlMessage proof{.type = WireType::kAuthProof};
  proof.mac = ComputeAuthProof(*auth_key_, Transcript(c, c.active ? AuthRole::kInitiator : AuthRole::kAcceptor));
  c.control.push_back(proof);  // after our challenge, queued when the connection was made
}

void EndpointCore::HandleAuthProof(Connection& c, const WireFrame& frame, Actions& out) {
  if (!auth_key_ || c.authenticated) {
    ++stats_.protocol_violations;
    Problem(c, PeerError(c, absl::StatusCode::kFailedPrecondition, "unexpected authentication proof (ignored)"), out);
    return;
  }
  if (!c.peer_nonce) return RefuseAuthentication(c, "it sent a proof before its challenge", out);
  const AuthRole peer_role = c.active ? AuthRole::kAcceptor : AuthRole::kInitiator;
  if (!VerifyAuthProof(*auth_key_, Transcript(c, peer_role), frame.auth_mac)) {
    return RefuseAuthentication(
        c, "its proof does not verify: it does not hold the job's key (or replayed a proof of another connection)",
        out);
  }
  MarkAuthenticated(c);
}

void EndpointCore::MarkAuthenticated(Connection& c) {
  c.authenticated = true;
  ++stats_.connections_authenticated;
  if (!c.active && c.state == Connection::State::kEstablished && !c.peer_address.empty() &&
      !by_address_.contains(c.peer_address)) {
    by_address_[c.peer_address] = c.id;  // replies to the peer reuse its connection
  }
  // The caller (OnReceiveCompleted) pumps: queued messages go now.
}

void EndpointCore::RefuseAuthentication(Connection& c, const std::string& what, Actions& out) {
  if (c.disconnecting) return;
  const uint64_t n = ++stats_.auth_rejected;
  c.auth_refused = true;
  c.disconnecting = true;
  out.push_back(DisconnectAction{
      c.id, PeerError(c, absl::StatusCode::kPermissionDenied, absl::StrCat("refused: ", what, " (", n, " refused so far)")),
      LogRefusal(n)});
}

}  // namespace tessera::rdma

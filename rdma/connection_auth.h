#pragma once
// Connection authentication for the RDMA transport: the pure pieces of the
// mutual challenge-response that EndpointCore (rdma_protocol.h) runs on every
// connection before anything else may cross it. No state, no I/O; the MAC and
// the key derivation are libsodium's.
//
// The exchange (the messages are in rdma_wire.h, the rules in rdma_protocol.h):
//   both sides, as the first SEND of the connection:
//     kAuthChallenge {fresh 32-byte nonce, the sender's own transport address}
//   each side, once it has the peer's challenge:
//     kAuthProof {HMAC-SHA-256(K, transcript with prover = its own role)}
// and each side verifies the peer's proof against the transcript with the
// peer's role before it accepts or sends anything else on that connection.
//
// K = the connection-authentication key: crypto_kdf_derive_from_key (BLAKE2b)
// of the job's 32-byte CURVE secret (the Z85 `secret` of the job key file,
// transport/job_keys.h) with context kAuthKdfContext and subkey id
// kAuthKdfSubkeyId. It is used for nothing else, and the raw secret never
// keys a MAC.
//
// Transcript (what a proof covers), byte by byte:
//   u32 label length, label kAuthTranscriptLabel,
//   u8  prover role ('I' initiator = the side that connected, 'A' acceptor),
//   32  initiator nonce, 32 acceptor nonce,
//   u32 length + the initiator's transport address,
//   u32 length + the acceptor's transport address
// (integers little-endian). Both nonces make a recorded proof worthless on
// any later connection; the role byte makes an acceptor's proof useless as an
// initiator's (no reflection); the addresses bind the proof to the two
// endpoints that each side names itself by; the label keeps the MAC apart
// from any other use of K.
//
// Thread safety: every function may be called from any thread.
#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "rdma/rdma_wire.h"

namespace tessera::rdma {

inline constexpr char kAuthTranscriptLabel[] = "tessera rdma connection proof v1";
inline constexpr char kAuthKdfContext[] = "RdmaAuth";  // crypto_kdf_CONTEXTBYTES (8) characters
inline constexpr uint64_t kAuthKdfSubkeyId = 1;

using AuthNonce = std::array<std::byte, kAuthNonceBytes>;
using AuthMac = std::array<std::byte, kAuthMacBytes>;

// The key every proof of a job is made with. Wiped when destroyed.
class ConnectionAuthKey {
 public:
  static constexpr size_t kBytes = 32;
  explicit ConnectionAuthKey(const std::array<unsigned char, kBytes>& bytes) : bytes_(bytes) {}
  ~ConnectionAuthKey();
  ConnectionAuthKey(const ConnectionAuthKey&) = default;
  ConnectionAuthKey& operator=(const ConnectionAuthKey&) = default;
  const std::array<unsigned char, kBytes>& bytes() const { return bytes_; }

 private:
  std::array<unsigned char, kBytes> bytes_;
};

// Decodes a 40-character Z85 key (ZeroMQ's encoding, RFC 32) into its 32
// bytes. InvalidArgument (naming the length or the position, never echoing
// the key) for anything else.
absl::StatusOr<std::array<unsigned char, 32>> DecodeZ85Key(std::string_view z85);

// K from the job's Z85 secret key (see above). InvalidArgument as DecodeZ85Key.
absl::StatusOr<ConnectionAuthKey> DeriveConnectionAuthKey(std::string_view z85_secret_key);

enum class AuthRole : uint8_t { kInitiator = 'I', kAcceptor = 'A' };

struct AuthTranscript {
  AuthRole prover = AuthRole::kInitiator;
  AuthNonce initiator_nonce{};
  AuthNonce acceptor_nonce{};
  std::string initiator_address;
  std::string acceptor_address;
};

// The bytes a proof covers (layout above).
std::vector<std::byte> EncodeAuthTranscript(const AuthTranscript& transcript);

AuthMac ComputeAuthProof(const ConnectionAuthKey& key, const AuthTranscript& transcript);

// Whether `proof` is the proof of `transcript` under `key`; compares in
// constant time. A proof of any other length is false.
bool VerifyAuthProof(const ConnectionAuthKey& key, const AuthTranscript& transcript,
                     std::span<const std::byte> proof);

// Fills `out` from libsodium's CSPRNG (the default nonce source).
void FillRandomBytes(std::span<std::byte> out);

}  // namespace tessera::rdma

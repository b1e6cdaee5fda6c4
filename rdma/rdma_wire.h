#pragma once
// The bytes the RDMA transport puts on the wire: one fixed little-endian
// header per SEND, the bodies of its message types, and the handshake carried
// in the connection request's private data. Pure functions, no state.
//
// Every SEND fills one receive slot of the peer and starts with a 32-byte header:
//
//   offset size field
//   0      4    magic "TSR1" (0x31525354)
//   4      1    version (1)
//   5      1    type (WireType)
//   6      2    flags (0 in version 1; anything else is rejected)
//   8      2    credits returned to the peer (piggybacked credit update)
//   10     2    part count (kMessage), else 0
//   12     4    rendezvous tag (kClearToSend, kCancel, kRefuse), else 0
//   16     8    request id (kMessage: the Envelope's request_id, the key a
//               receiver matches pre-posted destinations against), else 0
//   24     4    body bytes (everything after the header; must be exact)
//   28     4    reserved (0)
//
// Bodies:
//   kMessage       part table (part count x 16 bytes: u64 length, u32 tag,
//                  u32 reserved 0), then the inline parts' bytes back to back
//                  in part order. Part 0 is the serialized proto::Envelope,
//                  parts 1..n are the message's data frames. A part with tag 0
//                  is inline; a part with a non-zero tag travels by rendezvous
//                  (this message is its RTS {tag, length}).
//   kCreditUpdate  empty (the header's credits field is the point).
//   kClearToSend   u64 remote address, u64 length, u32 rkey, u32 reserved 0.
//   kCancel        u32 reason, u32 reserved 0: the data sender will not write
//                  the tag (sent only for tags it has not started writing).
//   kRefuse        u32 reason, u32 reserved 0: the data receiver will not take
//                  the tag; the sender must not write it.
//   kHello         the sender's transport address (when it did not fit in the
//                  handshake); only as the first message of a connection.
//   kAuthChallenge 32-byte nonce, then the sender's own transport address
//                  (at least one byte): the first message of each side of an
//                  authenticated connection (after the initiator's hello).
//   kAuthProof     32-byte MAC (HMAC-SHA-256) over the transcript of
//                  rdma/connection_auth.h: each side's second message.
//
// Errors: Parse* never crash on any input; they return InvalidArgument
// naming what is wrong. Encode* require an output span large enough (they
// abort on it: the caller sized it with the matching *Bytes function).
#include <cstddef>
#include <array>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace tessera::rdma {

inline constexpr uint32_t kWireMagic = 0x31525354;  // "TSR1" little-endian
inline constexpr uint8_t kWireVersion = 1;
inline constexpr size_t kWireHeaderBytes = 32;
inline constexpr size_t kPartDescriptorBytes = 16;
inline constexpr size_t kClearToSendBodyBytes = 24;
inline constexpr size_t kAbortBodyBytes = 8;
inline constexpr size_t kAuthNonceBytes = 32;
inline constexpr size_t kAuthMacBytes = 32;
// Envelope + 64 data frames (the ZeroMQ transport's default frame limit).
inline constexpr size_t kMaxParts = 65;

enum class WireType : uint8_t {
  kMessage = 1,
  kCreditUpdate = 2,
  kClearToSend = 3,
  kCancel = 4,
  kRefuse = 5,
  kHello = 6,
  kAuthChallenge = 7,
  kAuthProof = 8,
};

// Why a rendezvous was cancelled or refused (kCancel / kRefuse body).
enum class AbortReason : uint32_t {
  kTimeout = 1,             // the side that sent it waited too long
  kMessageFailed = 2,       // another part of the same message failed
  kTooLarge = 3,            // the receiver cannot register that many bytes at all
  kRegistrationFailed = 4,  // the receiver's memory registration failed
  kMalformed = 5,           // the message carrying the RTS was malformed
  kDuplicateTag = 6,        // the tag is already pending on this connection
  kLengthMismatch = 7,      // clear-to-send length differs from the RTS length
};
const char* AbortReasonName(uint32_t reason);

// One part of a message on the wire. tag 0 = inline.
struct PartDescriptor {
  uint64_t length = 0;
  uint32_t tag = 0;
};

struct ClearToSend {
  uint32_t tag = 0;
  uint64_t remote_address = 0;
  uint64_t length = 0;
  uint32_t rkey = 0;
};

// A parsed SEND. Spans point into the parsed bytes.
struct WireFrame {
  WireType type = WireType::kMessage;
  uint16_t credits = 0;
  uint32_t tag = 0;
  uint64_t request_id = 0;
  // kMessage
  std::vector<PartDescriptor> parts;
  std::vector<std::span<const std::byte>> inline_parts;  // per part; empty span for remote parts
  // kClearToSend
  ClearToSend clear_to_send;
  // kCancel / kRefuse
  uint32_t reason = 0;
  // kHello
  std::string hello_address;
  // kAuthChallenge: auth_nonce, auth_address; kAuthProof: auth_mac
  std::array<std::byte, kAuthNonceBytes> auth_nonce{};
  std::string auth_address;
  std::array<std::byte, kAuthMacBytes> auth_mac{};
};

// Parses one received SEND. `max_parts` caps the part table (at most kMaxParts).
absl::StatusOr<WireFrame> ParseWire(std::span<const std::byte> bytes, size_t max_parts = kMaxParts);

// Bytes a kMessage with these parts takes (header + table + inline bytes).
size_t MessageWireBytes(std::span<const PartDescriptor> parts);
// Writes a kMessage. inline_data[i] must hold parts[i].length bytes for inline
// parts (tag 0) and is ignored for remote ones. Returns the bytes written.
size_t EncodeMessage(std::span<std::byte> out, uint16_t credits, uint64_t request_id,
                     std::span<const PartDescriptor> parts,
                     std::span<const std::span<const std::byte>> inline_data);
size_t EncodeCreditUpdate(std::span<std::byte> out, uint16_t credits);
size_t EncodeClearToSend(std::span<std::byte> out, uint16_t credits, const ClearToSend& cts);
// type must be kCancel or kRefuse.
size_t EncodeAbort(std::span<std::byte> out, WireType type, uint16_t credits, uint32_t tag, AbortReason reason);
size_t HelloWireBytes(const std::string& address);
size_t EncodeHello(std::span<std::byte> out, uint16_t credits, const std::string& address);
size_t AuthChallengeWireBytes(const std::string& address);
// `address` must not be empty.
size_t EncodeAuthChallenge(std::span<std::byte> out, uint16_t credits,
                           std::span<const std::byte, kAuthNonceBytes> nonce, const std::string& address);
inline constexpr size_t kAuthProofWireBytes = kWireHeaderBytes + kAuthMacBytes;
size_t EncodeAuthProof(std::span<std::byte> out, uint16_t credits, std::span<const std::byte, kAuthMacBytes> mac);

// The connection handshake, carried in rdma_cm's private data both ways
// (connect request and accept reply):
//   u32 magic "TSH1", u16 version, u16 flags, u32 credits (receive window the
//   sender of the handshake granted), u32 slot bytes (its receive slot size,
//   also the chunk size of its staged rendezvous writes), u16 address length,
//   then the address bytes when they fit (else flag kAddressInHello and the
//   address follows in a kHello message). Flag kAuthRequired: the sender
//   holds a job key and will accept nothing on the connection before the
//   peer has proved it holds the same key (kAuthChallenge / kAuthProof). The
//   flag is not authenticated: it only lets a mismatch be refused at set-up;
//   what an endpoint requires follows from its own configuration.
inline constexpr uint32_t kHandshakeMagic = 0x31485354;  // "TSH1"
inline constexpr size_t kHandshakeFixedBytes = 18;
inline constexpr uint16_t kHandshakeAddressInHello = 1;
inline constexpr uint16_t kHandshakeAuthRequired = 2;

struct Handshake {
  uint32_t credits = 0;
  uint32_t slot_bytes = 0;
  std::string address;            // may be empty (the accepting side need not name itself)
  bool address_in_hello = false;  // set by Encode when the address did not fit
  bool auth_required = false;     // flag kHandshakeAuthRequired
};

// Encodes into at most `capacity` bytes (at least kHandshakeFixedBytes);
// when the address does not fit it is left out and the flag is set.
std::vector<std::byte> EncodeHandshake(const Handshake& handshake, size_t capacity);
absl::StatusOr<Handshake> ParseHandshake(std::span<const std::byte> bytes);

// "rdma://HOST:PORT" (or "tcp://HOST:PORT" when allow_tcp) split into its
// parts. HOST may be a name, an IPv4 literal or a bracketed IPv6 literal;
// PORT is 0..65535 (0 only when allow_port_zero).
struct HostPort {
  std::string host;  // without brackets
  uint16_t port = 0;
};
absl::StatusOr<HostPort> ParseRdmaAddress(const std::string& address, bool allow_tcp, bool allow_port_zero);
// "rdma://HOST:PORT", bracketing an IPv6 host.
std::string FormatRdmaAddress(const std::string& host, uint16_t port);

}  // namespace tessera::rdma

#include "rdma/rdma_wire.h"

#include <charconv>
#include <cstring>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "rdma/invariant.h"

namespace tessera::rdma {
namespace {

void Put16(std::byte* p, uint16_t v) {
  for (int i = 0; i < 2; ++i) p[i] = static_cast<std::byte>(v >> (8 * i));
}
void Put32(std::byte* p, uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = static_cast<std::byte>(v >> (8 * i));
}
void Put64(std::byte* p, uint64_t v) {
  for (int i = 0; i < 8; ++i) p[i] = static_cast<std::byte>(v >> (8 * i));
}
uint16_t Get16(const std::byte* p) {
  return static_cast<uint16_t>(static_cast<uint16_t>(p[0]) | static_cast<uint16_t>(p[1]) << 8);
}
uint32_t Get32(const std::byte* p) {
  uint32_t v = 0;
  for (int i = 3; i >= 0; --i) v = v << 8 | static_cast<uint32_t>(p[i]);
  return v;
}
uint64_t Get64(const std::byte* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = v << 8 | static_cast<uint64_t>(p[i]);
  return v;
}

void PutHeader(std::byte* p, WireType type, uint16_t credits, uint16_t part_count, uint32_t tag,
               uint64_t request_id, uint32_t body_bytes) {
  Put32(p, kWireMagic);
  p[4] = static_cast<std::byte>(kWireVersion);
  p[5] = static_cast<std::byte>(type);
  Put16(p + 6, 0);
  Put16(p + 8, credits);
  Put16(p + 10, part_count);
  Put32(p + 12, tag);
  Put64(p + 16, request_id);
  Put32(p + 24, body_bytes);
  Put32(p + 28, 0);
}

absl::Status Malformed(absl::string_view what) { return absl::InvalidArgumentError(absl::StrCat("malformed RDMA message: ", what)); }

}  // namespace

const char* AbortReasonName(uint32_t reason) {
  switch (static_cast<AbortReason>(reason)) {
    case AbortReason::kTimeout: return "timeout";
    case AbortReason::kMessageFailed: return "another part of the message failed";
    case AbortReason::kTooLarge: return "too large to register";
    case AbortReason::kRegistrationFailed: return "memory registration failed";
    case AbortReason::kMalformed: return "malformed message";
    case AbortReason::kDuplicateTag: return "duplicate tag";
    case AbortReason::kLengthMismatch: return "length mismatch";
  }
  return "unknown reason";
}

absl::StatusOr<WireFrame> ParseWire(std::span<const std::byte> bytes, size_t max_parts) {
  if (bytes.size() < kWireHeaderBytes) {
    return Malformed(absl::StrCat(bytes.size(), " bytes, shorter than the ", kWireHeaderBytes, "-byte header"));
  }
  const std::byte* p = bytes.data();
  if (Get32(p) != kWireMagic) return Malformed("bad magic");
  if (static_cast<uint8_t>(p[4]) != kWireVersion) {
    return Malformed(absl::StrCat("version ", static_cast<int>(p[4]), ", expected ", static_cast<int>(kWireVersion)));
  }
  const uint8_t raw_type = static_cast<uint8_t>(p[5]);
  if (raw_type < static_cast<uint8_t>(WireType::kMessage) || raw_type > static_cast<uint8_t>(WireType::kAuthProof)) {
    return Malformed(absl::StrCat("unknown type ", static_cast<int>(raw_type)));
  }
  if (Get16(p + 6) != 0) return Malformed("unknown flags");
  if (Get32(p + 28) != 0) return Malformed("reserved header bytes are not zero");
  WireFrame frame;
  frame.type = static_cast<WireType>(raw_type);
  frame.credits = Get16(p + 8);
  const uint16_t part_count = Get16(p + 10);
  frame.tag = Get32(p + 12);
  frame.request_id = Get64(p + 16);
  const uint32_t body_bytes = Get32(p + 24);
  const std::span<const std::byte> body = bytes.subspan(kWireHeaderBytes);
  if (body.size() != body_bytes) {
    return Malformed(absl::StrCat("header announces ", body_bytes, " body bytes, ", body.size(), " arrived"));
  }
  if (frame.type != WireType::kMessage && (part_count != 0 || frame.request_id != 0)) {
    return Malformed("part count or request id on a control message");
  }
  const bool tagged = frame.type == WireType::kClearToSend || frame.type == WireType::kCancel ||
                      frame.type == WireType::kRefuse;
  if (tagged != (frame.tag != 0)) return Malformed(tagged ? "rendezvous tag 0" : "tag on an untagged message");

  switch (frame.type) {
    case WireType::kMessage: {
      if (part_count == 0) return Malformed("message without parts (no envelope)");
      if (part_count > max_parts) return Malformed(absl::StrCat(part_count, " parts; the limit is ", max_parts));
      const size_t table_bytes = size_t{part_count} * kPartDescriptorBytes;
      if (body.size() < table_bytes) return Malformed("part table truncated");
      frame.parts.resize(part_count);
      frame.inline_parts.resize(part_count);
      uint64_t inline_total = 0;
      for (size_t i = 0; i < part_count; ++i) {
        const std::byte* d = body.data() + i * kPartDescriptorBytes;
        frame.parts[i].length = Get64(d);
        frame.parts[i].tag = Get32(d + 8);
        if (Get32(d + 12) != 0) return Malformed("reserved part bytes are not zero");
        if (frame.parts[i].tag == 0) {
          if (frame.parts[i].length > body.size()) return Malformed(absl::StrCat("inline part ", i, " too long"));
          inline_total += frame.parts[i].length;
        } else if (frame.parts[i].length == 0) {
          return Malformed(absl::StrCat("empty part ", i, " sent by rendezvous"));
        }
        for (size_t j = 0; j < i && frame.parts[i].tag != 0; ++j) {
          if (frame.parts[j].tag == frame.parts[i].tag) return Malformed(absl::StrCat("tag repeated in part ", i));
        }
      }
      if (inline_total != body.size() - table_bytes) {
        return Malformed(absl::StrCat("inline parts total ", inline_total, " bytes, body holds ",
                                      body.size() - table_bytes));
      }
      size_t offset = table_bytes;
      for (size_t i = 0; i < part_count; ++i) {
        if (frame.parts[i].tag != 0) continue;
        frame.inline_parts[i] = body.subspan(offset, frame.parts[i].length);
        offset += frame.parts[i].length;
      }
      break;
    }
    case WireType::kCreditUpdate:
      if (!body.empty()) return Malformed("credit update with a body");
      break;
    case WireType::kClearToSend:
      if (body.size() != kClearToSendBodyBytes) return Malformed("clear-to-send body size");
      frame.clear_to_send.tag = frame.tag;
      frame.clear_to_send.remote_address = Get64(body.data());
      frame.clear_to_send.length = Get64(body.data() + 8);
      frame.clear_to_send.rkey = Get32(body.data() + 16);
      if (Get32(body.data() + 20) != 0) return Malformed("reserved clear-to-send bytes are not zero");
      if (frame.clear_to_send.length == 0) return Malformed("clear-to-send for 0 bytes");
      break;
    case WireType::kCancel:
    case WireType::kRefuse:
      if (body.size() != kAbortBodyBytes) return Malformed("cancel/refuse body size");
      frame.reason = Get32(body.data());
      if (Get32(body.data() + 4) != 0) return Malformed("reserved cancel/refuse bytes are not zero");
      break;
    case WireType::kHello:
      if (body.empty()) return Malformed("hello without an address");
      frame.hello_address.assign(reinterpret_cast<const char*>(body.data()), body.size());
      break;
    case WireType::kAuthChallenge:
      if (body.size() <= kAuthNonceBytes) return Malformed("authentication challenge without nonce and address");
      std::memcpy(frame.auth_nonce.data(), body.data(), kAuthNonceBytes);
      frame.auth_address.assign(reinterpret_cast<const char*>(body.data() + kAuthNonceBytes),
                                body.size() - kAuthNonceBytes);
      break;
    case WireType::kAuthProof:
      if (body.size() != kAuthMacBytes) {
        return Malformed(absl::StrCat("authentication proof of ", body.size(), " bytes, expected ", kAuthMacBytes));
      }
      std::memcpy(frame.auth_mac.data(), body.data(), kAuthMacBytes);
      break;
  }
  return frame;
}

size_t MessageWireBytes(std::span<const PartDescriptor> parts) {
  size_t n = kWireHeaderBytes + parts.size() * kPartDescriptorBytes;
  for (const PartDescriptor& part : parts) {
    if (part.tag == 0) n += part.length;
  }
  return n;
}

size_t EncodeMessage(std::span<std::byte> out, uint16_t credits, uint64_t request_id,
                     std::span<const PartDescriptor> parts,
                     std::span<const std::span<const std::byte>> inline_data) {
  const size_t total = MessageWireBytes(parts);
  RDMA_CHECK(out.size() >= total);
  RDMA_CHECK(!parts.empty() && parts.size() <= kMaxParts);
  RDMA_CHECK(parts.size() == inline_data.size());
  std::byte* p = out.data();
  PutHeader(p, WireType::kMessage, credits, static_cast<uint16_t>(parts.size()), 0, request_id,
            static_cast<uint32_t>(total - kWireHeaderBytes));
  std::byte* table = p + kWireHeaderBytes;
  std::byte* data = table + parts.size() * kPartDescriptorBytes;
  for (size_t i = 0; i < parts.size(); ++i) {
    std::byte* d = table + i * kPartDescriptorBytes;
    Put64(d, parts[i].length);
    Put32(d + 8, parts[i].tag);
    Put32(d + 12, 0);
    if (parts[i].tag != 0) continue;
    RDMA_CHECK(inline_data[i].size() == parts[i].length);
    if (parts[i].length > 0) std::memcpy(data, inline_data[i].data(), parts[i].length);
    data += parts[i].length;
  }
  return total;
}

size_t EncodeCreditUpdate(std::span<std::byte> out, uint16_t credits) {
  RDMA_CHECK(out.size() >= kWireHeaderBytes);
  PutHeader(out.data(), WireType::kCreditUpdate, credits, 0, 0, 0, 0);
  return kWireHeaderBytes;
}

size_t EncodeClearToSend(std::span<std::byte> out, uint16_t credits, const ClearToSend& cts) {
  RDMA_CHECK(out.size() >= kWireHeaderBytes + kClearToSendBodyBytes);
  RDMA_CHECK(cts.tag != 0u);
  std::byte* p = out.data();
  PutHeader(p, WireType::kClearToSend, credits, 0, cts.tag, 0, kClearToSendBodyBytes);
  Put64(p + kWireHeaderBytes, cts.remote_address);
  Put64(p + kWireHeaderBytes + 8, cts.length);
  Put32(p + kWireHeaderBytes + 16, cts.rkey);
  Put32(p + kWireHeaderBytes + 20, 0);
  return kWireHeaderBytes + kClearToSendBodyBytes;
}

size_t EncodeAbort(std::span<std::byte> out, WireType type, uint16_t credits, uint32_t tag, AbortReason reason) {
  RDMA_CHECK(type == WireType::kCancel || type == WireType::kRefuse);
  RDMA_CHECK(out.size() >= kWireHeaderBytes + kAbortBodyBytes);
  RDMA_CHECK(tag != 0u);
  std::byte* p = out.data();
  PutHeader(p, type, credits, 0, tag, 0, kAbortBodyBytes);
  Put32(p + kWireHeaderBytes, static_cast<uint32_t>(reason));
  Put32(p + kWireHeaderBytes + 4, 0);
  return kWireHeaderBytes + kAbortBodyBytes;
}

size_t HelloWireBytes(const std::string& address) { return kWireHeaderBytes + address.size(); }

size_t EncodeHello(std::span<std::byte> out, uint16_t credits, const std::string& address) {
  RDMA_CHECK(!address.empty());
  RDMA_CHECK(out.size() >= HelloWireBytes(address));
  PutHeader(out.data(), WireType::kHello, credits, 0, 0, 0, static_cast<uint32_t>(address.size()));
  std::memcpy(out.data() + kWireHeaderBytes, address.data(), address.size());
  return HelloWireBytes(address);
}

size_t AuthChallengeWireBytes(const std::string& address) {
  return kWireHeaderBytes + kAuthNonceBytes + address.size();
}

size_t EncodeAuthChallenge(std::span<std::byte> out, uint16_t credits,
                           std::span<const std::byte, kAuthNonceBytes> nonce, const std::string& address) {
  RDMA_CHECK(!address.empty());
  const size_t total = AuthChallengeWireBytes(address);
  RDMA_CHECK(out.size() >= total);
  PutHeader(out.data(), WireType::kAuthChallenge, credits, 0, 0, 0, static_cast<uint32_t>(total - kWireHeaderBytes));
  std::memcpy(out.data() + kWireHeaderBytes, nonce.data(), kAuthNonceBytes);
  std::memcpy(out.data() + kWireHeaderBytes + kAuthNonceBytes, address.data(), address.size());
  return total;
}

size_t EncodeAuthProof(std::span<std::byte> out, uint16_t credits, std::span<const std::byte, kAuthMacBytes> mac) {
  RDMA_CHECK(out.size() >= kAuthProofWireBytes);
  PutHeader(out.data(), WireType::kAuthProof, credits, 0, 0, 0, kAuthMacBytes);
  std::memcpy(out.data() + kWireHeaderBytes, mac.data(), kAuthMacBytes);
  return kAuthProofWireBytes;
}

std::vector<std::byte> EncodeHandshake(const Handshake& handshake, size_t capacity) {
  RDMA_CHECK(capacity >= kHandshakeFixedBytes);
  const bool fits = handshake.address.size() <= capacity - kHandshakeFixedBytes && handshake.address.size() <= 0xffff;
  const size_t address_bytes = fits ? handshake.address.size() : 0;
  std::vector<std::byte> out(kHandshakeFixedBytes + address_bytes);
  std::byte* p = out.data();
  Put32(p, kHandshakeMagic);
  Put16(p + 4, kWireVersion);
  Put16(p + 6, static_cast<uint16_t>((fits ? 0 : kHandshakeAddressInHello) |
                                     (handshake.auth_required ? kHandshakeAuthRequired : 0)));
  Put32(p + 8, handshake.credits);
  Put32(p + 12, handshake.slot_bytes);
  Put16(p + 16, static_cast<uint16_t>(address_bytes));
  if (address_bytes > 0) std::memcpy(p + kHandshakeFixedBytes, handshake.address.data(), address_bytes);
  return out;
}

absl::StatusOr<Handshake> ParseHandshake(std::span<const std::byte> bytes) {
  auto bad = [](absl::string_view what) {
    return absl::InvalidArgumentError(absl::StrCat("malformed RDMA handshake: ", what));
  };
  if (bytes.size() < kHandshakeFixedBytes) return bad(absl::StrCat(bytes.size(), " bytes"));
  const std::byte* p = bytes.data();
  if (Get32(p) != kHandshakeMagic) return bad("bad magic (not a Tessera peer)");
  if (Get16(p + 4) != kWireVersion) return bad(absl::StrCat("version ", Get16(p + 4)));
  const uint16_t flags = Get16(p + 6);
  if ((flags & ~(kHandshakeAddressInHello | kHandshakeAuthRequired)) != 0) return bad("unknown flags");
  Handshake h;
  h.address_in_hello = (flags & kHandshakeAddressInHello) != 0;
  h.auth_required = (flags & kHandshakeAuthRequired) != 0;
  h.credits = Get32(p + 8);
  h.slot_bytes = Get32(p + 12);
  const uint16_t address_bytes = Get16(p + 16);
  // rdma_cm pads private data with zeros: anything after the address is ignored.
  if (bytes.size() < kHandshakeFixedBytes + address_bytes) return bad("address truncated");
  if (h.address_in_hello && address_bytes != 0) return bad("address both inline and in hello");
  h.address.assign(reinterpret_cast<const char*>(p + kHandshakeFixedBytes), address_bytes);
  if (h.credits == 0 || h.credits > 0x4000) return bad(absl::StrCat("credits ", h.credits));
  if (h.slot_bytes < 1024 || h.slot_bytes > (1u << 24)) return bad(absl::StrCat("slot bytes ", h.slot_bytes));
  return h;
}

absl::StatusOr<HostPort> ParseRdmaAddress(const std::string& address, bool allow_tcp, bool allow_port_zero) {
  absl::string_view rest(address);
  if (absl::StartsWith(rest, "rdma://")) {
    rest.remove_prefix(7);
  } else if (allow_tcp && absl::StartsWith(rest, "tcp://")) {
    rest.remove_prefix(6);
  } else {
    return absl::InvalidArgumentError(absl::StrCat("'", address, "' is not an rdma://HOST:PORT address",
                                                   allow_tcp ? " (or tcp://HOST:PORT)" : ""));
  }
  HostPort out;
  absl::string_view port_text;
  if (absl::StartsWith(rest, "[")) {
    const size_t close = rest.find(']');
    if (close == absl::string_view::npos || close + 1 >= rest.size() || rest[close + 1] != ':') {
      return absl::InvalidArgumentError(absl::StrCat("'", address, "': bad bracketed host"));
    }
    out.host = std::string(rest.substr(1, close - 1));
    port_text = rest.substr(close + 2);
  } else {
    const size_t colon = rest.rfind(':');
    if (colon == absl::string_view::npos) {
      return absl::InvalidArgumentError(absl::StrCat("'", address, "' has no :PORT"));
    }
    out.host = std::string(rest.substr(0, colon));
    if (out.host.find(':') != std::string::npos) {
      return absl::InvalidArgumentError(absl::StrCat("'", address, "': bracket an IPv6 host"));
    }
    port_text = rest.substr(colon + 1);
  }
  if (out.host.empty()) return absl::InvalidArgumentError(absl::StrCat("'", address, "' has no host"));
  unsigned port = 0;
  const auto [end, ec] = std::from_chars(port_text.data(), port_text.data() + port_text.size(), port);
  if (port_text.empty() || ec != std::errc() || end != port_text.data() + port_text.size() || port > 65535) {
    return absl::InvalidArgumentError(absl::StrCat("'", address, "' has a bad port"));
  }
  if (port == 0 && !allow_port_zero) return absl::InvalidArgumentError(absl::StrCat("'", address, "' has port 0"));
  out.port = static_cast<uint16_t>(port);
  return out;
}

std::string FormatRdmaAddress(const std::string& host, uint16_t port) {
  if (host.find(':') != std::string::npos) return absl::StrCat("rdma://[", host, "]:", port);
  return absl::StrCat("rdma://", host, ":", port);
}

}  // namespace tessera::rdma

#include "rdma/protocol_config.h"

#include <array>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "rdma/connection_auth.h"
#include "rdma/credit_window.h"
#include "rdma/rdma_wire.h"

namespace tessera::rdma {

absl::Status ValidateProtocolConfig(const ProtocolConfig& config, size_t pool_bytes) {
  auto bad = [](absl::string_view what) { return absl::InvalidArgumentError(absl::StrCat("RDMA options: ", what)); };
  if (config.slot_bytes < 1024 || config.slot_bytes > (1u << 24)) return bad("slot_bytes must be in [1 KiB, 16 MiB]");
  if (config.slot_bytes < kWireHeaderBytes + kMaxParts * kPartDescriptorBytes + 64) {
    return bad("slot_bytes too small for a full part table");
  }
  if (config.credits < 1 || config.credits > CreditWindow::kMaxWindow) {
    return bad(absl::StrCat("credits must be in [1, ", CreditWindow::kMaxWindow, "]"));
  }
  if (config.rendezvous_threshold < 1) return bad("rendezvous_threshold must be positive");
  if (config.max_data_frames + 1 > kMaxParts) return bad(absl::StrCat("max_data_frames above ", kMaxParts - 1));
  if (config.max_message_bytes < 1 || config.max_message_bytes > (size_t{1} << 31)) {
    return bad("max_message_bytes must be in [1, 2 GiB]");
  }
  if (config.max_staged_chunks_in_flight < 1) return bad("max_staged_chunks_in_flight must be positive");
  if (config.send_queue_depth < 1) return bad("send_queue_depth must be positive");
  if (config.handshake_capacity < kHandshakeFixedBytes) return bad("handshake_capacity too small");
  if (config.rendezvous_timeout_ticks < 1 || config.connect_timeout_ticks < 1) return bad("timeouts must be positive");
  if (config.page_bytes == 0 || (config.page_bytes & (config.page_bytes - 1)) != 0) {
    return bad("page_bytes must be a power of two");
  }
  const size_t slots = pool_bytes / config.slot_bytes;
  const size_t one_connection = size_t{config.credits} + CreditWindow::kReservedSlots;
  if (slots < one_connection + config.min_send_slots) {
    return bad(absl::StrCat("pool of ", pool_bytes, " bytes holds ", slots, " slots of ", config.slot_bytes,
                            " bytes; one connection needs ", one_connection, " receive slots plus ",
                            config.min_send_slots, " for sending"));
  }
  if (config.local_address.empty()) return bad("local_address is empty");
  if (AuthChallengeWireBytes(config.local_address) > config.slot_bytes) {
    return bad("local_address too long for one slot");
  }
  if (!config.auth_secret_key.empty()) {
    if (absl::StatusOr<std::array<unsigned char, 32>> key = DecodeZ85Key(config.auth_secret_key); !key.ok()) {
      return bad(absl::StrCat("auth_secret_key (the job's secret key): ", key.status().message()));
    }
  }
  return absl::OkStatus();
}

}  // namespace tessera::rdma

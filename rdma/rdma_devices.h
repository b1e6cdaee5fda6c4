#pragma once
// What this machine offers for RDMA, read through libibverbs and librdmacm.
// Shared by rdma::Usable() and the doctor probe. Every function is cheap,
// leaves nothing open behind it, and is safe to call from any thread.
//
// Without libibverbs at build time, ListRdmaDevices returns Unavailable
// ("built without libibverbs") and RdmaCmAvailable the same.
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace tessera::rdma {

struct RdmaPortInfo {
  uint32_t port = 0;
  std::string state;       // "ACTIVE", "DOWN", "INIT", "ARMED", "ACTIVE_DEFER", "NOP" or "UNKNOWN(n)"
  std::string link_layer;  // "InfiniBand", "Ethernet" or "Unspecified"
  uint32_t active_mtu = 0; // bytes (256 .. 4096), 0 when unknown
};

struct RdmaDeviceInfo {
  std::string name;
  std::vector<RdmaPortInfo> ports;
  std::string error;  // set when the device could not be opened or queried
};

// True when the library was built against libibverbs and librdmacm.
bool BuiltWithVerbs();

// The devices and their ports. Unavailable with a one-line reason when the
// device list cannot be read, e.g. "no RDMA device (ibv_get_device_list:
// Function not implemented)"; an empty list is OK (and an empty vector).
absl::StatusOr<std::vector<RdmaDeviceInfo>> ListRdmaDevices();

// OK when rdma_cm can make an event channel; else Unavailable with the reason.
absl::Status RdmaCmAvailable();

// Registers `bytes` bytes of fresh memory with the first device's protection
// domain and deregisters it again (the probe's "test_registration").
absl::Status TestRegistration(size_t bytes);

}  // namespace tessera::rdma

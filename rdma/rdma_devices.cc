#include "rdma/rdma_devices.h"

#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "absl/strings/str_cat.h"

#if defined(TESSERA_RDMA_HAVE_VERBS)
#include <infiniband/verbs.h>
#include <rdma/rdma_cma.h>
#endif

namespace tessera::rdma {

#if !defined(TESSERA_RDMA_HAVE_VERBS)

bool BuiltWithVerbs() { return false; }
absl::StatusOr<std::vector<RdmaDeviceInfo>> ListRdmaDevices() {
  return absl::UnavailableError("built without libibverbs");
}
absl::Status RdmaCmAvailable() { return absl::UnavailableError("built without libibverbs"); }
absl::Status TestRegistration(size_t) { return absl::UnavailableError("built without libibverbs"); }

#else

namespace {

std::string PortState(int state) {
  switch (state) {
    case IBV_PORT_NOP: return "NOP";
    case IBV_PORT_DOWN: return "DOWN";
    case IBV_PORT_INIT: return "INIT";
    case IBV_PORT_ARMED: return "ARMED";
    case IBV_PORT_ACTIVE: return "ACTIVE";
    case IBV_PORT_ACTIVE_DEFER: return "ACTIVE_DEFER";
    default: return absl::StrCat("UNKNOWN(", state, ")");
  }
}

std::string LinkLayer(int layer) {
  switch (layer) {
    case IBV_LINK_LAYER_INFINIBAND: return "InfiniBand";
    case IBV_LINK_LAYER_ETHERNET: return "Ethernet";
    default: return "Unspecified";
  }
}

uint32_t MtuBytes(int mtu) {
  switch (mtu) {
    case IBV_MTU_256: return 256;
    case IBV_MTU_512: return 512;
    case IBV_MTU_1024: return 1024;
    case IBV_MTU_2048: return 2048;
    case IBV_MTU_4096: return 4096;
    default: return 0;
  }
}

// ibv_get_device_list, with the reason when it fails or finds nothing.
absl::StatusOr<std::pair<ibv_device**, int>> DeviceList() {
  int count = 0;
  errno = 0;
  ibv_device** list = ibv_get_device_list(&count);
  if (list == nullptr) {
    const int err = errno;
    return absl::UnavailableError(
        absl::StrCat("no RDMA device (ibv_get_device_list: ", err != 0 ? std::strerror(err) : "failed", ")"));
  }
  return std::make_pair(list, count);
}

}  // namespace

bool BuiltWithVerbs() { return true; }

absl::StatusOr<std::vector<RdmaDeviceInfo>> ListRdmaDevices() {
  absl::StatusOr<std::pair<ibv_device**, int>> list = DeviceList();
  if (!list.ok()) return list.status();
  std::vector<RdmaDeviceInfo> out;
  for (int i = 0; i < list->second; ++i) {
    ibv_device* device = list->first[i];
    RdmaDeviceInfo info;
    info.name = ibv_get_device_name(device);
    ibv_context* ctx = ibv_open_device(device);
    if (ctx == nullptr) {
      info.error = absl::StrCat("ibv_open_device: ", std::strerror(errno));
      out.push_back(std::move(info));
      continue;
    }
    ibv_device_attr attr{};
    if (ibv_query_device(ctx, &attr) != 0) {
      info.error = absl::StrCat("ibv_query_device: ", std::strerror(errno));
    } else {
      for (uint32_t p = 1; p <= attr.phys_port_cnt; ++p) {
        ibv_port_attr port{};
        RdmaPortInfo pi;
        pi.port = p;
        if (ibv_query_port(ctx, static_cast<uint8_t>(p), &port) != 0) {
          pi.state = "UNKNOWN";
          pi.link_layer = "Unspecified";
        } else {
          pi.state = PortState(port.state);
          pi.link_layer = LinkLayer(port.link_layer);
          pi.active_mtu = MtuBytes(port.active_mtu);
        }
        info.ports.push_back(std::move(pi));
      }
    }
    ibv_close_device(ctx);
    out.push_back(std::move(info));
  }
  ibv_free_device_list(list->first);
  return out;
}

absl::Status RdmaCmAvailable() {
  errno = 0;
  rdma_event_channel* channel = rdma_create_event_channel();
  if (channel == nullptr) {
    const int err = errno;
    return absl::UnavailableError(absl::StrCat("rdma_cm unavailable (rdma_create_event_channel: ",
                                               err != 0 ? std::strerror(err) : "failed", ")"));
  }
  rdma_destroy_event_channel(channel);
  return absl::OkStatus();
}

absl::Status TestRegistration(size_t bytes) {
  absl::StatusOr<std::pair<ibv_device**, int>> list = DeviceList();
  if (!list.ok()) return absl::UnavailableError("no device");
  if (list->second == 0) {
    ibv_free_device_list(list->first);
    return absl::UnavailableError("no device");
  }
  absl::Status result = absl::OkStatus();
  ibv_context* ctx = ibv_open_device(list->first[0]);
  ibv_free_device_list(list->first);
  if (ctx == nullptr) return absl::UnavailableError(absl::StrCat("ibv_open_device: ", std::strerror(errno)));
  ibv_pd* pd = ibv_alloc_pd(ctx);
  if (pd == nullptr) {
    result = absl::UnavailableError(absl::StrCat("ibv_alloc_pd: ", std::strerror(errno)));
  } else {
    const size_t rounded = (bytes + 4095) / 4096 * 4096;
    void* memory = rounded > 0 ? std::aligned_alloc(4096, rounded) : nullptr;
    if (memory == nullptr) {
      result = absl::ResourceExhaustedError(absl::StrCat("cannot allocate ", bytes, " bytes"));
    } else {
      ibv_mr* mr = ibv_reg_mr(pd, memory, bytes, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
      if (mr == nullptr) {
        const int err = errno;
        result = absl::ResourceExhaustedError(
            absl::StrCat("ibv_reg_mr of ", bytes, " bytes: ", std::strerror(err),
                         err == ENOMEM ? " (is the locked-memory limit, ulimit -l, high enough?)" : ""));
      } else {
        ibv_dereg_mr(mr);
      }
      std::free(memory);
    }
    ibv_dealloc_pd(pd);
  }
  ibv_close_device(ctx);
  return result;
}

#endif

}  // namespace tessera::rdma

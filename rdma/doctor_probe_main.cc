// tessera-doctor-probe: reports what this machine offers Tessera's fast paths,
// as ONE JSON object on ONE line of stdout, and exits 0 even when nothing is
// usable (failures are data here, not errors).
//
//   tessera-doctor-probe [--pool-bytes N] [--listen HOST] [--listen-seconds S] [--help]
//
// Keys (always present unless noted; strings are empty when not applicable):
//   host                      gethostname()
//   rdma.usable, rdma.reason  rdma::Usable() (reason "" when usable)
//   rdma.devices[]            name, ports[] {port, state, link_layer, active_mtu},
//                             and "error" when the device could not be queried
//   rdma.test_registration    {ok, bytes, error}: ibv_reg_mr of --pool-bytes
//                             (default 64 MiB) on the first device, then deregistered
//   gpudirect                 {available, reason}: a peer-memory kernel module
//                             (nvidia_peermem or nv_peer_mem) and an RDMA device
//   memlock                   {soft, hard, unlimited}: RLIMIT_MEMLOCK in bytes,
//                             -1 for infinity; unlimited = the soft limit is infinite
//   cuda                      {available, devices[] {index, name, memory_bytes}, error}:
//                             the driver API through dlopen("libcuda.so.1")
//   listen (only with --listen HOST) {host, port[, error]}: a TCP listener on
//                             HOST, port 0 (ephemeral). After the line is printed and
//                             flushed, the probe accepts connections for
//                             --listen-seconds (default 10) and writes
//                             "tessera-doctor-probe\n" to each, then exits.
// Exit status: 0, or 2 for a bad command line (usage on stderr).
#include <dlfcn.h>
#include <netdb.h>
#include <poll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include "rdma/doctor_probe_json.h"
#include "rdma/rdma_devices.h"
#include "rdma/rdma_transport.h"

namespace tessera::rdma {
namespace {

constexpr char kBanner[] = "tessera-doctor-probe\n";
constexpr char kUsage[] =
    "usage: tessera-doctor-probe [--pool-bytes N] [--listen HOST] [--listen-seconds S] [--help]\n"
    "Prints one JSON line describing RDMA devices, GPUDirect, the locked-memory limit and CUDA devices.\n"
    "  --pool-bytes N       bytes to test-register on the first RDMA device (default 67108864)\n"
    "  --listen HOST        also listen on HOST (TCP, ephemeral port), report the port, and answer\n"
    "                       each connection with \"tessera-doctor-probe\\n\"\n"
    "  --listen-seconds S   how long to keep listening (default 10)\n";

struct Flags {
  uint64_t pool_bytes = 64ull << 20;
  std::optional<std::string> listen_host;
  double listen_seconds = 10;
};

bool ParseNumber(const std::string& text, double& out) {
  char* end = nullptr;
  errno = 0;
  out = std::strtod(text.c_str(), &end);
  return !text.empty() && errno == 0 && end == text.c_str() + text.size() && out >= 0;
}

// Returns the flags, or nullopt after printing why (exit code in `code`).
std::optional<Flags> ParseFlags(int argc, char** argv, int& code) {
  Flags f;
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    std::string value;
    bool has_value = false;
    if (const size_t eq = arg.find('='); arg.rfind("--", 0) == 0 && eq != std::string::npos) {
      value = arg.substr(eq + 1);
      arg = arg.substr(0, eq);
      has_value = true;
    }
    if (arg == "--help" || arg == "-h") {
      std::fputs(kUsage, stdout);
      code = 0;
      return std::nullopt;
    }
    const bool known = arg == "--pool-bytes" || arg == "--listen" || arg == "--listen-seconds";
    if (known && !has_value) {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "tessera-doctor-probe: %s needs a value\n%s", arg.c_str(), kUsage);
        code = 2;
        return std::nullopt;
      }
      value = argv[++i];
    }
    double number = 0;
    if (arg == "--pool-bytes" && ParseNumber(value, number) && number >= 1) {
      f.pool_bytes = static_cast<uint64_t>(number);
    } else if (arg == "--listen" && !value.empty()) {
      f.listen_host = value;
    } else if (arg == "--listen-seconds" && ParseNumber(value, number)) {
      f.listen_seconds = number;
    } else {
      std::fprintf(stderr, "tessera-doctor-probe: bad argument '%s'\n%s", argv[i], kUsage);
      code = 2;
      return std::nullopt;
    }
  }
  return f;
}

std::string Hostname() {
  char name[256] = {};
  if (gethostname(name, sizeof(name) - 1) != 0) return "";
  return name;
}

void WriteRdma(JsonLine& j, uint64_t pool_bytes, bool& any_device) {
  const absl::Status usable = Usable();
  absl::StatusOr<std::vector<RdmaDeviceInfo>> devices = ListRdmaDevices();
  any_device = devices.ok() && !devices->empty();
  j.BeginObject("rdma");
  j.Bool("usable", usable.ok());
  j.String("reason", usable.ok() ? "" : std::string(usable.message()));
  j.BeginArray("devices");
  if (devices.ok()) {
    for (const RdmaDeviceInfo& d : *devices) {
      j.BeginObject().String("name", d.name).BeginArray("ports");
      for (const RdmaPortInfo& p : d.ports) {
        j.BeginObject()
            .Uint("port", p.port)
            .String("state", p.state)
            .String("link_layer", p.link_layer)
            .Uint("active_mtu", p.active_mtu)
            .EndObject();
      }
      j.EndArray();
      if (!d.error.empty()) j.String("error", d.error);
      j.EndObject();
    }
  }
  j.EndArray();
  const absl::Status reg = any_device ? TestRegistration(pool_bytes) : absl::UnavailableError("no device");
  j.BeginObject("test_registration")
      .Bool("ok", reg.ok())
      .Uint("bytes", pool_bytes)
      .String("error", reg.ok() ? "" : std::string(reg.message()))
      .EndObject();
  j.EndObject();
}

void WriteGpuDirect(JsonLine& j, bool any_rdma_device) {
  struct stat st {};
  std::string module;
  for (const char* m : {"nvidia_peermem", "nv_peer_mem"}) {
    if (stat((std::string("/sys/module/") + m).c_str(), &st) == 0) {
      module = m;
      break;
    }
  }
  std::string reason;
  if (module.empty()) {
    reason = "no nvidia_peermem or nv_peer_mem kernel module";
  } else if (!any_rdma_device) {
    reason = module + " is loaded but there is no RDMA device";
  } else {
    reason = module + " is loaded and an RDMA device exists";
  }
  j.BeginObject("gpudirect").Bool("available", !module.empty() && any_rdma_device).String("reason", reason).EndObject();
}

void WriteMemlock(JsonLine& j) {
  rlimit limit{};
  j.BeginObject("memlock");
  if (getrlimit(RLIMIT_MEMLOCK, &limit) != 0) {
    j.Int("soft", 0).Int("hard", 0).Bool("unlimited", false).String("error", std::strerror(errno));
  } else {
    auto value = [](rlim_t v) { return v == RLIM_INFINITY ? int64_t{-1} : static_cast<int64_t>(v); };
    j.Int("soft", value(limit.rlim_cur)).Int("hard", value(limit.rlim_max)).Bool("unlimited", limit.rlim_cur == RLIM_INFINITY);
  }
  j.EndObject();
}

// The CUDA driver API, resolved at run time: no build dependency on CUDA.
void WriteCuda(JsonLine& j) {
  using InitFn = int (*)(unsigned);
  using CountFn = int (*)(int*);
  using GetFn = int (*)(int*, int);
  using NameFn = int (*)(char*, int, int);
  using MemFn = int (*)(size_t*, int);
  using ErrorNameFn = int (*)(int, const char**);
  struct Device {
    int index;
    std::string name;
    uint64_t memory_bytes;
  };
  std::vector<Device> devices;
  std::string error;
  void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (lib == nullptr) {
    error = "libcuda.so.1 not found";
  } else {
    auto init = reinterpret_cast<InitFn>(dlsym(lib, "cuInit"));
    auto count_fn = reinterpret_cast<CountFn>(dlsym(lib, "cuDeviceGetCount"));
    auto get = reinterpret_cast<GetFn>(dlsym(lib, "cuDeviceGet"));
    auto name_fn = reinterpret_cast<NameFn>(dlsym(lib, "cuDeviceGetName"));
    auto mem = reinterpret_cast<MemFn>(dlsym(lib, "cuDeviceTotalMem_v2"));
    auto error_name = reinterpret_cast<ErrorNameFn>(dlsym(lib, "cuGetErrorName"));
    auto describe = [&](const char* call, int rc) {
      const char* text = nullptr;
      if (error_name != nullptr) error_name(rc, &text);
      return std::string(call) + " failed: " + (text != nullptr ? text : "CUDA error") + " (" + std::to_string(rc) + ")";
    };
    if (init == nullptr || count_fn == nullptr || get == nullptr || name_fn == nullptr || mem == nullptr) {
      error = "libcuda.so.1 lacks the driver API entry points";
    } else if (int rc = init(0); rc != 0) {
      error = describe("cuInit", rc);
    } else {
      int count = 0;
      if (int rc2 = count_fn(&count); rc2 != 0) {
        error = describe("cuDeviceGetCount", rc2);
        count = 0;
      }
      for (int i = 0; i < count; ++i) {
        int dev = 0;
        char name[256] = {};
        size_t bytes = 0;
        if (get(&dev, i) != 0) continue;
        if (name_fn(name, sizeof(name) - 1, dev) != 0) std::snprintf(name, sizeof(name), "device %d", i);
        if (mem(&bytes, dev) != 0) bytes = 0;
        devices.push_back(Device{i, name, bytes});
      }
      if (count == 0 && error.empty()) error = "no CUDA device";
    }
    dlclose(lib);
  }
  j.BeginObject("cuda").Bool("available", !devices.empty()).BeginArray("devices");
  for (const Device& d : devices) {
    j.BeginObject().Int("index", d.index).String("name", d.name).Uint("memory_bytes", d.memory_bytes).EndObject();
  }
  j.EndArray().String("error", error).EndObject();
}

// Binds a TCP listener on host, port 0. Returns the socket (or -1 with `error`).
int Listen(const std::string& host, uint16_t& port, std::string& error) {
  addrinfo hints{};
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  if (int rc = getaddrinfo(host.c_str(), "0", &hints, &found); rc != 0) {
    error = std::string("cannot resolve ") + host + ": " + gai_strerror(rc);
    return -1;
  }
  int fd = -1;
  for (addrinfo* a = found; a != nullptr && fd < 0; a = a->ai_next) {
    fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) continue;
    if (bind(fd, a->ai_addr, a->ai_addrlen) != 0 || listen(fd, 16) != 0) {
      error = std::string("cannot listen on ") + host + ": " + std::strerror(errno);
      close(fd);
      fd = -1;
    }
  }
  freeaddrinfo(found);
  if (fd < 0) return -1;
  sockaddr_storage addr{};
  socklen_t len = sizeof(addr);
  getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  port = ntohs(addr.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6*>(&addr)->sin6_port
                                          : reinterpret_cast<sockaddr_in*>(&addr)->sin_port);
  error.clear();
  return fd;
}

void Serve(int fd, double seconds) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  for (;;) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) break;
    pollfd p{fd, POLLIN, 0};
    const int ready = poll(&p, 1, static_cast<int>(left.count()));
    if (ready < 0 && errno != EINTR) break;
    if (ready <= 0) continue;
    const int client = accept(fd, nullptr, nullptr);
    if (client < 0) continue;
    (void)!write(client, kBanner, sizeof(kBanner) - 1);
    close(client);
  }
}

int Main(int argc, char** argv) {
  int code = 0;
  std::optional<Flags> flags = ParseFlags(argc, argv, code);
  if (!flags) return code;

  JsonLine j;
  j.BeginObject().String("host", Hostname());
  bool any_rdma_device = false;
  WriteRdma(j, flags->pool_bytes, any_rdma_device);
  WriteGpuDirect(j, any_rdma_device);
  WriteMemlock(j);
  WriteCuda(j);
  int listener = -1;
  if (flags->listen_host) {
    uint16_t port = 0;
    std::string error;
    listener = Listen(*flags->listen_host, port, error);
    j.BeginObject("listen").String("host", *flags->listen_host).Uint("port", port);
    if (listener < 0) j.String("error", error);
    j.EndObject();
  }
  j.EndObject();
  std::fputs(j.text().c_str(), stdout);
  std::fputc('\n', stdout);
  std::fflush(stdout);
  if (listener >= 0) {
    Serve(listener, flags->listen_seconds);
    close(listener);
  }
  return 0;
}

}  // namespace
}  // namespace tessera::rdma

int main(int argc, char** argv) { return tessera::rdma::Main(argc, argv); }

#include "transport/transport_factory.h"

#include <unistd.h>

#include <atomic>
#include <cstdlib>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "transport/coalescing_transport.h"
#include "transport/fault_transport.h"
#include "transport/job_keys.h"
#include "transport/shm_ring.h"
#include "transport/shm_transport.h"
#include "rdma/rdma_transport.h"

namespace tessera {

absl::StatusOr<std::unique_ptr<Transport>> MakeTransport(const std::string& bind) {
  ZmqTransport::Options options;
  options.bind = bind;
  return MakeTransport(std::move(options));
}

namespace {

// The value of environment variable `name`, or nullptr when unset or empty.
const char* Env(const char* name) {
  const char* v = std::getenv(name);
  return v != nullptr && *v != '\0' ? v : nullptr;
}

absl::Status EnvFlag(const char* name, bool* out) {
  const char* v = Env(name);
  if (v == nullptr) return absl::OkStatus();
  const std::string s = v;
  if (s == "1" || s == "true") {
    *out = true;
  } else if (s == "0" || s == "false") {
    *out = false;
  } else {
    return absl::InvalidArgumentError(absl::StrCat(name, "=", s, ": expected 1 or 0"));
  }
  return absl::OkStatus();
}

template <typename T>
absl::Status EnvCount(const char* name, T* out) {
  const char* v = Env(name);
  if (v == nullptr) return absl::OkStatus();
  uint64_t n = 0;
  if (!absl::SimpleAtoi(v, &n) || n == 0) {
    return absl::InvalidArgumentError(absl::StrCat(name, "=", v, ": expected a positive integer"));
  }
  *out = static_cast<T>(n);
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<TransportChoice> TransportChoiceFromEnvironment() {
  TransportChoice c;
  if (const char* kind = Env(kTransportEnvironmentVariable)) {
    const std::string k = kind;
    if (k == "zmq") {
      c.kind = TransportChoice::Kind::kZmq;
    } else if (k == "rdma") {
      c.kind = TransportChoice::Kind::kRdma;
    } else if (k == "auto") {
      c.kind = TransportChoice::Kind::kAuto;
    } else {
      return absl::InvalidArgumentError(
          absl::StrCat(kTransportEnvironmentVariable, "=", k, ": expected zmq, rdma or auto"));
    }
  }
  for (absl::Status s : {EnvFlag("TESSERA_RDMA_REQUIRED", &c.rdma_required),
                         EnvCount("TESSERA_RDMA_POOL_BYTES", &c.rdma_pool_bytes),
                         EnvCount("TESSERA_RDMA_MAX_PINNED_BYTES", &c.rdma_max_pinned_bytes),
                         EnvFlag("TESSERA_SHM", &c.shm),
                         EnvCount("TESSERA_SHM_MIN_FRAME_BYTES", &c.shm_options.min_frame_bytes),
                         EnvCount("TESSERA_SHM_RING_BYTES", &c.shm_options.ring_bytes),
                         EnvFlag("TESSERA_SHM_CROSS_MEMORY", &c.shm_options.cross_memory),
                         EnvCount("TESSERA_SHM_MIN_LEND_BYTES", &c.shm_options.min_lend_bytes),
                         EnvFlag("TESSERA_COALESCE", &c.coalesce.enabled),
                         EnvCount("TESSERA_COALESCE_MAX_MESSAGE_BYTES", &c.coalesce.max_message_bytes),
                         EnvCount("TESSERA_COALESCE_MAX_BATCH_BYTES", &c.coalesce.max_batch_bytes)}) {
    if (!s.ok()) return s;
  }
  uint64_t delay_us = static_cast<uint64_t>(c.coalesce.max_delay.count());
  if (absl::Status s = EnvCount("TESSERA_COALESCE_MAX_DELAY_US", &delay_us); !s.ok()) return s;
  if (delay_us > 60'000'000) {
    return absl::InvalidArgumentError(
        absl::StrCat("TESSERA_COALESCE_MAX_DELAY_US=", delay_us, ": at most 60000000 (a minute)"));
  }
  c.coalesce.max_delay = std::chrono::microseconds(delay_us);
  if (c.coalesce.max_message_bytes > c.coalesce.max_batch_bytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "TESSERA_COALESCE_MAX_MESSAGE_BYTES=", c.coalesce.max_message_bytes,
        " is more than TESSERA_COALESCE_MAX_BATCH_BYTES=", c.coalesce.max_batch_bytes, " (a batch holds at least one)"));
  }
  if (const char* host_id = Env("TESSERA_HOST_ID")) c.host_id = host_id;
  if (c.shm) {
    if (absl::Status s = ShmTransport::Validate(c.shm_options); !s.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("TESSERA_SHM_MIN_FRAME_BYTES=", c.shm_options.min_frame_bytes,
                       ", TESSERA_SHM_RING_BYTES=", c.shm_options.ring_bytes, ": ", s.message()));
    }
  }
  return c;
}

absl::StatusOr<std::unique_ptr<Transport>> MakeTransport(ZmqTransport::Options options) {
  auto choice = TransportChoiceFromEnvironment();
  if (!choice.ok()) return choice.status();
  return MakeTransport(std::move(options), *choice);
}

absl::StatusOr<std::unique_ptr<Transport>> MakeTransport(ZmqTransport::Options options,
                                                         const TransportChoice& choice) {
  const std::string& bind = options.bind;
  const bool tcp = absl::StartsWith(bind, "tcp://") && bind.size() > 6;
  const bool ipc = absl::StartsWith(bind, "ipc://") && bind.size() > 6;
  if (!tcp && !ipc) {
    return absl::InvalidArgumentError(absl::StrCat(
        "unsupported transport endpoint '", bind,
        "': accepted schemes are tcp:// (e.g. tcp://127.0.0.1:0) and ipc:// (e.g. ipc:///tmp/node.sock)"));
  }
  static std::atomic<bool> told{false};  // one line per process about authentication
  if (options.curve_public_key.empty()) {
    const char* key_file = std::getenv(kJobKeysEnvironmentVariable);
    if (key_file != nullptr && *key_file != '\0') {
      auto keys = ReadJobKeys(key_file);
      if (!keys.ok()) {
        return absl::Status(keys.status().code(),
                            absl::StrCat(kJobKeysEnvironmentVariable, ": ", keys.status().message()));
      }
      options.curve_public_key = keys->public_key;
      options.curve_secret_key = keys->secret_key;
      if (!told.exchange(true)) TLOG_INFO("authentication on: only holders of the job key in {} get in", key_file);
    } else if (tcp && !told.exchange(true)) {
      TLOG_WARN("authentication off: any process that can reach this node's port can join the job and read or "
                "write its parameters ({} not set; docs/security.md)",
                kJobKeysEnvironmentVariable);
    }
  }
  std::unique_ptr<Transport> transport;
  static std::atomic<bool> told_rdma{false};  // one line per process about the fallback
  if (choice.kind != TransportChoice::Kind::kZmq) {
    const absl::Status usable = rdma::Usable();
    if (usable.ok() && tcp) {
      rdma::Options ro;
      ro.bind = bind;
      ro.pool_bytes = choice.rdma_pool_bytes;
      ro.max_pinned_bytes = choice.rdma_max_pinned_bytes;
      // The job's key (from TESSERA_JOB_KEYS or the options): RDMA peers must
      // prove they hold it at connection set-up (rdma/rdma_protocol.h).
      ro.auth_secret_key = options.curve_secret_key;
      auto made = rdma::MakeRdmaTransport(std::move(ro));
      if (!made.ok()) return made.status();
      transport = std::move(*made);
      if (!told_rdma.exchange(true)) TLOG_INFO("transport: RDMA verbs");
    } else {
      const std::string reason = usable.ok() ? std::string("RDMA needs a tcp:// host and port to listen on")
                                             : std::string(usable.message());
      if (choice.rdma_required) {
        return absl::FailedPreconditionError(absl::StrCat(
            "RDMA is required (TESSERA_RDMA_REQUIRED=1; rdma.required in the job config) but unusable: ", reason));
      }
      if (!told_rdma.exchange(true)) {
        TLOG_WARN("RDMA unavailable ({}); falling back to ZeroMQ over {}", reason, tcp ? "tcp" : "ipc");
      }
    }
  }
  if (transport == nullptr) transport.reset(new ZmqTransport(std::move(options)));
  if (choice.shm) {
    ShmTransport::Options so = choice.shm_options;
    if (so.host_identity == 0) so.host_identity = shm::HostIdentity(choice.host_id);
    if (so.host_identity != 0) transport.reset(new ShmTransport(std::move(transport), so));
  }
  // Every process unpacks batches; whether it holds messages is its choice
  // (coalesce.enabled): the wrapper is made either way.
  transport.reset(new CoalescingTransport(std::move(transport), choice.coalesce));
  const char* faults = std::getenv(kFaultsEnvironmentVariable);
  if (faults == nullptr) return transport;
  auto wrapped = WrapWithFaults(std::move(transport), faults);
  if (!wrapped.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(kFaultsEnvironmentVariable, ": ", wrapped.status().message()));
  }
  return wrapped;
}

absl::StatusOr<std::unique_ptr<Transport>> WrapWithFaults(std::unique_ptr<Transport> inner,
                                                          const std::string& spec) {
  if (inner == nullptr) return absl::InvalidArgumentError("WrapWithFaults: no transport to wrap");
  if (absl::StripAsciiWhitespace(spec).empty()) return inner;
  absl::StatusOr<FaultSpec> parsed = FaultSpec::Parse(spec);
  if (!parsed.ok()) return parsed.status();
  TLOG_INFO("fault injection on: {}", parsed->ToString());
  return std::unique_ptr<Transport>(new FaultTransport(std::move(inner), std::move(*parsed)));
}

std::string DefaultBind(const std::string& scheme, const std::string& host) {
  if (scheme == "tcp") {
    std::string h = host.empty() ? "127.0.0.1" : host;
    if (h.find(':') != std::string::npos && !absl::StartsWith(h, "[")) h = absl::StrCat("[", h, "]");
    return absl::StrCat("tcp://", h, ":0");
  }
  if (scheme == "ipc") {
    static std::atomic<uint64_t> counter{0};
    return absl::StrCat("ipc:///tmp/tessera-", getpid(), "-", counter.fetch_add(1), ".sock");
  }
  return "";
}

}  // namespace tessera

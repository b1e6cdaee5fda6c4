#include "transport/transport_factory.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
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

absl::Status ValidateTransportChoice(const TransportChoice& c) {
  const std::pair<const char*, uint64_t> counts[] = {
      {"--rdma_pool_bytes", c.rdma_pool_bytes},
      {"--rdma_max_pinned_bytes", c.rdma_max_pinned_bytes},
      {"--shm_min_frame_bytes", c.shm_options.min_frame_bytes},
      {"--shm_ring_bytes", c.shm_options.ring_bytes},
      {"--shm_min_lend_bytes", c.shm_options.min_lend_bytes},
      {"--coalesce_max_message_bytes", c.coalesce.max_message_bytes},
      {"--coalesce_max_batch_bytes", c.coalesce.max_batch_bytes},
      {"--coalesce_max_delay_us", static_cast<uint64_t>(std::max<int64_t>(c.coalesce.max_delay.count(), 0))}};
  for (const auto& [flag, value] : counts) {
    if (value == 0) return absl::InvalidArgumentError(absl::StrCat(flag, " 0: expected a positive integer"));
  }
  if (c.coalesce.max_delay.count() > 60'000'000) {
    return absl::InvalidArgumentError(
        absl::StrCat("--coalesce_max_delay_us ", c.coalesce.max_delay.count(), ": at most 60000000 (a minute)"));
  }
  if (c.coalesce.max_message_bytes > c.coalesce.max_batch_bytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--coalesce_max_message_bytes ", c.coalesce.max_message_bytes, " is more than --coalesce_max_batch_bytes ",
        c.coalesce.max_batch_bytes, " (a batch holds at least one)"));
  }
  if (c.shm) {
    if (absl::Status s = ShmTransport::Validate(c.shm_options); !s.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("--shm_min_frame_bytes ", c.shm_options.min_frame_bytes,
                                                     ", --shm_ring_bytes ", c.shm_options.ring_bytes, ": ",
                                                     s.message()));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<Transport>> MakeTransport(ZmqTransport::Options options) {
  return MakeTransport(std::move(options), TransportChoice{});
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
  if (absl::Status s = ValidateTransportChoice(choice); !s.ok()) return s;
  static std::atomic<bool> told{false};  // one line per process about authentication
  if (options.curve_public_key.empty()) {
    const std::string& key_file = choice.job_keys;
    if (!key_file.empty()) {
      auto keys = ReadJobKeys(key_file);
      if (!keys.ok()) {
        return absl::Status(keys.status().code(), absl::StrCat("--job_keys: ", keys.status().message()));
      }
      options.curve_public_key = keys->public_key;
      options.curve_secret_key = keys->secret_key;
      if (!told.exchange(true)) TLOG_INFO("authentication on: only holders of the job key in {} get in", key_file);
    } else if (tcp && !told.exchange(true)) {
      TLOG_WARN("authentication off: any process that can reach this node's port can join the job and read or "
                "write its parameters (no --job_keys; docs/security.md)");
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
      // The job's key (from --job_keys or the options): RDMA peers must
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
            "RDMA is required (--rdma_required 1; rdma.required in the job config) but unusable: ", reason));
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
  if (choice.faults.empty()) return transport;
  auto wrapped = WrapWithFaults(std::move(transport), choice.faults);
  if (!wrapped.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("--faults: ", wrapped.status().message()));
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

#include "transport/transport_factory.h"

#include <unistd.h>

#include <atomic>
#include <cstdlib>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "transport/fault_transport.h"
#include "transport/job_keys.h"

namespace tessera {

absl::StatusOr<std::unique_ptr<Transport>> MakeTransport(const std::string& bind) {
  ZmqTransport::Options options;
  options.bind = bind;
  return MakeTransport(std::move(options));
}

absl::StatusOr<std::unique_ptr<Transport>> MakeTransport(ZmqTransport::Options options) {
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
  std::unique_ptr<Transport> transport(new ZmqTransport(std::move(options)));
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

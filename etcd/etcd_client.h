#pragma once
// EtcdClient: the few etcd v3 calls Tessera makes (get, put, delete, leases,
// two guarded transactions), over etcd's JSON gateway: HTTP/1.1 POSTs to
// /v3/kv/... and /v3/lease/... on the client URL. No gRPC dependency; the
// JSON is read and written through protobuf's JSON mapping of the messages
// in proto/etcd_gateway.proto.
//
// Promises:
// - Every call answers or fails within the client's timeout per endpoint
//   tried, with an error that names the endpoint and what went wrong
//   (connection refused, timed out, the HTTP status and etcd's own message).
// - With several endpoints a call starts at the one that answered last and,
//   when an endpoint cannot be reached, tries the others in turn. An answer
//   from etcd (even an error) is final: it is not retried elsewhere.
// - Keys and values are arbitrary bytes.
// Thread safety: const methods may run concurrently (each call opens its
// own connection; the "last good endpoint" hint is atomic).
#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/clock.h"

namespace tessera {

struct EtcdKeyValue {
  std::string key;
  std::string value;
  int64_t create_revision = 0;
  int64_t mod_revision = 0;
  int64_t lease = 0;  // 0: not attached to a lease
};

struct EtcdLease {
  int64_t id = 0;
  Nanos ttl = 0;  // as granted (etcd rounds short TTLs up, to 2 s by default)
};

class EtcdClient {
 public:
  // `endpoints`: one or more client URLs separated by commas, each
  // "http://HOST:PORT" (the scheme may be left out). HTTPS is not supported.
  static absl::StatusOr<std::unique_ptr<EtcdClient>> Create(std::string_view endpoints,
                                                            Nanos timeout = 2 * kSeconds);

  // The key's value, or nullopt when it does not exist.
  absl::StatusOr<std::optional<EtcdKeyValue>> Get(std::string_view key) const;
  absl::Status Put(std::string_view key, std::string_view value, int64_t lease = 0) const;
  absl::Status Delete(std::string_view key) const;

  absl::StatusOr<EtcdLease> GrantLease(Nanos ttl) const;
  // Refreshes the lease; returns its remaining TTL, 0 when it has expired
  // (or was revoked): an expired lease never comes back.
  absl::StatusOr<Nanos> KeepAlive(int64_t lease) const;
  absl::Status RevokeLease(int64_t lease) const;

  // Creates key = value attached to `lease`, only if the key does not exist.
  // Returns nullopt when this call created it, else the key as it is.
  absl::StatusOr<std::optional<EtcdKeyValue>> CreateIfAbsent(std::string_view key, std::string_view value,
                                                             int64_t lease) const;
  // Puts key = value only while the key `guard` exists and is attached to
  // `lease`. Returns whether it did.
  absl::StatusOr<bool> PutIfHeld(std::string_view guard, int64_t lease, std::string_view key,
                                 std::string_view value) const;

  // The endpoints as given, comma-separated, for messages.
  const std::string& endpoints() const { return endpoints_text_; }

  // Exposed for tests ----------------------------------------------------
  struct Endpoint {
    std::string host;
    int port = 0;
  };
  static absl::StatusOr<std::vector<Endpoint>> ParseEndpoints(std::string_view endpoints);
  struct HttpResponse {
    int status = 0;
    std::string body;
  };
  // Parses a whole HTTP/1.1 response (status line, headers, a body sized by
  // Content-Length, by chunked encoding, or by the end of the connection).
  static absl::StatusOr<HttpResponse> ParseHttpResponse(std::string_view raw);

 private:
  EtcdClient(std::vector<Endpoint> endpoints, std::string text, Nanos timeout)
      : endpoints_(std::move(endpoints)), endpoints_text_(std::move(text)), timeout_(timeout) {}
  // POSTs `json` to `path` and returns the body of a 200 answer.
  absl::StatusOr<std::string> Call(std::string_view path, const std::string& json) const;

  std::vector<Endpoint> endpoints_;
  std::string endpoints_text_;
  Nanos timeout_;
  mutable std::atomic<size_t> preferred_{0};
};

// "etcd://HOST:PORT[,HOST:PORT...]/JOB": where nodes find a job's
// coordinator (the address in its leader key) instead of a fixed address.
struct EtcdCoordinatorAddress {
  std::string endpoints;  // "http://HOST:PORT[,...]", for EtcdClient::Create
  std::string job;
};
bool IsEtcdAddress(std::string_view address);
absl::StatusOr<EtcdCoordinatorAddress> ParseEtcdCoordinatorAddress(std::string_view address);

// The keys of one job: /tessera/JOB/leader (the leading coordinator's
// address, attached to its lease) and /tessera/JOB/state (the coordinator
// state, proto::CoordinatorState, written only by the leader).
std::string EtcdLeaderKey(std::string_view job);
std::string EtcdStateKey(std::string_view job);

}  // namespace tessera

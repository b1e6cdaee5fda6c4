#include "etcd/etcd_client.h"

#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "google/protobuf/util/json_util.h"
#include "proto/etcd_gateway.pb.h"

namespace tessera {
namespace {

namespace pb = google::protobuf;
using absl::string_view;

// Debian's abseil has a string_view of its own.
string_view AV(std::string_view s) { return string_view(s.data(), s.size()); }

std::string ToJson(const pb::Message& m) {
  std::string out;
  pb::util::JsonPrintOptions options;
  options.preserve_proto_field_names = true;
  (void)pb::util::MessageToJsonString(m, &out, options);
  return out;
}

absl::Status FromJson(string_view json, pb::Message* m, string_view what) {
  pb::util::JsonParseOptions options;
  options.ignore_unknown_fields = true;
  auto s = pb::util::JsonStringToMessage(std::string(json), m, options);
  if (!s.ok()) {
    return absl::DataLossError(absl::StrCat("etcd: cannot read the answer to ", what, ": ", s.ToString(),
                                            " (answer: ", json.substr(0, 200), ")"));
  }
  return absl::OkStatus();
}

// A file descriptor closed on scope exit.
struct Fd {
  int fd = -1;
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};

int RemainingMs(Nanos deadline) {
  Nanos left = deadline - MonotonicNow();
  return left <= 0 ? 0 : static_cast<int>((left + kMillis - 1) / kMillis);
}

// Connects to host:port before `deadline`; returns the connected socket.
absl::StatusOr<int> Connect(const EtcdClient::Endpoint& e, Nanos deadline) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  const std::string port = std::to_string(e.port);
  if (int rc = ::getaddrinfo(e.host.c_str(), port.c_str(), &hints, &found); rc != 0) {
    return absl::UnavailableError(absl::StrCat("cannot resolve ", e.host, ": ", gai_strerror(rc)));
  }
  std::string last_error = "no address";
  for (addrinfo* a = found; a != nullptr; a = a->ai_next) {
    int fd = ::socket(a->ai_family, a->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) continue;
    int rc = ::connect(fd, a->ai_addr, a->ai_addrlen);
    if (rc != 0 && errno == EINPROGRESS) {
      pollfd p{fd, POLLOUT, 0};
      const int ready = ::poll(&p, 1, RemainingMs(deadline));
      if (ready == 1) {
        int err = 0;
        socklen_t len = sizeof err;
        ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len);
        rc = err == 0 ? 0 : -1;
        errno = err;
      } else {
        rc = -1;
        if (ready == 0) errno = ETIMEDOUT;
      }
    }
    if (rc == 0) {
      ::freeaddrinfo(found);
      return fd;
    }
    last_error = std::strerror(errno);
    ::close(fd);
  }
  ::freeaddrinfo(found);
  return absl::UnavailableError(absl::StrCat("cannot connect: ", last_error));
}

// One request on its own connection: sends it all, reads until the server
// closes (the request says Connection: close).
absl::StatusOr<std::string> Exchange(const EtcdClient::Endpoint& e, const std::string& request, Nanos timeout) {
  const Nanos deadline = MonotonicNow() + timeout;
  auto fd_or = Connect(e, deadline);
  if (!fd_or.ok()) return fd_or.status();
  Fd fd{*fd_or};
  size_t sent = 0;
  while (sent < request.size()) {
    ssize_t n = ::send(fd.fd, request.data() + sent, request.size() - sent, MSG_NOSIGNAL);
    if (n > 0) {
      sent += static_cast<size_t>(n);
      continue;
    }
    if (n < 0 && errno != EAGAIN && errno != EINTR) {
      return absl::UnavailableError(absl::StrCat("send failed: ", std::strerror(errno)));
    }
    pollfd p{fd.fd, POLLOUT, 0};
    if (::poll(&p, 1, RemainingMs(deadline)) <= 0) return absl::DeadlineExceededError("timed out sending");
  }
  std::string raw;
  char buf[16384];
  for (;;) {
    ssize_t n = ::recv(fd.fd, buf, sizeof buf, 0);
    if (n > 0) {
      raw.append(buf, static_cast<size_t>(n));
      if (raw.size() > (64u << 20)) return absl::ResourceExhaustedError("answer larger than 64 MiB");
      continue;
    }
    if (n == 0) break;
    if (errno != EAGAIN && errno != EINTR) {
      return absl::UnavailableError(absl::StrCat("receive failed: ", std::strerror(errno)));
    }
    pollfd p{fd.fd, POLLIN, 0};
    if (::poll(&p, 1, RemainingMs(deadline)) <= 0) {
      return absl::DeadlineExceededError(
          absl::StrCat("no complete answer within ", static_cast<double>(timeout / kMillis) / 1000.0, " s"));
    }
  }
  return raw;
}

}  // namespace

absl::StatusOr<std::vector<EtcdClient::Endpoint>> EtcdClient::ParseEndpoints(std::string_view endpoints) {
  std::vector<Endpoint> out;
  for (string_view part : absl::StrSplit(AV(endpoints), ',', absl::SkipWhitespace())) {
    part = absl::StripAsciiWhitespace(part);
    string_view rest = part;
    if (absl::ConsumePrefix(&rest, "https://")) {
      return absl::InvalidArgumentError(absl::StrCat("etcd endpoint ", part, ": https is not supported"));
    }
    absl::ConsumePrefix(&rest, "http://");
    absl::ConsumeSuffix(&rest, "/");
    size_t colon = rest.rfind(':');
    int port = 0;
    if (colon == string_view::npos || colon == 0 || !absl::SimpleAtoi(rest.substr(colon + 1), &port) ||
        port <= 0 || port > 65535 || rest.find('/') != string_view::npos) {
      return absl::InvalidArgumentError(
          absl::StrCat("etcd endpoint '", part, "' is not http://HOST:PORT (e.g. http://127.0.0.1:2379)"));
    }
    std::string host(rest.substr(0, colon));
    if (host.size() > 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
    out.push_back({std::move(host), port});
  }
  if (out.empty()) return absl::InvalidArgumentError("no etcd endpoint given (expected http://HOST:PORT)");
  return out;
}

absl::StatusOr<EtcdClient::HttpResponse> EtcdClient::ParseHttpResponse(std::string_view raw_in) {
  const string_view raw = AV(raw_in);
  size_t head_end = raw.find("\r\n\r\n");
  if (head_end == string_view::npos) return absl::DataLossError("truncated HTTP answer (no end of headers)");
  string_view head = raw.substr(0, head_end);
  string_view body = raw.substr(head_end + 4);
  std::vector<string_view> lines = absl::StrSplit(head, "\r\n");
  HttpResponse r;
  std::vector<string_view> status = absl::StrSplit(lines[0], absl::MaxSplits(' ', 2));
  if (status.size() < 2 || !absl::StartsWith(status[0], "HTTP/1.") || !absl::SimpleAtoi(status[1], &r.status)) {
    return absl::DataLossError(absl::StrCat("not an HTTP answer: ", lines[0].substr(0, 80)));
  }
  bool chunked = false;
  std::optional<size_t> length;
  for (size_t i = 1; i < lines.size(); ++i) {
    size_t colon = lines[i].find(':');
    if (colon == string_view::npos) continue;
    std::string name = absl::AsciiStrToLower(lines[i].substr(0, colon));
    string_view value = absl::StripAsciiWhitespace(lines[i].substr(colon + 1));
    if (name == "transfer-encoding" && absl::StrContains(absl::AsciiStrToLower(value), "chunked")) chunked = true;
    size_t n = 0;
    if (name == "content-length" && absl::SimpleAtoi(value, &n)) length = n;
  }
  if (chunked) {
    for (;;) {
      size_t eol = body.find("\r\n");
      if (eol == string_view::npos) return absl::DataLossError("truncated chunked HTTP body");
      string_view size_text = body.substr(0, eol);
      if (size_t semi = size_text.find(';'); semi != string_view::npos) size_text = size_text.substr(0, semi);
      size_t size = 0;
      if (!absl::SimpleHexAtoi(absl::StripAsciiWhitespace(size_text), &size)) {
        return absl::DataLossError("bad chunk size in HTTP body");
      }
      body.remove_prefix(eol + 2);
      if (size == 0) break;
      if (body.size() < size + 2) return absl::DataLossError("truncated chunked HTTP body");
      r.body.append(body.data(), size);
      body.remove_prefix(size + 2);
    }
  } else if (length) {
    if (body.size() < *length) return absl::DataLossError("truncated HTTP body");
    r.body = std::string(body.substr(0, *length));
  } else {
    r.body = std::string(body);
  }
  return r;
}

absl::StatusOr<std::unique_ptr<EtcdClient>> EtcdClient::Create(std::string_view endpoints, Nanos timeout) {
  auto parsed = ParseEndpoints(endpoints);
  if (!parsed.ok()) return parsed.status();
  return std::unique_ptr<EtcdClient>(new EtcdClient(std::move(*parsed), std::string(endpoints), timeout));
}

absl::StatusOr<std::string> EtcdClient::Call(std::string_view path, const std::string& json) const {
  std::string errors;
  const size_t first = preferred_.load(std::memory_order_relaxed) % endpoints_.size();
  for (size_t i = 0; i < endpoints_.size(); ++i) {
    const size_t at = (first + i) % endpoints_.size();
    const Endpoint& e = endpoints_[at];
    const std::string where = absl::StrCat("http://", e.host, ":", e.port);
    std::string request = absl::StrCat("POST ", AV(path), " HTTP/1.1\r\nHost: ", e.host, ":", e.port,
                                       "\r\nContent-Type: application/json\r\nContent-Length: ", json.size(),
                                       "\r\nConnection: close\r\n\r\n", json);
    auto raw = Exchange(e, request, timeout_);
    if (!raw.ok()) {
      absl::StrAppend(&errors, errors.empty() ? "" : "; ", where, ": ", raw.status().message());
      continue;
    }
    preferred_.store(at, std::memory_order_relaxed);
    auto response = ParseHttpResponse(*raw);
    if (!response.ok()) return absl::Status(response.status().code(), absl::StrCat("etcd at ", where, ": ",
                                                                                   response.status().message()));
    if (response->status != 200) {
      etcdv3::GatewayError err;
      std::string message = response->body.substr(0, 300);
      if (FromJson(response->body, &err, AV(path)).ok() && !err.message().empty()) message = err.message();
      return absl::FailedPreconditionError(
          absl::StrCat("etcd at ", where, " refused ", AV(path), ": HTTP ", response->status, ": ", message));
    }
    return std::move(response->body);
  }
  return absl::UnavailableError(absl::StrCat("etcd unreachable (", errors, ")"));
}

absl::StatusOr<std::optional<EtcdKeyValue>> EtcdClient::Get(std::string_view key) const {
  etcdv3::RangeRequest req;
  req.set_key(std::string(key));
  auto body = Call("/v3/kv/range", ToJson(req));
  if (!body.ok()) return body.status();
  etcdv3::RangeResponse resp;
  if (auto s = FromJson(*body, &resp, "/v3/kv/range"); !s.ok()) return s;
  if (resp.kvs_size() == 0) return std::optional<EtcdKeyValue>();
  const etcdv3::KeyValue& kv = resp.kvs(0);
  return std::optional<EtcdKeyValue>(
      EtcdKeyValue{kv.key(), kv.value(), kv.create_revision(), kv.mod_revision(), kv.lease()});
}

absl::Status EtcdClient::Put(std::string_view key, std::string_view value, int64_t lease) const {
  etcdv3::PutRequest req;
  req.set_key(std::string(key));
  req.set_value(std::string(value));
  req.set_lease(lease);
  return Call("/v3/kv/put", ToJson(req)).status();
}

absl::Status EtcdClient::Delete(std::string_view key) const {
  etcdv3::DeleteRangeRequest req;
  req.set_key(std::string(key));
  return Call("/v3/kv/deleterange", ToJson(req)).status();
}

absl::StatusOr<EtcdLease> EtcdClient::GrantLease(Nanos ttl) const {
  etcdv3::LeaseGrantRequest req;
  req.set_ttl(std::max<int64_t>(1, (ttl + kSeconds - 1) / kSeconds));
  auto body = Call("/v3/lease/grant", ToJson(req));
  if (!body.ok()) return body.status();
  etcdv3::LeaseGrantResponse resp;
  if (auto s = FromJson(*body, &resp, "/v3/lease/grant"); !s.ok()) return s;
  if (!resp.error().empty() || resp.id() == 0) {
    return absl::FailedPreconditionError(absl::StrCat("etcd did not grant a lease: ", resp.error()));
  }
  return EtcdLease{resp.id(), resp.ttl() * kSeconds};
}

absl::StatusOr<Nanos> EtcdClient::KeepAlive(int64_t lease) const {
  etcdv3::LeaseKeepAliveRequest req;
  req.set_id(lease);
  auto body = Call("/v3/lease/keepalive", ToJson(req));
  if (!body.ok()) return body.status();
  // A stream of {"result": ...} objects, one per request sent: here one.
  string_view first = *body;
  if (size_t end = first.find("}}\n"); end != string_view::npos) first = first.substr(0, end + 2);
  etcdv3::LeaseKeepAliveStreamItem item;
  if (auto s = FromJson(first, &item, "/v3/lease/keepalive"); !s.ok()) return s;
  return item.result().ttl() * kSeconds;
}

absl::Status EtcdClient::RevokeLease(int64_t lease) const {
  etcdv3::LeaseRevokeRequest req;
  req.set_id(lease);
  return Call("/v3/lease/revoke", ToJson(req)).status();
}

absl::StatusOr<std::optional<EtcdKeyValue>> EtcdClient::CreateIfAbsent(std::string_view key, std::string_view value,
                                                                       int64_t lease) const {
  etcdv3::TxnRequest req;
  etcdv3::Compare* c = req.add_compare();
  c->set_target(etcdv3::Compare::CREATE);
  c->set_result(etcdv3::Compare::EQUAL);
  c->set_key(std::string(key));
  c->set_create_revision(0);
  etcdv3::PutRequest* put = req.add_success()->mutable_request_put();
  put->set_key(std::string(key));
  put->set_value(std::string(value));
  put->set_lease(lease);
  req.add_failure()->mutable_request_range()->set_key(std::string(key));
  auto body = Call("/v3/kv/txn", ToJson(req));
  if (!body.ok()) return body.status();
  etcdv3::TxnResponse resp;
  if (auto s = FromJson(*body, &resp, "/v3/kv/txn"); !s.ok()) return s;
  if (resp.succeeded()) return std::optional<EtcdKeyValue>();
  if (resp.responses_size() == 0 || resp.responses(0).response_range().kvs_size() == 0) {
    // The key went between the compare and the range: report it as held by nobody.
    return std::optional<EtcdKeyValue>(EtcdKeyValue{std::string(key), "", 0, 0, 0});
  }
  const etcdv3::KeyValue& kv = resp.responses(0).response_range().kvs(0);
  return std::optional<EtcdKeyValue>(
      EtcdKeyValue{kv.key(), kv.value(), kv.create_revision(), kv.mod_revision(), kv.lease()});
}

absl::StatusOr<bool> EtcdClient::PutIfHeld(std::string_view guard, int64_t lease, std::string_view key,
                                           std::string_view value) const {
  etcdv3::TxnRequest req;
  etcdv3::Compare* c = req.add_compare();
  c->set_target(etcdv3::Compare::LEASE);
  c->set_result(etcdv3::Compare::EQUAL);
  c->set_key(std::string(guard));
  c->set_lease(lease);
  etcdv3::PutRequest* put = req.add_success()->mutable_request_put();
  put->set_key(std::string(key));
  put->set_value(std::string(value));
  auto body = Call("/v3/kv/txn", ToJson(req));
  if (!body.ok()) return body.status();
  etcdv3::TxnResponse resp;
  if (auto s = FromJson(*body, &resp, "/v3/kv/txn"); !s.ok()) return s;
  return resp.succeeded();
}

bool IsEtcdAddress(std::string_view address) { return absl::StartsWith(AV(address), "etcd://"); }

absl::StatusOr<EtcdCoordinatorAddress> ParseEtcdCoordinatorAddress(std::string_view address_in) {
  const string_view address = AV(address_in);
  string_view rest = address;
  const auto bad = [&](string_view why) {
    return absl::InvalidArgumentError(absl::StrCat("coordinator address '", address, "': ", why,
                                                   " (expected etcd://HOST:PORT[,HOST:PORT...]/JOB)"));
  };
  if (!absl::ConsumePrefix(&rest, "etcd://")) return bad("not an etcd:// address");
  size_t slash = rest.find('/');
  if (slash == string_view::npos || slash + 1 >= rest.size()) return bad("no job name");
  string_view job = rest.substr(slash + 1);
  if (job.find('/') != string_view::npos) return bad("the job name has a '/'");
  EtcdCoordinatorAddress out;
  for (string_view host_port : absl::StrSplit(rest.substr(0, slash), ',', absl::SkipWhitespace())) {
    absl::StrAppend(&out.endpoints, out.endpoints.empty() ? "" : ",", "http://", host_port);
  }
  if (auto parsed = EtcdClient::ParseEndpoints(out.endpoints); !parsed.ok()) return bad(parsed.status().message());
  out.job = std::string(job);
  return out;
}

std::string EtcdLeaderKey(std::string_view job) { return absl::StrCat("/tessera/", AV(job), "/leader"); }
std::string EtcdStateKey(std::string_view job) { return absl::StrCat("/tessera/", AV(job), "/state"); }

}  // namespace tessera

#include "transport/zmq_curve_auth.h"

#include <bit>
#include <cerrno>
#include <cstring>
#include <iterator>
#include <string_view>
#include <vector>

#include <zmq_addon.hpp>

#include "common/logging.h"

namespace tessera::zmq_internal {

absl::Status ValidateCurveKeys(const std::string& public_key, const std::string& secret_key) {
  if (public_key.empty() != secret_key.empty()) {
    return absl::InvalidArgumentError("CURVE needs both keys of the job's pair, or neither");
  }
  if (!public_key.empty()) {
    if (!zmq_has("curve")) return absl::FailedPreconditionError("this libzmq was built without CURVE");
    uint8_t public_binary[32];
    uint8_t secret[32];
    uint8_t derived[32];
    char derived_z85[41];
    if (public_key.size() != 40 || secret_key.size() != 40 ||
        zmq_z85_decode(public_binary, public_key.c_str()) == nullptr ||
        zmq_z85_decode(secret, secret_key.c_str()) == nullptr) {
      return absl::InvalidArgumentError("CURVE keys must be 40-character Z85 strings");
    }
    if (zmq_curve_public(derived_z85, secret_key.c_str()) != 0 || zmq_z85_decode(derived, derived_z85) == nullptr ||
        std::memcmp(derived, public_binary, 32) != 0) {
      return absl::InvalidArgumentError("the CURVE public and secret keys are not one pair");
    }
  }
  return absl::OkStatus();
}

void SetCurveServerOptions(zmq::socket_t& router, const std::string& secret_key) {
  router.set(zmq::sockopt::curve_server, 1);
  router.set(zmq::sockopt::curve_secretkey, secret_key);
  router.set(zmq::sockopt::zap_domain, "tessera");
}

void SetCurveClientOptions(zmq::socket_t& dealer, const std::string& public_key, const std::string& secret_key) {
  dealer.set(zmq::sockopt::curve_serverkey, public_key);
  dealer.set(zmq::sockopt::curve_publickey, public_key);
  dealer.set(zmq::sockopt::curve_secretkey, secret_key);
}

void ZapHandler::Bind(zmq::context_t& ctx, const std::string& public_key) {
  zmq_z85_decode(job_public_key_, public_key.c_str());  // checked by ValidateCurveKeys
  socket_ = zmq::socket_t(ctx, zmq::socket_type::rep);
  socket_.set(zmq::sockopt::linger, 0);
  socket_.bind("inproc://zeromq.zap.01");
}

void ZapHandler::Close() { socket_.close(); }

void ZapHandler::Start() {
  thread_ = std::thread([this] { Loop(); });
}

void ZapHandler::Join() {
  if (thread_.joinable()) thread_.join();  // woken by the shutdown; closes its socket
}

void ZapHandler::Loop() {
  for (;;) {
    std::vector<zmq::message_t> request;
    try {
      if (!zmq::recv_multipart(socket_, std::back_inserter(request))) continue;
    } catch (const zmq::error_t& e) {
      if (e.num() == ETERM) break;
      continue;
    }
    // RFC 27: version, request id, domain, address, identity, mechanism, credentials.
    const bool ok = request.size() >= 7 && request[5].to_string_view() == "CURVE" && request[6].size() == 32 &&
                    std::memcmp(request[6].data(), job_public_key_, 32) == 0;
    if (!ok) {
      const uint64_t n = rejected_.fetch_add(1, std::memory_order_relaxed) + 1;
      if (std::bit_width(n) != std::bit_width(n - 1)) {  // the 1st, 2nd, 4th, 8th, ... refusal
        TLOG_WARN("{}: refused a connection from {}: it does not hold the job's key ({} refused so far)", name_,
                  request.size() > 3 ? request[3].to_string() : std::string("?"), n);
      }
    }
    std::vector<zmq::message_t> reply;
    reply.emplace_back(std::string_view("1.0"));
    reply.emplace_back(request.size() > 1 ? request[1].data() : nullptr, request.size() > 1 ? request[1].size() : 0);
    reply.emplace_back(std::string_view(ok ? "200" : "400"));
    reply.emplace_back(std::string_view(ok ? "OK" : "not the job's key"));
    reply.emplace_back(std::string_view(ok ? "job" : ""));
    reply.emplace_back();
    try {
      zmq::send_multipart(socket_, reply);
    } catch (const zmq::error_t& e) {
      if (e.num() == ETERM) break;
    }
  }
  socket_.close();
}

}  // namespace tessera::zmq_internal

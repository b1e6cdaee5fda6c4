#pragma once
// CURVE authentication of ZmqTransport (internal to transport/): checking the
// job's key pair, the socket options that make a ROUTER a CURVE server and a
// DEALER its client, and the ZAP handler that lets a peer in only if it
// presents the job's public key as its own.
//
// Contract:
// - Callers: ZmqTransport::Impl. Validate calls ValidateCurveKeys; Start
//   binds the ZapHandler before the ROUTER binds (libzmq asks the ZAP
//   handler during every CURVE handshake, and refuses the handshake when
//   no handler is bound), then starts it once address() is known; Finish
//   joins it after shutting the context down. PeerFor calls
//   SetCurveClientOptions on each new DEALER. Nothing here runs per message.
// - ZapHandler owns its ZAP socket (a REP socket bound to libzmq's fixed
//   ZAP endpoint in the transport's context) and the thread that answers
//   on it; that thread is the only user of the socket once started, and
//   closes it when the context is shut down (ETERM). Bind, Start, Close and
//   Join are called by one thread at a time (the transport's lifecycle
//   lock); rejected() may be read from any thread.
// - Every node holds the same pair: it is the job's shared secret. A refused
//   peer's handshake fails and nothing it sends reaches the ROUTER.
#include <atomic>
#include <cstdint>
#include <string>
#include <thread>

#include <zmq.hpp>

#include "absl/status/status.h"

namespace tessera::zmq_internal {

// OK when both keys are empty (no CURVE) or when they are one pair of
// 40-character Z85 keys and this libzmq has CURVE; InvalidArgument or
// FailedPrecondition (no CURVE in libzmq) otherwise.
absl::Status ValidateCurveKeys(const std::string& public_key, const std::string& secret_key);

// Makes `router` a CURVE server of the job (before it binds): it holds the
// job's secret key and sends every handshake to the ZAP handler.
void SetCurveServerOptions(zmq::socket_t& router, const std::string& secret_key);

// Makes `dealer` a CURVE client (before it connects) that expects the job's
// key as the server's and presents the job's pair as its own.
void SetCurveClientOptions(zmq::socket_t& dealer, const std::string& public_key, const std::string& secret_key);

class ZapHandler {
 public:
  // `name` (the transport's address) prefixes log lines; it is read only by
  // the handler's thread, and must be set before Start and outlive it.
  explicit ZapHandler(const std::string& name) : name_(name) {}
  ZapHandler(const ZapHandler&) = delete;
  ZapHandler& operator=(const ZapHandler&) = delete;

  // Keeps the job's public key (Z85, checked by ValidateCurveKeys) and binds
  // the ZAP socket in `ctx`. Throws zmq::error_t.
  void Bind(zmq::context_t& ctx, const std::string& public_key);
  // Closes the socket Bind made, when Start will not follow (a failed
  // transport Start); Bind may be called again.
  void Close();
  // Starts the thread that answers ZAP requests until the context is shut
  // down.
  void Start();
  // Waits for that thread; call after shutting the context down.
  void Join();
  // Handshakes refused so far.
  uint64_t rejected() const { return rejected_.load(std::memory_order_relaxed); }

 private:
  void Loop();

  const std::string& name_;
  uint8_t job_public_key_[32] = {};
  zmq::socket_t socket_;  // bound by Bind; the thread's alone once started
  std::thread thread_;
  std::atomic<uint64_t> rejected_{0};
};

}  // namespace tessera::zmq_internal

#pragma once
// Choosing a Transport from an endpoint string.
//
// MakeTransport picks the implementation by the endpoint's scheme:
//   "tcp://HOST:PORT", "ipc:///path"  -> ZmqTransport (bound at that endpoint)
// Anything else is InvalidArgument, with a message that lists the accepted
// schemes. (In-process transports need a shared InProcNetwork and are made
// with InProcNetwork::Create; RDMA is made by its own module.)
// The returned transport is not started: call Start(handler), which binds.
// Thread safety: both functions may be called from any thread.
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "transport/transport.h"
#include "transport/zmq_transport.h"

namespace tessera {

// A ZmqTransport with default options bound at `bind` once started.
absl::StatusOr<std::unique_ptr<Transport>> MakeTransport(const std::string& bind);

// The same with every ZeroMQ option given; options.bind selects the scheme.
absl::StatusOr<std::unique_ptr<Transport>> MakeTransport(ZmqTransport::Options options);

// A bind endpoint for `scheme` on this machine:
//   "tcp": "tcp://HOST:0" (an ephemeral port; HOST defaults to 127.0.0.1, an
//          IPv6 literal is bracketed);
//   "ipc": "ipc:///tmp/tessera-<pid>-<counter>.sock", unique within this
//          process and across live processes (`host` is ignored).
// Returns an empty string for any other scheme.
std::string DefaultBind(const std::string& scheme, const std::string& host);

}  // namespace tessera

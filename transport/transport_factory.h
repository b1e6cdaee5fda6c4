#pragma once
// Choosing a Transport from an endpoint string.
//
// MakeTransport picks the implementation by the endpoint's scheme:
//   "tcp://HOST:PORT", "ipc:///path"  -> ZmqTransport (bound at that endpoint)
// Anything else is InvalidArgument, with a message that lists the accepted
// schemes. (In-process transports need a shared InProcNetwork and are made
// with InProcNetwork::Create; RDMA is made by its own module.)
// The returned transport is not started: call Start(handler), which binds.
//
// Fault injection: when the environment variable TESSERA_FAULTS is set and
// not empty, MakeTransport wraps the transport it makes in a FaultTransport
// with that spec (grammar in transport/fault_transport.h), and logs one line
// "fault injection on: <spec>". This is how a launcher gives every process of
// a job faults without new flags; it is the one place outside main and the
// launcher that reads the environment. A spec that does not parse is an
// InvalidArgument from MakeTransport that names TESSERA_FAULTS.
//
// Authentication: when options carry no CURVE keys and the environment
// variable TESSERA_JOB_KEYS names a key file (transport/job_keys.h), the
// transport gets the job's key pair from it (a bad file is an error from
// MakeTransport naming the variable); one line per process says
// "authentication on". A tcp transport without keys logs once per process
// that authentication is off.
// Thread safety: every function here may be called from any thread (as long
// as nobody changes the environment meanwhile).
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "transport/transport.h"
#include "transport/zmq_transport.h"

namespace tessera {

// A ZmqTransport with default options bound at `bind` once started (wrapped
// in a FaultTransport when TESSERA_FAULTS is set).
absl::StatusOr<std::unique_ptr<Transport>> MakeTransport(const std::string& bind);

// The same with every ZeroMQ option given; options.bind selects the scheme.
absl::StatusOr<std::unique_ptr<Transport>> MakeTransport(ZmqTransport::Options options);

// `inner` wrapped in a FaultTransport applying `spec` (FaultSpec::Parse), or
// `inner` itself when `spec` is empty or only whitespace. `inner` must not be
// started. Logs "fault injection on: <canonical spec>" when it wraps. Errors:
// InvalidArgument for a spec that does not parse (nothing is logged, `inner`
// is destroyed) or a null `inner`.
absl::StatusOr<std::unique_ptr<Transport>> WrapWithFaults(std::unique_ptr<Transport> inner,
                                                          const std::string& spec);

// The environment variable MakeTransport reads its fault spec from.
inline constexpr char kFaultsEnvironmentVariable[] = "TESSERA_FAULTS";

// A bind endpoint for `scheme` on this machine:
//   "tcp": "tcp://HOST:0" (an ephemeral port; HOST defaults to 127.0.0.1, an
//          IPv6 literal is bracketed);
//   "ipc": "ipc:///tmp/tessera-<pid>-<counter>.sock", unique within this
//          process and across live processes (`host` is ignored).
// Returns an empty string for any other scheme.
std::string DefaultBind(const std::string& scheme, const std::string& host);

}  // namespace tessera

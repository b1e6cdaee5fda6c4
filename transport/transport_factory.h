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
// Transport selection and the same-host path, also from the environment
// (the launcher sets these for every process; docs/launcher.md):
//   TESSERA_TRANSPORT=zmq|rdma|auto  (default zmq). With rdma or auto the
//     RDMA verbs transport (rdma/rdma_transport.h) is made when this process
//     can use a device (and the bind is tcp://HOST:PORT, which it listens on
//     instead); otherwise one line per process says "RDMA unavailable
//     (REASON); falling back to ZeroMQ over tcp" and ZeroMQ is used, unless
//   TESSERA_RDMA_REQUIRED=1: then MakeTransport fails with
//     FailedPrecondition "RDMA is required ... but unusable: REASON".
//   TESSERA_RDMA_POOL_BYTES, TESSERA_RDMA_MAX_PINNED_BYTES: its pool sizes.
//   TESSERA_SHM=1|0 (default 1): wrap the transport in a ShmTransport
//     (transport/shm_transport.h), so that large frames between processes
//     of one host go through shared memory; TESSERA_SHM_MIN_FRAME_BYTES and
//     TESSERA_SHM_RING_BYTES set its options, and TESSERA_SHM_CROSS_MEMORY=1|0
//     (default 1) whether pull values are lent and read in place
//     (ShmTransport::Options::cross_memory), TESSERA_SHM_MIN_LEND_BYTES from
//     what size. TESSERA_HOST_ID (any text; the launcher sets it to the
//     host's name in its placement) joins the host identity
//     (shm::HostIdentity): processes the launcher placed on different hosts
//     never take each other for one. Where the host identity cannot be
//     read, no wrapping.
//   TESSERA_COALESCE=1|0 (default 1): small messages to one peer made close
//     together go as one (transport/coalescing_transport.h); the transport
//     is wrapped in a CoalescingTransport either way, so that every process
//     takes batches apart. TESSERA_COALESCE_MAX_MESSAGE_BYTES (16384),
//     TESSERA_COALESCE_MAX_BATCH_BYTES (65536) and
//     TESSERA_COALESCE_MAX_DELAY_US (1000) set its options; whether a
//     process holds its requests (hold_requests) is its own choice (the
//     worker does), not the environment's.
//   The stack, outermost first: faults, coalescing, shared memory, then
//   ZeroMQ or RDMA.
// A value that does not parse is an InvalidArgument naming the variable.
// Thread safety: every function here may be called from any thread (as long
// as nobody changes the environment meanwhile).
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "transport/coalescing_transport.h"
#include "transport/shm_transport.h"
#include "transport/transport.h"
#include "transport/zmq_transport.h"

namespace tessera {

// What the environment asks for (see above); defaults when nothing is set.
struct TransportChoice {
  enum class Kind { kZmq, kRdma, kAuto };
  Kind kind = Kind::kZmq;
  bool rdma_required = false;
  size_t rdma_pool_bytes = 64ull << 20;
  size_t rdma_max_pinned_bytes = 1ull << 30;
  bool shm = true;
  ShmTransport::Options shm_options;
  std::string host_id;  // TESSERA_HOST_ID, mixed into the host identity
  CoalescingTransport::Options coalesce;
};
absl::StatusOr<TransportChoice> TransportChoiceFromEnvironment();

inline constexpr char kTransportEnvironmentVariable[] = "TESSERA_TRANSPORT";

// A ZmqTransport with default options bound at `bind` once started (wrapped
// in a FaultTransport when TESSERA_FAULTS is set).
absl::StatusOr<std::unique_ptr<Transport>> MakeTransport(const std::string& bind);

// The same with every ZeroMQ option given; options.bind selects the scheme.
absl::StatusOr<std::unique_ptr<Transport>> MakeTransport(ZmqTransport::Options options);

// The same with the selection given instead of read from the environment
// (TESSERA_FAULTS and TESSERA_JOB_KEYS are still read).
absl::StatusOr<std::unique_ptr<Transport>> MakeTransport(ZmqTransport::Options options,
                                                         const TransportChoice& choice);

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

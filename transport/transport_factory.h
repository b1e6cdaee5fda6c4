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
// Every setting comes from a TransportChoice that the caller fills (a
// binary's `main` from its flags: transport/transport_flags.h); nothing here
// reads the environment. The choice holds:
//
// Fault injection: `faults` (flag --faults), when not empty, wraps the
// transport made in a FaultTransport with that spec (grammar in
// transport/fault_transport.h) and logs one line "fault injection on:
// <spec>". A spec that does not parse is an InvalidArgument from
// MakeTransport that names --faults.
//
// Authentication: when the ZeroMQ options carry no CURVE keys and
// `job_keys` (flag --job_keys) names a key file (transport/job_keys.h), the
// transport gets the job's key pair from it (a bad file is an error from
// MakeTransport naming --job_keys); one line per process says
// "authentication on". A tcp transport without keys logs once per process
// that authentication is off.
//
// Transport selection and the same-host path (the launcher passes these as
// flags to every process; docs/launcher.md, "The process contract"):
//   kind (--transport zmq|rdma|auto, default zmq). With rdma or auto the
//     RDMA verbs transport (rdma/rdma_transport.h) is made when this process
//     can use a device (and the bind is tcp://HOST:PORT, which it listens on
//     instead); otherwise one line per process says "RDMA unavailable
//     (REASON); falling back to ZeroMQ over tcp" and ZeroMQ is used, unless
//   rdma_required (--rdma_required 1): then MakeTransport fails with
//     FailedPrecondition "RDMA is required ... but unusable: REASON".
//   rdma_pool_bytes, rdma_max_pinned_bytes (--rdma_pool_bytes,
//     --rdma_max_pinned_bytes): its pool sizes.
//   shm (--shm 1|0, default 1): wrap the transport in a ShmTransport
//     (transport/shm_transport.h), so that large frames between processes
//     of one host go through shared memory; shm_options (--shm_min_frame_bytes,
//     --shm_ring_bytes, --shm_cross_memory 1|0, --shm_min_lend_bytes) are its
//     options. host_id (--host_id, any text; the launcher gives the host's
//     name in its placement) joins the host identity (shm::HostIdentity):
//     processes the launcher placed on different hosts never take each
//     other for one. Where the host identity cannot be read, no wrapping.
//   coalesce (--coalesce 1|0, default 1): small messages to one peer made
//     close together go as one (transport/coalescing_transport.h); the
//     transport is wrapped in a CoalescingTransport either way, so that
//     every process takes batches apart. --coalesce_max_message_bytes
//     (16384), --coalesce_max_batch_bytes (65536) and
//     --coalesce_max_delay_us (1000) set its options; whether a process
//     holds its requests (hold_requests) is its own choice (the worker
//     does), not a flag.
//   The stack, outermost first: faults, coalescing, shared memory, then
//   ZeroMQ or RDMA.
// The defaults are the struct's (and the options structs' it holds): the one
// place they are written; flags, `--help` and the launcher's defaults follow
// them (tests/launcher_e2e/test_defaults.py checks the launcher).
// Thread safety: every function here may be called from any thread.
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "transport/coalescing_transport.h"
#include "transport/shm_transport.h"
#include "transport/transport.h"
#include "transport/zmq_transport.h"

namespace tessera {

// Every transport setting of a process (see above); the defaults are the
// ones a process gets without flags.
struct TransportChoice {
  enum class Kind { kZmq, kRdma, kAuto };
  Kind kind = Kind::kZmq;
  bool rdma_required = false;
  size_t rdma_pool_bytes = 64ull << 20;
  size_t rdma_max_pinned_bytes = 1ull << 30;
  bool shm = true;
  ShmTransport::Options shm_options;
  std::string host_id;  // --host_id, mixed into the host identity
  CoalescingTransport::Options coalesce;
  std::string job_keys;  // --job_keys: the job's key file ("" = no authentication unless the options carry keys)
  std::string faults;    // --faults: a fault spec ("" = none)
};

// OK, or an InvalidArgument naming the flag(s) of the first setting out of
// range: sizes of 0, a delay over a minute, a coalesced message larger than
// a batch, shared-memory options ShmTransport refuses (when shm is on).
// MakeTransport checks the same.
absl::Status ValidateTransportChoice(const TransportChoice& choice);

// A ZmqTransport with default options bound at `bind` once started, with the
// default TransportChoice (no authentication, no faults).
absl::StatusOr<std::unique_ptr<Transport>> MakeTransport(const std::string& bind);

// The same with every ZeroMQ option given; options.bind selects the scheme.
absl::StatusOr<std::unique_ptr<Transport>> MakeTransport(ZmqTransport::Options options);

// The same with the settings given.
absl::StatusOr<std::unique_ptr<Transport>> MakeTransport(ZmqTransport::Options options,
                                                         const TransportChoice& choice);

// `inner` wrapped in a FaultTransport applying `spec` (FaultSpec::Parse), or
// `inner` itself when `spec` is empty or only whitespace. `inner` must not be
// started. Logs "fault injection on: <canonical spec>" when it wraps. Errors:
// InvalidArgument for a spec that does not parse (nothing is logged, `inner`
// is destroyed) or a null `inner`.
absl::StatusOr<std::unique_ptr<Transport>> WrapWithFaults(std::unique_ptr<Transport> inner,
                                                          const std::string& spec);

// A bind endpoint for `scheme` on this machine:
//   "tcp": "tcp://HOST:0" (an ephemeral port; HOST defaults to 127.0.0.1, an
//          IPv6 literal is bracketed);
//   "ipc": "ipc:///tmp/tessera-<pid>-<counter>.sock", unique within this
//          process and across live processes (`host` is ignored).
// Returns an empty string for any other scheme.
std::string DefaultBind(const std::string& scheme, const std::string& host);

}  // namespace tessera

#pragma once
// DeviceStaging: pushes from and pulls into device (GPU) memory through a
// few staging host buffers (pinned where CUDA is used), overlapping the
// copies between device and staging memory with the transfers to and from
// the servers.
//
// A call splits the rows of one request into parts of at most
// options.staging_bytes, whole rows each (part k holds rows
// [k * R, min((k + 1) * R, n)), R = staging_bytes / (row_floats * 4)), and
// moves them through options.buffers staging buffers in rotation (part k
// uses buffer k % buffers):
//
//   PushFromDevice, per part k:  device -> staging copy, then Push(part k).
//     The copy of part k + 1 is started as soon as part k's Push has been
//     issued, so it runs while that Push is in flight. A buffer is reused
//     only once the Push that read it completed (the transport may reference
//     the memory until then).
//   PullToDevice: Pulls of parts 0 .. buffers-1 are issued at once. When the
//     Pull of part k completed, its staging -> device copy starts while the
//     Pulls of the following parts stay in flight; the Pull of part
//     k + buffers (into the same buffer) is issued only after that copy
//     finished. Parts are taken in order: a later part that completes first
//     waits for its turn.
//
// Contract:
// - keys stay in host memory; values live in device memory: the "device"
//   side of the Copier in use (CUDA device memory for the CUDA copier, any
//   host memory for HostCopier). device_values / device_out hold
//   keys.size() * row_floats floats, row i for keys[i]. row_floats must be
//   the table's width (the Worker rejects a mismatch; the error is
//   returned).
// - A row larger than a staging buffer is an error (InvalidArgument naming
//   the row's bytes and the buffer's); nothing is sent.
// - An empty key list returns OK at once and moves nothing.
// - The calls block until every part is done, and return OK, or the first
//   error seen (a failed Push or Pull, or a failed copy), with its code and
//   a message that names the part (k of n, its rows) and the table. After
//   the first error no new part is started, but every copy and transfer
//   already started is waited for: nothing is in flight when a call returns,
//   so the caller may free or reuse keys and device memory at once. After a
//   failed pull, device_out holds the parts that completed and is otherwise
//   unchanged or partly written.
// - Ordering: the parts of a push are issued in order from the calling
//   thread, so a later pull from the same Worker reflects them (worker.h).
// - Device work that produces device_values must be complete before the call
//   (see the copier's own contract); after PullToDevice returns, every copy
//   into device_out has finished.
// - Thread safety: calls may come from any thread; they run one at a time
//   (they share the staging buffers), others wait. stats() may be called at
//   any time.
// - Ownership: the Worker (or TransferPort) must outlive the DeviceStaging;
//   the DeviceStaging owns its Copier and thereby the staging buffers.
#include <cstddef>
#include <functional>
#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/clock.h"
#include "common/keys.h"
#include "worker/worker.h"

namespace tessera {

// Moves floats between "device" memory and a fixed set of staging buffers
// that it owns. One copy at most is outstanding per buffer (slot) at a time.
// Implementations: HostCopier (below), the CUDA copier (worker/cuda/), fakes
// in tests. Not thread-safe: one caller at a time.
class Copier {
 public:
  virtual ~Copier() = default;

  // Allocates `count` staging buffers of `bytes` each (a multiple of 4);
  // called once, before any other method. Errors: ResourceExhausted or the
  // allocator's own.
  virtual absl::Status Allocate(size_t count, size_t bytes) = 0;
  // Staging buffer `slot` (bytes / 4 floats), valid from Allocate until the
  // copier is destroyed.
  virtual std::span<float> buffer(size_t slot) = 0;

  // Starts copying `floats` floats from device memory `device_src` into the
  // front of buffer(slot). The slot must have no outstanding copy. On error
  // no copy was started.
  virtual absl::Status StartToHost(size_t slot, const float* device_src, size_t floats) = 0;
  // Starts copying the first `floats` floats of buffer(slot) to device
  // memory `device_dst`. The same rules.
  virtual absl::Status StartToDevice(size_t slot, float* device_dst, size_t floats) = 0;

  // Blocks until the slot's outstanding copy finished; returns how long the
  // copy itself took as the copier measured it (0 when it cannot tell), or
  // the copy's error. Afterwards the slot has no outstanding copy. A slot
  // with no outstanding copy returns 0 at once.
  virtual absl::StatusOr<Nanos> Wait(size_t slot) = 0;
  // True when the slot has no outstanding copy, or its copy finished (Wait
  // then returns without blocking). Never blocks.
  virtual bool Done(size_t slot) = 0;

  // For messages, e.g. "host" or "cuda:0".
  virtual std::string name() const = 0;
};

// The "device" is host memory: copies are memcpy, done when Start returns
// (on the calling thread, which makes them overlap with the transfers in
// flight). For tests, and for builds or machines without CUDA.
class HostCopier final : public Copier {
 public:
  HostCopier() = default;
  HostCopier(const HostCopier&) = delete;
  HostCopier& operator=(const HostCopier&) = delete;

  absl::Status Allocate(size_t count, size_t bytes) override;
  std::span<float> buffer(size_t slot) override;
  absl::Status StartToHost(size_t slot, const float* device_src, size_t floats) override;
  absl::Status StartToDevice(size_t slot, float* device_dst, size_t floats) override;
  absl::StatusOr<Nanos> Wait(size_t slot) override;
  bool Done(size_t /*slot*/) override { return true; }
  std::string name() const override { return "host"; }

 private:
  struct Slot {
    std::unique_ptr<float[]> data;
    size_t floats = 0;
    Nanos last_copy = 0;  // duration of the copy not yet waited for
  };
  absl::Status CheckCopy(size_t slot, const void* device, size_t floats) const;

  std::unique_ptr<Slot[]> slots_;
  size_t count_ = 0;
};

// One push or pull that was issued; Wait() blocks until it completed.
class PendingTransfer {
 public:
  virtual ~PendingTransfer() = default;
  // Blocks until the request completed; returns its status. Idempotent.
  virtual absl::Status Wait() = 0;
  // True once the request completed (Wait returns without blocking).
  virtual bool ready() const = 0;
};

// Where staged parts go: a Worker (MakeWorkerTransferPort) in production, a
// fake in tests. Push and Pull follow worker.h: the memory behind keys,
// values and out stays referenced until the returned transfer completed.
class TransferPort {
 public:
  virtual ~TransferPort() = default;
  virtual std::unique_ptr<PendingTransfer> Push(uint32_t table, std::span<const Key> keys,
                                                std::span<const float> values) = 0;
  virtual std::unique_ptr<PendingTransfer> Pull(uint32_t table, std::span<const Key> keys,
                                                std::span<float> out) = 0;
};

// Push and Pull of `worker` (which must outlive the port).
std::unique_ptr<TransferPort> MakeWorkerTransferPort(Worker& worker);

struct DeviceStagingOptions {
  size_t staging_bytes = 4 << 20;  // bytes per staging buffer: a part holds as many whole rows as fit, >= 4
  size_t buffers = 3;              // staging buffers in rotation = most parts in flight, 1..64 (2-4 overlap)
};

class DeviceStaging {
 public:
  // What the calls did since creation. Times are summed over calls.
  struct Stats {
    uint64_t pushes = 0;           // PushFromDevice calls (successful or not)
    uint64_t pulls = 0;            // PullToDevice calls (successful or not)
    uint64_t failed_calls = 0;     // calls that returned an error
    uint64_t parts_pushed = 0;     // pushes issued for parts
    uint64_t parts_pulled = 0;     // pulls issued for parts
    uint64_t bytes_to_host = 0;    // device -> staging bytes copied (pushes)
    uint64_t bytes_to_device = 0;  // staging -> device bytes copied (pulls)
    Nanos copy_time = 0;           // the copies' own durations, as the copier measured them
    // Of copy_time, the copies started while at least one transfer of the
    // same call was still in flight: the copy time hidden behind transfers
    // (an upper bound: a transfer may finish while the copy runs).
    Nanos copy_time_overlapped = 0;
    Nanos copy_wait = 0;      // time the calling thread blocked waiting for copies
    Nanos transfer_wait = 0;  // time the calling thread blocked waiting for pushes and pulls
    Nanos wall = 0;           // time spent in the calls (from the start of the work to its end)
  };

  // Allocates options.buffers staging buffers of options.staging_bytes
  // (rounded down to whole floats) from `copier`. Errors: InvalidArgument
  // for bad options, the copier's allocation error.
  static absl::StatusOr<std::unique_ptr<DeviceStaging>> Create(Worker& worker, std::unique_ptr<Copier> copier,
                                                               DeviceStagingOptions options = {});
  // The same over any TransferPort, which must outlive the DeviceStaging.
  static absl::StatusOr<std::unique_ptr<DeviceStaging>> Create(TransferPort& port, std::unique_ptr<Copier> copier,
                                                               DeviceStagingOptions options = {});

  DeviceStaging(const DeviceStaging&) = delete;
  DeviceStaging& operator=(const DeviceStaging&) = delete;
  ~DeviceStaging();

  // Pushes keys.size() rows of row_floats floats from device memory.
  absl::Status PushFromDevice(uint32_t table, std::span<const Key> keys, const float* device_values,
                              size_t row_floats);
  // Pulls keys.size() rows of row_floats floats into device memory.
  absl::Status PullToDevice(uint32_t table, std::span<const Key> keys, float* device_out, size_t row_floats);

  // Rows per part for rows of row_floats floats (0 when a row does not fit).
  size_t RowsPerPart(size_t row_floats) const;
  const DeviceStagingOptions& options() const { return options_; }
  Stats stats() const;

 private:
  class Call;
  DeviceStaging(std::unique_ptr<TransferPort> owned_port, TransferPort& port, std::unique_ptr<Copier> copier,
                DeviceStagingOptions options);
  absl::Status CheckRequest(std::span<const Key> keys, const void* device, size_t row_floats) const;
  void AddStats(const Stats& call);
  // One push or pull: checks, runs `body` on a Call under the call lock, and
  // adds the call's figures to the stats.
  absl::Status RunCall(bool push, uint32_t table, std::span<const Key> keys, const void* device, size_t row_floats,
                       const std::function<absl::Status(Call&)>& body);

  const DeviceStagingOptions options_;
  const size_t buffer_floats_;
  std::unique_ptr<TransferPort> owned_port_;  // set when made over a Worker
  TransferPort& port_;

  // One call at a time owns the copier and its buffers.
  // Invariants: outside a call, no copy and no transfer is outstanding.
  std::mutex call_mu_;
  std::unique_ptr<Copier> copier_ ABSL_GUARDED_BY(call_mu_);

  mutable std::mutex stats_mu_;
  Stats stats_ ABSL_GUARDED_BY(stats_mu_);
};

}  // namespace tessera

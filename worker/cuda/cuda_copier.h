#pragma once
// The CUDA copier for DeviceStaging (worker/device_staging.h): pinned
// staging buffers and asynchronous copies between them and CUDA device
// memory.
//
// Contract:
// - MakeCudaCopier() returns a Copier for `options.device`, or Unavailable
//   with the reason when no CUDA device can be used (for example "no CUDA
//   device: cudaGetDeviceCount returned 35 (cudaErrorInsufficientDriver:
//   ...)") or when this build has no CUDA support; InvalidArgument for a
//   device index that does not exist.
// - Buffers: Allocate() takes page-locked host memory (cudaMallocHost), so
//   copies run by DMA, asynchronously to the host, and the transport may
//   read or write the buffers directly. Freed when the copier is destroyed.
// - Copies: cudaMemcpyAsync (cudaMemcpyDefault: any memory the CUDA driver
//   can address, device memory as well as managed or host memory) on one
//   stream of the copier's own, each bracketed by two events of its slot;
//   Wait() synchronizes on the slot's end event (blocking, not spinning)
//   and reports the copy's duration as the device measured it; Done()
//   queries the event. A CUDA error is returned as Internal with its name.
// - Ordering with the caller's device work: the copier's stream is a
//   blocking stream, so work the caller queued earlier on the legacy default
//   stream is finished before a copy starts. Work on other streams (or with
//   per-thread default streams) must be synchronized by the caller before
//   PushFromDevice. PullToDevice returns only after its copies finished.
// - Every call makes options.device current on the calling thread for its
//   duration and restores the previous device.
// - Not thread-safe (Copier's rule: one caller at a time).
#include <memory>

#include "absl/status/statusor.h"
#include "worker/device_staging.h"

namespace tessera {

struct CudaCopierOptions {
  int device = 0;  // CUDA device index the copies run on
};

absl::StatusOr<std::unique_ptr<Copier>> MakeCudaCopier(CudaCopierOptions options = {});

}  // namespace tessera

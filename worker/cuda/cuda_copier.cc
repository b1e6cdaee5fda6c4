#include "worker/cuda/cuda_copier.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"

namespace tessera {
namespace {

std::string Describe(cudaError_t e) {
  return absl::StrCat(static_cast<int>(e), " (", cudaGetErrorName(e), ": ", cudaGetErrorString(e), ")");
}

absl::Status CudaError(cudaError_t e, const std::string& what) {
  if (e == cudaSuccess) return absl::OkStatus();
  const std::string message = absl::StrCat("CUDA ", what, " failed with error ", Describe(e));
  if (e == cudaErrorMemoryAllocation) return absl::ResourceExhaustedError(message);
  return absl::InternalError(message);
}

// Makes `device` current on this thread for the scope; restores the
// previous device afterwards.
class ScopedDevice {
 public:
  explicit ScopedDevice(int device) {
    if (cudaGetDevice(&previous_) == cudaSuccess && previous_ == device) return;
    status_ = cudaSetDevice(device);
    switched_ = status_ == cudaSuccess;
  }
  ~ScopedDevice() {
    if (switched_) cudaSetDevice(previous_);
  }
  ScopedDevice(const ScopedDevice&) = delete;
  ScopedDevice& operator=(const ScopedDevice&) = delete;
  cudaError_t status() const { return status_; }

 private:
  int previous_ = -1;
  bool switched_ = false;
  cudaError_t status_ = cudaSuccess;
};

class CudaCopier final : public Copier {
 public:
  CudaCopier(int device, cudaStream_t stream) : device_(device), stream_(stream) {}
  CudaCopier(const CudaCopier&) = delete;
  CudaCopier& operator=(const CudaCopier&) = delete;

  ~CudaCopier() override {
    ScopedDevice on(device_);
    cudaStreamSynchronize(stream_);  // nothing may still read or write the buffers
    for (Slot& s : slots_) {
      if (s.host != nullptr) cudaFreeHost(s.host);
      if (s.start != nullptr) cudaEventDestroy(s.start);
      if (s.done != nullptr) cudaEventDestroy(s.done);
    }
    cudaStreamDestroy(stream_);
  }

  absl::Status Allocate(size_t count, size_t bytes) override {
    if (!slots_.empty()) return absl::FailedPreconditionError("CUDA copier: buffers already allocated");
    if (bytes % sizeof(float) != 0) {
      return absl::InvalidArgumentError(absl::StrCat("CUDA copier: buffer size ", bytes, " is not a multiple of 4"));
    }
    ScopedDevice on(device_);
    if (absl::Status s = CudaError(on.status(), "cudaSetDevice"); !s.ok()) return s;
    // Filled in place, so that the destructor frees whatever was taken.
    slots_.resize(count);
    for (Slot& slot : slots_) {
      void* host = nullptr;
      if (absl::Status s = CudaError(cudaMallocHost(&host, std::max<size_t>(bytes, sizeof(float))),
                                     absl::StrCat("cudaMallocHost of ", bytes, " bytes"));
          !s.ok()) {
        return s;
      }
      slot.host = static_cast<float*>(host);
      slot.floats = bytes / sizeof(float);
      if (absl::Status s = CudaError(cudaEventCreateWithFlags(&slot.start, cudaEventBlockingSync), "cudaEventCreate");
          !s.ok()) {
        return s;
      }
      if (absl::Status s = CudaError(cudaEventCreateWithFlags(&slot.done, cudaEventBlockingSync), "cudaEventCreate");
          !s.ok()) {
        return s;
      }
    }
    return absl::OkStatus();
  }

  std::span<float> buffer(size_t slot) override {
    if (slot >= slots_.size()) return {};
    return {slots_[slot].host, slots_[slot].floats};
  }

  absl::Status StartToHost(size_t slot, const float* device_src, size_t floats) override {
    if (absl::Status s = CheckCopy(slot, device_src, floats); !s.ok()) return s;
    return Start(slot, slots_[slot].host, device_src, floats);
  }

  absl::Status StartToDevice(size_t slot, float* device_dst, size_t floats) override {
    if (absl::Status s = CheckCopy(slot, device_dst, floats); !s.ok()) return s;
    return Start(slot, device_dst, slots_[slot].host, floats);
  }

  absl::StatusOr<Nanos> Wait(size_t slot) override {
    if (slot >= slots_.size()) return SlotError(slot);
    Slot& s = slots_[slot];
    if (!s.pending) return Nanos{0};
    ScopedDevice on(device_);
    s.pending = false;
    if (absl::Status st = CudaError(cudaEventSynchronize(s.done), "copy"); !st.ok()) return st;
    float ms = 0;
    if (cudaEventElapsedTime(&ms, s.start, s.done) != cudaSuccess) return Nanos{0};
    return static_cast<Nanos>(static_cast<double>(ms) * 1e6);
  }

  bool Done(size_t slot) override {
    if (slot >= slots_.size() || !slots_[slot].pending) return true;
    ScopedDevice on(device_);
    // Any answer but "not ready" means Wait() will not block (errors included).
    return cudaEventQuery(slots_[slot].done) != cudaErrorNotReady;
  }

  std::string name() const override { return absl::StrCat("cuda:", device_); }

 private:
  struct Slot {
    float* host = nullptr;  // pinned, `floats` long
    size_t floats = 0;
    cudaEvent_t start = nullptr;  // recorded before the copy
    cudaEvent_t done = nullptr;   // recorded after it
    bool pending = false;         // a copy was started and not yet waited for
  };

  absl::Status SlotError(size_t slot) const {
    return absl::InvalidArgumentError(absl::StrCat("CUDA copier: slot ", slot, " of ", slots_.size()));
  }

  absl::Status CheckCopy(size_t slot, const void* device, size_t floats) const {
    if (slot >= slots_.size()) return SlotError(slot);
    if (slots_[slot].pending) {
      return absl::FailedPreconditionError(absl::StrCat("CUDA copier: slot ", slot, " has a copy outstanding"));
    }
    if (floats > slots_[slot].floats) {
      return absl::InvalidArgumentError(absl::StrCat("CUDA copier: ", floats, " floats do not fit a buffer of ",
                                                     slots_[slot].floats));
    }
    if (floats > 0 && device == nullptr) return absl::InvalidArgumentError("CUDA copier: null device memory");
    return absl::OkStatus();
  }

  absl::Status Start(size_t slot, void* dst, const void* src, size_t floats) {
    Slot& s = slots_[slot];
    ScopedDevice on(device_);
    if (absl::Status st = CudaError(on.status(), "cudaSetDevice"); !st.ok()) return st;
    if (absl::Status st = CudaError(cudaEventRecord(s.start, stream_), "cudaEventRecord"); !st.ok()) return st;
    if (floats > 0) {
      if (absl::Status st = CudaError(cudaMemcpyAsync(dst, src, floats * sizeof(float), cudaMemcpyDefault, stream_),
                                      "cudaMemcpyAsync");
          !st.ok()) {
        return st;
      }
    }
    if (absl::Status st = CudaError(cudaEventRecord(s.done, stream_), "cudaEventRecord"); !st.ok()) {
      // The copy may be queued already: let it finish before the slot is reused.
      cudaStreamSynchronize(stream_);
      return st;
    }
    s.pending = true;
    return absl::OkStatus();
  }

  const int device_;
  const cudaStream_t stream_;
  // Invariants: a slot has at most one copy outstanding (pending); its
  // events are recorded on stream_ around that copy.
  std::vector<Slot> slots_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Copier>> MakeCudaCopier(CudaCopierOptions options) {
  int count = 0;  // left unwritten when the call fails
  const cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess) {
    return absl::UnavailableError(absl::StrCat("no CUDA device: cudaGetDeviceCount returned ", Describe(e)));
  }
  if (count <= 0) return absl::UnavailableError("no CUDA device: cudaGetDeviceCount found none");
  if (options.device < 0 || options.device >= count) {
    return absl::InvalidArgumentError(
        absl::StrCat("no CUDA device ", options.device, ": this machine has ", count, " (0..", count - 1, ")"));
  }
  ScopedDevice on(options.device);
  if (on.status() != cudaSuccess) {
    return absl::UnavailableError(
        absl::StrCat("CUDA device ", options.device, " cannot be used: cudaSetDevice returned ", Describe(on.status())));
  }
  cudaStream_t stream = nullptr;
  // A blocking stream: ordered after work on the legacy default stream.
  if (absl::Status s = CudaError(cudaStreamCreateWithFlags(&stream, cudaStreamDefault), "cudaStreamCreate");
      !s.ok()) {
    return s;
  }
  return std::unique_ptr<Copier>(std::make_unique<CudaCopier>(options.device, stream));
}

}  // namespace tessera

// MakeCudaCopier in builds without CUDA support.
#include "worker/cuda/cuda_copier.h"

namespace tessera {

absl::StatusOr<std::unique_ptr<Copier>> MakeCudaCopier(CudaCopierOptions) {
  return absl::UnavailableError(
      "no CUDA copier: this build has no CUDA support (no CUDA toolkit was found at build time, or "
      "TESSERA_CUDA=OFF); use HostCopier for host memory");
}

}  // namespace tessera

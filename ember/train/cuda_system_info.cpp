// CUDA library versions for system_info (system_info.h); compiled only in CUDA builds (files named cuda_*.cpp), so the
// CUDA and cuDNN headers stay out of every other file. Invariant: failures read as "unknown" (0), never throw.
#include <cuda_runtime_api.h>

#include "ember/train/system_info.h"

#if defined(EMBER_WITH_CUDNN)
#include <cudnn.h>
#endif

namespace ember::train::detail {

int cuda_runtime_version() {
  int v = 0;
  return cudaRuntimeGetVersion(&v) == cudaSuccess ? v : 0;
}

int cuda_driver_version() {
  int v = 0;
  return cudaDriverGetVersion(&v) == cudaSuccess ? v : 0;
}

int64_t cudnn_version() {
#if defined(EMBER_WITH_CUDNN)
  return static_cast<int64_t>(cudnnGetVersion());
#else
  return 0;
#endif
}

}  // namespace ember::train::detail

// CUDA library versions for system_info (system_info.h); compiled only in CUDA builds (files named cuda_*.cpp), so the
// CUDA and cuDNN headers stay out of every other file. Invariant: failures read as "unknown" (0) or "unavailable
// (<reason>)", never throw.
#include <cublasLt.h>
#include <cuda_runtime_api.h>

#include <string>

#include "ember/base/error.h"

#include "ember/train/system_info.h"

#if defined(EMBER_WITH_CUDNN)
#include <cudnn.h>
#endif
#if defined(EMBER_WITH_CUSPARSE)
#include <cusparse.h>
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

// "13.1.0" from cuBLAS's encoding 10000 * major + 100 * minor + patch.
std::string cublaslt_version() {
  try {
    const size_t v = cublasLtGetVersion();
    return std::to_string(v / 10000) + "." + std::to_string(v % 10000 / 100) + "." + std::to_string(v % 100);
  } catch (const Error& e) {
    return std::string("unavailable (") + e.what() + ")";
  }
}

std::string cusparse_version() {
#if defined(EMBER_WITH_CUSPARSE)
  try {
    int major = 0, minor = 0, patch = 0;
    if (cusparseGetProperty(MAJOR_VERSION, &major) != CUSPARSE_STATUS_SUCCESS ||
        cusparseGetProperty(MINOR_VERSION, &minor) != CUSPARSE_STATUS_SUCCESS ||
        cusparseGetProperty(PATCH_LEVEL, &patch) != CUSPARSE_STATUS_SUCCESS)
      return "unknown";
    return std::to_string(major) + "." + std::to_string(minor) + "." + std::to_string(patch);
  } catch (const Error& e) {
    return std::string("unavailable (") + e.what() + ")";
  }
#else
  return "";
#endif
}

}  // namespace ember::train::detail

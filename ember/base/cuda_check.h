// The checked-call macro for the CUDA runtime and for kernel launches (DESIGN.md §7).
// Every cuda* call in ember goes through EMBER_CUDA_CHECK; every <<<>>> launch is followed by EMBER_CUDA_LAUNCH_CHECK.
// Library-specific members of the family (cuBLAS, cuDNN) live in kernels/cuda/library_check.h.
#pragma once

#include <cuda_runtime.h>

#include "ember/base/error.h"

namespace ember::detail {
[[noreturn]] inline void throw_backend_error(const char* library, const char* expr, const char* status,
                                             const char* file, int line) {
  throw BackendError(concat(library, " call failed: ", expr, " returned ", status, " at ", file, ":", line));
}
}  // namespace ember::detail

#define EMBER_CUDA_CHECK(expr)                                                                         \
  do {                                                                                                 \
    cudaError_t ember_status_ = (expr);                                                                \
    if (ember_status_ != cudaSuccess) {                                                                \
      (void)cudaGetLastError(); /* a caught error must not resurface at the next launch check */       \
      ::ember::detail::throw_backend_error("CUDA", #expr, cudaGetErrorString(ember_status_), __FILE__, \
                                           __LINE__);                                                  \
    }                                                                                                  \
  } while (0)

// After a kernel launch: picks up launch-configuration errors without synchronising.
#define EMBER_CUDA_LAUNCH_CHECK() EMBER_CUDA_CHECK(cudaGetLastError())

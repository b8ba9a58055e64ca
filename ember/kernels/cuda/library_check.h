// The library members of the checked-call family (DESIGN.md §7): EMBER_CUBLAS_CHECK and, where cuDNN / cuSPARSE are
// built in (EMBER_WITH_CUDNN / EMBER_WITH_CUSPARSE, private definitions of the library), EMBER_CUDNN_CHECK and
// EMBER_CUSPARSE_CHECK. Like EMBER_CUDA_CHECK in
// base/cuda_check.h, each throws ember::BackendError carrying the expression, the status name, file and line.
#pragma once

#include <cublasLt.h>

#include <string>

#include "ember/base/cuda_check.h"

#if defined(EMBER_WITH_CUDNN)
#include <cudnn.h>
#endif
#if defined(EMBER_WITH_CUSPARSE)
#include <cusparse.h>
#endif

namespace ember::detail {

// "CUBLAS_STATUS_NOT_SUPPORTED (the functionality requested is not supported)".
inline std::string cublas_status_text(cublasStatus_t status) {
  const char* name = cublasLtGetStatusName(status);
  const char* text = cublasLtGetStatusString(status);
  std::string s = name != nullptr ? name : concat("cublasStatus_t ", static_cast<int>(status));
  if (text != nullptr) s += concat(" (", text, ")");
  return s;
}

#if defined(EMBER_WITH_CUSPARSE)
// "CUSPARSE_STATUS_INVALID_VALUE (invalid value)".
inline std::string cusparse_status_text(cusparseStatus_t status) {
  const char* name = cusparseGetErrorName(status);
  const char* text = cusparseGetErrorString(status);
  std::string s = name != nullptr ? name : concat("cusparseStatus_t ", static_cast<int>(status));
  if (text != nullptr) s += concat(" (", text, ")");
  return s;
}
#endif

}  // namespace ember::detail

#define EMBER_CUBLAS_CHECK(expr)                                                                      \
  do {                                                                                                \
    cublasStatus_t ember_cublas_status_ = (expr);                                                     \
    if (ember_cublas_status_ != CUBLAS_STATUS_SUCCESS)                                                \
      ::ember::detail::throw_backend_error("cuBLAS", #expr,                                           \
                                           ::ember::detail::cublas_status_text(ember_cublas_status_)  \
                                               .c_str(),                                              \
                                           __FILE__, __LINE__);                                       \
  } while (0)

#if defined(EMBER_WITH_CUDNN)
#define EMBER_CUDNN_CHECK(expr)                                                                        \
  do {                                                                                                 \
    cudnnStatus_t ember_cudnn_status_ = (expr);                                                        \
    if (ember_cudnn_status_ != CUDNN_STATUS_SUCCESS)                                                   \
      ::ember::detail::throw_backend_error("cuDNN", #expr, cudnnGetErrorString(ember_cudnn_status_),   \
                                           __FILE__, __LINE__);                                        \
  } while (0)
#endif

#if defined(EMBER_WITH_CUSPARSE)
#define EMBER_CUSPARSE_CHECK(expr)                                                                                \
  do {                                                                                                            \
    cusparseStatus_t ember_cusparse_status_ = (expr);                                                             \
    if (ember_cusparse_status_ != CUSPARSE_STATUS_SUCCESS)                                                        \
      ::ember::detail::throw_backend_error("cuSPARSE", #expr,                                                     \
                                           ::ember::detail::cusparse_status_text(ember_cusparse_status_).c_str(), \
                                           __FILE__, __LINE__);                                                   \
  } while (0)
#endif

// The cuSPARSE functions ember calls (kernels/cuda/sparse_matmul.cpp, library_check.h, train/cuda_system_info.cpp),
// forwarded to libcusparse opened on first use (Note [Libraries opened on first use] in base/dynamic_library.h).
// Compiled with hidden visibility, only where cuSPARSE was found (EMBER_WITH_CUSPARSE). Invariant: one forwarder per
// function called, with the header's own declaration (a mismatch does not compile).
#if defined(EMBER_WITH_CUSPARSE)
#include <cusparse.h>

#include <string>

#include "ember/base/dynamic_library.h"

#ifndef EMBER_CUSPARSE_DIR
#define EMBER_CUSPARSE_DIR ""
#endif

namespace {

ember::DynamicLibrary& cusparse_library() {
  static ember::DynamicLibrary* lib = new ember::DynamicLibrary(
      "cuSPARSE", "libcusparse.so." + std::to_string(CUSPARSE_VER_MAJOR), {EMBER_CUSPARSE_DIR});
  return *lib;
}

}  // namespace

extern "C" {

EMBER_FORWARD(cusparse_library, cusparseStatus_t, cusparseGetProperty, (libraryPropertyType type, int* value),
              (type, value))
EMBER_FORWARD(cusparse_library, const char*, cusparseGetErrorName, (cusparseStatus_t status), (status))
EMBER_FORWARD(cusparse_library, const char*, cusparseGetErrorString, (cusparseStatus_t status), (status))
EMBER_FORWARD(cusparse_library, cusparseStatus_t, cusparseCreate, (cusparseHandle_t * handle), (handle))
EMBER_FORWARD(cusparse_library, cusparseStatus_t, cusparseSetStream, (cusparseHandle_t handle, cudaStream_t stream),
              (handle, stream))
EMBER_FORWARD(cusparse_library, cusparseStatus_t, cusparseDestroySpMat, (cusparseConstSpMatDescr_t mat), (mat))
EMBER_FORWARD(cusparse_library, cusparseStatus_t, cusparseDestroyDnMat, (cusparseConstDnMatDescr_t mat), (mat))
EMBER_FORWARD(cusparse_library, cusparseStatus_t, cusparseCreateConstCsr,
              (cusparseConstSpMatDescr_t * mat, int64_t rows, int64_t cols, int64_t nnz, const void* row_offsets,
               const void* col_ind, const void* values, cusparseIndexType_t row_offsets_type,
               cusparseIndexType_t col_ind_type, cusparseIndexBase_t base, cudaDataType value_type),
              (mat, rows, cols, nnz, row_offsets, col_ind, values, row_offsets_type, col_ind_type, base, value_type))
EMBER_FORWARD(cusparse_library, cusparseStatus_t, cusparseCreateConstDnMat,
              (cusparseConstDnMatDescr_t * mat, int64_t rows, int64_t cols, int64_t ld, const void* values,
               cudaDataType value_type, cusparseOrder_t order),
              (mat, rows, cols, ld, values, value_type, order))
EMBER_FORWARD(cusparse_library, cusparseStatus_t, cusparseCreateDnMat,
              (cusparseDnMatDescr_t * mat, int64_t rows, int64_t cols, int64_t ld, void* values,
               cudaDataType value_type, cusparseOrder_t order),
              (mat, rows, cols, ld, values, value_type, order))
EMBER_FORWARD(cusparse_library, cusparseStatus_t, cusparseSpMM_bufferSize,
              (cusparseHandle_t handle, cusparseOperation_t op_a, cusparseOperation_t op_b, const void* alpha,
               cusparseConstSpMatDescr_t a, cusparseConstDnMatDescr_t b, const void* beta, cusparseDnMatDescr_t c,
               cudaDataType compute, cusparseSpMMAlg_t alg, size_t* bytes),
              (handle, op_a, op_b, alpha, a, b, beta, c, compute, alg, bytes))
EMBER_FORWARD(cusparse_library, cusparseStatus_t, cusparseSpMM,
              (cusparseHandle_t handle, cusparseOperation_t op_a, cusparseOperation_t op_b, const void* alpha,
               cusparseConstSpMatDescr_t a, cusparseConstDnMatDescr_t b, const void* beta, cusparseDnMatDescr_t c,
               cudaDataType compute, cusparseSpMMAlg_t alg, void* buffer),
              (handle, op_a, op_b, alpha, a, b, beta, c, compute, alg, buffer))

}  // extern "C"
#endif  // EMBER_WITH_CUSPARSE

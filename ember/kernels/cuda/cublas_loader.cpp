// The cuBLASLt functions ember calls (kernels/cuda/blas.cu, library_check.h, conv_cudnn.cpp,
// train/cuda_system_info.cpp), forwarded to libcublasLt opened on first use (Note [Libraries opened on first use] in
// base/dynamic_library.h). Compiled with hidden visibility. Invariant: one forwarder per function called, with
// the header's own declaration (a mismatch does not compile).
#include <cublasLt.h>

#include <string>

#include "ember/base/dynamic_library.h"

#ifndef EMBER_CUBLASLT_DIR
#define EMBER_CUBLASLT_DIR ""
#endif

namespace {

ember::DynamicLibrary& cublaslt_library() {
  static ember::DynamicLibrary* lib =
      new ember::DynamicLibrary("cuBLASLt", "libcublasLt.so." + std::to_string(CUBLAS_VER_MAJOR), {EMBER_CUBLASLT_DIR});
  return *lib;
}

}  // namespace

extern "C" {

EMBER_FORWARD(cublaslt_library, size_t, cublasLtGetVersion, (void), ())
EMBER_FORWARD(cublaslt_library, const char*, cublasLtGetStatusName, (cublasStatus_t status), (status))
EMBER_FORWARD(cublaslt_library, const char*, cublasLtGetStatusString, (cublasStatus_t status), (status))
EMBER_FORWARD(cublaslt_library, cublasStatus_t, cublasLtCreate, (cublasLtHandle_t * handle), (handle))
EMBER_FORWARD(cublaslt_library, cublasStatus_t, cublasLtMatmulDescCreate,
              (cublasLtMatmulDesc_t * desc, cublasComputeType_t compute, cudaDataType_t scale), (desc, compute, scale))
EMBER_FORWARD(cublaslt_library, cublasStatus_t, cublasLtMatmulDescDestroy, (cublasLtMatmulDesc_t desc), (desc))
EMBER_FORWARD(cublaslt_library, cublasStatus_t, cublasLtMatmulDescSetAttribute,
              (cublasLtMatmulDesc_t desc, cublasLtMatmulDescAttributes_t attr, const void* buf, size_t bytes),
              (desc, attr, buf, bytes))
EMBER_FORWARD(cublaslt_library, cublasStatus_t, cublasLtMatrixLayoutCreate,
              (cublasLtMatrixLayout_t * layout, cudaDataType type, uint64_t rows, uint64_t cols, int64_t ld),
              (layout, type, rows, cols, ld))
EMBER_FORWARD(cublaslt_library, cublasStatus_t, cublasLtMatrixLayoutDestroy, (cublasLtMatrixLayout_t layout), (layout))
EMBER_FORWARD(cublaslt_library, cublasStatus_t, cublasLtMatrixLayoutSetAttribute,
              (cublasLtMatrixLayout_t layout, cublasLtMatrixLayoutAttribute_t attr, const void* buf, size_t bytes),
              (layout, attr, buf, bytes))
EMBER_FORWARD(cublaslt_library, cublasStatus_t, cublasLtMatmulPreferenceCreate, (cublasLtMatmulPreference_t * pref),
              (pref))
EMBER_FORWARD(cublaslt_library, cublasStatus_t, cublasLtMatmulPreferenceDestroy, (cublasLtMatmulPreference_t pref),
              (pref))
EMBER_FORWARD(cublaslt_library, cublasStatus_t, cublasLtMatmulPreferenceSetAttribute,
              (cublasLtMatmulPreference_t pref, cublasLtMatmulPreferenceAttributes_t attr, const void* buf,
               size_t bytes),
              (pref, attr, buf, bytes))
EMBER_FORWARD(cublaslt_library, cublasStatus_t, cublasLtMatmulAlgoGetHeuristic,
              (cublasLtHandle_t handle, cublasLtMatmulDesc_t desc, cublasLtMatrixLayout_t a, cublasLtMatrixLayout_t b,
               cublasLtMatrixLayout_t c, cublasLtMatrixLayout_t d, cublasLtMatmulPreference_t pref, int requested,
               cublasLtMatmulHeuristicResult_t results[], int* returned),
              (handle, desc, a, b, c, d, pref, requested, results, returned))
EMBER_FORWARD(cublaslt_library, cublasStatus_t, cublasLtMatmul,
              (cublasLtHandle_t handle, cublasLtMatmulDesc_t desc, const void* alpha, const void* a,
               cublasLtMatrixLayout_t a_desc, const void* b, cublasLtMatrixLayout_t b_desc, const void* beta,
               const void* c, cublasLtMatrixLayout_t c_desc, void* d, cublasLtMatrixLayout_t d_desc,
               const cublasLtMatmulAlgo_t* algo, void* workspace, size_t workspace_bytes, cudaStream_t stream),
              (handle, desc, alpha, a, a_desc, b, b_desc, beta, c, c_desc, d, d_desc, algo, workspace, workspace_bytes,
               stream))

}  // extern "C"

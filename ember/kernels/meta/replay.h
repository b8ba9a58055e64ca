// Replays of the CUDA kernels' workspace on meta (Note [Dry-run targets] in core/meta_scope.h): each function takes, as
// meta tensors and in the order and for the lifetimes the CUDA entry point of its stub takes them, the scratch that
// entry allocates from the caching allocator, and computes nothing. Registered with EMBER_REGISTER_CUDA_REPLAY in
// every build, CUDA or not. Invariant: each replay mirrors the CUDA entry it names; tests/kernels/test_cuda_replay.cpp
// holds the replays to hand-computed bytes and, on a GPU, to the CUDA allocator's peak.
#pragma once

#include <cstdint>

#include "ember/core/meta_scope.h"
#include "ember/core/tensor.h"
#include "ember/kernels/cpu/meta_workspace.h"

namespace ember::kernels::meta {

using cpu::MetaWorkspace;

// Whether a tensor's first element lies on an n-byte boundary in a real run. The caching allocator hands out blocks
// on 512-byte boundaries, so the storage offset decides — on meta as on the device.
inline bool aligned(const Tensor& t, int64_t n) { return t.storage_offset() * t.itemsize() % n == 0; }

// One matrix operand of cuda::gemm(): element strides of its batch, rows and columns.
struct GemmOperand {
  int64_t batch_stride, row_stride, col_stride;
};

// cuda::gemm()'s scratch (blas.cu, Note [GEMM through cuBLASLt]): a packed copy of each operand whose strides
// cuBLASLt cannot read in place, held for the call, and per call of at most 64,512 batches the cuBLASLt workspace
// the target assumes (MetaTarget::gemm_workspace_bytes), freed when that call returns.
void replay_gemm(DType dtype, int64_t batch, int64_t M, int64_t N, int64_t K, const GemmOperand& a,
                 const GemmOperand& b);

// The workspace of one cuBLASLt call with operands read in place: taken and given back.
void replay_gemm_workspace();

}  // namespace ember::kernels::meta

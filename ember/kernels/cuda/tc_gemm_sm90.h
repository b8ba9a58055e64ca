// The Hopper GEMM (wgmma + TMA, Note [Hopper GEMM] in tc_gemm_sm90_kernel.cuh) behind tensor_core_gemm (blas.h):
// when it applies and how it is launched. Internal to kernels/cuda/.
// Invariant: wgmma_gemm runs only where wgmma_gemm_applies returned true for the same operands and device.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "ember/core/dtype.h"
#include "ember/kernels/cuda/blas.h"

namespace ember::cuda {

// True when the kernel can take these operands on `device`: wgmma_gemm_supported(device), not both operands
// transposed, N and the stored rows of a and b (K or M, N or K) multiples of 8 (TMA's 16-byte global strides), a and b
// 16-byte aligned, and M, N, K below 2^31 (TMA's 32-bit coordinates).
bool wgmma_gemm_applies(int64_t M, int64_t N, int64_t K, const TcGemmOperands& ops, int device);

// How many clusters of 2 blocks of the kernel fit on `device` at once (cudaOccupancyMaxActiveClusters; the 128- and
// 256-wide kernels take the same shared memory, the smaller count of the two); 0 where the kernel does not run.
int wgmma_max_clusters(int device);

// The tile width and cluster size a product of this shape runs with, on `sm_count` SMs of which `max_clusters`
// clusters of 2 fit at once: set_wgmma_config's fixed values, the rest chosen by the fewest waves of units (blocks or
// clusters) times the bytes a block loads per k step (Note [Hopper GEMM], "Tile width"), a tie to the smaller unit.
// When the chosen cluster of 2 fits nowhere (max_clusters 0) only single blocks are considered.
WgmmaConfig wgmma_config_for(int64_t batch, int64_t M, int64_t N, int sm_count, int max_clusters);

// out[b] = a[b] @ bm[b] (+ bias) for the operands of tensor_core_gemm (blas.h), out [batch, M, N] contiguous; dtype
// f16 or bf16; batch, M, N, K >= 1.
void wgmma_gemm(DType dtype, int64_t batch, int64_t M, int64_t N, int64_t K, const TcGemmOperands& ops, void* out,
                cudaStream_t stream);

}  // namespace ember::cuda

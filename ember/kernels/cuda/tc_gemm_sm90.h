// The Hopper GEMM (wgmma + TMA, Note [Hopper GEMM] in tc_gemm_sm90_kernel.cuh) behind tensor_core_gemm (blas.h):
// when it applies and how it is launched. Internal to kernels/cuda/.
// Invariant: wgmma_gemm runs only where wgmma_gemm_applies returned true for the same operands and device.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "ember/core/dtype.h"
#include "ember/kernels/cuda/blas.h"

namespace ember::cuda {

// True when the kernel can take these operands on `device`: wgmma_gemm_supported(device), K and N multiples of 8
// (TMA's 16-byte global strides), a and b 16-byte aligned, and M, N, K below 2^31 (TMA's 32-bit coordinates).
bool wgmma_gemm_applies(int64_t M, int64_t N, int64_t K, const void* a, const void* b, int device);

// The tile width (N columns per block: 256, 128 or 64) for a product on `sm_count` SMs: the fewest waves times bytes
// loaded per tile and k step (128 + width), the widest on a tie (Note [Hopper GEMM], "Tile width").
int wgmma_tile_width(int64_t batch, int64_t M, int64_t N, int sm_count);

// The tile width and cluster size a product of this shape runs with: set_wgmma_config's fixed values, else the tile
// width above and clusters of 2 (B shared by multicast) for widths 128 and 256 when M spans more than one tile.
WgmmaConfig wgmma_config_for(int64_t batch, int64_t M, int64_t N, int sm_count);

// out[b] = a[b] @ bm[b] for contiguous row-major a [batch, M, K], b [batch, K, N], out [batch, M, N]; dtype f16 or
// bf16; batch, M, N, K >= 1.
void wgmma_gemm(DType dtype, int64_t batch, int64_t M, int64_t N, int64_t K, const void* a, const void* b, void* out,
                cudaStream_t stream);

}  // namespace ember::cuda

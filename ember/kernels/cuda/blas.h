// The GEMM entry of the CUDA backend: strided-batched row-major products through cuBLASLt (the default) or the
// hand-written tensor-core kernel (a strategy for benchmarking), used by bmm and by the im2col convolution path.
// Invariant: every workspace comes from the caching allocator on the stream the product runs on; nothing here
// synchronises the host.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "ember/core/dtype.h"

namespace ember::cuda {

// A batch of row-major matrices: element (b, i, j) lives at data + (b * batch_stride + i * row_stride +
// j * col_stride) elements. batch_stride may be 0 (one matrix shared by every batch).
struct MatrixRef {
  const void* data = nullptr;
  int64_t batch_stride = 0, row_stride = 0, col_stride = 1;
};

// Which kernel computes gemm(): cuBLASLt (any dtype), or the hand-written tensor-core kernel (f16/bf16 operands, f32
// accumulation; other dtypes and layouts it does not take still go to cuBLASLt).
enum class GemmStrategy : int8_t { CublasLt, TensorCore };
GemmStrategy gemm_strategy();
// Sets the strategy for the process; EMBER_GEMM=cublaslt|tensorcore sets the initial value (ConfigError otherwise).
void set_gemm_strategy(GemmStrategy s);

// For every b < batch: out[b] (M x N) = alpha * a[b] (M x K) @ bm[b] (K x N) + beta * out[b], where out[b] has
// unit column stride, row stride ldo and batch stride out_batch_stride. dtype is every operand's dtype: f32 (f32
// accumulation, no TF32), f64, f16 or bf16 (f32 accumulation). An operand is read in place when one of its strides
// is unit and the other at least the matching extent (size-1 dims take any stride); otherwise (neither unit, a
// broadcast row or column, a negative batch stride) it is packed into a contiguous copy first (Note [GEMM through
// cuBLASLt] in blas.cu). beta == 0 means out is not read (it may hold NaN); K == 0 gives out = beta * out. Batches of
// out must not overlap (ValueError). `device` is current; scratch comes from the allocator for `stream`.
// bias (optional): N contiguous elements of dtype added to every row of every out[b], out = alpha a @ bm + bias;
// requires beta == 0 (ValueError). It goes into cuBLASLt's bias epilogue where one applies, else out is filled with
// the bias rows and the product accumulated (Note [Bias epilogue] in blas.cu); either way the sum is rounded once.
void gemm(DType dtype, int64_t batch, int64_t M, int64_t N, int64_t K, const MatrixRef& a, const MatrixRef& b,
          void* out, int64_t out_batch_stride, int64_t ldo, double alpha, double beta, int device, cudaStream_t stream,
          const void* bias = nullptr);
// How many gemm() calls with a bias took the fallback (bias rows + accumulate) since the process started.
int64_t gemm_bias_fallbacks();

// The hand-written tensor-core GEMMs (f16/bf16 in, f32 accumulate): out[b] = a[b] @ bm[b] (+ bias) into a contiguous
// row-major out [batch, M, N]. The operands are contiguous: a is [batch, M, K] row-major, or with a_transposed stored
// [batch, K, M] (a[b] is that matrix's transpose: a weight gradient's x^T); b is [batch, K, N], or with b_transposed
// stored [batch, N, K] (a linear layer's weight W in x @ W^T); bias (optional) holds N elements of dtype, added to
// every row before the one rounding. Any M, N, K >= 1; dtype f16 or bf16. `kernel` picks the implementation:
//   MmaSync: mma.sync m16n8k16 with a cp.async pipeline (sm_80 and later; Note [Tensor-core GEMM]); neither operand
//            transposed, no bias (ShapeError otherwise);
//   Wgmma:   wgmma + TMA with warp-specialised warpgroups (Hopper, a build with sm_90a code; Note [Hopper GEMM]): N and
//            the stored rows of a and b multiples of 8, a and b 16-byte aligned, not both transposed; DeviceError or
//            ShapeError where it does not apply;
//   Auto:    Wgmma where it applies, else MmaSync.
// Exposed for the benchmarks, which compare them with cuBLASLt on the same operands, and taken by gemm() under
// GemmStrategy::TensorCore where tensor_core_gemm_takes says so.
enum class TcGemmKernel : int8_t { Auto, MmaSync, Wgmma };
struct TcGemmOperands {
  const void* a = nullptr;
  bool a_transposed = false;
  const void* b = nullptr;
  bool b_transposed = false;
  const void* bias = nullptr;
};
void tensor_core_gemm(DType dtype, int64_t batch, int64_t M, int64_t N, int64_t K, const TcGemmOperands& ops, void* out,
                      cudaStream_t stream, TcGemmKernel kernel = TcGemmKernel::Auto);
// The same for row-major a [batch, M, K] and b [batch, K, N] without a bias.
void tensor_core_gemm(DType dtype, int64_t batch, int64_t M, int64_t N, int64_t K, const void* a, const void* b,
                      void* out, cudaStream_t stream, TcGemmKernel kernel = TcGemmKernel::Auto);
// Products run by the hand-written kernels since the process started: all of them, and those on the wgmma kernel.
int64_t tensor_core_gemm_calls();
int64_t wgmma_gemm_calls();
// Whether tensor_core_gemm with kernel Auto takes these operands on `device` (a reduced-float dtype and a kernel that
// applies) rather than raising.
bool tensor_core_gemm_takes(DType dtype, int64_t M, int64_t N, int64_t K, const TcGemmOperands& ops, int device);
// Whether the Hopper kernel can run on `device`: compute capability 9.x, enough shared memory, and sm_90a code in
// this build (CMAKE_CUDA_ARCHITECTURES 90a; a plain 90 build lacks wgmma). Checked once per device by a probe kernel.
bool wgmma_gemm_supported(int device);
// Why wgmma_gemm_supported(device) is false (empty when it is true): not a 9.x device, too little shared memory, a
// build without sm_90a code, a kernel compiled to another register count than its setmaxnreg split needs, or the
// probe kernel's error.
std::string wgmma_gemm_unsupported_reason(int device);
// The Hopper kernel's tile width (N columns per block: 64, 128 or 256) and cluster size (1, or 2 blocks along M that
// share B's loads by multicast); 0 picks per product (Note [Hopper GEMM], "Tile width" and "Clusters"). Set for the
// process (tests, benchmarks); ValueError for other values or a cluster of 2 at width 64.
struct WgmmaConfig {
  int tile_width = 0;
  int cluster = 0;
};
void set_wgmma_config(const WgmmaConfig& config);

}  // namespace ember::cuda

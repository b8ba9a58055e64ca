// Replays of the CUDA int8 and CSR kernels' workspace (replay.h): quant_kernels.cu's error records, dequantized
// weight tiles and quantized activations; sparse_matmul.cpp's index conversions for cuSPARSE. Not counted: the SpMM
// buffer, which only cuSPARSE sizes (cusparseSpMM_bufferSize on the device).
#include <cstdint>
#include <limits>

#include "ember/kernels/meta/replay.h"
#include "ember/kernels/ops_quant.h"
#include "ember/kernels/ops_sparse.h"
#include "ember/kernels/stubs.h"

namespace ember::kernels::meta {

namespace {

void quantize_replay(const Tensor& w, const Tensor& /*q*/, const Tensor& /*scale*/) {
  if (w.size(0) == 0) return;
  MetaWorkspace err;  // make_error_record: 8 bytes for the call
  err.take(8, DType::u8);
}

// weight_linear_typed: one tile of dequantized weights (at most kInt8DequantBlockBytes) for the call, and a product
// per tile through gemm() with operands in place.
void weight_linear_replay(const Tensor& x, const Tensor& q, const Tensor& /*scale*/, const Tensor& /*bias*/,
                          const Tensor& out) {
  const int64_t k = x.size(1), n = q.size(0);
  if (out.numel() == 0 || k == 0) return;
  const int64_t budget = kInt8DequantBlockBytes / x.itemsize();
  const int64_t kb = k < budget ? k : budget;
  const int64_t nb = budget / kb < n ? budget / kb : n;
  MetaWorkspace ws;
  ws.take(nb * kb, x.dtype());
  replay_gemm_workspace();
}

// dynamic_linear_cuda: the error record, the activation scale (dynamic), then the whole activation in int8.
void dynamic_linear_replay(const Tensor& x, const Tensor& q, const Tensor& /*scale*/, const Tensor& /*bias*/,
                           bool dynamic, float /*act_scale*/, const Tensor& /*out*/) {
  const int64_t m = x.size(0), k = x.size(1), n = q.size(0);
  if (m == 0 || n == 0) return;
  MetaWorkspace ws;
  ws.take(8, DType::u8);
  if (dynamic) ws.take(8, DType::u8);
  ws.take(m * k > 0 ? m * k : 1, DType::i8);
}

// spmm in sparse_matmul.cpp: row_ptr, then col_indices, converted to the index type cuSPARSE takes (i32, or i64 for
// an i64 row_ptr or a dimension past int32), held for the call.
void replay_spmm(const Tensor& col_indices, const Tensor& row_ptr, int64_t rows, int64_t cols) {
  constexpr int64_t kI32Max = std::numeric_limits<int32_t>::max();
  const bool wide = row_ptr.dtype() == DType::i64 || rows >= kI32Max || cols >= kI32Max;
  const DType idx = wide ? DType::i64 : DType::i32;
  MetaWorkspace ws;
  if (row_ptr.dtype() != idx) ws.take(row_ptr.numel(), idx);
  if (col_indices.dtype() != idx) ws.take(col_indices.numel(), idx);
}

void csr_linear_replay(const Tensor& x, const Tensor& values, const Tensor& col_indices, const Tensor& row_ptr,
                       const Tensor& /*bias*/, const Tensor& out) {
  const int64_t B = x.size(0), K = x.size(1), N = out.size(1);
  if (B == 0 || N == 0 || values.numel() == 0) return;
  replay_spmm(col_indices, row_ptr, N, K);
}

void csr_matmul_replay(const Tensor& values, const Tensor& col_indices, const Tensor& row_ptr, const Tensor& dense,
                       const Tensor& out) {
  const int64_t M = out.size(0), N = out.size(1), K = dense.size(0);
  if (M == 0 || N == 0 || values.numel() == 0) return;
  replay_spmm(col_indices, row_ptr, M, K);
}

}  // namespace

EMBER_REGISTER_CUDA_REPLAY(quantize_per_channel, quantize_replay);
EMBER_REGISTER_CUDA_REPLAY(int8_weight_linear, weight_linear_replay);
EMBER_REGISTER_CUDA_REPLAY(int8_dynamic_linear, dynamic_linear_replay);
EMBER_REGISTER_CUDA_REPLAY(csr_linear, csr_linear_replay);
EMBER_REGISTER_CUDA_REPLAY(csr_matmul, csr_matmul_replay);

}  // namespace ember::kernels::meta

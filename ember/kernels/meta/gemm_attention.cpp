// Replays of the CUDA GEMM and attention kernels' workspace (replay.h): bmm (cuda/matmul.cpp over cuda/blas.cu's
// gemm()), attention and its backward (cuda/attention.cu: the tiled path's score tiles, the flash path's staging).
// Invariant: the tiled path's tiles and the GEMM's batch split come from cuda/scratch_sizes.h, as the kernels' do.
#include <algorithm>

#include "ember/kernels/cuda/scratch_sizes.h"
#include "ember/kernels/meta/replay.h"
#include "ember/kernels/stubs.h"

namespace ember::kernels::meta {

namespace {

// prepare_operand in blas.cu: in place when one stride is unit and the other a valid leading dimension.
bool in_place(int64_t batch, int64_t rows, int64_t cols, const GemmOperand& m) {
  const int64_t bs = batch == 1 ? 0 : m.batch_stride;
  if (bs < 0) return false;
  return ((cols == 1 || m.col_stride == 1) && (rows == 1 || m.row_stride >= cols)) ||
         ((rows == 1 || m.row_stride == 1) && (cols == 1 || m.col_stride >= rows));
}

void take_operand(MetaWorkspace& ws, DType dtype, int64_t batch, int64_t rows, int64_t cols, const GemmOperand& m) {
  if (in_place(batch, rows, cols, m)) return;
  const int64_t copies = (batch == 1 ? 0 : m.batch_stride) == 0 ? 1 : batch;
  ws.take(copies * rows * cols, dtype);
}

void bmm_replay(const Tensor& a, const Tensor& b, const Tensor& out, bool /*accumulate*/) {
  if (out.numel() == 0) return;
  replay_gemm(out.dtype(), a.size(0), a.size(1), b.size(2), a.size(2), {a.stride(0), a.stride(1), a.stride(2)},
              {b.stride(0), b.stride(1), b.stride(2)});
}

// ---- attention (cuda/attention.cu) -------------------------------------------------------------------------------

struct Geometry {
  int64_t B, T, C, H;
};

Geometry geometry(const Tensor& qkv, int64_t n_head) { return {qkv.size(0), qkv.size(1), qkv.size(2) / 3, n_head}; }

// flash_attention_applies (attention_flash.cu) on a device of sm_80 or later.
bool flash_applies(const Tensor& qkv, const Geometry& g) {
  return current_meta_target().flash_attention && is_reduced_float(qkv.dtype()) && g.H > 0 && g.C % g.H == 0 &&
         (g.C / g.H == 32 || g.C / g.H == 64) && aligned(qkv, 16);
}

// Elements of one tile buffer: plan_tiles in attention.cu.
int64_t tile_elements(const Geometry& g, DType dtype) {
  const auto t = ::ember::kernels::cuda::attention_tiles(g.B, g.T, dtype);
  return t.nb * t.ni * g.T;
}

void attention_replay(const Tensor& qkv, int64_t n_head, bool /*causal*/, const Tensor& out, const Tensor& /*lse*/) {
  if (out.numel() == 0) return;
  const Geometry g = geometry(qkv, n_head);
  MetaWorkspace ws;
  if (flash_applies(qkv, g)) {
    if (!aligned(out, 4)) ws.take(out.numel(), out.dtype());  // staged, then copied into out
    return;
  }
  ws.take(tile_elements(g, qkv.dtype()), qkv.dtype());
  replay_gemm_workspace();
}

void attention_backward_replay(const Tensor& grad_out, const Tensor& qkv, const Tensor& /*out*/, const Tensor& /*lse*/,
                               int64_t n_head, bool /*causal*/, const Tensor& grad_qkv) {
  if (grad_qkv.numel() == 0) return;
  const Geometry g = geometry(qkv, n_head);
  MetaWorkspace ws;
  if (flash_applies(qkv, g)) {
    if (!aligned(grad_out, 16)) ws.take(grad_out.numel(), grad_out.dtype());  // grad_out.clone()
    if (!aligned(grad_qkv, 4)) ws.take(grad_qkv.numel(), grad_qkv.dtype());   // staged result
    MetaWorkspace delta;  // flash_attention_backward's row sums of dO * O, freed when it returns
    delta.take(g.B * g.H * g.T, DType::f32);
    return;
  }
  const int64_t tile = tile_elements(g, qkv.dtype());
  ws.take(tile, qkv.dtype());  // weights
  ws.take(tile, qkv.dtype());  // their gradient
  replay_gemm_workspace();
}

}  // namespace

void replay_gemm_workspace() {
  const int64_t bytes = current_meta_target().gemm_workspace_bytes;
  if (bytes == 0) return;
  MetaWorkspace ws;
  ws.take(bytes, DType::u8);
}

void replay_gemm(DType dtype, int64_t batch, int64_t M, int64_t N, int64_t K, const GemmOperand& a,
                 const GemmOperand& b) {
  // The K == 0 product only scales the output; the tensor-core strategy (EMBER_GEMM=tensorcore) takes nothing
  // either, and is not what a dry run assumes.
  if (batch == 0 || M == 0 || N == 0 || K == 0) return;
  MetaWorkspace ws;
  take_operand(ws, dtype, batch, M, K, a);
  take_operand(ws, dtype, batch, K, N, b);
  for (int64_t b0 = 0; b0 < batch; b0 += ::ember::kernels::cuda::kGemmMaxBatchPerCall) replay_gemm_workspace();
}

EMBER_REGISTER_CUDA_REPLAY(bmm, bmm_replay);
EMBER_REGISTER_CUDA_REPLAY(attention, attention_replay);
EMBER_REGISTER_CUDA_REPLAY(attention_backward, attention_backward_replay);

}  // namespace ember::kernels::meta

// Replays of the CUDA convolution, max-pool backward and embedding kernels' workspace (replay.h): cuDNN's operand
// copies and workspace, the f32 accumulator of a 16-bit pool gradient, the index checks' flag and the embedding
// gradient's radix sort. Invariant: the convolutions are replayed on the path the target names — cuDNN (the CUDA
// default where it is built in) as conv_cudnn.cpp takes it when cuDNN has an algorithm for the shape, or im2col.
#include <algorithm>

#include "ember/kernels/meta/replay.h"
#include "ember/kernels/stubs.h"

namespace ember::kernels::meta {

namespace {

int64_t round_up(int64_t n, int64_t m) { return (n + m - 1) / m * m; }

// find_bad_index (cuda/index_check.cuh): an 8-byte flag, freed before the kernel that reads the indices runs.
void replay_index_check(const Tensor& indices) {
  if (indices.numel() == 0) return;
  MetaWorkspace flag;
  flag.take(1, DType::i64);
}

// packed() in conv_cudnn.cpp: a contiguous copy of a strided operand, or of one that starts off a 16-byte boundary.
void take_cudnn_operand(MetaWorkspace& ws, const Tensor& t) {
  if (!t.is_contiguous() || !aligned(t, 16)) ws.take(t.numel(), t.dtype());
}

// One cuDNN pass: its operand copies, then the workspace the target assumes; freed when the pass returns.
void replay_cudnn_pass(const Tensor& first, const Tensor& second) {
  MetaWorkspace ws;
  take_cudnn_operand(ws, first);
  take_cudnn_operand(ws, second);
  if (current_meta_target().conv_workspace_bytes > 0) ws.take(current_meta_target().conv_workspace_bytes, DType::u8);
}

// ---- the im2col path (conv_im2col.cu) ------------------------------------------------------------------------------

struct Im2colShape {
  int64_t n, c, o, kg, rows, plane;  // rows: every group's C/groups x KH x KW; plane: OH x OW
};

Im2colShape im2col_shape(const Shape& x, const Shape& weight, const Shape& out) {
  const int64_t kg = weight[1] * weight[2] * weight[3];
  return {x[0], x[1], weight[0], kg, x[1] * weight[2] * weight[3], out[2] * out[3]};
}

// images_per_batch: as many images as keep `per_image` bytes of scratch each within the column budget, at least one.
int64_t images_per_batch(int64_t per_image, int64_t n) {
  return std::clamp<int64_t>(current_meta_target().im2col_chunk_bytes / std::max<int64_t>(1, per_image), 1,
                             std::max<int64_t>(1, n));
}

DType accumulate_dtype(DType dt) { return is_reduced_float(dt) ? DType::f32 : dt; }

// conv2d_typed: the weight as a contiguous [O, kg] (packed when strided), then columns for a batch of images.
void replay_im2col_forward(const Tensor& x, const Tensor& weight, const Tensor& out) {
  const Im2colShape s = im2col_shape(x.sizes(), weight.sizes(), out.sizes());
  if (s.kg == 0) return;
  const DType dt = x.dtype();
  MetaWorkspace ws;
  if (!weight.is_contiguous()) ws.take(s.o * s.kg, dt);
  const int64_t nb = images_per_batch(s.rows * s.plane * itemsize(dt), s.n);
  ws.take(nb * s.rows * s.plane, dt);
  replay_gemm_workspace();
}

// input_grad_typed: the weight in the accumulation dtype (packed unless it is already that, contiguous), the column
// gradients of a batch, and grad_out packed in that dtype unless it can be read as it is.
void replay_im2col_input_grad(const Tensor& grad_out, const Tensor& weight, const Tensor& grad_x) {
  const Im2colShape s = im2col_shape(grad_x.sizes(), weight.sizes(), grad_out.sizes());
  const DType dt = grad_out.dtype(), acc = accumulate_dtype(dt);
  const bool widen = acc != dt;
  MetaWorkspace ws;
  if (widen || !weight.is_contiguous()) ws.take(s.o * s.kg, acc);
  const bool gout_view = !widen && grad_out.is_contiguous();
  const int64_t nb = images_per_batch((s.rows * s.plane + (gout_view ? 0 : s.o * s.plane)) * itemsize(acc), s.n);
  ws.take(nb * s.rows * s.plane, acc);
  if (!gout_view) ws.take(nb * s.o * s.plane, acc);
  replay_gemm_workspace();
}

// weight_grad_typed: a batch's columns and its grad_out packed as [O, images, plane].
void replay_im2col_weight_grad(const Tensor& grad_out, const Tensor& x, const Tensor& grad_w) {
  const Im2colShape s = im2col_shape(x.sizes(), grad_w.sizes(), grad_out.sizes());
  const DType dt = grad_out.dtype();
  const int64_t nb = images_per_batch((s.rows + s.o) * s.plane * itemsize(dt), s.n);
  MetaWorkspace ws;
  ws.take(s.rows * nb * s.plane, dt);
  ws.take(s.o * nb * s.plane, dt);
  replay_gemm_workspace();
}

void conv2d_replay(const Tensor& x, const Tensor& weight, const Tensor& /*bias*/, const Conv2dParams& /*p*/,
                   const Tensor& out) {
  if (out.numel() == 0) return;
  if (current_meta_target().conv_im2col)
    replay_im2col_forward(x, weight, out);
  else
    replay_cudnn_pass(x, weight);
}

void conv2d_backward_replay(const Tensor& grad_out, const Tensor& x, const Tensor& weight, const Conv2dParams& /*p*/,
                            const Tensor& grad_x, const Tensor& grad_w) {
  if (grad_out.numel() == 0) return;  // the gradients are zero-filled
  const bool im2col = current_meta_target().conv_im2col;
  if (grad_x.defined() && grad_x.numel() > 0) {
    if (im2col)
      replay_im2col_input_grad(grad_out, weight, grad_x);
    else
      replay_cudnn_pass(grad_out, weight);
  }
  if (grad_w.defined() && grad_w.numel() > 0) {
    if (im2col)
      replay_im2col_weight_grad(grad_out, x, grad_w);
    else
      replay_cudnn_pass(grad_out, x);
  }
}

// pool.cu: the index check, then for f16/bf16 an f32 accumulator the size of grad_in (atomic adds in f32).
void max_pool2d_backward_replay(const Tensor& grad_out, const Tensor& indices, const Tensor& grad_in) {
  if (grad_out.numel() == 0 && grad_in.numel() == 0) return;
  replay_index_check(indices);
  if (!is_reduced_float(grad_in.dtype())) return;
  MetaWorkspace ws;
  ws.take(grad_in.numel(), DType::f32);
}

void embedding_replay(const Tensor& /*weight*/, const Tensor& indices, const Tensor& out) {
  if (out.numel() > 0) replay_index_check(indices);
}

// CUB's temporary storage for DeviceRadixSort::SortPairs of n (uint64 key, int64 position) pairs over `end_bit` key
// bits, as CUB 3 sizes it for sm_90: one tile (n <= 2304) needs none (CUB reports 1 byte); otherwise the onesweep
// sort's per-pass histograms (256 bins of 8 bytes), per-block lookback (256 x 4 bytes per 4,608-pair tile), the
// alternate key and value buffers when it takes more than one 8-bit pass, and the pass counters, each in 256-byte
// units, plus 255 bytes of alignment slack.
int64_t cub_sort_temp_bytes(int64_t n, int end_bit) {
  constexpr int64_t kTile = 4608, kSingleTile = 2304, kPortion = ((int64_t{1} << 28) - 1) / kTile * kTile;
  if (n <= kSingleTile) return 1;
  const int64_t passes = (end_bit + 7) / 8;
  const int64_t portions = (n + kPortion - 1) / kPortion;
  const int64_t blocks = (std::min(n, kPortion) + kTile - 1) / kTile;
  int64_t bytes = round_up(portions * passes * 256 * 8, 256) + round_up(blocks * 256 * 4, 256) +
                  round_up(portions * passes * 4, 256) + 255;
  if (passes > 1) bytes += 2 * round_up(8 * n, 256);
  return bytes;
}

// key_bits in embedding.cu: the bits that hold every index below v (at least 1).
int key_bits(int64_t v) {
  int bits = 1;
  while (bits < 63 && (int64_t{1} << bits) < v) ++bits;
  return bits;
}

// embedding.cu: the index check, then keys and positions (in and out, [4 n] i64) for the call, and the sort's
// temporary storage while it sorts.
void embedding_backward_replay(const Tensor& grad_out, const Tensor& indices, const Tensor& grad_weight) {
  if (grad_out.numel() == 0) return;
  replay_index_check(indices);
  const int64_t n = grad_out.size(0);
  MetaWorkspace ws;
  ws.take(4 * n, DType::i64);
  MetaWorkspace temp;
  temp.take(cub_sort_temp_bytes(n, key_bits(grad_weight.size(0))) + 1, DType::u8);
}

}  // namespace

EMBER_REGISTER_CUDA_REPLAY(conv2d, conv2d_replay);
EMBER_REGISTER_CUDA_REPLAY(conv2d_backward, conv2d_backward_replay);
EMBER_REGISTER_CUDA_REPLAY(max_pool2d_backward, max_pool2d_backward_replay);
EMBER_REGISTER_CUDA_REPLAY(embedding, embedding_replay);
EMBER_REGISTER_CUDA_REPLAY(embedding_backward, embedding_backward_replay);

}  // namespace ember::kernels::meta

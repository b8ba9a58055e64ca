// Replays of the CUDA convolution, max-pool backward and embedding kernels' workspace (replay.h): cuDNN's operand
// copies and workspace, the f32 accumulator of a 16-bit pool gradient, the index checks' flag and the embedding
// gradient's radix sort. Invariant: the convolutions are replayed on cuDNN (the CUDA default where cuDNN is built
// in), as conv_cudnn.cpp takes them when cuDNN has an algorithm for the shape.
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

void conv2d_replay(const Tensor& x, const Tensor& weight, const Tensor& /*bias*/, const Conv2dParams& /*p*/,
                   const Tensor& out) {
  if (out.numel() > 0) replay_cudnn_pass(x, weight);
}

void conv2d_backward_replay(const Tensor& grad_out, const Tensor& x, const Tensor& weight, const Conv2dParams& /*p*/,
                            const Tensor& grad_x, const Tensor& grad_w) {
  if (grad_out.numel() == 0) return;  // the gradients are zero-filled
  if (grad_x.defined() && grad_x.numel() > 0) replay_cudnn_pass(grad_out, weight);
  if (grad_w.defined() && grad_w.numel() > 0) replay_cudnn_pass(grad_out, x);
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

// Sizes of the CUDA kernels' scratch that follow from shapes alone — attention tile buffers, the row groups of the
// partial-sum passes, the GEMM batch split — in a header without CUDA code, so the kernels and the dry run's replays
// of their workspace (kernels/meta/) size it with the same code. Invariant: nothing here depends on the device.
#pragma once

#include <algorithm>
#include <cstdint>

#include "ember/core/dtype.h"

namespace ember::kernels::cuda {

// attention.cu (Note [Attention tiles]): the tiled path plans its tiles against this many bytes per score buffer
// (forward one buffer, backward two).
inline constexpr int64_t kAttentionTileBytes = int64_t{128} << 20;

// The largest tile of the tiled attention: nb batch elements of ni query rows, each row T scores wide — whole batch
// elements when one T x T matrix fits the budget, else one element and as many query rows as fit.
struct AttentionTiles {
  int64_t nb, ni;
};
inline AttentionTiles attention_tiles(int64_t B, int64_t T, DType dtype) {
  const int64_t budget = std::max<int64_t>(1, kAttentionTileBytes / itemsize(dtype));  // elements per buffer
  if (T <= budget / T) return {std::min(B, budget / (T * T)), T};
  return {1, std::max<int64_t>(1, budget / T)};
}

// blas.cu (Note [GEMM through cuBLASLt]): batches per cublasLtMatmul call, below the 65535 grid limit.
inline constexpr int64_t kGemmMaxBatchPerCall = 63 * 1024;

// layer_norm_backward.cu: the affine gradients' row groups — at least kPackGroupRows rows each on the packed pass,
// kRowsPerGroup on the strided one, at most kMaxGroups — from the sizes alone, so every device adds in one order.
inline constexpr int64_t kLayerNormRowsPerGroup = 256;
inline constexpr int64_t kLayerNormPackGroupRows = 64;
inline constexpr int64_t kLayerNormMaxGroups = 64;
inline int64_t layer_norm_backward_groups(int64_t rows, bool packed) {
  return std::clamp<int64_t>(rows / (packed ? kLayerNormPackGroupRows : kLayerNormRowsPerGroup), 1,
                             kLayerNormMaxGroups);
}

// bias_gelu.cu: the bias gradient's row groups, at least 64 rows each and at most 64 (with 256-row groups, GPT-2's
// [4096, 3072] bf16 backward had 12 column blocks x 16 groups, too few for the packed kernel: 53 µs a call at 49% of a
// copy on an H100).
inline constexpr int64_t kBiasGeluRowsPerGroup = 64;
inline constexpr int64_t kBiasGeluMaxGroups = 64;
inline int64_t bias_gelu_backward_groups(int64_t rows) {
  return std::max<int64_t>(1, std::min(kBiasGeluMaxGroups, rows / kBiasGeluRowsPerGroup));
}

}  // namespace ember::kernels::cuda

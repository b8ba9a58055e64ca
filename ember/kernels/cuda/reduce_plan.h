// Host-side planning of the CUDA reductions (reduce.cu): the kernel shape and split count of a reduction, and which
// packed path takes a sum — in a header without CUDA code, so the dry run's replay of the reduction's scratch
// (kernels/meta/norm_reduce.cpp) decides as the kernel does. Invariant: every choice here depends on sizes, strides,
// alignment and the SM count alone.
#pragma once

#include <algorithm>
#include <cstdint>
#include <limits>
#include <vector>

#include "ember/core/tensor.h"
#include "ember/kernels/cuda/tensor_iter.cuh"

namespace ember::kernels::cuda {

// Note [Reduction shapes] in reduce.cu.
constexpr int kMaxThreads = 512;
constexpr int64_t kWarpMaxR = 1024;
constexpr int64_t kSmallR = 16;
constexpr int64_t kMinPerThread = 16;   // a split gets at least this many elements per thread
constexpr int64_t kMaxPerThread = 256;  // a thread adds at most about this many elements in sequence
constexpr int64_t kMaxSplits = 65535;   // gridDim.y limit

// Note [Whole-tensor sums through CUB] in reduce.cu: the smallest reduction CUB takes, and the accumulator's slot in
// front of CUB's temporary storage.
constexpr int64_t kCubMinR = int64_t{1} << 16;
constexpr int64_t kCubScratchAlign = 256;

// Note [Packed sums] in reduce.cu.
constexpr int64_t kPackGroupRows = 64;
constexpr int64_t kPackMaxGroups = 64;
constexpr int64_t kPackMinRowWarps = 16;
constexpr int64_t kPackColumnsPerBlock = 32;  // reduce_pack::kPackColumns (reduce.cu checks that they agree)

struct Plan {
  bool r_in_x = false, r_in_y = false;
  int bx = 32, by = 8, out_per_block = 8;
  int64_t splits = 1, chunk = 0;
  unsigned int grid_x = 1;
};

inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

inline int64_t inner_stride(const ::ember::cuda::OffsetCalculator<1>& c) {
  const int64_t s = c.strides[0][0];
  return s < 0 ? -s : s;
}

inline int pow2_at_least(int64_t n, int cap) {
  int p = 1;
  while (p < cap && p < n) p *= 2;
  return p;
}

// The kernel shape for n_out outputs of R elements each (Note [Reduction shapes]).
inline Plan plan_reduction(int64_t n_out, int64_t R, const ::ember::cuda::OffsetCalculator<1>& kept,
                           const ::ember::cuda::OffsetCalculator<1>& red, int sm_count, bool allow_split) {
  Plan pl;
  const bool columns = R <= kSmallR || (kept.dims > 0 && red.dims > 0 && inner_stride(kept) < inner_stride(red));
  int threads = 256, r_lanes = 32;
  if (columns) {
    pl.bx = pow2_at_least(n_out, R <= kSmallR ? 256 : 32);
    pl.by = 256 / pl.bx;
    pl.r_in_y = pl.by > 1;
    pl.out_per_block = pl.bx;
    r_lanes = pl.by;
  } else if (R <= kWarpMaxR) {
    pl.bx = 32;
    pl.by = 8;
    pl.r_in_x = true;
    pl.out_per_block = pl.by;
  } else {
    pl.bx = 32;
    pl.by = kMaxThreads / 32;
    pl.r_in_x = pl.r_in_y = true;
    pl.out_per_block = 1;
    threads = kMaxThreads;
    r_lanes = kMaxThreads;
  }
  const int64_t blocks_out = ceil_div(n_out, pl.out_per_block);
  int64_t splits = 1;
  if (allow_split && R > 0) {
    const int64_t target = static_cast<int64_t>(sm_count) * (2048 / threads);  // one full wave
    const int64_t s_fill =
        blocks_out >= target ? 1 : std::min(ceil_div(target, blocks_out), ceil_div(R, r_lanes * kMinPerThread));
    const int64_t s_seq = ceil_div(R, r_lanes * kMaxPerThread);
    splits = std::clamp<int64_t>(std::max(s_fill, s_seq), 1, kMaxSplits);
  }
  pl.chunk = R == 0 ? 0 : ceil_div(R, splits);
  pl.splits = R == 0 ? 1 : ceil_div(R, pl.chunk);  // no empty split
  const int64_t grid_cap = static_cast<int64_t>(sm_count) * 64;
  pl.grid_x = static_cast<unsigned int>(std::clamp<int64_t>(blocks_out, 1, std::max<int64_t>(grid_cap, 1)));
  return pl;
}

// Whether the reduced dims (of size > 1) all come before the kept ones (of size > 1): `leading`, or all after.
inline bool reduced_dims_are(const Tensor& in, const std::vector<int64_t>& dims, bool leading) {
  std::vector<bool> reduced(static_cast<size_t>(in.dim()), false);
  for (int64_t d : dims) reduced[static_cast<size_t>(d)] = true;
  bool seen_second = false;  // a dim of the kind that must come second (kept when leading) has been seen
  for (int64_t d = 0; d < in.dim(); ++d) {
    if (in.size(d) == 1) continue;
    const bool first_kind = reduced[static_cast<size_t>(d)] == leading;
    if (!first_kind) seen_second = true;
    if (first_kind && seen_second) return false;
  }
  return true;
}

// Column blocks of the packed column sum over `cols` outputs of V-element packs.
inline int64_t packed_column_blocks(int64_t cols, int V) {
  return (cols / V + kPackColumnsPerBlock - 1) / kPackColumnsPerBlock;
}

// The row groups of the packed column sum of `cols` outputs over R rows, or 0 when its blocks would not give two to
// every SM (the sum then runs on reduce_kernel).
inline int64_t packed_column_groups(int64_t cols, int64_t R, int V, int64_t sm_count) {
  const int64_t col_blocks = packed_column_blocks(cols, V);
  if (col_blocks == 0) return 0;  // fewer columns than a pack
  // Past kPackMaxGroups only as far as two blocks a SM need: a narrow bf16 bias gradient ([65536, 1024]: 4 column
  // blocks) ran on reduce_kernel at 20% of a copy on an H100, where f32's 8 column blocks x 64 groups reached 94%.
  const int64_t most = std::max(kPackMaxGroups, (2 * sm_count + col_blocks - 1) / col_blocks);
  const int64_t groups = std::clamp<int64_t>(R / kPackGroupRows, 1, most);
  if (col_blocks * groups < 2 * sm_count || col_blocks > std::numeric_limits<int32_t>::max()) return 0;
  return groups;
}

// Whether the packed row sum (a warp per output) takes n_out rows of R elements (V-element packs).
inline bool packed_row_sum_takes(int64_t n_out, int64_t R, int V, int64_t sm_count) {
  return R % V == 0 && R / V >= 32 && n_out >= kPackMinRowWarps * sm_count;
}

}  // namespace ember::kernels::cuda

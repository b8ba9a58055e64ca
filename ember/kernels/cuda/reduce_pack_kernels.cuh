// Sums and means over contiguous rows and columns with 16-byte packs (Note [Packed sums] in reduce.cu, which launches
// them; bias_gelu_kernels.cuh shares the column sums' block combine), in a header so that a host compiler can build it
// too: tests/kernels/test_reduce_pack_emulated.cpp runs it on the CPU under tests/harness/simt_emulator.h.
// Invariant: the order of additions depends on the sizes alone (never on the device or the grid), and each result is
// rounded once: a sum as convert<T>(total), a mean as convert<T>(total / count) in double, as reduce.cu's other
// kernels store them.
#pragma once

#include <cstdint>

#include "ember/base/host_device.h"
#include "ember/core/half.h"
#include "ember/kernels/convert.h"
#include "ember/kernels/cuda/kernel_macros.h"
#include "ember/kernels/cuda/tensor_iter.cuh"

namespace ember::kernels::cuda::reduce_pack {

constexpr int kPackColumns = 32;   // column blocks: 32 packs of columns ...
constexpr int kRowThreads = 8;     // ... x 8 row threads
constexpr int kRowBlockWarps = 8;  // row blocks: 8 warps, a row each

// A finished result: total (a sum of `count` elements) rounded once to T, divided by count first for a mean.
template <class T, class A>
EMBER_HD_INLINE T finish(A total, int64_t count, bool mean) {
  return mean ? convert<T>(static_cast<double>(total) / static_cast<double>(count)) : convert<T>(total);
}

// The end of a column block (kPackColumns packs x kRowThreads row threads; thread (tx, ty) holds acc[V], the sums of
// pack cp's V columns over its rows): the kRowThreads sums of each column are added in ty order and stored into
// out [cols] of T (`final`: finish(total, count, mean)) or into row blockIdx.y of the partial sums [groups, cols] of
// A. Every thread of the block calls it (it has barriers, and returns with the shared buffer free for another call).
template <class T, class A, int V>
__device__ __forceinline__ void store_column_block(const A (&acc)[V], int tx, int ty, int64_t cp, int64_t cols,
                                                   void* sums, bool final, int64_t count, bool mean) {
  __shared__ A partial[kRowThreads][V][kPackColumns];  // [ty][element of the pack][tx]: the writes hit 32 banks
  EMBER_UNROLL
  for (int e = 0; e < V; ++e) partial[ty][e][tx] = acc[e];
  __syncthreads();
  if (ty == 0 && cp * V < cols) {
    EMBER_UNROLL
    for (int e = 0; e < V; ++e) {
      A total = 0;
      EMBER_UNROLL
      for (int k = 0; k < kRowThreads; ++k) total += partial[k][e][tx];
      const int64_t col = cp * V + e;
      if (final)
        static_cast<T*>(sums)[col] = finish<T, A>(total, count, mean);
      else
        static_cast<A*>(sums)[static_cast<int64_t>(blockIdx.y) * cols + col] = total;
    }
  }
  __syncthreads();  // row 0 has read every row's sums before a second call writes them
}

// Where a thread of a column block (kPackColumns packs x kRowThreads row threads over group blockIdx.y of
// rows_per_group rows of [rows, cols]) works: pack column cp of col_packs, rows r0 + ty, r0 + ty + kRowThreads, ...
// below r1.
struct ColumnThread {
  int tx, ty;
  int64_t col_packs, cp, r0, r1;
};
__device__ __forceinline__ ColumnThread column_thread(int64_t rows, int64_t cols, int64_t rows_per_group, int V) {
  ColumnThread t;
  t.tx = static_cast<int>(threadIdx.x) % kPackColumns;
  t.ty = static_cast<int>(threadIdx.x) / kPackColumns;
  t.col_packs = cols / V;
  t.cp = static_cast<int64_t>(blockIdx.x) * kPackColumns + t.tx;
  t.r0 = static_cast<int64_t>(blockIdx.y) * rows_per_group;
  t.r1 = t.r0 + rows_per_group < rows ? t.r0 + rows_per_group : rows;
  return t;
}

// Adds the partial sums [groups, cols] of each column in group order into out [cols] (finish(total, count, mean)).
template <class A, class T>
__global__ void sum_groups_kernel(const A* partial, int64_t groups, int64_t cols, int64_t count, bool mean, T* out) {
  for (int64_t col = ::ember::cuda::grid_stride_begin(); col < cols; col += ::ember::cuda::grid_stride_step()) {
    A s = 0;
    for (int64_t k = 0; k < groups; ++k) s += partial[k * cols + col];
    out[col] = finish<T, A>(s, count, mean);
  }
}

// Column sums of contiguous in [rows, cols] (cols a whole number of packs, in 16-byte aligned): block (kPackColumns
// packs of columns, group blockIdx.y of rows_per_group rows); thread (tx, ty) reads pack tx of rows ty, ty + 8, ...
// of the group with 128-bit loads and keeps V sums in A; then store_column_block. For out = sum(in, leading dims).
template <class T, class A>
__global__ void __launch_bounds__(kPackColumns* kRowThreads)
    column_sum_pack_kernel(const T* in, int64_t rows, int64_t cols, int64_t rows_per_group, void* sums, bool final,
                           bool mean) {
  using P = ::ember::cuda::Pack<T>;
  constexpr int V = P::kSize;
  const ColumnThread t = column_thread(rows, cols, rows_per_group, V);
  A acc[V];
  EMBER_UNROLL
  for (int e = 0; e < V; ++e) acc[e] = A(0);
  if (t.cp < t.col_packs) {
    const P* src = reinterpret_cast<const P*>(in) + t.cp;
    // Rows in batches of kBatch loads issued together (an unrolled loop kept two in flight), added in row order.
    constexpr int kBatch = 4;
    int64_t r = t.r0 + t.ty;
    for (; r + (kBatch - 1) * kRowThreads < t.r1; r += kBatch * kRowThreads) {
      P p[kBatch];
      EMBER_UNROLL
      for (int u = 0; u < kBatch; ++u) p[u] = src[(r + u * kRowThreads) * t.col_packs];
      EMBER_UNROLL
      for (int u = 0; u < kBatch; ++u) {
        EMBER_UNROLL
        for (int e = 0; e < V; ++e) acc[e] += static_cast<A>(static_cast<op_math_t<T>>(p[u].v[e]));
      }
    }
    for (; r < t.r1; r += kRowThreads) {
      const P p = src[r * t.col_packs];
      EMBER_UNROLL
      for (int e = 0; e < V; ++e) acc[e] += static_cast<A>(static_cast<op_math_t<T>>(p.v[e]));
    }
  }
  store_column_block<T, A, V>(acc, t.tx, t.ty, t.cp, cols, sums, final, rows, mean);
}

// Row sums of contiguous in [rows, n] (n a whole number of packs, in 16-byte aligned) into out [rows]: a warp per row
// (grid-stride over rows); lane l adds packs l, l + 32, ... of its row in A, element by element, then the 32 lanes'
// sums meet by shuffles (xor butterfly: every lane ends with the same total, lane 0 stores it).
template <class T, class A>
__global__ void __launch_bounds__(kRowBlockWarps * 32)
    row_sum_pack_kernel(const T* in, int64_t rows, int64_t n, bool mean, T* out) {
  using P = ::ember::cuda::Pack<T>;
  constexpr int V = P::kSize;
  const int lane = static_cast<int>(threadIdx.x) % 32;
  const int64_t packs = n / V;
  const int64_t first = static_cast<int64_t>(blockIdx.x) * kRowBlockWarps + threadIdx.x / 32;
  const int64_t step = static_cast<int64_t>(gridDim.x) * kRowBlockWarps;
  for (int64_t row = first; row < rows; row += step) {  // uniform across the warp
    const P* src = reinterpret_cast<const P*>(in) + row * packs;
    A acc = 0;
    EMBER_UNROLL_N(4)
    for (int64_t c = lane; c < packs; c += 32) {
      const P p = src[c];
      EMBER_UNROLL
      for (int e = 0; e < V; ++e) acc += static_cast<A>(static_cast<op_math_t<T>>(p.v[e]));
    }
    EMBER_UNROLL
    for (int mask = 16; mask > 0; mask >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, mask);
    if (lane == 0) out[row] = finish<T, A>(acc, n, mean);
  }
}

}  // namespace ember::kernels::cuda::reduce_pack

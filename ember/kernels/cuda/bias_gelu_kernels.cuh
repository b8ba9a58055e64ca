// The packed backward kernel of the fused bias + GELU (Note [Bias and GELU] in kernels/ops_bias_gelu.cpp; launched by
// bias_gelu.cu), in a header so that a host compiler can build it too: tests/kernels/test_bias_gelu_emulated.cpp runs
// it on the CPU under tests/harness/simt_emulator.h.
// Invariant: the same element math and the same order of additions as bias_gelu_backward_kernel in bias_gelu.cu:
// every column adds its rows ty, ty + 8, ... of the block's row group in row order per row thread, then the 8 row
// threads' sums in ty order, so the bias gradient does not depend on which of the two kernels ran.
#pragma once

#include <cstdint>

#include "ember/base/host_device.h"
#include "ember/core/half.h"
#include "ember/kernels/convert.h"
#include "ember/kernels/cuda/kernel_macros.h"
#include "ember/kernels/cuda/reduce_pack_kernels.cuh"
#include "ember/kernels/cuda/tensor_iter.cuh"
#include "ember/kernels/elementwise_math.h"

namespace ember::kernels::cuda::bias_gelu {

// Backward blocks: 32 column threads (or 32 packs of columns) x 8 row threads, as reduce_pack's column sums.
constexpr int kRowThreads = reduce_pack::kRowThreads;
static_assert(reduce_pack::kPackColumns == 32);

// The gradient of GELU (tanh form or exact) at v, times g.
template <class A>
EMBER_HD_INLINE A gelu_grad_at(A g, A v, bool tanh_approx) {
  return unary_backward_fn<A>(tanh_approx ? UnaryOp::GeluTanh : UnaryOp::GeluErf, g, v, 0.0, 0.0);
}

// Block (32 x V columns as 32 packs, group blockIdx.y of rows_per_group rows) over contiguous g, x, grad_x [rows,
// cols] and bias [cols], all 16-byte aligned with cols a multiple of V: thread (tx, ty) reads and writes pack tx of
// rows ty, ty + 8, ... with 128-bit accesses (bias_gelu_backward_kernel moves one element per access), keeps V column
// sums, and the block adds the 8 row threads' sums of each column in ty order into grad_bias (T, `final`) or the
// partial buffer [groups, cols] of op_math_t<T>. grad_x or sums may be null (not written). A thread takes its rows two
// at a time, the four loads of both before any arithmetic (grad_x does not alias the inputs: __restrict__), and adds
// them in row order as one row at a time would.
template <class T>
__global__ void __launch_bounds__(32 * kRowThreads)
    bias_gelu_backward_pack_kernel(const T* __restrict__ g, const T* __restrict__ x, const T* __restrict__ bias,
                                   int64_t rows, int64_t cols, int64_t rows_per_group, bool tanh_approx,
                                   T* __restrict__ grad_x, void* sums, bool final) {
  using A = op_math_t<T>;
  using P = ::ember::cuda::Pack<T>;
  constexpr int V = P::kSize;
  const reduce_pack::ColumnThread t = reduce_pack::column_thread(rows, cols, rows_per_group, V);
  A acc[V];
  EMBER_UNROLL
  for (int e = 0; e < V; ++e) acc[e] = A(0);
  if (t.cp < t.col_packs) {
    const P bv = reinterpret_cast<const P*>(bias)[t.cp];
    const P* gp = reinterpret_cast<const P*>(g);
    const P* xp = reinterpret_cast<const P*>(x);
    P* dp = reinterpret_cast<P*>(grad_x);
    // The gradient of one row's pack into d, added to the sums.
    auto row_grad = [&](const P& gv, const P& xv, P& d) {
      EMBER_UNROLL
      for (int e = 0; e < V; ++e) {
        const A v =
            gelu_grad_at(static_cast<A>(gv.v[e]), static_cast<A>(xv.v[e]) + static_cast<A>(bv.v[e]), tanh_approx);
        d.v[e] = T(v);
        acc[e] += v;
      }
    };
    int64_t r = t.r0 + t.ty;
    for (; r + kRowThreads < t.r1; r += 2 * kRowThreads) {
      const int64_t i0 = r * t.col_packs + t.cp, i1 = i0 + kRowThreads * t.col_packs;
      const P g0 = gp[i0], x0 = xp[i0], g1 = gp[i1], x1 = xp[i1];
      P d0, d1;
      row_grad(g0, x0, d0);
      row_grad(g1, x1, d1);
      if (dp != nullptr) {
        dp[i0] = d0;
        dp[i1] = d1;
      }
    }
    if (r < t.r1) {
      const int64_t i = r * t.col_packs + t.cp;
      P d;
      row_grad(gp[i], xp[i], d);
      if (dp != nullptr) dp[i] = d;
    }
  }
  if (sums == nullptr) return;  // uniform over the grid: no thread reaches the barrier
  reduce_pack::store_column_block<T, A, V>(acc, t.tx, t.ty, t.cp, cols, sums, final, rows, /*mean=*/false);
}

}  // namespace ember::kernels::cuda::bias_gelu

// The layer-norm backward's arguments and its packed kernels (Note [Packed layer-norm backward] in
// layer_norm_backward.cu, which launches them beside its strided ones), in a header so that a host compiler can build
// them too: tests/kernels/test_layer_norm_backward_emulated.cpp runs them on the CPU under
// tests/harness/simt_emulator.h.
// Invariant: arithmetic in op_math_t<T>, as the strided kernels' (the same formulas; sums in another order); every
// element of grad_x and of the affine gradients (or their partial sums) is written by the thread that owns it.
#pragma once

#include <cstdint>
#include <type_traits>

#include "ember/base/host_device.h"
#include "ember/core/half.h"
#include "ember/kernels/convert.h"
#include "ember/kernels/cuda/block_reduce.cuh"
#include "ember/kernels/cuda/kernel_macros.h"
#include "ember/kernels/cuda/reduce_pack_kernels.cuh"
#include "ember/kernels/cuda/tensor_iter.cuh"

namespace ember::kernels::cuda::layer_norm_backward {

// g [rows, cols] and x [rows, cols] with any strides; weight [cols] contiguous or null; mean/rstd [rows] contiguous;
// grad_x [rows, cols] contiguous. T: x and grad_x; P: g, weight and the affine gradients; A = op_math_t<T>, the
// statistics' type too.
struct Args {
  int64_t rows, cols;
  const void* g;
  int64_t g_rs, g_cs;
  const void* x;
  int64_t x_rs, x_cs;
  const void* weight;
  const void* mean;
  const void* rstd;
  const void* grad_add;  // T, or null: added to grad_x before its rounding
  int64_t add_rs, add_cs;
  void* grad_x;
};

constexpr int kPackRowThreads = 128;  // grad_x: 4 rows per block, one per warp
constexpr int kPackPerLane = 32;      // ... of at most 32 x 32 = 1024 elements (kPackPerLane / V packs per lane)

// grad_x over contiguous, 16-byte aligned g, x, grad_x (and grad_add) of one dtype T, cols a whole number of packs
// and at most 32 * kPackPerLane: a warp per row (a warp past the last row leaves as a whole). Lane l reads packs
// l, l + 32, ... of g, x (and weight) once with 128-bit loads, keeps d = g * w and xhat in registers, reduces the
// row's sums of d and d * xhat by xor shuffles, then writes grad_x = rstd * (d - mean(d) - xhat * mean(d * xhat))
// (+ grad_add) with 128-bit stores.
template <class T>
__global__ void __launch_bounds__(kPackRowThreads) grad_x_warp_pack_kernel(Args a) {
  using A = op_math_t<T>;
  using P = ::ember::cuda::Pack<T>;
  constexpr int V = P::kSize;
  constexpr int kPacks = kPackPerLane / V;
  const int lane = static_cast<int>(threadIdx.x) % 32;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;
  if (row >= a.rows) return;  // uniform across the warp
  const int64_t packs = a.cols / V;
  const P* g = reinterpret_cast<const P*>(static_cast<const T*>(a.g) + row * a.cols);
  const P* x = reinterpret_cast<const P*>(static_cast<const T*>(a.x) + row * a.cols);
  const P* w = static_cast<const P*>(a.weight);
  const A mu = static_cast<const A*>(a.mean)[row], k = static_cast<const A*>(a.rstd)[row];
  // Every load is issued before the first use (loads under `if (live)` would wait for each other); a lane past the
  // row reads the row's last pack again (packs >= 1: the launcher returns on cols 0) and ignores it.
  P gp[kPacks], xp[kPacks], wp[kPacks];
  EMBER_UNROLL
  for (int c = 0; c < kPacks; ++c) {
    const int64_t pc = lane + static_cast<int64_t>(c) * 32 < packs ? lane + static_cast<int64_t>(c) * 32 : packs - 1;
    gp[c] = g[pc];
    xp[c] = x[pc];
    if (w != nullptr) wp[c] = w[pc];
  }
  A d[kPacks][V], xh[kPacks][V];
  A sa = 0, sb = 0;  // sum d, sum d * xhat
  EMBER_UNROLL
  for (int c = 0; c < kPacks; ++c) {
    const bool live = lane + static_cast<int64_t>(c) * 32 < packs;
    EMBER_UNROLL
    for (int e = 0; e < V; ++e) {
      A dv = live ? static_cast<A>(gp[c].v[e]) : A(0);
      if (w != nullptr && live) dv *= static_cast<A>(wp[c].v[e]);
      const A xv = live ? (static_cast<A>(xp[c].v[e]) - mu) * k : A(0);
      d[c][e] = dv;
      xh[c][e] = xv;
      sa += dv;
      sb += dv * xv;
    }
  }
  const A n = static_cast<A>(a.cols);
  const A ma = ::ember::cuda::warp_all_reduce(sa, ::ember::cuda::SumOp{}) / n;
  const A mb = ::ember::cuda::warp_all_reduce(sb, ::ember::cuda::SumOp{}) / n;
  P* out = reinterpret_cast<P*>(static_cast<T*>(a.grad_x) + row * a.cols);
  const P* add = a.grad_add ? reinterpret_cast<const P*>(static_cast<const T*>(a.grad_add) + row * a.cols) : nullptr;
  EMBER_UNROLL
  for (int c = 0; c < kPacks; ++c) {
    const int64_t pc = lane + static_cast<int64_t>(c) * 32;
    if (pc >= packs) continue;
    P ap, o;
    if (add != nullptr) ap = add[pc];
    EMBER_UNROLL
    for (int e = 0; e < V; ++e) {
      A v = k * (d[c][e] - ma - xh[c][e] * mb);
      if (add != nullptr) v += static_cast<A>(ap.v[e]);
      o.v[e] = T(v);
    }
    out[pc] = o;
  }
}

// The affine gradients over contiguous, 16-byte aligned g and x of one dtype T, cols a whole number of packs: block
// (32 packs of columns, group blockIdx.y of rows_per_group rows), thread (tx, ty) reading pack tx of rows ty, ty + 8,
// ... of g (and x, for the weight's gradient) with 128-bit loads; V sums of g * xhat (wsum) and of g (bsum) per
// thread, then reduce_pack's block combine: into grad_weight / grad_bias (T, `final`) or row blockIdx.y of the
// partial sums [groups, cols] (A). Either destination may be null (uniform over the grid).
template <class T>
__global__ void __launch_bounds__(reduce_pack::kPackColumns* reduce_pack::kRowThreads)
    affine_partial_pack_kernel(Args a, int64_t rows_per_group, void* wsum, void* bsum, bool final) {
  using A = op_math_t<T>;
  using P = ::ember::cuda::Pack<T>;
  constexpr int V = P::kSize;
  constexpr int kRows = reduce_pack::kRowThreads;
  const reduce_pack::ColumnThread t = reduce_pack::column_thread(a.rows, a.cols, rows_per_group, V);
  A aw[V], ab[V];
  EMBER_UNROLL
  for (int e = 0; e < V; ++e) aw[e] = ab[e] = A(0);
  if (t.cp < t.col_packs) {
    const P* g = static_cast<const P*>(a.g) + t.cp;
    const P* x = a.x != nullptr ? static_cast<const P*>(a.x) + t.cp : nullptr;  // null: grad_bias alone
    const A* mean = static_cast<const A*>(a.mean);
    const A* rstd = static_cast<const A*>(a.rstd);
    // Rows two at a time with every load of both issued first (loads under a branch would wait for each other),
    // added in row order; kWeight: whether x, mean and rstd are read (the weight's gradient is asked for).
    auto walk = [&](auto weight) {
      constexpr bool kWeight = decltype(weight)::value;
      auto add = [&](const P& gp, const P& xp, A mu, A k) {
        EMBER_UNROLL
        for (int e = 0; e < V; ++e) {
          if constexpr (kWeight) aw[e] += static_cast<A>(gp.v[e]) * ((static_cast<A>(xp.v[e]) - mu) * k);
          ab[e] += static_cast<A>(gp.v[e]);
        }
      };
      int64_t r = t.r0 + t.ty;
      for (; r + kRows < t.r1; r += 2 * kRows) {
        const P g0 = g[r * t.col_packs], g1 = g[(r + kRows) * t.col_packs];
        P x0{}, x1{};
        A mu0 = 0, mu1 = 0, k0 = 0, k1 = 0;
        if constexpr (kWeight) {
          x0 = x[r * t.col_packs];
          x1 = x[(r + kRows) * t.col_packs];
          mu0 = mean[r];
          mu1 = mean[r + kRows];
          k0 = rstd[r];
          k1 = rstd[r + kRows];
        }
        add(g0, x0, mu0, k0);
        add(g1, x1, mu1, k1);
      }
      if (r < t.r1) {
        if constexpr (kWeight)
          add(g[r * t.col_packs], x[r * t.col_packs], mean[r], rstd[r]);
        else
          add(g[r * t.col_packs], P{}, A(0), A(0));
      }
    };
    if (wsum != nullptr)
      walk(std::true_type{});
    else
      walk(std::false_type{});
  }
  if (wsum != nullptr)
    reduce_pack::store_column_block<T, A, V>(aw, t.tx, t.ty, t.cp, a.cols, wsum, final, a.rows, false);
  if (bsum != nullptr)
    reduce_pack::store_column_block<T, A, V>(ab, t.tx, t.ty, t.cp, a.cols, bsum, final, a.rows, false);
}

}  // namespace ember::kernels::cuda::layer_norm_backward

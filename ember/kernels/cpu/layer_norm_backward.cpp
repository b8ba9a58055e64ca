// CPU layer-norm backward (Note [Fused layer-norm backward] in kernels/ops_norm.cpp): grad_x row by row, the rows
// split over the threads; grad_weight / grad_bias column block by column block, each column summed over the rows in
// row order by one thread. Every sum accumulates in double; the row sums in 8 interleaved lanes (vectorised), combined
// in a fixed order. Results are therefore bitwise independent of the thread count.
#include <algorithm>
#include <type_traits>

#include "ember/core/parallel.h"
#include "ember/kernels/cpu/loops.h"
#include "ember/kernels/stubs.h"

namespace ember::kernels::cpu {
namespace {

constexpr int kLanes = 8;             // interleaved double accumulators of a row sum
constexpr int64_t kColumnBlock = 64;  // columns per chunk of the weight/bias pass (2 x 64 double accumulators)

// T: x's element type and grad_x's; P: g, weight, grad_weight and grad_bias (T, or float for the mixed form); S: the
// statistics. M: the arithmetic of one element (float, double for f64).
template <class T, class P, class S>
struct LayerNormBackwardArgs {
  using M = op_math_t<T>;
  int64_t rows, cols;
  const P* g;
  int64_t g_rs, g_cs;
  const T* x;
  int64_t x_rs, x_cs;
  const P* w;  // null: no weight
  int64_t w_s;
  const S* mean;
  const S* rstd;
  int64_t m_s, r_s;
  const T* add;  // null: no grad_add
  int64_t add_rs, add_cs;
};

// grad_x for rows [r0, r1). Unit: g, x and weight have unit column stride (the loops then vectorise).
template <bool Unit, class T, class P, class S>
void grad_x_rows(const LayerNormBackwardArgs<T, P, S>& a, T* gx, int64_t r0, int64_t r1) {
  using M = op_math_t<T>;
  const int64_t n = a.cols;
  const int64_t gcs = Unit ? 1 : a.g_cs, xcs = Unit ? 1 : a.x_cs, ws = Unit ? 1 : a.w_s;
  for (int64_t r = r0; r < r1; ++r) {
    const P* g = a.g + r * a.g_rs;
    const T* x = a.x + r * a.x_rs;
    const M mu = static_cast<M>(a.mean[r * a.m_s]), k = static_cast<M>(a.rstd[r * a.r_s]);
    auto dxhat = [&](int64_t j) {
      const M gj = static_cast<M>(g[j * gcs]);
      return a.w ? gj * static_cast<M>(a.w[j * ws]) : gj;
    };
    auto xhat = [&](int64_t j) { return (static_cast<M>(x[j * xcs]) - mu) * k; };
    double sa[kLanes] = {}, sb[kLanes] = {};  // sum dxhat, sum dxhat * xhat
    int64_t j = 0;
    for (; j + kLanes <= n; j += kLanes) {
      for (int l = 0; l < kLanes; ++l) {
        const M d = dxhat(j + l);
        sa[l] += static_cast<double>(d);
        sb[l] += static_cast<double>(d * xhat(j + l));
      }
    }
    for (int l = 0; j < n; ++j, ++l) {
      const M d = dxhat(j);
      sa[l] += static_cast<double>(d);
      sb[l] += static_cast<double>(d * xhat(j));
    }
    double ta = 0.0, tb = 0.0;
    for (int l = 0; l < kLanes; ++l) {
      ta += sa[l];
      tb += sb[l];
    }
    const M ma = static_cast<M>(ta / static_cast<double>(n)), mb = static_cast<M>(tb / static_cast<double>(n));
    T* out = gx + r * n;
    if (a.add) {  // the residual stream's gradient, added before the one rounding
      const T* add = a.add + r * a.add_rs;
      const int64_t acs = Unit ? 1 : a.add_cs;
      for (int64_t c = 0; c < n; ++c)
        out[c] = T(k * (dxhat(c) - ma - xhat(c) * mb) + static_cast<M>(add[c * acs]));
    } else {
      for (int64_t c = 0; c < n; ++c) out[c] = T(k * (dxhat(c) - ma - xhat(c) * mb));
    }
  }
}

// grad_weight / grad_bias (either may be null) for the columns [c0, c1), c1 - c0 <= kColumnBlock: each summed over
// all rows in row order. Unit: g and x have unit column stride.
template <bool Unit, class T, class P, class S>
void affine_columns(const LayerNormBackwardArgs<T, P, S>& a, P* gw, P* gb, int64_t c0, int64_t c1) {
  using M = op_math_t<T>;
  const int64_t gcs = Unit ? 1 : a.g_cs, xcs = Unit ? 1 : a.x_cs;
  double sw[kColumnBlock] = {}, sb[kColumnBlock] = {};
  const int64_t n = c1 - c0;
  for (int64_t r = 0; r < a.rows; ++r) {
    const P* g = a.g + r * a.g_rs + c0 * gcs;
    if (gw) {
      const T* x = a.x + r * a.x_rs + c0 * xcs;
      const M mu = static_cast<M>(a.mean[r * a.m_s]), k = static_cast<M>(a.rstd[r * a.r_s]);
      for (int64_t c = 0; c < n; ++c)
        sw[c] += static_cast<double>(static_cast<M>(g[c * gcs]) * ((static_cast<M>(x[c * xcs]) - mu) * k));
    }
    if (gb)
      for (int64_t c = 0; c < n; ++c) sb[c] += static_cast<double>(static_cast<M>(g[c * gcs]));
  }
  for (int64_t c = 0; c < n; ++c) {
    if (gw) gw[c0 + c] = P(static_cast<M>(sw[c]));
    if (gb) gb[c0 + c] = P(static_cast<M>(sb[c]));
  }
}

template <class T, class P, class S>
void layer_norm_backward_typed(const Tensor& g, const Tensor& x, const Tensor& weight, const Tensor& mean,
                               const Tensor& rstd, const Tensor& grad_add, const Tensor& grad_x,
                               const Tensor& grad_weight, const Tensor& grad_bias) {
  LayerNormBackwardArgs<T, P, S> a{};
  a.rows = g.size(0);
  a.cols = g.size(1);
  a.g = static_cast<const P*>(g.raw_data());
  a.g_rs = g.stride(0);
  a.g_cs = g.stride(1);
  if (x.defined()) {
    a.x = static_cast<const T*>(x.raw_data());
    a.x_rs = x.stride(0);
    a.x_cs = x.stride(1);
    a.mean = static_cast<const S*>(mean.raw_data());
    a.rstd = static_cast<const S*>(rstd.raw_data());
    a.m_s = mean.stride(0);
    a.r_s = rstd.stride(0);
  }
  if (weight.defined()) {
    a.w = static_cast<const P*>(weight.raw_data());
    a.w_s = weight.stride(0);
  }
  if (grad_add.defined()) {
    a.add = static_cast<const T*>(grad_add.raw_data());
    a.add_rs = grad_add.stride(0);
    a.add_cs = grad_add.stride(1);
  }
  const bool unit = a.g_cs == 1 && (!a.x || a.x_cs == 1) && (!a.w || a.w_s == 1) && (!a.add || a.add_cs == 1);
  if (grad_x.defined() && a.rows > 0) {
    T* gx = static_cast<T*>(grad_x.raw_data());
    const int64_t grain = std::max<int64_t>(1, kElementGrain / std::max<int64_t>(a.cols, 1));
    parallel::parallel_for(a.rows, grain, [&](int64_t r0, int64_t r1) {
      if (unit)
        grad_x_rows<true>(a, gx, r0, r1);
      else
        grad_x_rows<false>(a, gx, r0, r1);
    });
  }
  P* gw = grad_weight.defined() ? static_cast<P*>(grad_weight.raw_data()) : nullptr;
  P* gb = grad_bias.defined() ? static_cast<P*>(grad_bias.raw_data()) : nullptr;
  if (gw || gb) {
    const int64_t blocks = (a.cols + kColumnBlock - 1) / kColumnBlock;
    const int64_t per_block = std::max<int64_t>(a.rows, 1) * kColumnBlock;
    const int64_t grain = std::max<int64_t>(1, kElementGrain / per_block);
    parallel::parallel_for(blocks, grain, [&](int64_t b0, int64_t b1) {
      for (int64_t b = b0; b < b1; ++b) {
        const int64_t c0 = b * kColumnBlock, c1 = std::min(a.cols, c0 + kColumnBlock);
        if (unit)
          affine_columns<true>(a, gw, gb, c0, c1);
        else
          affine_columns<false>(a, gw, gb, c0, c1);
      }
    });
  }
}

void layer_norm_backward_kernel(const Tensor& g, const Tensor& x, const Tensor& weight, const Tensor& mean,
                                const Tensor& rstd, const Tensor& grad_add, const Tensor& grad_x,
                                const Tensor& grad_weight, const Tensor& grad_bias) {
  // x's dtype decides T; without x (grad_bias alone) T = P. The front end (ops_norm.cpp) checked the pairing.
  const DType xt = x.defined() ? x.dtype() : g.dtype();
  if (g.dtype() != xt) {  // mixed: f16/bf16 x, f32 g/weight/affine gradients
    if (xt == DType::f16)
      layer_norm_backward_typed<Half, float, float>(g, x, weight, mean, rstd, grad_add, grad_x, grad_weight,
                                                    grad_bias);
    else
      layer_norm_backward_typed<BFloat16, float, float>(g, x, weight, mean, rstd, grad_add, grad_x, grad_weight,
                                                        grad_bias);
    return;
  }
  EMBER_DISPATCH_FLOAT(xt, "layer_norm_backward", [&] {
    using stats_t = std::conditional_t<std::is_same_v<scalar_t, double>, double, float>;
    layer_norm_backward_typed<scalar_t, scalar_t, stats_t>(g, x, weight, mean, rstd, grad_add, grad_x,
                                                           grad_weight, grad_bias);
  });
}

}  // namespace

EMBER_REGISTER_KERNEL(layer_norm_backward, DeviceType::CPU, layer_norm_backward_kernel);

}  // namespace ember::kernels::cpu

// CPU softmax / log-softmax along any dim of any strides, and layer norm over the rows of an [rows, cols] view.
// Softmax subtracts the row max before exponentiating (finite for any finite input); sums and layer-norm statistics
// accumulate in double; layer norm uses the biased variance and rstd = 1 / sqrt(var + eps).
#include <algorithm>
#include <cmath>
#include <limits>
#include <type_traits>

#include "ember/kernels/cpu/loops.h"
#include "ember/kernels/cpu/softmax_row.h"
#include "ember/kernels/stubs.h"

namespace ember::kernels::cpu {
namespace {

template <class T>
void softmax_typed(const Tensor& in, const Tensor& out, int64_t dim, bool log) {
  const int64_t n = in.size(dim), s_in = in.stride(dim), s_out = out.stride(dim);
  const T* src = static_cast<const T*>(in.raw_data());
  T* dst = static_cast<T*>(out.raw_data());
  Shape rows = in.sizes();
  rows[static_cast<size_t>(dim)] = 1;  // strided_loop skips size-1 dims, so it visits each row's first element
  strided_loop<2>(
      rows, {&out.strides(), &in.strides()},
      [&](const std::array<int64_t, 2>& off, int64_t count, const std::array<int64_t, 2>& st) {
        for (int64_t r = 0; r < count; ++r)
          softmax_row(src + off[1] + r * st[1], s_in, dst + off[0] + r * st[0], s_out, n, log);
      },
      std::max<int64_t>(1, kElementGrain / std::max<int64_t>(n, 1)));  // rows per chunk
}

void softmax_kernel(const Tensor& in, const Tensor& out, int64_t dim, bool log) {
  EMBER_DISPATCH_FLOAT(in.dtype(), "softmax", [&] { softmax_typed<scalar_t>(in, out, dim, log); });
}

constexpr int kLanes = 8;

// sum_{j < n} f(j) in kLanes interleaved double accumulators, added in lane order at the end.
template <class F>
double lane_sum(int64_t n, F&& f) {
  double acc[kLanes] = {};
  int64_t j = 0;
  for (; j + kLanes <= n; j += kLanes)
    for (int l = 0; l < kLanes; ++l) acc[l] += f(j + l);
  for (int l = 0; j < n; ++j, ++l) acc[l] += f(j);
  double total = 0.0;
  for (int l = 0; l < kLanes; ++l) total += acc[l];
  return total;
}

// T: x's element type; P: weight, bias and out (T itself, or float for the mixed f16/bf16-in, f32-out form);
// S: the statistics. With `residual` defined, the row normalised is x + residual, rounded to T and stored into `sum`
// first (add_layer_norm), then read back from there: the same values and order as layer norm of the stored sum.
// R: the residual's element type (T, or f16/bf16 added to an f32 x).
template <class T, class P, class S, class R = T>
void layer_norm_typed(const Tensor& x, const Tensor& residual, const Tensor& sum, const Tensor& weight,
                      const Tensor& bias, double eps, const Tensor& out, const Tensor& mean, const Tensor& rstd) {
  using math_t = op_math_t<T>;
  const int64_t rows = x.size(0), cols = x.size(1);
  const bool fused = residual.defined();
  const int64_t rs = fused ? cols : x.stride(0), cs = fused ? 1 : x.stride(1);
  const T* px = static_cast<const T*>(fused ? sum.raw_data() : x.raw_data());
  T* ps = fused ? static_cast<T*>(sum.raw_data()) : nullptr;
  const T* pa = fused ? static_cast<const T*>(x.raw_data()) : nullptr;
  const R* pr = fused ? static_cast<const R*>(residual.raw_data()) : nullptr;
  const int64_t a_rs = fused ? x.stride(0) : 0, a_cs = fused ? x.stride(1) : 0;
  const int64_t r_rs = fused ? residual.stride(0) : 0, r_cs = fused ? residual.stride(1) : 0;
  const P* pw = weight.defined() ? static_cast<const P*>(weight.raw_data()) : nullptr;
  const P* pb = bias.defined() ? static_cast<const P*>(bias.raw_data()) : nullptr;
  const int64_t ws = weight.defined() ? weight.stride(0) : 0, bs = bias.defined() ? bias.stride(0) : 0;
  P* po = static_cast<P*>(out.raw_data());
  S* pm = static_cast<S*>(mean.raw_data());
  S* pk = static_cast<S*>(rstd.raw_data());
  // Rows are independent: they are split over the CPU threads, each computed as serially. The two row sums run in
  // kLanes interleaved double accumulators (element j in lane j % kLanes, lanes added in order), so they vectorise
  // and stay independent of the thread count.
  const int64_t grain = std::max<int64_t>(1, kElementGrain / std::max<int64_t>(cols, 1));
  // One row; `stride` is x's column stride, a compile-time 1 for rows with unit stride (the loops then vectorise).
  auto row_norm = [&](int64_t r, auto stride) {
    const T* row = cols > 0 ? px + r * rs : px;  // an empty x may have no storage (null px): no offset applied
    if (fused && cols > 0) {  // the sum row, as ops::add computes it: in math_t, rounded to T
      T* srow = ps + r * cols;
      const T* arow = pa + r * a_rs;
      const R* rrow = pr + r * r_rs;
      if (a_cs == 1 && r_cs == 1) {
        for (int64_t j = 0; j < cols; ++j) srow[j] = T(static_cast<math_t>(arow[j]) + static_cast<math_t>(rrow[j]));
      } else {
        for (int64_t j = 0; j < cols; ++j)
          srow[j] = T(static_cast<math_t>(arow[j * a_cs]) + static_cast<math_t>(rrow[j * r_cs]));
      }
    }
    auto value = [&](int64_t j) { return static_cast<double>(static_cast<math_t>(row[j * stride])); };
    const double mu = lane_sum(cols, value) / static_cast<double>(cols);
    const double ss = lane_sum(cols, [&](int64_t j) {
      const double d = value(j) - mu;
      return d * d;
    });
    const double inv = 1.0 / std::sqrt(ss / static_cast<double>(cols) + eps);
    pm[r] = static_cast<S>(mu);
    pk[r] = static_cast<S>(inv);
    const math_t m = static_cast<math_t>(mu), k = static_cast<math_t>(inv);
    P* __restrict y = po + r * cols;
    if (pw && pb && ws == 1 && bs == 1) {  // the usual affine form: unit strides, so the loop vectorises
      const P* __restrict w = pw;
      const P* __restrict b = pb;
      for (int64_t j = 0; j < cols; ++j)
        y[j] = P((static_cast<math_t>(row[j * stride]) - m) * k * static_cast<math_t>(w[j]) +
                 static_cast<math_t>(b[j]));
      return;
    }
    for (int64_t j = 0; j < cols; ++j) {
      math_t v = (static_cast<math_t>(row[j * stride]) - m) * k;
      if (pw) v *= static_cast<math_t>(pw[j * ws]);
      if (pb) v += static_cast<math_t>(pb[j * bs]);
      y[j] = P(v);
    }
  };
  parallel::parallel_for(rows, grain, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      if (cs == 1)
        row_norm(r, std::integral_constant<int64_t, 1>{});
      else
        row_norm(r, cs);
    }
  });
}

void add_layer_norm_kernel(const Tensor& x, const Tensor& residual, const Tensor& weight, const Tensor& bias,
                           double eps, const Tensor& sum, const Tensor& out, const Tensor& mean, const Tensor& rstd) {
  if (residual.defined() && residual.dtype() != x.dtype()) {  // f32 x, f16/bf16 residual (ops_norm.cpp checked)
    if (residual.dtype() == DType::f16)
      layer_norm_typed<float, float, float, Half>(x, residual, sum, weight, bias, eps, out, mean, rstd);
    else
      layer_norm_typed<float, float, float, BFloat16>(x, residual, sum, weight, bias, eps, out, mean, rstd);
    return;
  }
  if (out.dtype() != x.dtype()) {  // mixed: f16/bf16 x, f32 weight/bias/out (ops_norm.cpp checks the pairing)
    if (x.dtype() == DType::f16)
      layer_norm_typed<Half, float, float>(x, residual, sum, weight, bias, eps, out, mean, rstd);
    else
      layer_norm_typed<BFloat16, float, float>(x, residual, sum, weight, bias, eps, out, mean, rstd);
    return;
  }
  EMBER_DISPATCH_FLOAT(x.dtype(), "layer_norm", [&] {
    using stats_t = std::conditional_t<std::is_same_v<scalar_t, double>, double, float>;
    layer_norm_typed<scalar_t, scalar_t, stats_t>(x, residual, sum, weight, bias, eps, out, mean, rstd);
  });
}

void layer_norm_kernel(const Tensor& x, const Tensor& weight, const Tensor& bias, double eps, const Tensor& out,
                       const Tensor& mean, const Tensor& rstd) {
  add_layer_norm_kernel(x, Tensor(), weight, bias, eps, Tensor(), out, mean, rstd);
}

}  // namespace

EMBER_REGISTER_KERNEL(softmax, DeviceType::CPU, softmax_kernel);
EMBER_REGISTER_KERNEL(layer_norm, DeviceType::CPU, layer_norm_kernel);
EMBER_REGISTER_KERNEL(add_layer_norm, DeviceType::CPU, add_layer_norm_kernel);

}  // namespace ember::kernels::cpu

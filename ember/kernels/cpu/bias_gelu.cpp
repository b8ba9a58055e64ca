// CPU kernels of the fused bias + GELU (Note [Bias and GELU] in kernels/ops_bias_gelu.cpp): the forward row by row,
// the rows split over the threads; the backward over a fixed number of row groups, each writing its rows' input
// gradient and its own double column sums, which are then added in group order — bitwise independent of the thread
// count. The f32 exact GELU uses the vectorisable form of vec_math.h (Note [Vectorisable float math]).
#include <algorithm>
#include <type_traits>

#include "ember/core/parallel.h"
#include "ember/kernels/cpu/loops.h"
#include "ember/kernels/cpu/meta_workspace.h"
#include "ember/kernels/cpu/vec_math.h"
#include "ember/kernels/elementwise_math.h"
#include "ember/kernels/stubs.h"

namespace ember::kernels::cpu {
namespace {

constexpr int64_t kMaxGroups = 8;  // row groups of the backward's column sums (each a [cols] double buffer)

// The number of row groups for `rows` rows: from the sizes alone.
int64_t group_count(int64_t rows) { return std::clamp<int64_t>(rows, 1, kMaxGroups); }

template <class M, bool TanhApprox>
inline M gelu_of(M v) {
  if constexpr (std::is_same_v<M, float> && !TanhApprox) return gelu_vec(v);
  return unary_fn<M>(TanhApprox ? UnaryOp::GeluTanh : UnaryOp::GeluErf, v, 0.0, 0.0);
}

template <class M, bool TanhApprox>
inline M gelu_grad_of(M g, M v) {
  if constexpr (std::is_same_v<M, float> && !TanhApprox) return gelu_backward_vec(g, v);
  return unary_backward_fn<M>(TanhApprox ? UnaryOp::GeluTanh : UnaryOp::GeluErf, g, v, 0.0, 0.0);
}

template <class T, bool TanhApprox>
void forward_typed(const Tensor& x, const Tensor& bias, const Tensor& out) {
  using M = op_math_t<T>;
  const int64_t rows = x.size(0), cols = x.size(1);
  const T* px = static_cast<const T*>(x.raw_data());
  const T* pb = static_cast<const T*>(bias.raw_data());
  T* po = static_cast<T*>(out.raw_data());
  const int64_t grain = std::max<int64_t>(1, kElementGrain / std::max<int64_t>(cols, 1));
  parallel::parallel_for(rows, grain, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const T* xr = px + r * cols;
      T* o = po + r * cols;
      for (int64_t j = 0; j < cols; ++j)
        o[j] = T(gelu_of<M, TanhApprox>(static_cast<M>(xr[j]) + static_cast<M>(pb[j])));
    }
  });
}

template <class T, bool TanhApprox>
void backward_typed(const Tensor& g, const Tensor& x, const Tensor& bias, const Tensor& grad_x,
                    const Tensor& grad_bias) {
  using M = op_math_t<T>;
  const int64_t rows = x.size(0), cols = x.size(1);
  const T* pg = static_cast<const T*>(g.raw_data());
  const T* px = static_cast<const T*>(x.raw_data());
  const T* pb = static_cast<const T*>(bias.raw_data());
  T* gx = grad_x.defined() ? static_cast<T*>(grad_x.raw_data()) : nullptr;
  T* gb = grad_bias.defined() ? static_cast<T*>(grad_bias.raw_data()) : nullptr;
  const int64_t groups = group_count(rows), per_group = (rows + groups - 1) / groups;
  // The groups' column sums: workspace taken before the chunks run (chunk bodies must not allocate).
  Tensor partial;
  if (gb) partial = empty({groups, cols}, TensorOptions(DType::f64, Device::cpu()));
  double* ps = gb ? static_cast<double*>(partial.raw_data()) : nullptr;
  parallel::parallel_for(groups, 1, [&](int64_t q0, int64_t q1) {
    for (int64_t q = q0; q < q1; ++q) {
      double* acc = ps ? ps + q * cols : nullptr;
      if (acc) std::fill(acc, acc + cols, 0.0);
      const int64_t r0 = q * per_group, r1 = std::min(rows, r0 + per_group);
      for (int64_t r = r0; r < r1; ++r) {
        const T* gr = pg + r * cols;
        const T* xr = px + r * cols;
        auto grad = [&](int64_t j) {
          return gelu_grad_of<M, TanhApprox>(static_cast<M>(gr[j]), static_cast<M>(xr[j]) + static_cast<M>(pb[j]));
        };
        T* o = gx ? gx + r * cols : nullptr;
        if (o && acc) {
          for (int64_t j = 0; j < cols; ++j) {
            const M d = grad(j);
            o[j] = T(d);
            acc[j] += static_cast<double>(d);
          }
        } else if (o) {
          for (int64_t j = 0; j < cols; ++j) o[j] = T(grad(j));
        } else {
          for (int64_t j = 0; j < cols; ++j) acc[j] += static_cast<double>(grad(j));
        }
      }
    }
  });
  if (!gb) return;
  for (int64_t j = 0; j < cols; ++j) {
    double s = 0.0;
    for (int64_t q = 0; q < groups; ++q) s += ps[q * cols + j];
    gb[j] = T(static_cast<M>(s));
  }
}

void bias_gelu_kernel(const Tensor& x, const Tensor& bias, bool tanh_approx, const Tensor& out) {
  EMBER_DISPATCH_FLOAT(x.dtype(), "bias_gelu", [&] {
    if (tanh_approx)
      forward_typed<scalar_t, true>(x, bias, out);
    else
      forward_typed<scalar_t, false>(x, bias, out);
  });
}

void bias_gelu_backward_kernel(const Tensor& g, const Tensor& x, const Tensor& bias, bool tanh_approx,
                               const Tensor& grad_x, const Tensor& grad_bias) {
  EMBER_DISPATCH_FLOAT(x.dtype(), "bias_gelu_backward", [&] {
    if (tanh_approx)
      backward_typed<scalar_t, true>(g, x, bias, grad_x, grad_bias);
    else
      backward_typed<scalar_t, false>(g, x, bias, grad_x, grad_bias);
  });
}

// backward_typed's workspace on meta (Note [Meta kernels] in kernels/stubs.h): the groups' column sums.
void bias_gelu_backward_meta_kernel(const Tensor&, const Tensor& x, const Tensor&, bool, const Tensor&,
                                    const Tensor& grad_bias) {
  if (!grad_bias.defined()) return;
  MetaWorkspace ws;
  ws.take(group_count(x.size(0)) * x.size(1), DType::f64);
}

}  // namespace

EMBER_REGISTER_KERNEL(bias_gelu, DeviceType::CPU, bias_gelu_kernel);
EMBER_REGISTER_KERNEL(bias_gelu_backward, DeviceType::CPU, bias_gelu_backward_kernel);
EMBER_REGISTER_KERNEL(bias_gelu_backward, DeviceType::Meta, bias_gelu_backward_meta_kernel);

}  // namespace ember::kernels::cpu

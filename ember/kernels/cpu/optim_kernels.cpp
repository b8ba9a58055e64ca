// CPU kernels of the fused optimizer updates (sgd_step, adam_step): one pass over the contiguous parameter, its
// gradient and its state, each element updated with the shared math of kernels/optim_math.h.
// Invariant: every element is read once and written once; the front end (ops_optim.cpp) has checked the layout.
// Elements are independent, so the pass is split over the CPU threads (core/parallel.h) with the same results.
#include <type_traits>

#include "ember/core/parallel.h"
#include "ember/kernels/optim_math.h"
#include "ember/kernels/stubs.h"

namespace ember::kernels::cpu {
namespace {

constexpr int64_t kOptimGrain = int64_t{1} << 15;  // elements per chunk at least

// State element type for a parameter of type T: double for f64, else float.
template <class T>
using state_t = std::conditional_t<std::is_same_v<T, double>, double, float>;

template <class T>
void sgd_typed(const Tensor& param, const Tensor& grad, const Tensor& momentum_buf, const SgdParams& params) {
  using M = op_math_t<T>;
  using S = state_t<T>;
  const SgdCoeffs<M> c = sgd_coeffs<M>(params);
  const int64_t n = param.numel();
  T* p = static_cast<T*>(param.raw_data());
  const T* g = static_cast<const T*>(grad.raw_data());
  if (!c.use_momentum) {
    parallel::parallel_for(n, kOptimGrain, [&](int64_t lo, int64_t hi) {
      const SgdCoeffs<M> k = c;  // a local copy (see adam_typed)
      M unused{};
      for (int64_t i = lo; i < hi; ++i) p[i] = T(sgd_update<M>(M(p[i]), M(g[i]), unused, k));
    });
    return;
  }
  S* b = static_cast<S*>(momentum_buf.raw_data());
  parallel::parallel_for(n, kOptimGrain, [&](int64_t lo, int64_t hi) {
    const SgdCoeffs<M> k = c;  // a local copy (see adam_typed)
    for (int64_t i = lo; i < hi; ++i) {
      M buf = static_cast<M>(b[i]);
      p[i] = T(sgd_update<M>(M(p[i]), M(g[i]), buf, k));
      b[i] = static_cast<S>(buf);
    }
  });
}

template <class T>
void adam_typed(const Tensor& param, const Tensor& grad, const Tensor& exp_avg, const Tensor& exp_avg_sq,
                const AdamParams& params) {
  using M = op_math_t<T>;
  using S = state_t<T>;
  const AdamCoeffs<M> c = adam_coeffs<M>(params);
  const int64_t n = param.numel();
  T* p = static_cast<T*>(param.raw_data());
  const T* g = static_cast<const T*>(grad.raw_data());
  S* m = static_cast<S*>(exp_avg.raw_data());
  S* v = static_cast<S*>(exp_avg_sq.raw_data());
  parallel::parallel_for(n, kOptimGrain, [&](int64_t lo, int64_t hi) {
    // A local copy of the coefficients: captured by reference they might alias the stores through p, m, v, so GCC
    // reloads them every element and does not vectorise the loop.
    const AdamCoeffs<M> k = c;
    for (int64_t i = lo; i < hi; ++i) {
      M mi = static_cast<M>(m[i]), vi = static_cast<M>(v[i]);
      p[i] = T(adam_update<M>(M(p[i]), M(g[i]), mi, vi, k));
      m[i] = static_cast<S>(mi);
      v[i] = static_cast<S>(vi);
    }
  });
}

void sgd_step_kernel(const Tensor& param, const Tensor& grad, const Tensor& momentum_buf, const SgdParams& p) {
  EMBER_DISPATCH_FLOAT(param.dtype(), "sgd_step_", [&] { sgd_typed<scalar_t>(param, grad, momentum_buf, p); });
}

void adam_step_kernel(const Tensor& param, const Tensor& grad, const Tensor& exp_avg, const Tensor& exp_avg_sq,
                      const AdamParams& p) {
  EMBER_DISPATCH_FLOAT(param.dtype(), "adam_step_", [&] { adam_typed<scalar_t>(param, grad, exp_avg, exp_avg_sq, p); });
}

}  // namespace

EMBER_REGISTER_KERNEL(sgd_step, DeviceType::CPU, sgd_step_kernel);
EMBER_REGISTER_KERNEL(adam_step, DeviceType::CPU, adam_step_kernel);

}  // namespace ember::kernels::cpu

// CPU kernels of the fused softmax + cross-entropy (Note [Fused cross-entropy] in kernels/stubs.h): rows are split
// over the CPU threads; per row one pass finds the max, one sums e^(x - max) and x (double accumulators), and the
// backward writes each gradient element in one more pass. f32 rows use exp_vec in 8 lanes (vec_math.h).
// Invariant: a NaN logit makes its row's loss and gradient NaN, as the composed log_softmax path does.
#include <algorithm>
#include <cmath>
#include <limits>
#include <type_traits>

#include "ember/core/parallel.h"
#include "ember/kernels/cpu/vec_math.h"
#include "ember/kernels/stubs.h"

namespace ember::kernels::cpu {
namespace {

constexpr int64_t kRowGrain = int64_t{1} << 14;  // elements per chunk of rows at least

// e^d in the math type: exp_vec for float (Note [Vectorisable float math]), std::exp for double.
template <class M>
inline M exp_math(M d) {
  if constexpr (std::is_same_v<M, float>)
    return exp_vec(d);
  else
    return std::exp(d);
}

struct RowStats {
  double lse = 0.0, sum_x = 0.0;
};

// log sum_j e^(x_j) and sum_j x_j of one contiguous row (n >= 1).
template <class T>
RowStats row_stats(const T* x, int64_t n) {
  using M = op_math_t<T>;
  constexpr int64_t L = std::is_same_v<T, float> ? 8 : 1;  // independent lanes, so the f32 loops vectorise
  M lane_max[L];
  int lane_nan[L] = {};
  for (int64_t l = 0; l < L; ++l) lane_max[l] = -std::numeric_limits<M>::infinity();
  int64_t i = 0;
  for (; i + L <= n; i += L)
    for (int64_t l = 0; l < L; ++l) {
      const M v = static_cast<M>(x[i + l]);
      lane_nan[l] |= v != v;
      lane_max[l] = v > lane_max[l] ? v : lane_max[l];
    }
  for (; i < n; ++i) {
    const M v = static_cast<M>(x[i]);
    lane_nan[0] |= v != v;
    lane_max[0] = v > lane_max[0] ? v : lane_max[0];
  }
  M mx = lane_max[0];
  bool has_nan = false;
  for (int64_t l = 0; l < L; ++l) {
    mx = lane_max[l] > mx ? lane_max[l] : mx;
    has_nan = has_nan || lane_nan[l] != 0;
  }
  if (has_nan) mx = std::numeric_limits<M>::quiet_NaN();
  double lane_sum[L] = {}, lane_x[L] = {};
  i = 0;
  for (; i + L <= n; i += L)
    for (int64_t l = 0; l < L; ++l) {
      const M v = static_cast<M>(x[i + l]);
      if constexpr (std::is_same_v<M, float>)
        lane_sum[l] += static_cast<double>(exp_vec(v - mx));
      else
        lane_sum[l] += std::exp(static_cast<double>(v - mx));
      lane_x[l] += static_cast<double>(v);
    }
  for (; i < n; ++i) {
    const M v = static_cast<M>(x[i]);
    lane_sum[0] += std::exp(static_cast<double>(v - mx));
    lane_x[0] += static_cast<double>(v);
  }
  RowStats s;
  double sum = 0.0;
  for (int64_t l = 0; l < L; ++l) {
    sum += lane_sum[l];
    s.sum_x += lane_x[l];
  }
  s.lse = static_cast<double>(mx) + std::log(sum);
  return s;
}

template <class T>
void forward_typed(const Tensor& logits, const Tensor& target, int64_t ignore_index, double smoothing,
                   const Tensor& loss, const Tensor& lse) {
  using A = std::conditional_t<std::is_same_v<T, double>, double, float>;  // the accumulation dtype's type
  const int64_t rows = logits.size(0), cols = logits.size(1);
  const T* px = static_cast<const T*>(logits.raw_data());
  const int64_t* pt = static_cast<const int64_t*>(target.raw_data());
  A* pl = static_cast<A*>(loss.raw_data());
  A* pe = static_cast<A*>(lse.raw_data());
  const double c = static_cast<double>(cols);
  parallel::parallel_for(rows, std::max<int64_t>(1, kRowGrain / cols), [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const T* row = px + r * cols;
      const RowStats st = row_stats(row, cols);
      pe[r] = static_cast<A>(st.lse);
      const int64_t t = pt[r];
      if (t == ignore_index) {
        pl[r] = A(0);
        continue;
      }
      // The composed path's form (nn/functional.cpp): -log p[t], mixed with the mean of -log p when smoothing.
      const double nll = st.lse - static_cast<double>(static_cast<op_math_t<T>>(row[t]));
      pl[r] = static_cast<A>(smoothing > 0.0 ? (1.0 - smoothing) * nll + smoothing / c * (c * st.lse - st.sum_x) : nll);
    }
  });
}

template <class T>
void backward_typed(const Tensor& grad_loss, const Tensor& logits, const Tensor& target, const Tensor& lse,
                    int64_t ignore_index, double smoothing, const Tensor& grad_logits) {
  using M = op_math_t<T>;
  using A = std::conditional_t<std::is_same_v<T, double>, double, float>;
  const int64_t rows = logits.size(0), cols = logits.size(1);
  const T* px = static_cast<const T*>(logits.raw_data());
  const int64_t* pt = static_cast<const int64_t*>(target.raw_data());
  const A* pg = static_cast<const A*>(grad_loss.raw_data());
  const A* pe = static_cast<const A*>(lse.raw_data());
  T* po = static_cast<T*>(grad_logits.raw_data());
  const M uniform = static_cast<M>(smoothing / static_cast<double>(cols)), hit = static_cast<M>(1.0 - smoothing);
  parallel::parallel_for(rows, std::max<int64_t>(1, kRowGrain / cols), [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const T* row = px + r * cols;
      T* out = po + r * cols;
      const int64_t t = pt[r];
      if (t == ignore_index) {
        for (int64_t j = 0; j < cols; ++j) out[j] = T(0);
        continue;
      }
      const M g = static_cast<M>(pg[r]), l = static_cast<M>(pe[r]), u = uniform;
      for (int64_t j = 0; j < cols; ++j) out[j] = T(g * (exp_math<M>(static_cast<M>(row[j]) - l) - u));
      // In [0, C) unless the caller passed unchecked targets as checked (Note [Targets checked once]).
      if (t >= 0 && t < cols) out[t] = T(g * ((exp_math<M>(static_cast<M>(row[t]) - l) - u) - hit));
    }
  });
}

void cross_entropy_kernel(const Tensor& logits, const Tensor& target, int64_t ignore_index, double smoothing,
                          const Tensor& loss, const Tensor& lse) {
  EMBER_DISPATCH_FLOAT(logits.dtype(), "cross_entropy_rows",
                       [&] { forward_typed<scalar_t>(logits, target, ignore_index, smoothing, loss, lse); });
}

void cross_entropy_backward_kernel(const Tensor& grad_loss, const Tensor& logits, const Tensor& target,
                                   const Tensor& lse, int64_t ignore_index, double smoothing,
                                   const Tensor& grad_logits) {
  EMBER_DISPATCH_FLOAT(logits.dtype(), "cross_entropy_rows_backward", [&] {
    backward_typed<scalar_t>(grad_loss, logits, target, lse, ignore_index, smoothing, grad_logits);
  });
}

}  // namespace

EMBER_REGISTER_KERNEL(cross_entropy, DeviceType::CPU, cross_entropy_kernel);
EMBER_REGISTER_KERNEL(cross_entropy_backward, DeviceType::CPU, cross_entropy_backward_kernel);

}  // namespace ember::kernels::cpu

// One softmax (or log-softmax) row of the CPU kernels, shared by the softmax kernel and the fused attention
// (attention.cpp): the row max is subtracted before exponentiating (finite for any finite input), the sum accumulates
// in double, a NaN anywhere makes the whole row NaN. Each returns the row's log-sum-exp (max + log sum).
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>

#include "ember/kernels/convert.h"
#include "ember/kernels/cpu/vec_math.h"

namespace ember::kernels::cpu {

// A contiguous f32 row: the max and the sum run in 8 independent lanes (sums in double) so they vectorise, e^(x - max)
// is computed once with exp_vec (Note [Vectorisable float math]) and stored, then scaled in place.
inline double softmax_row_f32(const float* x, float* y, int64_t n, bool log) {
  constexpr int64_t L = 8;
  float lane_max[L];
  int lane_nan[L] = {};
  for (int64_t l = 0; l < L; ++l) lane_max[l] = -std::numeric_limits<float>::infinity();
  int64_t i = 0;
  for (; i + L <= n; i += L)
    for (int64_t l = 0; l < L; ++l) {
      const float v = x[i + l];
      lane_nan[l] |= v != v;
      lane_max[l] = v > lane_max[l] ? v : lane_max[l];
    }
  for (; i < n; ++i) {
    lane_nan[0] |= x[i] != x[i];
    lane_max[0] = x[i] > lane_max[0] ? x[i] : lane_max[0];
  }
  float mx = lane_max[0];
  bool has_nan = false;
  for (int64_t l = 0; l < L; ++l) {
    mx = lane_max[l] > mx ? lane_max[l] : mx;
    has_nan = has_nan || lane_nan[l] != 0;
  }
  if (has_nan) mx = std::numeric_limits<float>::quiet_NaN();  // a NaN anywhere makes the whole row NaN
  double lane_sum[L] = {};
  i = 0;
  for (; i + L <= n; i += L)
    for (int64_t l = 0; l < L; ++l) {
      const float e = exp_vec(x[i + l] - mx);
      if (!log) y[i + l] = e;
      lane_sum[l] += static_cast<double>(e);
    }
  for (; i < n; ++i) {
    const float e = exp_vec(x[i] - mx);
    if (!log) y[i] = e;
    lane_sum[0] += static_cast<double>(e);
  }
  double sum = 0.0;
  for (int64_t l = 0; l < L; ++l) sum += lane_sum[l];
  if (log) {
    const float lse = static_cast<float>(std::log(sum));
    for (int64_t j = 0; j < n; ++j) y[j] = x[j] - mx - lse;
  } else {
    const float inv = static_cast<float>(1.0 / sum);
    for (int64_t j = 0; j < n; ++j) y[j] *= inv;
  }
  return static_cast<double>(mx) + std::log(sum);
}

// One row: n elements at x (stride sx) into y (stride sy).
template <class T>
inline double softmax_row(const T* x, int64_t sx, T* y, int64_t sy, int64_t n, bool log) {
  if constexpr (std::is_same_v<T, float>) {
    if (sx == 1 && sy == 1) return softmax_row_f32(x, y, n, log);
  }
  using math_t = op_math_t<T>;
  math_t mx = -std::numeric_limits<math_t>::infinity();
  bool has_nan = false;
  for (int64_t i = 0; i < n; ++i) {
    const math_t v = static_cast<math_t>(x[i * sx]);
    has_nan = has_nan || std::isnan(v);
    mx = v > mx ? v : mx;
  }
  if (has_nan) mx = std::numeric_limits<math_t>::quiet_NaN();  // a NaN anywhere makes the whole row NaN
  double sum = 0.0;
  for (int64_t i = 0; i < n; ++i) sum += std::exp(static_cast<math_t>(x[i * sx]) - mx);
  if (log) {
    const math_t lse = static_cast<math_t>(std::log(sum));
    for (int64_t i = 0; i < n; ++i) y[i * sy] = T(static_cast<math_t>(x[i * sx]) - mx - lse);
  } else {
    const math_t inv = static_cast<math_t>(1.0 / sum);
    for (int64_t i = 0; i < n; ++i) y[i * sy] = T(std::exp(static_cast<math_t>(x[i * sx]) - mx) * inv);
  }
  return static_cast<double>(mx) + std::log(sum);
}

}  // namespace ember::kernels::cpu

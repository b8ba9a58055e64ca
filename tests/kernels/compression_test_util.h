// Test helpers shared by the sparse and int8 kernel tests (test_sparse_matmul.cpp, test_quant_kernels.cpp,
// test_compression_kernels_cuda.cpp): random sparse matrices, naive float64 products over dense matrices, and the rise
// of an allocator's high-water mark over a call.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <optional>
#include <vector>

#include "ember/ember.h"
#include "tests/harness/op_harness.h"

namespace ember::testing {

// A random [rows, cols] f64 CPU matrix with about `density` nonzeros; rows listed in empty_rows are all zero.
inline Tensor random_sparse(int64_t rows, int64_t cols, double density, uint64_t seed,
                            const std::vector<int64_t>& empty_rows = {}) {
  Tensor v = rand_input_seeded({rows, cols}, seed);
  const std::vector<double> keep = rand_input_seeded({rows, cols}, seed + 1, 0.0, 1.0).to_vector<double>();
  double* p = v.data<double>();
  for (int64_t i = 0; i < rows * cols; ++i)
    if (keep[static_cast<size_t>(i)] >= density) p[i] = 0.0;
  for (int64_t r : empty_rows)
    for (int64_t c = 0; c < cols; ++c) p[r * cols + c] = 0.0;
  return v;
}

// y[b, n] = sum_k x[b, k] w[n, k] + bias[n] in f64 with naive loops; x [B, K], w [N, K], bias [N] or undefined.
inline Tensor naive_linear(const Tensor& x, const Tensor& w, const Tensor& bias) {
  const int64_t B = x.size(0), K = x.size(1), N = w.size(0);
  const std::vector<double> xv = x.contiguous().to_vector<double>(), wv = w.contiguous().to_vector<double>();
  const std::vector<double> bv =
      bias.defined() ? bias.contiguous().to_vector<double>() : std::vector<double>(static_cast<size_t>(N), 0.0);
  std::vector<double> y(static_cast<size_t>(B * N));
  for (int64_t b = 0; b < B; ++b)
    for (int64_t n = 0; n < N; ++n) {
      double acc = bv[static_cast<size_t>(n)];
      for (int64_t k = 0; k < K; ++k) acc += xv[static_cast<size_t>(b * K + k)] * wv[static_cast<size_t>(n * K + k)];
      y[static_cast<size_t>(b * N + n)] = acc;
    }
  return from_vector(y, {B, N});
}

// [M, N] = a [M, K] @ d [K, N] in f64 with naive loops.
inline Tensor naive_matmul(const Tensor& a, const Tensor& d) {
  const int64_t M = a.size(0), K = a.size(1), N = d.size(1);
  const std::vector<double> av = a.contiguous().to_vector<double>(), dv = d.contiguous().to_vector<double>();
  std::vector<double> y(static_cast<size_t>(M * N), 0.0);
  for (int64_t m = 0; m < M; ++m)
    for (int64_t n = 0; n < N; ++n)
      for (int64_t k = 0; k < K; ++k)
        y[static_cast<size_t>(m * N + n)] += av[static_cast<size_t>(m * K + k)] * dv[static_cast<size_t>(k * N + n)];
  return from_vector(y, {M, N});
}

// How far an allocator's requested-bytes high-water mark rises while f() runs.
template <class F>
int64_t peak_rise(memory::Allocator& a, F&& f) {
  a.reset_peak_stats();
  const int64_t before = a.stats().requested_bytes;
  f();
  return a.stats().peak_requested_bytes - before;
}

// The int8 x int8 model of int8_dynamic_linear (Int8DynamicLinearFn in ops_quant.h) in f64 with exact integer sums:
// x [..., K] f32, q [N, K], scale s [N], bias b [N] or undefined; act_scale as the op takes it (nullopt: dynamic,
// max|x| / 127 in f32). The activation scale used is stored in *act_out when given.
inline Tensor ref_dynamic_linear(const Tensor& x, const Tensor& q, const Tensor& s, const Tensor& b,
                                 std::optional<float> act_scale = std::nullopt, double* act_out = nullptr) {
  const int64_t k = q.size(1), n = q.size(0);
  Shape shape(x.sizes().begin(), x.sizes().end() - 1);
  int64_t m = 1;
  for (int64_t d : shape) m *= d;
  const std::vector<float> xv = x.contiguous().to_vector<float>();
  const std::vector<int64_t> qv = q.contiguous().to_vector<int64_t>();
  const std::vector<double> sv = s.to(DType::f64).to_vector<double>();
  const std::vector<double> bv =
      b.defined() ? b.to(DType::f64).to_vector<double>() : std::vector<double>(static_cast<size_t>(n), 0.0);
  float sx;
  if (act_scale) {
    sx = *act_scale;
  } else {
    float amax = 0.0f;
    for (float v : xv) amax = std::max(amax, std::fabs(v));
    sx = amax / 127.0f;  // the documented formula, in f32
    if (sx == 0.0f) sx = 1.0f;
  }
  if (act_out != nullptr) *act_out = sx;
  std::vector<int64_t> qx(xv.size());
  for (size_t e = 0; e < xv.size(); ++e) {
    const double r = std::nearbyint(static_cast<double>(xv[e]) / static_cast<double>(sx));
    qx[e] = static_cast<int64_t>(std::clamp(r, -127.0, 127.0));
  }
  std::vector<double> y(static_cast<size_t>(m * n));
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) {
      int64_t acc = 0;
      for (int64_t t = 0; t < k; ++t) acc += qx[static_cast<size_t>(i * k + t)] * qv[static_cast<size_t>(j * k + t)];
      y[static_cast<size_t>(i * n + j)] =
          static_cast<double>(acc) * sx * sv[static_cast<size_t>(j)] + bv[static_cast<size_t>(j)];
    }
  shape.push_back(n);
  return from_vector(y, shape);
}

}  // namespace ember::testing

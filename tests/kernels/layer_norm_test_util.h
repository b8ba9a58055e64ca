// The float64 layer-norm backward the layer-norm kernel tests compare with, shared by the layer-norm backward and
// fused add + layer norm tests.
#pragma once

#include <cmath>
#include <vector>

#include "ember/core/tensor.h"

namespace ember::testing {

struct LayerNormRefGrads {
  std::vector<double> gx, gw, gb;
};

// x and g viewed as [rows, cols]; w [cols] or undefined (scale 1).
inline LayerNormRefGrads ref_layer_norm_backward(const Tensor& g, const Tensor& x, const Tensor& w, int64_t cols,
                                                 double eps) {
  const std::vector<double> gv = g.contiguous().to_vector<double>(), xv = x.contiguous().to_vector<double>();
  const std::vector<double> wv = w.defined() ? w.contiguous().to_vector<double>() : std::vector<double>();
  const int64_t rows = cols > 0 ? static_cast<int64_t>(xv.size()) / cols : 0;
  LayerNormRefGrads r;
  r.gx.assign(xv.size(), 0.0);
  r.gw.assign(static_cast<size_t>(cols), 0.0);
  r.gb.assign(static_cast<size_t>(cols), 0.0);
  std::vector<double> xhat(static_cast<size_t>(cols)), dxhat(static_cast<size_t>(cols));
  for (int64_t i = 0; i < rows; ++i) {
    const double* xr = xv.data() + i * cols;
    const double* gr = gv.data() + i * cols;
    double mean = 0.0, var = 0.0;
    for (int64_t j = 0; j < cols; ++j) mean += xr[j];
    mean /= static_cast<double>(cols);
    for (int64_t j = 0; j < cols; ++j) var += (xr[j] - mean) * (xr[j] - mean);
    const double rstd = 1.0 / std::sqrt(var / static_cast<double>(cols) + eps);
    double a = 0.0, b = 0.0;
    for (int64_t j = 0; j < cols; ++j) {
      const size_t k = static_cast<size_t>(j);
      xhat[k] = (xr[j] - mean) * rstd;
      dxhat[k] = gr[j] * (w.defined() ? wv[k] : 1.0);
      a += dxhat[k];
      b += dxhat[k] * xhat[k];
      r.gw[k] += gr[j] * xhat[k];
      r.gb[k] += gr[j];
    }
    a /= static_cast<double>(cols);
    b /= static_cast<double>(cols);
    for (int64_t j = 0; j < cols; ++j) {
      const size_t k = static_cast<size_t>(j);
      r.gx[static_cast<size_t>(i * cols + j)] = rstd * (dxhat[k] - a - xhat[k] * b);
    }
  }
  return r;
}

}  // namespace ember::testing

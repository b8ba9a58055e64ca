// Builders for the convolution and pooling parameter structs, and the direct float64 convolution loops the
// backward references are made of, shared by the convolution and pooling kernel tests.
#pragma once

#include <functional>
#include <vector>

#include "ember/ember.h"
#include "ember/kernels/stubs.h"

namespace ember::testing {

inline Conv2dParams conv_params(int64_t sh, int64_t sw, int64_t ph, int64_t pw, int64_t dh, int64_t dw,
                                int64_t groups) {
  Conv2dParams p;
  p.stride[0] = sh;
  p.stride[1] = sw;
  p.padding[0] = ph;
  p.padding[1] = pw;
  p.dilation[0] = dh;
  p.dilation[1] = dw;
  p.groups = groups;
  return p;
}

inline Pool2dParams pool_params(int64_t kh, int64_t kw, int64_t sh, int64_t sw, int64_t ph, int64_t pw,
                                bool count_include_pad = true) {
  Pool2dParams p;
  p.kernel[0] = kh;
  p.kernel[1] = kw;
  p.stride[0] = sh;
  p.stride[1] = sw;
  p.padding[0] = ph;
  p.padding[1] = pw;
  p.count_include_pad = count_include_pad;
  return p;
}

inline size_t flat(int64_t i) { return static_cast<size_t>(i); }

// ---- direct convolution references -------------------------------------------------------------------------------

inline Shape conv_out_shape(const Shape& x, const Shape& w, const Conv2dParams& p) {
  return {x[0], w[0], (x[2] + 2 * p.padding[0] - p.dilation[0] * (w[2] - 1) - 1) / p.stride[0] + 1,
          (x[3] + 2 * p.padding[1] - p.dilation[1] * (w[3] - 1) - 1) / p.stride[1] + 1};
}

// Visits every product of the direct convolution: f(gout index, x index, w index) for each in-bounds tap, where
// out[n, o, y, z] += x[n, g*cg + c, y*s - p + i*d, z*s - p + j*d] * w[o, c, i, j] (flat row-major indices).
inline void for_each_conv_term(const Shape& xs, const Shape& ws, const Conv2dParams& p,
                               const std::function<void(size_t, size_t, size_t)>& f) {
  const Shape os = conv_out_shape(xs, ws, p);
  const int64_t N = xs[0], C = xs[1], H = xs[2], W = xs[3];
  const int64_t O = ws[0], CG = ws[1], KH = ws[2], KW = ws[3], OG = O / p.groups, OH = os[2], OW = os[3];
  for (int64_t n = 0; n < N; ++n)
    for (int64_t o = 0; o < O; ++o)
      for (int64_t y = 0; y < OH; ++y)
        for (int64_t z = 0; z < OW; ++z)
          for (int64_t c = 0; c < CG; ++c)
            for (int64_t i = 0; i < KH; ++i)
              for (int64_t j = 0; j < KW; ++j) {
                const int64_t iy = y * p.stride[0] - p.padding[0] + i * p.dilation[0];
                const int64_t ix = z * p.stride[1] - p.padding[1] + j * p.dilation[1];
                if (iy < 0 || iy >= H || ix < 0 || ix >= W) continue;
                f(flat(((n * O + o) * OH + y) * OW + z), flat(((n * C + (o / OG) * CG + c) * H + iy) * W + ix),
                  flat(((o * CG + c) * KH + i) * KW + j));
              }
}

inline Tensor conv_grad_x_ref(const Tensor& gout, const Tensor& w, const Shape& xs, const Conv2dParams& p) {
  const std::vector<double> gv = gout.to_vector<double>(), wv = w.to_vector<double>();
  std::vector<double> gx(flat(numel_of(xs)), 0.0);
  for_each_conv_term(xs, w.sizes(), p, [&](size_t go, size_t xi, size_t wi) { gx[xi] += gv[go] * wv[wi]; });
  return from_vector(gx, xs);
}

inline Tensor conv_grad_w_ref(const Tensor& gout, const Tensor& x, const Shape& ws, const Conv2dParams& p) {
  const std::vector<double> gv = gout.to_vector<double>(), xv = x.to_vector<double>();
  std::vector<double> gw(flat(numel_of(ws)), 0.0);
  for_each_conv_term(x.sizes(), ws, p, [&](size_t go, size_t xi, size_t wi) { gw[wi] += gv[go] * xv[xi]; });
  return from_vector(gw, ws);
}

}  // namespace ember::testing

// The im2col geometry shared by the CPU conv2d kernels (conv_pool.cpp, conv_pool_backward.cpp): the sizes of one
// convolution, the weight as a matrix, the runs of the column matrix that read the input, and im2col itself. Invariant:
// column matrices are [K, OH*OW] row-major with K ordered (c, i, j), the order of a contiguous [O, CG, KH, KW] weight's
// rows.
#pragma once

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "ember/core/tensor.h"
#include "ember/kernels/cpu/loops.h"
#include "ember/kernels/stubs.h"

namespace ember::kernels::cpu {

// The geometry of one convolution: x [N, C, H, W], weight [O, CG, KH, KW], out (or grad_out) [N, O, OH, OW].
struct ConvGeometry {
  int64_t n_img, c, h, w, o, cg, kh, kw, oh, ow, groups, og, k, plane;
  ConvGeometry(const Tensor& x, const Tensor& weight, const Tensor& out, const Conv2dParams& p)
      : n_img(x.size(0)),
        c(x.size(1)),
        h(x.size(2)),
        w(x.size(3)),
        o(weight.size(0)),
        cg(weight.size(1)),
        kh(weight.size(2)),
        kw(weight.size(3)),
        oh(out.size(2)),
        ow(out.size(3)),
        groups(p.groups),
        og(o / p.groups),
        k(cg * kh * kw),
        plane(out.size(2) * out.size(3)) {}
};

// Calls f(row, c, q0, iy, ix0, n) for every run of the im2col matrix of one (image, group) that reads the input (not
// the zero padding): row = (c, i, j) of the [K, OH*OW] column matrix, columns q0 .. q0+n-1 (one output row y) read
// input elements (c, iy, ix0 + t * stride[1]) for t < n. The runs' bounds come from tap_range (loops.h), so the
// callers' inner loops carry no bounds test. Only channels [c_begin, c_end) are visited.
template <class F>
void for_each_tap_run(const ConvGeometry& g, const Conv2dParams& p, int64_t c_begin, int64_t c_end, F&& f) {
  for (int64_t c = c_begin; c < c_end; ++c)
    for (int64_t i = 0; i < g.kh; ++i)
      for (int64_t j = 0; j < g.kw; ++j) {
        const int64_t row = (c * g.kh + i) * g.kw + j;
        const int64_t off = j * p.dilation[1] - p.padding[1];
        const TapRange zr = tap_range(off, p.stride[1], g.w, g.ow);
        if (zr.lo >= zr.hi) continue;
        for (int64_t y = 0; y < g.oh; ++y) {
          const int64_t iy = y * p.stride[0] - p.padding[0] + i * p.dilation[0];
          if (iy < 0 || iy >= g.h) continue;
          f(row, c, y * g.ow + zr.lo, iy, zr.lo * p.stride[1] + off, zr.hi - zr.lo);
        }
      }
}

// im2col of channels [c_begin, c_end) of one (image, group) into the rows of those channels of col [K, OH*OW]:
// column (y, z) of row (c, i, j) = x[c, y*sh - ph + i*dh, z*sw - pw + j*dw], or 0 in the padding. xg points at the
// group's first channel of the image; (xs1, xs2, xs3) are x's channel, row and column strides. Only the padding is
// zero-filled (whole rows above or below the input, the columns left and right of a run).
template <class acc_t, class scalar_t>
void im2col(const ConvGeometry& g, const Conv2dParams& p, const scalar_t* xg, int64_t xs1, int64_t xs2, int64_t xs3,
            int64_t c_begin, int64_t c_end, acc_t* col) {
  const int64_t step = p.stride[1] * xs3;
  for (int64_t c = c_begin; c < c_end; ++c) {
    const scalar_t* xc = xg + c * xs1;
    for (int64_t i = 0; i < g.kh; ++i)
      for (int64_t j = 0; j < g.kw; ++j) {
        acc_t* row = col + ((c * g.kh + i) * g.kw + j) * g.plane;
        const int64_t off = j * p.dilation[1] - p.padding[1];
        const TapRange zr = tap_range(off, p.stride[1], g.w, g.ow);
        for (int64_t y = 0; y < g.oh; ++y) {
          const int64_t iy = y * p.stride[0] - p.padding[0] + i * p.dilation[0];
          acc_t* dst = row + y * g.ow;
          if (iy < 0 || iy >= g.h || zr.lo == zr.hi) {
            std::fill(dst, dst + g.ow, acc_t(0));
            continue;
          }
          std::fill(dst, dst + zr.lo, acc_t(0));
          std::fill(dst + zr.hi, dst + g.ow, acc_t(0));
          const scalar_t* src = xc + iy * xs2 + (zr.lo * p.stride[1] + off) * xs3;
          acc_t* d = dst + zr.lo;
          const int64_t cnt = zr.hi - zr.lo;
          if (step == 1) {
            for (int64_t t = 0; t < cnt; ++t) d[t] = static_cast<acc_t>(src[t]);
          } else {
            for (int64_t t = 0; t < cnt; ++t) d[t] = static_cast<acc_t>(src[t * step]);
          }
        }
      }
  }
}

// The weight as an [O, K] matrix in the compute type, K ordered (c, i, j) like the im2col rows: the weight itself
// when it already has that layout (row stride rs), else packed (and widened) into workspace.
template <class acc_t, class scalar_t>
struct WeightMatrix {
  Tensor packed;
  const acc_t* data = nullptr;
  int64_t rs = 0;
  WeightMatrix(const Tensor& weight, const ConvGeometry& g) {
    const int64_t s0 = weight.stride(0), s1 = weight.stride(1), s2 = weight.stride(2), s3 = weight.stride(3);
    if constexpr (std::is_same_v<acc_t, scalar_t>) {
      if (s3 == 1 && s2 == g.kw && s1 == g.kh * g.kw) {
        data = static_cast<const acc_t*>(weight.raw_data());
        rs = s0;
        return;
      }
    }
    packed = empty({g.o, g.k}, TensorOptions(dtype_of_v<acc_t>, Device::cpu()));
    const scalar_t* wp = static_cast<const scalar_t*>(weight.raw_data());
    acc_t* wm = static_cast<acc_t*>(packed.raw_data());
    for (int64_t oc = 0; oc < g.o; ++oc)
      for (int64_t c = 0; c < g.cg; ++c)
        for (int64_t i = 0; i < g.kh; ++i)
          for (int64_t j = 0; j < g.kw; ++j)
            wm[oc * g.k + (c * g.kh + i) * g.kw + j] = static_cast<acc_t>(wp[oc * s0 + c * s1 + i * s2 + j * s3]);
    data = wm;
    rs = g.k;
  }
};

}  // namespace ember::kernels::cpu

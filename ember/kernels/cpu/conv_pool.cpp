// CPU conv2d (im2col + the CPU bmm kernel per image and group) and max/avg pool2d (direct loops), NCHW, any input
// strides. Invariant: f16/bf16 are only storage: inputs are widened to float, every sum runs in op_math_t, and each
// output element is rounded once when stored. Every workspace byte comes from the host allocator.
#include <algorithm>
#include <cmath>
#include <limits>
#include <type_traits>

#include "ember/core/parallel.h"
#include "ember/kernels/cpu/loops.h"
#include "ember/kernels/cpu/meta_workspace.h"
#include "ember/kernels/stubs.h"

namespace ember::kernels::cpu {
namespace {

// Note [Kernel workspace]
// CPU kernels take scratch memory (im2col columns, packed operands, f32 staging for f16/bf16, accumulators, GEMM
// panels) as `empty({n}, {dtype, Device::cpu()})` tensors held for the duration of the call, so those bytes appear
// in the host allocator's statistics and traces, and running out of memory surfaces as OutOfMemoryError like any
// other allocation. Eigen sees them through Eigen::Map; products are written with `.noalias() =` into a Map, so Eigen
// never materialises a full-size temporary, and its GEMM panels come from the allocator too (Note [GEMM panels from
// the allocator] in matmul.cpp). Small fixed-size stack arrays and O(ndim) shape metadata are not workspace.
// tests/kernels/test_workspace_accounting.cpp holds the kernels to this. A kernel that takes workspace also registers a
// Meta entry that takes the same on meta (Note [Meta kernels] in kernels/stubs.h): change the two together.

template <class scalar_t>
void conv2d_typed(const Tensor& x, const Tensor& weight, const Tensor& bias, const Conv2dParams& p, const Tensor& out) {
  using acc_t = op_math_t<scalar_t>;
  constexpr bool kWiden = !std::is_same_v<acc_t, scalar_t>;
  const TensorOptions acc_opts(dtype_of_v<acc_t>, Device::cpu());
  const int64_t n_img = x.size(0), h = x.size(2), w = x.size(3);
  const int64_t o = weight.size(0), cg = weight.size(1), kh = weight.size(2), kw = weight.size(3);
  const int64_t groups = p.groups, og = o / groups;
  const int64_t oh = out.size(2), ow = out.size(3);
  const int64_t k = cg * kh * kw, plane = oh * ow;
  const int64_t sh = p.stride[0], sw = p.stride[1], ph = p.padding[0], pw = p.padding[1];
  const int64_t dh = p.dilation[0], dw = p.dilation[1];

  // Weight as an [O, K] matrix in the compute type, K ordered (c, i, j) like the im2col rows: a view of the weight
  // when it already has that layout, else packed (and widened) into workspace.
  const int64_t s0 = weight.stride(0), s1 = weight.stride(1), s2 = weight.stride(2), s3 = weight.stride(3);
  Tensor wmat;
  if constexpr (!kWiden) {
    if (s3 == 1 && s2 == kw && s1 == kh * kw) wmat = weight.view({o, k});
  }
  if (!wmat.defined()) {
    wmat = empty({o, k}, acc_opts);
    const scalar_t* wp = static_cast<const scalar_t*>(weight.raw_data());
    acc_t* wm = static_cast<acc_t*>(wmat.raw_data());
    for (int64_t oc = 0; oc < o; ++oc)
      for (int64_t c = 0; c < cg; ++c)
        for (int64_t i = 0; i < kh; ++i)
          for (int64_t j = 0; j < kw; ++j)
            wm[oc * k + (c * kh + i) * kw + j] = static_cast<acc_t>(wp[oc * s0 + c * s1 + i * s2 + j * s3]);
  }
  const scalar_t* bp = bias.defined() ? static_cast<const scalar_t*>(bias.raw_data()) : nullptr;
  const int64_t bs = bias.defined() ? bias.stride(0) : 0;

  const scalar_t* xp = static_cast<const scalar_t*>(x.raw_data());
  const int64_t xs0 = x.stride(0), xs1 = x.stride(1), xs2 = x.stride(2), xs3 = x.stride(3);
  scalar_t* op = static_cast<scalar_t*>(out.raw_data());
  const Tensor col = empty({1, k, plane}, acc_opts);                       // im2col of one (image, group)
  const Tensor res = kWiden ? empty({1, og, plane}, acc_opts) : Tensor();  // f32 product before rounding
  acc_t* col_data = static_cast<acc_t*>(col.raw_data());
  const BmmFn gemm = bmm_stub.get(DeviceType::CPU);
  const int64_t channel_grain = std::max<int64_t>(1, kElementGrain / std::max<int64_t>(1, kh * kw * plane));

  for (int64_t n = 0; n < n_img; ++n) {
    for (int64_t g = 0; g < groups; ++g) {
      // im2col: row (c, i, j), column (y, z) holds x[n, g*cg + c, y*sh - ph + i*dh, z*sw - pw + j*dw] or 0. Channels
      // own their rows, so they are split over the CPU threads.
      parallel::parallel_for(cg, channel_grain, [&](int64_t c_lo, int64_t c_hi) {
        for (int64_t c = c_lo; c < c_hi; ++c) {
          const scalar_t* xc = xp + n * xs0 + (g * cg + c) * xs1;
          for (int64_t i = 0; i < kh; ++i)
            for (int64_t j = 0; j < kw; ++j) {
              acc_t* row = col_data + ((c * kh + i) * kw + j) * plane;
              // Columns [zr.lo, zr.hi) read x (ix = z * sw + off), the rest are padding: no bounds test per element.
              const int64_t off = j * dw - pw, step = sw * xs3;
              const TapRange zr = tap_range(off, sw, w, ow);
              for (int64_t y = 0; y < oh; ++y) {
                const int64_t iy = y * sh - ph + i * dh;
                acc_t* dst = row + y * ow;
                if (iy < 0 || iy >= h) {
                  std::fill(dst, dst + ow, acc_t(0));
                  continue;
                }
                std::fill(dst, dst + zr.lo, acc_t(0));
                std::fill(dst + zr.hi, dst + ow, acc_t(0));
                if (zr.lo == zr.hi) continue;
                const scalar_t* src = xc + iy * xs2 + (zr.lo * sw + off) * xs3;
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
      });
      // [og, plane] = weight rows of group g [og, K] @ col [K, plane], straight into out when no rounding is needed.
      const Tensor w_g = wmat.narrow(0, g * og, og).unsqueeze(0);
      scalar_t* out_g = op + (n * o + g * og) * plane;
      if constexpr (!kWiden) {
        gemm(w_g, col, out.select(0, n).narrow(0, g * og, og).view({1, og, plane}));
        if (bp)
          for (int64_t r = 0; r < og; ++r) {
            const acc_t b = static_cast<acc_t>(bp[(g * og + r) * bs]);
            for (int64_t q = 0; q < plane; ++q) out_g[r * plane + q] += b;
          }
      } else {
        gemm(w_g, col, res);
        const acc_t* rp = static_cast<const acc_t*>(res.raw_data());
        for (int64_t r = 0; r < og; ++r) {
          const acc_t b = bp ? static_cast<acc_t>(bp[(g * og + r) * bs]) : acc_t(0);
          for (int64_t q = 0; q < plane; ++q) out_g[r * plane + q] = scalar_t(rp[r * plane + q] + b);
        }
      }
    }
  }
}

void conv2d_kernel(const Tensor& x, const Tensor& weight, const Tensor& bias, const Conv2dParams& p,
                   const Tensor& out) {
  EMBER_DISPATCH_FLOAT(x.dtype(), "conv2d", [&] { conv2d_typed<scalar_t>(x, weight, bias, p, out); });
}

// Calls f(plane_in, plane_out_offset) for every (n, c) plane of x [N, C, H, W] and the contiguous out. Planes are
// independent, so they are split over the CPU threads (f writes only its own plane and allocates nothing).
template <class scalar_t, class F>
void for_each_plane(const Tensor& x, const Tensor& out, F&& f) {
  const scalar_t* xp = static_cast<const scalar_t*>(x.raw_data());
  const int64_t channels = x.size(1), plane_out = out.size(2) * out.size(3);
  const int64_t xs0 = x.stride(0), xs1 = x.stride(1);
  const int64_t per_plane = std::max<int64_t>(1, x.size(2) * x.size(3));
  parallel::parallel_for(x.size(0) * channels, std::max<int64_t>(1, kElementGrain / per_plane),
                         [&](int64_t lo, int64_t hi) {
                           for (int64_t i = lo; i < hi; ++i)
                             f(xp + (i / channels) * xs0 + (i % channels) * xs1, i * plane_out);
                         });
}

// Max over one window of a 2x2 max pool with stride 2 and no padding, in max_pool2d_kernel's order (row by row,
// NaN wins, the last NaN's index), for an input row pair at r0 / r0 + rs with unit column stride.
template <class acc_t, class scalar_t>
inline void max2x2(const scalar_t* r0, int64_t rs, int64_t z, int64_t w, int64_t y2, acc_t& best, int64_t& idx) {
  const scalar_t* a = r0 + 2 * z;
  const acc_t v[4] = {static_cast<acc_t>(a[0]), static_cast<acc_t>(a[1]), static_cast<acc_t>(a[rs]),
                      static_cast<acc_t>(a[rs + 1])};
  const int64_t at[4] = {y2 * w + 2 * z, y2 * w + 2 * z + 1, (y2 + 1) * w + 2 * z, (y2 + 1) * w + 2 * z + 1};
  best = v[0];
  idx = at[0];
  for (int k = 1; k < 4; ++k)
    if (v[k] > best || std::isnan(v[k])) {
      best = v[k];
      idx = at[k];
    }
}

void max_pool2d_kernel(const Tensor& x, const Pool2dParams& p, const Tensor& out, const Tensor& indices) {
  EMBER_DISPATCH_FLOAT(x.dtype(), "max_pool2d", [&] {
    using acc_t = op_math_t<scalar_t>;
    const int64_t h = x.size(2), w = x.size(3), oh = out.size(2), ow = out.size(3);
    const int64_t xs2 = x.stride(2), xs3 = x.stride(3);
    scalar_t* op = static_cast<scalar_t*>(out.raw_data());
    int64_t* ip = indices.defined() ? static_cast<int64_t*>(indices.raw_data()) : nullptr;
    // The 2x2 / stride 2 / no padding pool of most CNNs over unit-stride rows: windows without bounds arithmetic.
    const bool two_by_two = p.kernel[0] == 2 && p.kernel[1] == 2 && p.stride[0] == 2 && p.stride[1] == 2 &&
                            p.padding[0] == 0 && p.padding[1] == 0 && xs3 == 1 && 2 * oh <= h && 2 * ow <= w;
    for_each_plane<scalar_t>(x, out, [&](const scalar_t* xc, int64_t base) {
      if (two_by_two) {
        for (int64_t y = 0; y < oh; ++y) {
          const scalar_t* r0 = xc + 2 * y * xs2;
          scalar_t* orow = op + base + y * ow;
          int64_t* irow = ip ? ip + base + y * ow : nullptr;
          for (int64_t z = 0; z < ow; ++z) {
            acc_t best;
            int64_t idx;
            max2x2<acc_t>(r0, xs2, z, w, 2 * y, best, idx);
            orow[z] = scalar_t(best);
            if (irow) irow[z] = idx;
          }
        }
        return;
      }
      for (int64_t y = 0; y < oh; ++y) {
        const int64_t y0 = y * p.stride[0] - p.padding[0];
        const int64_t ya = std::max<int64_t>(y0, 0), yb = std::min<int64_t>(y0 + p.kernel[0], h);
        for (int64_t z = 0; z < ow; ++z) {
          const int64_t z0 = z * p.stride[1] - p.padding[1];
          const int64_t za = std::max<int64_t>(z0, 0), zb = std::min<int64_t>(z0 + p.kernel[1], w);
          // Padding counts as -inf: only the window's in-bounds part is read. NaN propagates (the last one wins).
          acc_t best = -std::numeric_limits<acc_t>::infinity();
          int64_t best_i = ya * w + za;
          for (int64_t yy = ya; yy < yb; ++yy)
            for (int64_t zz = za; zz < zb; ++zz) {
              const acc_t v = static_cast<acc_t>(xc[yy * xs2 + zz * xs3]);
              if (v > best || std::isnan(v)) {
                best = v;
                best_i = yy * w + zz;
              }
            }
          op[base + y * ow + z] = scalar_t(best);
          if (ip) ip[base + y * ow + z] = best_i;
        }
      }
    });
  });
}

void avg_pool2d_kernel(const Tensor& x, const Pool2dParams& p, const Tensor& out) {
  EMBER_DISPATCH_FLOAT(x.dtype(), "avg_pool2d", [&] {
    using acc_t = op_math_t<scalar_t>;
    const int64_t h = x.size(2), w = x.size(3), oh = out.size(2), ow = out.size(3);
    const int64_t xs2 = x.stride(2), xs3 = x.stride(3);
    scalar_t* op = static_cast<scalar_t*>(out.raw_data());
    for_each_plane<scalar_t>(x, out, [&](const scalar_t* xc, int64_t base) {
      for (int64_t y = 0; y < oh; ++y) {
        const int64_t y0 = y * p.stride[0] - p.padding[0];
        const int64_t y1 = std::min<int64_t>(y0 + p.kernel[0], h + p.padding[0]);
        const int64_t ya = std::max<int64_t>(y0, 0), yb = std::min<int64_t>(y1, h);
        for (int64_t z = 0; z < ow; ++z) {
          const int64_t z0 = z * p.stride[1] - p.padding[1];
          const int64_t z1 = std::min<int64_t>(z0 + p.kernel[1], w + p.padding[1]);
          const int64_t za = std::max<int64_t>(z0, 0), zb = std::min<int64_t>(z1, w);
          acc_t sum = 0;
          for (int64_t yy = ya; yy < yb; ++yy)
            for (int64_t zz = za; zz < zb; ++zz) sum += static_cast<acc_t>(xc[yy * xs2 + zz * xs3]);
          const int64_t count = p.count_include_pad ? (y1 - y0) * (z1 - z0) : (yb - ya) * (zb - za);
          op[base + y * ow + z] = scalar_t(sum / static_cast<acc_t>(count));
        }
      }
    });
  });
}

// conv2d_typed's workspace on meta, in its order (Note [Meta kernels] in kernels/stubs.h): the packed weight unless
// it is used in place, the im2col columns, the f32 product for f16/bf16, and what its GEMMs take (each GEMM frees
// its own before the next, so one replay stands for all of them).
void conv2d_meta_kernel(const Tensor& x, const Tensor& weight, const Tensor& bias, const Conv2dParams& p,
                        const Tensor& out) {
  if (out.numel() == 0) return;
  const bool widen = x.dtype() == DType::f16 || x.dtype() == DType::bf16;
  const DType acc = widen ? DType::f32 : x.dtype();
  const int64_t o = weight.size(0), kh = weight.size(2), kw = weight.size(3);
  const int64_t og = o / p.groups, k = weight.size(1) * kh * kw, plane = out.size(2) * out.size(3);
  const bool in_place = !widen && weight.stride(3) == 1 && weight.stride(2) == kw && weight.stride(1) == kh * kw;
  MetaWorkspace ws;
  if (!in_place) ws.take(o * k, acc);
  ws.take(k * plane, acc);
  if (widen) ws.take(og * plane, acc);
  replay_bmm_workspace(acc, 1, og, k, plane, in_place ? weight.stride(0) : k, 1, plane, 1);
}

}  // namespace

EMBER_REGISTER_KERNEL(conv2d, DeviceType::CPU, conv2d_kernel);
EMBER_REGISTER_KERNEL(conv2d, DeviceType::Meta, conv2d_meta_kernel);
EMBER_REGISTER_KERNEL(max_pool2d, DeviceType::CPU, max_pool2d_kernel);
EMBER_REGISTER_KERNEL(avg_pool2d, DeviceType::CPU, avg_pool2d_kernel);

}  // namespace ember::kernels::cpu

// CPU conv2d backward (GEMM + col2im for grad_x, im2col + GEMM summed over images for grad_w) and max/avg pool2d
// backward (scatter-add), NCHW, inputs of any strides. Invariant: f16/bf16 are only storage: every sum (GEMM,
// scatter-add of overlapping windows, sum over images) runs in op_math_t and each gradient element is rounded once
// when stored. Workspace comes from the host allocator (Note [Kernel workspace] in conv_pool.cpp).
#include <algorithm>
#include <type_traits>

#include "ember/core/parallel.h"
#include "ember/kernels/cpu/loops.h"
#include "ember/kernels/cpu/meta_workspace.h"
#include "ember/kernels/stubs.h"

namespace ember::kernels::cpu {
namespace {

// The geometry of one convolution: x [N, C, H, W], weight [O, CG, KH, KW], grad_out [N, O, OH, OW].
struct ConvGeometry {
  int64_t n_img, c, h, w, o, cg, kh, kw, oh, ow, groups, og, k, plane;
  ConvGeometry(const Tensor& x, const Tensor& weight, const Tensor& grad_out, const Conv2dParams& p)
      : n_img(x.size(0)),
        c(x.size(1)),
        h(x.size(2)),
        w(x.size(3)),
        o(weight.size(0)),
        cg(weight.size(1)),
        kh(weight.size(2)),
        kw(weight.size(3)),
        oh(grad_out.size(2)),
        ow(grad_out.size(3)),
        groups(p.groups),
        og(o / p.groups),
        k(cg * kh * kw),
        plane(grad_out.size(2) * grad_out.size(3)) {}
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

template <class scalar_t>
void conv2d_backward_typed(const Tensor& grad_out, const Tensor& x, const Tensor& weight, const Conv2dParams& p,
                           const Tensor& grad_x, const Tensor& grad_w) {
  using acc_t = op_math_t<scalar_t>;
  constexpr bool kWiden = !std::is_same_v<acc_t, scalar_t>;
  const TensorOptions acc_opts(dtype_of_v<acc_t>, Device::cpu());
  const ConvGeometry g(x, weight, grad_out, p);
  const BmmFn gemm = bmm_stub.get(DeviceType::CPU);
  const int64_t channel_grain = std::max<int64_t>(1, kElementGrain / std::max<int64_t>(1, g.kh * g.kw * g.plane));

  // grad_out of one (image, group) as a [1, og, plane] matrix in the compute type: a view when its rows are evenly
  // strided and no widening is needed, else packed (and widened) into workspace.
  const scalar_t* gp = static_cast<const scalar_t*>(grad_out.raw_data());
  const int64_t gs0 = grad_out.stride(0), gs1 = grad_out.stride(1), gs2 = grad_out.stride(2), gs3 = grad_out.stride(3);
  const bool gout_view = !kWiden && gs2 == gs3 * g.ow;
  const Tensor gout_pack = gout_view ? Tensor() : empty({1, g.og, g.plane}, acc_opts);
  auto grad_out_matrix = [&](int64_t n, int64_t grp) -> Tensor {
    if (gout_view) return grad_out.select(0, n).narrow(0, grp * g.og, g.og).view({1, g.og, g.plane});
    acc_t* dst = static_cast<acc_t*>(gout_pack.raw_data());
    for (int64_t r = 0; r < g.og; ++r) {
      const scalar_t* src = gp + n * gs0 + (grp * g.og + r) * gs1;
      for (int64_t y = 0; y < g.oh; ++y)
        for (int64_t z = 0; z < g.ow; ++z) dst[(r * g.oh + y) * g.ow + z] = static_cast<acc_t>(src[y * gs2 + z * gs3]);
    }
    return gout_pack;
  };

  // ---- grad_x workspace: W^T per group, the column gradient, and (f16/bf16) one image's float accumulator.
  Tensor wmat, dcol, gx_acc;
  if (grad_x.defined()) {
    // Weight as [O, K], K ordered (c, i, j) like the im2col rows: a view when already laid out so, else packed.
    const int64_t s0 = weight.stride(0), s1 = weight.stride(1), s2 = weight.stride(2), s3 = weight.stride(3);
    if constexpr (!kWiden) {
      if (s3 == 1 && s2 == g.kw && s1 == g.kh * g.kw) wmat = weight.view({g.o, g.k});
    }
    if (!wmat.defined()) {
      wmat = empty({g.o, g.k}, acc_opts);
      const scalar_t* wp = static_cast<const scalar_t*>(weight.raw_data());
      acc_t* wm = static_cast<acc_t*>(wmat.raw_data());
      for (int64_t oc = 0; oc < g.o; ++oc)
        for (int64_t c = 0; c < g.cg; ++c)
          for (int64_t i = 0; i < g.kh; ++i)
            for (int64_t j = 0; j < g.kw; ++j)
              wm[oc * g.k + (c * g.kh + i) * g.kw + j] = static_cast<acc_t>(wp[oc * s0 + c * s1 + i * s2 + j * s3]);
    }
    dcol = empty({1, g.k, g.plane}, acc_opts);
    if constexpr (kWiden) gx_acc = empty({g.c * g.h * g.w}, acc_opts);
  }
  // ---- grad_w workspace: one (image, group)'s im2col columns, the product of one image, and (f16/bf16, or images
  // after the first) the float accumulator over images.
  Tensor col, gw_prod, gw_acc;
  if (grad_w.defined()) {
    col = empty({1, g.k, g.plane}, acc_opts);
    if (g.n_img > 1) gw_prod = empty({1, g.og, g.k}, acc_opts);
    gw_acc = kWiden ? empty({g.o, g.k}, acc_opts) : grad_w.view({g.o, g.k});
  }
  const scalar_t* xp = grad_w.defined() ? static_cast<const scalar_t*>(x.raw_data()) : nullptr;
  const int64_t xs0 = x.stride(0), xs1 = x.stride(1), xs2 = x.stride(2), xs3 = x.stride(3);

  for (int64_t n = 0; n < g.n_img; ++n) {
    // grad_x of image n accumulates in acc (float for f16/bf16, else grad_x itself, contiguous).
    acc_t* gx = nullptr;
    if (grad_x.defined()) {
      if constexpr (kWiden)
        gx = static_cast<acc_t*>(gx_acc.raw_data());
      else
        gx = static_cast<scalar_t*>(grad_x.raw_data()) + n * g.c * g.h * g.w;
      std::fill(gx, gx + g.c * g.h * g.w, acc_t(0));
    }
    for (int64_t grp = 0; grp < g.groups; ++grp) {
      const Tensor gout = grad_out_matrix(n, grp);
      if (grad_x.defined()) {
        // Column gradient [K, plane] = W_g^T [K, og] @ grad_out [og, plane], then col2im: scatter-add each column
        // entry into the input element it was read from.
        gemm(wmat.narrow(0, grp * g.og, g.og).transpose(0, 1).unsqueeze(0), gout, dcol);
        const acc_t* dc = static_cast<const acc_t*>(dcol.raw_data());
        acc_t* gxg = gx + grp * g.cg * g.h * g.w;
        const int64_t sw = p.stride[1];
        // A channel's column rows scatter only into that channel's plane: channels are split over the threads.
        parallel::parallel_for(g.cg, channel_grain, [&](int64_t c0, int64_t c1) {
          for_each_tap_run(g, p, c0, c1, [&](int64_t row, int64_t c, int64_t q0, int64_t iy, int64_t ix0, int64_t cnt) {
            acc_t* dst = gxg + (c * g.h + iy) * g.w + ix0;
            const acc_t* src = dc + row * g.plane + q0;
            if (sw == 1) {
              for (int64_t t = 0; t < cnt; ++t) dst[t] += src[t];
            } else {
              for (int64_t t = 0; t < cnt; ++t) dst[t * sw] += src[t];
            }
          });
        });
      }
      if (grad_w.defined()) {
        // im2col of (n, grp), then grad_w_g [og, K] (+)= grad_out [og, plane] @ col^T [plane, K].
        acc_t* cd = static_cast<acc_t*>(col.raw_data());
        const scalar_t* xg = xp + n * xs0 + grp * g.cg * xs1;
        const int64_t step = p.stride[1] * xs3, rows_per_c = g.kh * g.kw;
        parallel::parallel_for(g.cg, channel_grain, [&](int64_t c0, int64_t c1) {  // channels own their rows
          std::fill(cd + c0 * rows_per_c * g.plane, cd + c1 * rows_per_c * g.plane, acc_t(0));
          for_each_tap_run(g, p, c0, c1, [&](int64_t row, int64_t c, int64_t q0, int64_t iy, int64_t ix0, int64_t cnt) {
            acc_t* dst = cd + row * g.plane + q0;
            const scalar_t* src = xg + c * xs1 + iy * xs2 + ix0 * xs3;
            if (step == 1) {
              for (int64_t t = 0; t < cnt; ++t) dst[t] = static_cast<acc_t>(src[t]);
            } else {
              for (int64_t t = 0; t < cnt; ++t) dst[t] = static_cast<acc_t>(src[t * step]);
            }
          });
        });
        const Tensor acc_g = gw_acc.narrow(0, grp * g.og, g.og);
        if (n == 0) {
          gemm(gout, col.transpose(1, 2), acc_g.unsqueeze(0));
        } else {
          gemm(gout, col.transpose(1, 2), gw_prod);
          acc_t* dst = static_cast<acc_t*>(acc_g.raw_data());
          const acc_t* src = static_cast<const acc_t*>(gw_prod.raw_data());
          for (int64_t e = 0; e < g.og * g.k; ++e) dst[e] += src[e];
        }
      }
    }
    if constexpr (kWiden) {
      if (grad_x.defined()) {
        scalar_t* dst = static_cast<scalar_t*>(grad_x.raw_data()) + n * g.c * g.h * g.w;
        for (int64_t e = 0; e < g.c * g.h * g.w; ++e) dst[e] = scalar_t(gx[e]);
      }
    }
  }
  if constexpr (kWiden) {
    if (grad_w.defined()) {
      const acc_t* src = static_cast<const acc_t*>(gw_acc.raw_data());
      scalar_t* dst = static_cast<scalar_t*>(grad_w.raw_data());
      for (int64_t e = 0; e < g.o * g.k; ++e) dst[e] = scalar_t(src[e]);
    }
  }
}

void conv2d_backward_kernel(const Tensor& grad_out, const Tensor& x, const Tensor& weight, const Conv2dParams& p,
                            const Tensor& grad_x, const Tensor& grad_w) {
  EMBER_DISPATCH_FLOAT(grad_out.dtype(), "conv2d_backward",
                       [&] { conv2d_backward_typed<scalar_t>(grad_out, x, weight, p, grad_x, grad_w); });
}

// Calls f(acc, plane) for every (n, c) plane of the contiguous grad_in [N, C, H, W], where acc is a zeroed
// accumulator of H*W elements in op_math_t that f adds into: grad_in's plane itself for f32/f64, else a float
// workspace plane rounded into grad_in once f returns.
template <class scalar_t, class F>
void accumulate_planes(const Tensor& grad_in, F&& f) {
  using acc_t = op_math_t<scalar_t>;
  const int64_t planes = grad_in.size(0) * grad_in.size(1), hw = grad_in.size(2) * grad_in.size(3);
  scalar_t* gi = static_cast<scalar_t*>(grad_in.raw_data());
  if constexpr (std::is_same_v<acc_t, scalar_t>) {
    std::fill(gi, gi + planes * hw, scalar_t(0));
    for (int64_t pl = 0; pl < planes; ++pl) f(gi + pl * hw, pl);
  } else {
    const Tensor ws = empty({hw}, TensorOptions(dtype_of_v<acc_t>, Device::cpu()));
    acc_t* acc = static_cast<acc_t*>(ws.raw_data());
    for (int64_t pl = 0; pl < planes; ++pl) {
      std::fill(acc, acc + hw, acc_t(0));
      f(acc, pl);
      for (int64_t e = 0; e < hw; ++e) gi[pl * hw + e] = scalar_t(acc[e]);
    }
  }
}

void max_pool2d_backward_kernel(const Tensor& grad_out, const Tensor& indices, const Tensor& grad_in) {
  EMBER_DISPATCH_FLOAT(grad_out.dtype(), "max_pool2d_backward", [&] {
    using acc_t = op_math_t<scalar_t>;
    const int64_t c = grad_out.size(1), oh = grad_out.size(2), ow = grad_out.size(3);
    const int64_t hw = grad_in.size(2) * grad_in.size(3);
    const scalar_t* gp = static_cast<const scalar_t*>(grad_out.raw_data());
    const int64_t* ip = static_cast<const int64_t*>(indices.raw_data());
    // Strides as locals: Tensor::stride() is an out-of-line call, too slow per element.
    const int64_t gs0 = grad_out.stride(0), gs1 = grad_out.stride(1), gs2 = grad_out.stride(2),
                  gs3 = grad_out.stride(3);
    const int64_t is0 = indices.stride(0), is1 = indices.stride(1), is2 = indices.stride(2), is3 = indices.stride(3);
    accumulate_planes<scalar_t>(grad_in, [&](acc_t* acc, int64_t pl) {
      const int64_t n = pl / c, ch = pl % c;
      const scalar_t* gpl = gp + n * gs0 + ch * gs1;
      const int64_t* ipl = ip + n * is0 + ch * is1;
      for (int64_t y = 0; y < oh; ++y)
        for (int64_t z = 0; z < ow; ++z) {
          const int64_t idx = ipl[y * is2 + z * is3];
          EMBER_CHECK(idx >= 0 && idx < hw, IndexError, "max_pool2d_backward: index ", idx, " at output (", n, ", ", ch,
                      ", ", y, ", ", z, ") is out of range for an input plane of ", hw, " elements");
          acc[idx] += static_cast<acc_t>(gpl[y * gs2 + z * gs3]);
        }
    });
  });
}

void avg_pool2d_backward_kernel(const Tensor& grad_out, const Pool2dParams& p, const Tensor& grad_in) {
  EMBER_DISPATCH_FLOAT(grad_out.dtype(), "avg_pool2d_backward", [&] {
    using acc_t = op_math_t<scalar_t>;
    const int64_t c = grad_out.size(1), oh = grad_out.size(2), ow = grad_out.size(3);
    const int64_t h = grad_in.size(2), w = grad_in.size(3);
    const int64_t gs0 = grad_out.stride(0), gs1 = grad_out.stride(1), gs2 = grad_out.stride(2),
                  gs3 = grad_out.stride(3);
    const scalar_t* gp = static_cast<const scalar_t*>(grad_out.raw_data());
    accumulate_planes<scalar_t>(grad_in, [&](acc_t* acc, int64_t pl) {
      const scalar_t* gpl = gp + (pl / c) * gs0 + (pl % c) * gs1;
      for (int64_t y = 0; y < oh; ++y) {
        // The window and divisor exactly as avg_pool2d_kernel (conv_pool.cpp) computes them.
        const int64_t y0 = y * p.stride[0] - p.padding[0];
        const int64_t y1 = std::min<int64_t>(y0 + p.kernel[0], h + p.padding[0]);
        const int64_t ya = std::max<int64_t>(y0, 0), yb = std::min<int64_t>(y1, h);
        for (int64_t z = 0; z < ow; ++z) {
          const int64_t z0 = z * p.stride[1] - p.padding[1];
          const int64_t z1 = std::min<int64_t>(z0 + p.kernel[1], w + p.padding[1]);
          const int64_t za = std::max<int64_t>(z0, 0), zb = std::min<int64_t>(z1, w);
          const int64_t count = p.count_include_pad ? (y1 - y0) * (z1 - z0) : (yb - ya) * (zb - za);
          const acc_t v = static_cast<acc_t>(gpl[y * gs2 + z * gs3]) / static_cast<acc_t>(count);
          for (int64_t yy = ya; yy < yb; ++yy)
            for (int64_t zz = za; zz < zb; ++zz) acc[yy * w + zz] += v;
        }
      }
    });
  });
}

// ---- the same workspace on meta (Note [Meta kernels] in kernels/stubs.h) -------------------------------------------

bool widens(DType dtype) { return dtype == DType::f16 || dtype == DType::bf16; }

// conv2d_backward_typed's workspace in its order: the packed grad_out matrix unless viewed in place; for grad_x the
// packed weight unless used in place, the column gradient and (f16/bf16) the image accumulator; for grad_w the
// columns, the per-image product and (f16/bf16) the accumulator; then what its GEMMs take, each freeing its own.
void conv2d_backward_meta_kernel(const Tensor& grad_out, const Tensor& x, const Tensor& weight, const Conv2dParams& p,
                                 const Tensor& grad_x, const Tensor& grad_w) {
  const bool widen = widens(grad_out.dtype());
  const DType acc = widen ? DType::f32 : grad_out.dtype();
  const ConvGeometry g(x, weight, grad_out, p);
  MetaWorkspace ws;
  const bool gout_view = !widen && grad_out.stride(2) == grad_out.stride(3) * g.ow;
  // The [og, plane] matrix of one (image, group) as the kernel hands it to its GEMMs.
  const Tensor gout = gout_view ? grad_out.select(0, 0).narrow(0, 0, g.og).view({1, g.og, g.plane}) : Tensor();
  const int64_t gout_rs = gout_view ? gout.stride(1) : g.plane, gout_cs = gout_view ? gout.stride(2) : 1;
  if (!gout_view) ws.take(g.og * g.plane, acc);
  int64_t wmat_rs = g.k;
  if (grad_x.defined()) {
    const bool in_place =
        !widen && weight.stride(3) == 1 && weight.stride(2) == g.kw && weight.stride(1) == g.kh * g.kw;
    if (in_place)
      wmat_rs = weight.stride(0);
    else
      ws.take(g.o * g.k, acc);
    ws.take(g.k * g.plane, acc);
    if (widen) ws.take(g.c * g.h * g.w, acc);
  }
  if (grad_w.defined()) {
    ws.take(g.k * g.plane, acc);
    if (g.n_img > 1) ws.take(g.og * g.k, acc);
    if (widen) ws.take(g.o * g.k, acc);
  }
  // grad_x: W_g^T [K, og] @ grad_out [og, plane]; grad_w: grad_out [og, plane] @ col^T [plane, K].
  if (grad_x.defined()) replay_bmm_workspace(acc, 1, g.k, g.og, g.plane, 1, wmat_rs, gout_rs, gout_cs);
  if (grad_w.defined()) replay_bmm_workspace(acc, 1, g.og, g.plane, g.k, gout_rs, gout_cs, 1, g.plane);
}

// accumulate_planes' f32 plane for f16/bf16.
void pool2d_backward_meta_workspace(const Tensor& grad_in) {
  if (!widens(grad_in.dtype())) return;
  MetaWorkspace ws;
  ws.take(grad_in.size(2) * grad_in.size(3), DType::f32);
}

void max_pool2d_backward_meta_kernel(const Tensor& grad_out, const Tensor& indices, const Tensor& grad_in) {
  pool2d_backward_meta_workspace(grad_in);
}

void avg_pool2d_backward_meta_kernel(const Tensor& grad_out, const Pool2dParams& p, const Tensor& grad_in) {
  pool2d_backward_meta_workspace(grad_in);
}

}  // namespace

EMBER_REGISTER_KERNEL(conv2d_backward, DeviceType::CPU, conv2d_backward_kernel);
EMBER_REGISTER_KERNEL(max_pool2d_backward, DeviceType::CPU, max_pool2d_backward_kernel);
EMBER_REGISTER_KERNEL(avg_pool2d_backward, DeviceType::CPU, avg_pool2d_backward_kernel);
EMBER_REGISTER_KERNEL(conv2d_backward, DeviceType::Meta, conv2d_backward_meta_kernel);
EMBER_REGISTER_KERNEL(max_pool2d_backward, DeviceType::Meta, max_pool2d_backward_meta_kernel);
EMBER_REGISTER_KERNEL(avg_pool2d_backward, DeviceType::Meta, avg_pool2d_backward_meta_kernel);

}  // namespace ember::kernels::cpu

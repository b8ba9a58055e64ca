// CPU conv2d (im2col + GEMM per image and group, images over the CPU threads) and max/avg pool2d (direct loops), NCHW,
// any input strides. Invariant: f16/bf16 are only storage: inputs are widened to float, every sum runs in op_math_t,
// and each output element is rounded once when stored. Every workspace byte comes from the host allocator.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>
#include <vector>

#include "ember/core/parallel.h"
#include "ember/kernels/cpu/conv_im2col.h"
#include "ember/kernels/cpu/gemm.h"
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
// the allocator] in gemm.cpp). Small fixed-size stack arrays and O(ndim) shape metadata are not workspace.
// tests/kernels/test_workspace_accounting.cpp holds the kernels to this. A kernel that takes workspace also registers a
// Meta entry that takes the same on meta (Note [Meta kernels] in kernels/stubs.h): change the two together.

// Note [Convolution over images]
// A batch of images runs on the CPU threads image by image: with c = chunk_count(N, 1) >= 2 chunks, each chunk has
// its own columns and a serial Gemm (gemm.h) and claims the next image whenever it is free (for_each_claimed), so an
// image's columns are written and multiplied on one core, no image waits for another, and a thread the OS
// deschedules holds up one image, not half the batch. With one chunk (one image, or one thread) the images run in turn
// and each one's im2col (by channel) and GEMM (in row or column blocks) are split instead. Every output element is
// computed by the same operations in the same order either way (a split GEMM sums like a serial one: Note [Parallel
// GEMM] in gemm.cpp), so results do not depend on the thread count. The bias is the first term of each output's sum:
// the rows are filled with it and the GEMM accumulates onto them. The weight gradient, a sum over images, is split
// into a fixed number of partial sums (conv_pool_backward.cpp) for the same reason.

template <class scalar_t>
void conv2d_typed(const Tensor& x, const Tensor& weight, const Tensor& bias, const Conv2dParams& p, const Tensor& out) {
  using acc_t = op_math_t<scalar_t>;
  constexpr bool kWiden = !std::is_same_v<acc_t, scalar_t>;
  const TensorOptions acc_opts(dtype_of_v<acc_t>, Device::cpu());
  const ConvGeometry g(x, weight, out, p);
  if (out.numel() == 0) return;
  const WeightMatrix<acc_t, scalar_t> wmat(weight, g);
  const scalar_t* bp = bias.defined() ? static_cast<const scalar_t*>(bias.raw_data()) : nullptr;
  const int64_t bs = bias.defined() ? bias.stride(0) : 0;
  const scalar_t* xp = static_cast<const scalar_t*>(x.raw_data());
  const int64_t xs0 = x.stride(0), xs1 = x.stride(1), xs2 = x.stride(2), xs3 = x.stride(3);
  scalar_t* op = static_cast<scalar_t*>(out.raw_data());

  // Per chunk (Note [Convolution over images]): the columns of one (image, group), the f32 product before rounding
  // (f16/bf16), and the Gemm [og, K] @ [K, plane].
  struct Worker {
    Tensor col, res;
    Gemm<acc_t> gemm;
  };
  const int64_t chunks = parallel::chunk_count(g.n_img, 1);
  const bool by_image = chunks >= 2;
  std::vector<Worker> workers;
  workers.reserve(static_cast<size_t>(chunks));
  for (int64_t c = 0; c < chunks; ++c) {
    Tensor col = empty({g.k * g.plane}, acc_opts);
    Tensor res = kWiden ? empty({g.og * g.plane}, acc_opts) : Tensor();
    workers.push_back(
        {std::move(col), std::move(res), Gemm<acc_t>(g.og, g.k, g.plane, wmat.rs, 1, g.plane, 1, !by_image)});
  }
  const int64_t channel_grain = std::max<int64_t>(1, kElementGrain / std::max<int64_t>(1, g.kh * g.kw * g.plane));

  auto image = [&](int64_t n, Worker& wk, bool split) {
    acc_t* cd = static_cast<acc_t*>(wk.col.raw_data());
    for (int64_t grp = 0; grp < g.groups; ++grp) {
      const scalar_t* xg = xp + n * xs0 + grp * g.cg * xs1;
      if (split)  // channels own their rows
        parallel::parallel_for(g.cg, channel_grain,
                               [&](int64_t c0, int64_t c1) { im2col(g, p, xg, xs1, xs2, xs3, c0, c1, cd); });
      else
        im2col(g, p, xg, xs1, xs2, xs3, 0, g.cg, cd);
      const acc_t* wg = wmat.data + grp * g.og * wmat.rs;
      scalar_t* out_g = op + (n * g.o + grp * g.og) * g.plane;
      if constexpr (!kWiden) {
        if (bp)
          for (int64_t r = 0; r < g.og; ++r)
            std::fill(out_g + r * g.plane, out_g + (r + 1) * g.plane, bp[(grp * g.og + r) * bs]);
        wk.gemm.run(wg, cd, out_g, g.plane, /*accumulate=*/bp != nullptr);
      } else {
        acc_t* rp = static_cast<acc_t*>(wk.res.raw_data());
        wk.gemm.run(wg, cd, rp, g.plane);
        for (int64_t r = 0; r < g.og; ++r) {
          const acc_t b = bp ? static_cast<acc_t>(bp[(grp * g.og + r) * bs]) : acc_t(0);
          for (int64_t q = 0; q < g.plane; ++q) out_g[r * g.plane + q] = scalar_t(rp[r * g.plane + q] + b);
        }
      }
    }
  };
  if (by_image) {
    parallel::for_each_claimed(g.n_img, chunks,
                               [&](int64_t c, int64_t n) { image(n, workers[static_cast<size_t>(c)], false); });
  } else {
    for (int64_t n = 0; n < g.n_img; ++n) image(n, workers[0], true);
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

// The maximum of a 2x2 cell (v0 v1 / v2 v3, rows w apart) in max_pool2d_kernel's order — row by row, NaN wins, the
// last NaN's index — and at, its offset from the cell's corner (0, 1, w or w + 1). Selects, not jumps.
template <class acc_t>
inline acc_t max2x2(acc_t v0, acc_t v1, acc_t v2, acc_t v3, int64_t w, int64_t& at) {
  acc_t best = v0;
  at = 0;
  bool take = v1 > best || v1 != v1;
  best = take ? v1 : best;
  at = take ? 1 : at;
  take = v2 > best || v2 != v2;
  best = take ? v2 : best;
  at = take ? w : at;
  take = v3 > best || v3 != v3;
  best = take ? v3 : best;
  at = take ? w + 1 : at;
  return best;
}

// One output row of a 2x2 max pool with stride 2 and no padding over the input rows r0 and r1 (unit column stride),
// in max_pool2d_kernel's order: row by row, NaN wins, the last NaN's index. base = the flat index of r0[0] in its
// plane, w the plane's width. Branch-free (selects instead of jumps), so the compiler vectorises it: with branches,
// random data mispredicts about every other comparison (~14 ns per output).
template <class acc_t, bool kIndices, class scalar_t>
void max2x2_row(const scalar_t* __restrict r0, const scalar_t* __restrict r1, int64_t ow, int64_t base, int64_t w,
                scalar_t* __restrict out, int64_t* __restrict idx) {
  for (int64_t z = 0; z < ow; ++z) {
    int64_t at;
    const acc_t best = max2x2(static_cast<acc_t>(r0[2 * z]), static_cast<acc_t>(r0[2 * z + 1]),
                              static_cast<acc_t>(r1[2 * z]), static_cast<acc_t>(r1[2 * z + 1]), w, at);
    out[z] = scalar_t(best);
    if constexpr (kIndices) idx[z] = base + 2 * z + at;
  }
}

// The same over a whole plane the pool covers exactly (h = 2 oh, w = 2 ow, rows of x contiguous), as one loop over its
// oh * ow outputs: corner[j] is output j's top-left input element (a table shared by all planes). A row of the MNIST
// CNN's pool has 12 outputs, fewer than one 16-lane AVX-512 vector, so max2x2_row ran its scalar remainder only
// (3.9 ns an output); the plane's loop vectorises with gathers. Same comparisons in the same order.
template <class acc_t, bool kIndices, class scalar_t>
void max2x2_plane(const scalar_t* __restrict x, const int32_t* __restrict corner, int64_t outputs, int64_t w,
                  scalar_t* __restrict out, int64_t* __restrict idx) {
  for (int64_t j = 0; j < outputs; ++j) {
    const int64_t c = corner[j];
    int64_t at;
    const acc_t best = max2x2(static_cast<acc_t>(x[c]), static_cast<acc_t>(x[c + 1]), static_cast<acc_t>(x[c + w]),
                              static_cast<acc_t>(x[c + w + 1]), w, at);
    out[j] = scalar_t(best);
    if constexpr (kIndices) idx[j] = c + at;
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
    // max2x2_plane's corners, when the pool covers the plane exactly and its rows are contiguous.
    const bool by_planes = two_by_two && 2 * oh == h && 2 * ow == w && xs2 == w && h * w <= (int64_t{1} << 30);
    std::vector<int32_t> corner(by_planes ? oh * ow : 0);
    for (int64_t j = 0; j < static_cast<int64_t>(corner.size()); ++j)
      corner[j] = static_cast<int32_t>(2 * (j / ow) * w + 2 * (j % ow));
    for_each_plane<scalar_t>(x, out, [&](const scalar_t* xc, int64_t base) {
      if (by_planes) {
        if (ip)
          max2x2_plane<acc_t, true>(xc, corner.data(), oh * ow, w, op + base, ip + base);
        else
          max2x2_plane<acc_t, false>(xc, corner.data(), oh * ow, w, op + base, nullptr);
        return;
      }
      if (two_by_two) {
        for (int64_t y = 0; y < oh; ++y) {
          const scalar_t* r0 = xc + 2 * y * xs2;
          scalar_t* orow = op + base + y * ow;
          if (ip)
            max2x2_row<acc_t, true>(r0, r0 + xs2, ow, 2 * y * w, w, orow, ip + base + y * ow);
          else
            max2x2_row<acc_t, false>(r0, r0 + xs2, ow, 2 * y * w, w, orow, nullptr);
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
              const bool take = v > best || v != v;  // selects, not a jump (see max2x2_row)
              best = take ? v : best;
              best_i = take ? yy * w + zz : best_i;
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
// it is used in place, then per chunk the im2col columns, the f32 product for f16/bf16 and the Gemm's workspace.
void conv2d_meta_kernel(const Tensor& x, const Tensor& weight, const Tensor& bias, const Conv2dParams& p,
                        const Tensor& out) {
  if (out.numel() == 0) return;
  const bool widen = is_reduced_float(x.dtype());
  const DType acc = widen ? DType::f32 : x.dtype();
  const ConvGeometry g(x, weight, out, p);
  const bool in_place = !widen && weight.stride(3) == 1 && weight.stride(2) == g.kw && weight.stride(1) == g.kh * g.kw;
  MetaWorkspace ws;
  if (!in_place) ws.take(g.o * g.k, acc);
  const int64_t chunks = parallel::chunk_count(g.n_img, 1);
  for (int64_t c = 0; c < chunks; ++c) {
    ws.take(g.k * g.plane, acc);
    if (widen) ws.take(g.og * g.plane, acc);
    take_gemm_workspace(ws, acc, g.og, g.k, g.plane, in_place ? weight.stride(0) : g.k, 1, g.plane, 1, chunks == 1);
  }
}

}  // namespace

EMBER_REGISTER_KERNEL(conv2d, DeviceType::CPU, conv2d_kernel);
EMBER_REGISTER_KERNEL(conv2d, DeviceType::Meta, conv2d_meta_kernel);
EMBER_REGISTER_KERNEL(max_pool2d, DeviceType::CPU, max_pool2d_kernel);
EMBER_REGISTER_KERNEL(avg_pool2d, DeviceType::CPU, avg_pool2d_kernel);

}  // namespace ember::kernels::cpu

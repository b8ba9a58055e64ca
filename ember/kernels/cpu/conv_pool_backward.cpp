// CPU conv2d backward (GEMM + col2im for grad_x, im2col + GEMM summed over images for grad_w) and max/avg pool2d
// backward (scatter-add), NCHW, inputs of any strides. Invariant: f16/bf16 are only storage: every sum (GEMM,
// scatter-add of overlapping windows, sum over images) runs in op_math_t and each gradient element is rounded once
// when stored. Workspace comes from the host allocator (Note [Kernel workspace] in conv_pool.cpp).
#include <algorithm>
#include <cstddef>
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

// The weight gradient sums a product per image. The images are split into a fixed number of partial sums (at most
// kWeightPartials, fewer when their workspace would pass kPartialBytes), each summed in image order by one chunk,
// then added in order: the split depends on the sizes only, so results do not depend on the thread count (Note
// [Convolution over images] in conv_pool.cpp).
constexpr int64_t kWeightPartials = 8;
constexpr int64_t kPartialBytes = int64_t{8} << 20;

int64_t weight_partials(int64_t n_img, int64_t partial_bytes) {
  return std::max<int64_t>(1,
                           std::min({n_img, kWeightPartials, 1 + kPartialBytes / std::max<int64_t>(1, partial_bytes)}));
}

template <class scalar_t>
void conv2d_backward_typed(const Tensor& grad_out, const Tensor& x, const Tensor& weight, const Conv2dParams& p,
                           const Tensor& grad_x, const Tensor& grad_w) {
  using acc_t = op_math_t<scalar_t>;
  constexpr bool kWiden = !std::is_same_v<acc_t, scalar_t>;
  const TensorOptions acc_opts(dtype_of_v<acc_t>, Device::cpu());
  const ConvGeometry g(x, weight, grad_out, p);
  if (grad_out.numel() == 0) {  // no products: both gradients are zero
    if (grad_x.defined()) std::fill_n(static_cast<scalar_t*>(grad_x.raw_data()), grad_x.numel(), scalar_t(0));
    if (grad_w.defined()) std::fill_n(static_cast<scalar_t*>(grad_w.raw_data()), grad_w.numel(), scalar_t(0));
    return;
  }
  const int64_t channel_grain = std::max<int64_t>(1, kElementGrain / std::max<int64_t>(1, g.kh * g.kw * g.plane));

  // grad_out of one (image, group) as an [og, plane] matrix in the compute type with strides (gout_rs, gout_cs): in
  // place when its rows are evenly strided and no widening is needed, else packed (and widened) into `pack`.
  const scalar_t* gp = static_cast<const scalar_t*>(grad_out.raw_data());
  const int64_t gs0 = grad_out.stride(0), gs1 = grad_out.stride(1), gs2 = grad_out.stride(2), gs3 = grad_out.stride(3);
  const bool gout_view = !kWiden && gs2 == gs3 * g.ow;
  const int64_t gout_rs = gout_view ? gs1 : g.plane, gout_cs = gout_view ? gs3 : 1;
  auto grad_out_matrix = [&](int64_t n, int64_t grp, const Tensor& pack) -> const acc_t* {
    if constexpr (!kWiden) {
      if (gout_view) return gp + n * gs0 + grp * g.og * gs1;
    }
    acc_t* dst = static_cast<acc_t*>(pack.raw_data());
    for (int64_t r = 0; r < g.og; ++r) {
      const scalar_t* src = gp + n * gs0 + (grp * g.og + r) * gs1;
      for (int64_t y = 0; y < g.oh; ++y)
        for (int64_t z = 0; z < g.ow; ++z) dst[(r * g.oh + y) * g.ow + z] = static_cast<acc_t>(src[y * gs2 + z * gs3]);
    }
    return dst;
  };
  auto gout_pack = [&] { return gout_view ? Tensor() : empty({g.og * g.plane}, acc_opts); };

  if (grad_x.defined()) {
    // Per image: the column gradient [K, plane] = W_g^T [K, og] @ grad_out [og, plane] per group, then col2im
    // (scatter-add each column entry into the input element it was read from), into a zeroed accumulator (grad_x's
    // image itself, or f32 for f16/bf16). Images run over the threads (Note [Convolution over images]).
    const WeightMatrix<acc_t, scalar_t> wmat(weight, g);
    struct Worker {
      Tensor gout, dcol, acc;
      Gemm<acc_t> gemm;
    };
    const int64_t chunks = parallel::chunk_count(g.n_img, 1);
    const bool by_image = chunks >= 2;
    std::vector<Worker> workers;
    workers.reserve(static_cast<size_t>(chunks));
    for (int64_t c = 0; c < chunks; ++c) {
      Tensor gout = gout_pack();
      Tensor dcol = empty({g.k * g.plane}, acc_opts);
      Tensor acc = kWiden ? empty({g.c * g.h * g.w}, acc_opts) : Tensor();
      workers.push_back({std::move(gout), std::move(dcol), std::move(acc),
                         Gemm<acc_t>(g.k, g.og, g.plane, 1, wmat.rs, gout_rs, gout_cs, !by_image)});
    }
    scalar_t* gxp = static_cast<scalar_t*>(grad_x.raw_data());
    const int64_t sw = p.stride[1];
    auto image = [&](int64_t n, Worker& wk, bool split) {
      acc_t* gx;
      if constexpr (kWiden)
        gx = static_cast<acc_t*>(wk.acc.raw_data());
      else
        gx = gxp + n * g.c * g.h * g.w;
      std::fill(gx, gx + g.c * g.h * g.w, acc_t(0));
      acc_t* dc = static_cast<acc_t*>(wk.dcol.raw_data());
      for (int64_t grp = 0; grp < g.groups; ++grp) {
        wk.gemm.run(wmat.data + grp * g.og * wmat.rs, grad_out_matrix(n, grp, wk.gout), dc, g.plane);
        acc_t* gxg = gx + grp * g.cg * g.h * g.w;
        // A channel's column rows scatter only into that channel's plane.
        auto col2im = [&](int64_t c0, int64_t c1) {
          for_each_tap_run(g, p, c0, c1, [&](int64_t row, int64_t c, int64_t q0, int64_t iy, int64_t ix0, int64_t cnt) {
            acc_t* dst = gxg + (c * g.h + iy) * g.w + ix0;
            const acc_t* src = dc + row * g.plane + q0;
            if (sw == 1) {
              for (int64_t t = 0; t < cnt; ++t) dst[t] += src[t];
            } else {
              for (int64_t t = 0; t < cnt; ++t) dst[t * sw] += src[t];
            }
          });
        };
        if (split)
          parallel::parallel_for(g.cg, channel_grain, col2im);
        else
          col2im(0, g.cg);
      }
      if constexpr (kWiden) {
        scalar_t* dst = gxp + n * g.c * g.h * g.w;
        for (int64_t e = 0; e < g.c * g.h * g.w; ++e) dst[e] = scalar_t(gx[e]);
      }
    };
    if (by_image)
      parallel::for_each_claimed(g.n_img, chunks,
                                 [&](int64_t c, int64_t n) { image(n, workers[static_cast<size_t>(c)], false); });
    else
      for (int64_t n = 0; n < g.n_img; ++n) image(n, workers[0], true);
  }

  if (grad_w.defined()) {
    // Partial sum q over its images: grad_w_g [og, K] (+)= grad_out [og, plane] @ col^T [plane, K] per image and
    // group, the GEMM accumulating after the partial's first image. Partial 0 is the result (grad_w itself, or f32
    // for f16/bf16); the others are workspace, added to it in order at the end.
    const int64_t wk_numel = g.o * g.k;
    const int64_t parts = weight_partials(g.n_img, wk_numel * static_cast<int64_t>(sizeof(acc_t)));
    const Tensor acc0 = kWiden ? empty({wk_numel}, acc_opts) : Tensor();
    const Tensor rest = parts > 1 ? empty({(parts - 1) * wk_numel}, acc_opts) : Tensor();
    acc_t* gw0 = kWiden ? static_cast<acc_t*>(acc0.raw_data()) : static_cast<acc_t*>(grad_w.raw_data());
    acc_t* gw_rest = parts > 1 ? static_cast<acc_t*>(rest.raw_data()) : nullptr;
    struct Worker {
      Tensor gout, col;
      Gemm<acc_t> gemm;
    };
    const int64_t chunks = parallel::chunk_count(parts, 1);
    const bool by_part = chunks >= 2;
    std::vector<Worker> workers;
    workers.reserve(static_cast<size_t>(chunks));
    for (int64_t c = 0; c < chunks; ++c) {
      Tensor gout = gout_pack();
      Tensor col = empty({g.k * g.plane}, acc_opts);
      workers.push_back(
          {std::move(gout), std::move(col), Gemm<acc_t>(g.og, g.plane, g.k, gout_rs, gout_cs, 1, g.plane, !by_part)});
    }
    const scalar_t* xp = static_cast<const scalar_t*>(x.raw_data());
    const int64_t xs0 = x.stride(0), xs1 = x.stride(1), xs2 = x.stride(2), xs3 = x.stride(3);
    auto partial = [&](int64_t q, Worker& wk, bool split) {
      acc_t* acc = q == 0 ? gw0 : gw_rest + (q - 1) * wk_numel;
      acc_t* cd = static_cast<acc_t*>(wk.col.raw_data());
      const int64_t n0 = parallel::chunk_begin(q, parts, g.n_img, 1),
                    n1 = parallel::chunk_begin(q + 1, parts, g.n_img, 1);
      for (int64_t n = n0; n < n1; ++n)
        for (int64_t grp = 0; grp < g.groups; ++grp) {
          const scalar_t* xg = xp + n * xs0 + grp * g.cg * xs1;
          if (split)  // channels own their rows
            parallel::parallel_for(g.cg, channel_grain,
                                   [&](int64_t c0, int64_t c1) { im2col(g, p, xg, xs1, xs2, xs3, c0, c1, cd); });
          else
            im2col(g, p, xg, xs1, xs2, xs3, 0, g.cg, cd);
          wk.gemm.run(grad_out_matrix(n, grp, wk.gout), cd, acc + grp * g.og * g.k, g.k, /*accumulate=*/n != n0);
        }
    };
    if (by_part)
      parallel::for_each_claimed(parts, chunks,
                                 [&](int64_t c, int64_t q) { partial(q, workers[static_cast<size_t>(c)], false); });
    else
      for (int64_t q = 0; q < parts; ++q) partial(q, workers[0], true);
    if (parts > 1 || kWiden)
      parallel::parallel_for(wk_numel, kElementGrain, [&](int64_t lo, int64_t hi) {
        for (int64_t e = lo; e < hi; ++e) {
          acc_t v = gw0[e];
          for (int64_t q = 1; q < parts; ++q) v += gw_rest[(q - 1) * wk_numel + e];
          if constexpr (kWiden)
            static_cast<scalar_t*>(grad_w.raw_data())[e] = scalar_t(v);
          else
            gw0[e] = v;
        }
      });
  }
}

void conv2d_backward_kernel(const Tensor& grad_out, const Tensor& x, const Tensor& weight, const Conv2dParams& p,
                            const Tensor& grad_x, const Tensor& grad_w) {
  EMBER_DISPATCH_FLOAT(grad_out.dtype(), "conv2d_backward",
                       [&] { conv2d_backward_typed<scalar_t>(grad_out, x, weight, p, grad_x, grad_w); });
}

// Planes per chunk of the pool backward kernels: chunks of at least kElementGrain input elements.
int64_t pool_backward_grain(const Tensor& grad_in) {
  return std::max<int64_t>(1, kElementGrain / std::max<int64_t>(1, grad_in.size(2) * grad_in.size(3)));
}

// Calls f(acc, plane) for every (n, c) plane of the contiguous grad_in [N, C, H, W], where acc is a zeroed
// accumulator of H*W elements in op_math_t that f adds into: grad_in's plane itself for f32/f64, else a float
// workspace plane (one per chunk, taken before the chunks run) rounded into grad_in once f returns. The planes are
// split over the CPU threads; each owns its plane and is zeroed just before f scatters into it (while it is in
// cache), so results do not depend on the thread count.
// write(plane, pl), when given, is tried first on each plane: it may fill grad_in's plane itself and return true, or
// return false (whatever it wrote is then overwritten) for the plane to go through f.
// The chunk count is taken once, for the workspace and the split alike (a thread-count change between two counts
// could otherwise hand a chunk no workspace).
template <class scalar_t, class F, class W = std::nullptr_t>
void accumulate_planes(const Tensor& grad_in, F&& f, W&& write = nullptr) {
  using acc_t = op_math_t<scalar_t>;
  const int64_t planes = grad_in.size(0) * grad_in.size(1), hw = grad_in.size(2) * grad_in.size(3);
  scalar_t* gi = static_cast<scalar_t*>(grad_in.raw_data());
  const int64_t chunks = parallel::chunk_count(planes, pool_backward_grain(grad_in));
  std::vector<Tensor> ws;
  if constexpr (!std::is_same_v<acc_t, scalar_t>) {
    for (int64_t c = 0; c < chunks; ++c) ws.push_back(empty({hw}, TensorOptions(dtype_of_v<acc_t>, Device::cpu())));
  }
  parallel::parallel_for(chunks, 1, 1, [&](int64_t chunk, int64_t, int64_t) {
    const int64_t lo = parallel::chunk_begin(chunk, chunks, planes, 1);
    const int64_t hi = parallel::chunk_begin(chunk + 1, chunks, planes, 1);
    for (int64_t pl = lo; pl < hi; ++pl) {
      if constexpr (!std::is_same_v<std::decay_t<W>, std::nullptr_t>) {
        if (write(gi + pl * hw, pl)) continue;
      }
      if constexpr (std::is_same_v<acc_t, scalar_t>) {
        std::fill(gi + pl * hw, gi + (pl + 1) * hw, scalar_t(0));
        f(gi + pl * hw, pl);
      } else {
        acc_t* acc = static_cast<acc_t*>(ws[chunk].raw_data());
        std::fill(acc, acc + hw, acc_t(0));
        f(acc, pl);
        for (int64_t e = 0; e < hw; ++e) gi[pl * hw + e] = scalar_t(acc[e]);
      }
    }
  });
}

// Note [Max-pool backward by cells]
// When every output's index lies in its own 2x2 cell {2y, 2y+1} x {2z, 2z+1} of the input plane — always so for the
// unpadded 2x2 / stride-2 pool of most CNNs, and for any pool whose maxima happen to — no two outputs share an input
// element, so the scatter-add is a write: each cell gets 0 + g at the index (the sum the scatter-add forms, rounded
// once) and 0 elsewhere, and the rows and columns no cell covers get 0: no zero-fill pass, no read-modify-write of
// the plane, and a loop that vectorises (bench/RESULTS.md, "CPU kernels against the machine's ceilings"). Each index
// is compared with its cell's four positions as the cell is written (compared, not subtracted: any int64 index is
// safe); at the end of the first row with an index outside its cell the plane returns false and is redone by the
// scatter-add, which also raises IndexError for an index outside the plane — so a pool whose windows overlap (3x3,
// stride 2) pays one row per plane. Results are the scatter-add's bit for bit.
template <class scalar_t>
bool max_pool_backward_cells(const scalar_t* __restrict g, int64_t gs2, int64_t gs3, const int64_t* __restrict idx,
                             int64_t is2, int64_t is3, int64_t oh, int64_t ow, int64_t h, int64_t w,
                             scalar_t* __restrict plane) {
  using acc_t = op_math_t<scalar_t>;
  const scalar_t zero = scalar_t(acc_t(0));
  for (int64_t y = 0; y < oh; ++y) {
    scalar_t* r0 = plane + 2 * y * w;
    scalar_t* r1 = r0 + w;
    const int64_t base = 2 * y * w;
    const int64_t* __restrict irow = idx + y * is2;
    const scalar_t* __restrict grow = g + y * gs2;
    int64_t outside = 0;
    // Selects, not branches (random data would mispredict where the maximum was); the loop vectorises.
    for (int64_t z = 0; z < ow; ++z) {
      const int64_t i = irow[z * is3], at = base + 2 * z;  // at: the cell's top-left corner
      const acc_t v = acc_t(0) + static_cast<acc_t>(grow[z * gs3]);
      r0[2 * z] = scalar_t(i == at ? v : acc_t(0));
      r0[2 * z + 1] = scalar_t(i == at + 1 ? v : acc_t(0));
      r1[2 * z] = scalar_t(i == at + w ? v : acc_t(0));
      r1[2 * z + 1] = scalar_t(i == at + w + 1 ? v : acc_t(0));
      outside += (i != at) & (i != at + 1) & (i != at + w) & (i != at + w + 1);
    }
    if (outside != 0) return false;
    for (int64_t z = 2 * ow; z < w; ++z) r0[z] = r1[z] = zero;
  }
  std::fill(plane + 2 * oh * w, plane + h * w, zero);
  return true;
}

// Note [Max-pool backward by planes]
// The cells of a plane the pool covers exactly (h = 2 oh, w = 2 ow) with grad_out and the indices contiguous within
// the plane — the 2x2 pool of the MNIST CNN: 12 outputs a row — as one loop over the plane's h*w elements: element e
// belongs to output cell[e] (a table shared by all planes) and gets 0 + g there when that output's index is e, else 0.
// A row of 12 outputs is shorter than one 16-lane AVX-512 vector, so the row loop above ran its scalar remainder
// only (7.5 ns an output); the plane's loop vectorises with gathers. Every output's index lies in its cell exactly
// when as many elements matched as there are outputs (an output matches at most once: only its cell's elements look
// it up); otherwise the plane is redone by the scatter-add, as above. Same bits as the scatter-add.
template <class scalar_t>
bool max_pool_backward_plane(const scalar_t* __restrict g, const int64_t* __restrict idx,
                             const int32_t* __restrict cell, int64_t hw, int64_t outputs, scalar_t* __restrict plane) {
  using acc_t = op_math_t<scalar_t>;
  int64_t hits = 0;
  for (int64_t e = 0; e < hw; ++e) {
    const int32_t j = cell[e];
    const bool hit = idx[j] == e;
    const acc_t v = acc_t(0) + static_cast<acc_t>(g[j]);
    plane[e] = scalar_t(hit ? v : acc_t(0));
    hits += hit;
  }
  return hits == outputs;
}

void max_pool2d_backward_kernel(const Tensor& grad_out, const Tensor& indices, const Tensor& grad_in) {
  EMBER_DISPATCH_FLOAT(grad_out.dtype(), "max_pool2d_backward", [&] {
    using acc_t = op_math_t<scalar_t>;
    const int64_t c = grad_out.size(1), oh = grad_out.size(2), ow = grad_out.size(3);
    const int64_t h = grad_in.size(2), w = grad_in.size(3), hw = h * w;
    const scalar_t* gp = static_cast<const scalar_t*>(grad_out.raw_data());
    const int64_t* ip = static_cast<const int64_t*>(indices.raw_data());
    // Strides as locals: Tensor::stride() is an out-of-line call, too slow per element.
    const int64_t gs0 = grad_out.stride(0), gs1 = grad_out.stride(1), gs2 = grad_out.stride(2),
                  gs3 = grad_out.stride(3);
    const int64_t is0 = indices.stride(0), is1 = indices.stride(1), is2 = indices.stride(2), is3 = indices.stride(3);
    const bool cells = 2 * oh <= h && 2 * ow <= w;  // the cells fit in the plane (Note [Max-pool backward by cells])
    // Note [Max-pool backward by planes]: the cell of each element of an exactly covered plane.
    const bool by_planes = h == 2 * oh && w == 2 * ow && gs3 == 1 && gs2 == ow && is3 == 1 && is2 == ow &&
                           hw <= std::numeric_limits<int32_t>::max();
    std::vector<int32_t> cell(by_planes ? hw : 0);
    for (int64_t e = 0; e < static_cast<int64_t>(cell.size()); ++e)
      cell[e] = static_cast<int32_t>((e / w / 2) * ow + (e % w) / 2);
    accumulate_planes<scalar_t>(
        grad_in,
        [&](acc_t* acc, int64_t pl) {
          const int64_t n = pl / c, ch = pl % c;
          const scalar_t* gpl = gp + n * gs0 + ch * gs1;
          const int64_t* ipl = ip + n * is0 + ch * is1;
          for (int64_t y = 0; y < oh; ++y)
            for (int64_t z = 0; z < ow; ++z) {
              const int64_t idx = ipl[y * is2 + z * is3];
              EMBER_CHECK(idx >= 0 && idx < hw, IndexError, "max_pool2d_backward: index ", idx, " at output (", n,
                          ", ", ch, ", ", y, ", ", z, ") is out of range for an input plane of ", hw, " elements");
              acc[idx] += static_cast<acc_t>(gpl[y * gs2 + z * gs3]);
            }
        },
        [&](scalar_t* plane, int64_t pl) {
          const int64_t n = pl / c, ch = pl % c;
          if (by_planes)
            return max_pool_backward_plane(gp + n * gs0 + ch * gs1, ip + n * is0 + ch * is1, cell.data(), hw, oh * ow,
                                           plane);
          return cells && max_pool_backward_cells(gp + n * gs0 + ch * gs1, gs2, gs3, ip + n * is0 + ch * is1, is2,
                                                  is3, oh, ow, h, w, plane);
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

// conv2d_backward_typed's workspace in its order. grad_x: the packed weight unless used in place, then per chunk the
// packed grad_out matrix unless viewed in place, the column gradient, (f16/bf16) the image accumulator and the
// Gemm's workspace, all freed before grad_w's: (f16/bf16) the f32 result, the other partial sums, then per chunk the
// packed grad_out matrix, the columns and the Gemm's workspace.
void conv2d_backward_meta_kernel(const Tensor& grad_out, const Tensor& x, const Tensor& weight, const Conv2dParams& p,
                                 const Tensor& grad_x, const Tensor& grad_w) {
  if (grad_out.numel() == 0) return;
  const bool widen = is_reduced_float(grad_out.dtype());
  const DType acc = widen ? DType::f32 : grad_out.dtype();
  const ConvGeometry g(x, weight, grad_out, p);
  const bool gout_view = !widen && grad_out.stride(2) == grad_out.stride(3) * g.ow;
  const int64_t gout_rs = gout_view ? grad_out.stride(1) : g.plane, gout_cs = gout_view ? grad_out.stride(3) : 1;
  if (grad_x.defined()) {
    MetaWorkspace ws;
    const bool in_place =
        !widen && weight.stride(3) == 1 && weight.stride(2) == g.kw && weight.stride(1) == g.kh * g.kw;
    if (!in_place) ws.take(g.o * g.k, acc);
    const int64_t chunks = parallel::chunk_count(g.n_img, 1);
    for (int64_t c = 0; c < chunks; ++c) {
      if (!gout_view) ws.take(g.og * g.plane, acc);
      ws.take(g.k * g.plane, acc);
      if (widen) ws.take(g.c * g.h * g.w, acc);
      take_gemm_workspace(ws, acc, g.k, g.og, g.plane, 1, in_place ? weight.stride(0) : g.k, gout_rs, gout_cs,
                          chunks == 1);
    }
  }
  if (grad_w.defined()) {
    MetaWorkspace ws;
    const int64_t parts = weight_partials(g.n_img, g.o * g.k * itemsize(acc));
    if (widen) ws.take(g.o * g.k, acc);
    if (parts > 1) ws.take((parts - 1) * g.o * g.k, acc);
    const int64_t chunks = parallel::chunk_count(parts, 1);
    for (int64_t c = 0; c < chunks; ++c) {
      if (!gout_view) ws.take(g.og * g.plane, acc);
      ws.take(g.k * g.plane, acc);
      take_gemm_workspace(ws, acc, g.og, g.plane, g.k, gout_rs, gout_cs, 1, g.plane, chunks == 1);
    }
  }
}

// accumulate_planes' f32 planes for f16/bf16, one per chunk.
void pool2d_backward_meta_workspace(const Tensor& grad_in) {
  if (!is_reduced_float(grad_in.dtype())) return;
  MetaWorkspace ws;
  const int64_t chunks = parallel::chunk_count(grad_in.size(0) * grad_in.size(1), pool_backward_grain(grad_in));
  for (int64_t c = 0; c < chunks; ++c) ws.take(grad_in.size(2) * grad_in.size(3), DType::f32);
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

// The im2col + GEMM path of the CUDA convolution (conv_impl.h): im2col, deterministic col2im by gather, operand packing
// and the bias fill, products through ::ember::cuda::gemm (blas.h), images in batches within im2col_chunk_bytes().
// Invariant: f16/bf16 sums run in f32 and round once per output (per batch of images for grad_w); scratch is tensors.
#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "ember/base/cuda_check.h"
#include "ember/kernels/cuda/blas.h"
#include "ember/kernels/cuda/conv.h"
#include "ember/kernels/cuda/conv_impl.h"
#include "ember/kernels/cuda/tensor_iter.cuh"

namespace ember::kernels::cuda {
namespace {

using ::ember::cuda::grid_for;
using ::ember::cuda::grid_stride_begin;
using ::ember::cuda::grid_stride_step;
using ::ember::cuda::kElementwiseThreads;
using ::ember::cuda::MatrixRef;

// Note [Column layouts]
// A column matrix holds, for a batch of `nb` images, row r = (c, i, j) (c over all C channels, so group g owns rows
// [g*kg, (g+1)*kg), in the order of a contiguous [O, CG, KH, KW] weight's columns) and column q = (y, z) of the
// output plane. Element (image n, row r, column q) lives at n * col_ns + r * col_rs + q:
//   * per image ([nb, C*KH*KW, plane]: col_ns = C*KH*KW*plane, col_rs = plane) for the forward pass and grad_x,
//     where every image has its own product;
//   * images side by side ([C*KH*KW, nb*plane]: col_ns = plane, col_rs = nb*plane) for grad_w, whose sum over the
//     batch's images and output positions is then the K dimension of a single product, accumulated in f32 by the
//     GEMM and rounded once per batch.
//
// Note [Bias first]
// As on the CPU, the bias is the first term of each output's sum: the output is filled with it and the product is
// accumulated onto it (GEMM or cuDNN beta = 1), so an f16/bf16 output is rounded once, from f32.
//
// Note [Column gradient in f32]
// grad_x's column gradient W_g^T @ grad_out is summed again by col2im (over the kernel taps that read the same input
// element). For f16/bf16 it is therefore computed and kept in f32 (operands widened into f32 scratch), so the only
// rounding is the final store, as on the CPU; storing it in f16/bf16 would round every partial sum.

// ---- kernels ----------------------------------------------------------------------------------------------------

// Columns of images [0, nb) of x (already offset to the batch's first image; strides xs0..xs3) in the layout of
// Note [Column layouts]. One thread per (image, channel, output position) writes that position's KH*KW rows; the
// padding reads as 0.
template <class T>
__global__ void im2col_kernel(const T* __restrict__ x, int64_t xs0, int64_t xs1, int64_t xs2, int64_t xs3, ConvShape s,
                              int64_t nb, T* __restrict__ col, int64_t col_ns, int64_t col_rs) {
  const int64_t total = nb * s.c * s.plane;
  for (int64_t idx = grid_stride_begin(); idx < total; idx += grid_stride_step()) {
    const int64_t z = idx % s.ow;
    int64_t t = idx / s.ow;
    const int64_t y = t % s.oh;
    t /= s.oh;
    const int64_t c = t % s.c;
    const int64_t n = t / s.c;
    const T* xc = x + n * xs0 + c * xs1;
    T* dst = col + n * col_ns + c * s.kh * s.kw * col_rs + y * s.ow + z;
    const int64_t y0 = y * s.sh - s.ph, z0 = z * s.sw - s.pw;
    for (int64_t i = 0; i < s.kh; ++i) {
      const int64_t iy = y0 + i * s.dh;
      const bool row_in = iy >= 0 && iy < s.h;
      for (int64_t j = 0; j < s.kw; ++j) {
        const int64_t ix = z0 + j * s.dw;
        dst[(i * s.kw + j) * col_rs] = row_in && ix >= 0 && ix < s.w ? xc[iy * xs2 + ix * xs3] : T(0.0f);
      }
    }
  }
}

// col2im by gather: gx (images [0, nb) of the contiguous grad_x, already offset) at (n, c, iy, ix) = the sum, in
// (i, j) order, of the per-image column gradient entries (Note [Column layouts], col_rs = plane) that were read
// from that input element: tap (i, j) at the output position (y, z) with y*sh - ph + i*dh = iy and
// z*sw - pw + j*dw = ix. Each element is written once by one thread, so the result does not depend on scheduling.
template <class T>
__global__ void col2im_kernel(const op_math_t<T>* __restrict__ dcol, int64_t col_ns, ConvShape s, int64_t nb,
                              T* __restrict__ gx) {
  using acc_t = op_math_t<T>;
  const int64_t total = nb * s.c * s.h * s.w;
  for (int64_t idx = grid_stride_begin(); idx < total; idx += grid_stride_step()) {
    const int64_t ix = idx % s.w;
    int64_t t = idx / s.w;
    const int64_t iy = t % s.h;
    t /= s.h;
    const int64_t c = t % s.c;
    const int64_t n = t / s.c;
    const acc_t* src = dcol + n * col_ns + c * s.kh * s.kw * s.plane;
    acc_t acc = 0;
    for (int64_t i = 0; i < s.kh; ++i) {
      const int64_t ynum = iy + s.ph - i * s.dh;  // = y * sh for the output row that reads iy through tap row i
      if (ynum < 0) break;                        // decreases with i
      if (ynum % s.sh != 0) continue;
      const int64_t y = ynum / s.sh;
      if (y >= s.oh) continue;
      for (int64_t j = 0; j < s.kw; ++j) {
        const int64_t znum = ix + s.pw - j * s.dw;
        if (znum < 0) break;
        if (znum % s.sw != 0) continue;
        const int64_t z = znum / s.sw;
        if (z >= s.ow) continue;
        acc += src[(i * s.kw + j) * s.plane + y * s.ow + z];
      }
    }
    gx[idx] = T(acc);
  }
}

// A 4-d strided view copied into contiguous dst (row-major over `sizes`), converted from Tin to Tout through
// op_math_t<Tin> (exact for Tin == Tout and for widening).
struct Pack4 {
  int64_t sizes[4];
  int64_t strides[4];
};

template <class Tin, class Tout>
__global__ void pack4_kernel(const Tin* __restrict__ src, Pack4 g, int64_t total, Tout* __restrict__ dst) {
  for (int64_t idx = grid_stride_begin(); idx < total; idx += grid_stride_step()) {
    const int64_t i3 = idx % g.sizes[3];
    int64_t t = idx / g.sizes[3];
    const int64_t i2 = t % g.sizes[2];
    t /= g.sizes[2];
    const int64_t i1 = t % g.sizes[1];
    const int64_t i0 = t / g.sizes[1];
    const Tin v = src[i0 * g.strides[0] + i1 * g.strides[1] + i2 * g.strides[2] + i3 * g.strides[3]];
    dst[idx] = Tout(static_cast<op_math_t<Tin>>(v));
  }
}

// out [n, o, plane] (contiguous, `total` elements) = bias[oc * bs], or 0 where bias is null (uniform across the grid).
template <class T>
__global__ void bias_fill_kernel(const T* __restrict__ bias, int64_t bs, int64_t o, int64_t plane, int64_t total,
                                 T* __restrict__ out) {
  for (int64_t idx = grid_stride_begin(); idx < total; idx += grid_stride_step()) {
    const int64_t oc = (idx / plane) % o;
    out[idx] = bias != nullptr ? bias[oc * bs] : T(0.0f);
  }
}

// ---- launchers --------------------------------------------------------------------------------------------------

template <class T>
void launch_im2col(const T* x, int64_t xs0, int64_t xs1, int64_t xs2, int64_t xs3, const ConvShape& s, int64_t nb,
                   T* col, int64_t col_ns, int64_t col_rs, int device, cudaStream_t stream) {
  const int64_t total = nb * s.c * s.plane;
  if (total == 0) return;
  im2col_kernel<T>
      <<<grid_for(total, device), kElementwiseThreads, 0, stream>>>(x, xs0, xs1, xs2, xs3, s, nb, col, col_ns, col_rs);
  EMBER_CUDA_LAUNCH_CHECK();
}

template <class T>
void launch_col2im(const op_math_t<T>* dcol, int64_t col_ns, const ConvShape& s, int64_t nb, T* gx, int device,
                   cudaStream_t stream) {
  const int64_t total = nb * s.c * s.h * s.w;
  if (total == 0) return;
  col2im_kernel<T><<<grid_for(total, device), kElementwiseThreads, 0, stream>>>(dcol, col_ns, s, nb, gx);
  EMBER_CUDA_LAUNCH_CHECK();
}

template <class Tin, class Tout>
void launch_pack4(const Tin* src, const Pack4& g, Tout* dst, int device, cudaStream_t stream) {
  const int64_t total = g.sizes[0] * g.sizes[1] * g.sizes[2] * g.sizes[3];
  if (total == 0) return;
  pack4_kernel<Tin, Tout><<<grid_for(total, device), kElementwiseThreads, 0, stream>>>(src, g, total, dst);
  EMBER_CUDA_LAUNCH_CHECK();
}

// ---- batched products ---------------------------------------------------------------------------------------------

// An operand of the per-(image, group) products: matrix (n, g) starts at data + n * n_stride + g * g_stride
// (elements) and has the given row and column strides.
struct GroupedOperand {
  const void* data;
  int64_t n_stride, g_stride, row_stride, col_stride;
};

const void* advance(const void* p, int64_t elements, int64_t itemsize) {
  return static_cast<const char*>(p) + elements * itemsize;
}

// out(n, g) [m x k2] = a(n, g) [m x k] @ b(n, g) [k x k2] (+ beta * out(n, g)) for n < nb, g < groups, where
// out(n, g) = out + n * out_n + g * out_g with row stride ldo. One batched GEMM per group (batch over images) or per
// image (batch over groups), whichever needs fewer calls.
void grouped_gemm(DType dt, int64_t nb, int64_t groups, int64_t m, int64_t k2, int64_t k, const GroupedOperand& a,
                  const GroupedOperand& b, void* out, int64_t out_n, int64_t out_g, int64_t ldo, double beta,
                  int device, cudaStream_t stream) {
  const int64_t is = itemsize(dt);
  void* const out_base = out;
  auto out_at = [&](int64_t elements) { return static_cast<char*>(out_base) + elements * is; };
  if (nb >= groups) {
    for (int64_t g = 0; g < groups; ++g) {
      const MatrixRef ma{advance(a.data, g * a.g_stride, is), a.n_stride, a.row_stride, a.col_stride};
      const MatrixRef mb{advance(b.data, g * b.g_stride, is), b.n_stride, b.row_stride, b.col_stride};
      ::ember::cuda::gemm(dt, nb, m, k2, k, ma, mb, out_at(g * out_g), out_n, ldo, 1.0, beta, device, stream);
    }
  } else {
    for (int64_t n = 0; n < nb; ++n) {
      const MatrixRef ma{advance(a.data, n * a.n_stride, is), a.g_stride, a.row_stride, a.col_stride};
      const MatrixRef mb{advance(b.data, n * b.n_stride, is), b.g_stride, b.row_stride, b.col_stride};
      ::ember::cuda::gemm(dt, groups, m, k2, k, ma, mb, out_at(n * out_n), out_g, ldo, 1.0, beta, device, stream);
    }
  }
}

// Images per batch: as many as keep `per_image` bytes of scratch each within the budget, at least one.
int64_t images_per_batch(int64_t per_image, int64_t n) {
  const int64_t budget = ::ember::cuda::im2col_chunk_bytes();
  return std::clamp<int64_t>(budget / std::max<int64_t>(1, per_image), 1, std::max<int64_t>(1, n));
}

// The weight as a contiguous [o, kg] matrix of type U: the weight itself when it already is one, else a packed
// (and converted) copy held in `holder`.
template <class T, class U>
const U* weight_matrix(const Tensor& weight, const ConvShape& s, Tensor& holder, int device, cudaStream_t stream) {
  if constexpr (std::is_same_v<T, U>) {
    if (weight.is_contiguous()) return static_cast<const U*>(weight.raw_data());
  }
  holder = empty({s.o, s.kg}, TensorOptions(dtype_of_v<U>, weight.device()));
  const Pack4 g{{s.o, s.cg, s.kh, s.kw}, {weight.stride(0), weight.stride(1), weight.stride(2), weight.stride(3)}};
  launch_pack4<T, U>(static_cast<const T*>(weight.raw_data()), g, static_cast<U*>(holder.raw_data()), device, stream);
  return static_cast<const U*>(holder.raw_data());
}

// ---- the three passes ---------------------------------------------------------------------------------------------

// out[n, g] (og x plane) = W_g (og x kg) @ col[n, g] (kg x plane), accumulated onto the bias (Note [Bias first]).
template <class T>
void conv2d_typed(const Tensor& x, const Tensor& weight, const Tensor& bias, const ConvShape& s, const Tensor& out,
                  int device, cudaStream_t stream) {
  const DType dt = dtype_of_v<T>;
  const bool has_bias = bias.defined();
  if (has_bias || s.kg == 0) fill_conv_bias(bias, out, device, stream);
  if (s.kg == 0) return;  // no input channels: the bias (or 0) is the whole sum
  Tensor wpack;
  const T* wp = weight_matrix<T, T>(weight, s, wpack, device, stream);
  const int64_t rows = s.c * s.kh * s.kw;  // all groups' rows
  const int64_t nb = images_per_batch(rows * s.plane * static_cast<int64_t>(sizeof(T)), s.n);
  const Tensor col = empty({nb * rows * s.plane}, TensorOptions(dt, out.device()));
  T* cp = static_cast<T*>(col.raw_data());
  const T* xp = static_cast<const T*>(x.raw_data());
  T* op = static_cast<T*>(out.raw_data());
  const int64_t xs0 = x.stride(0), xs1 = x.stride(1), xs2 = x.stride(2), xs3 = x.stride(3);
  const int64_t col_ns = rows * s.plane;
  for (int64_t n0 = 0; n0 < s.n; n0 += nb) {
    const int64_t cnt = std::min(nb, s.n - n0);
    launch_im2col<T>(xp + n0 * xs0, xs0, xs1, xs2, xs3, s, cnt, cp, col_ns, s.plane, device, stream);
    const GroupedOperand a{wp, 0, s.og * s.kg, s.kg, 1};
    const GroupedOperand b{cp, col_ns, s.kg * s.plane, s.plane, 1};
    grouped_gemm(dt, cnt, s.groups, s.og, s.plane, s.kg, a, b, op + n0 * s.o * s.plane, s.o * s.plane, s.og * s.plane,
                 s.plane, has_bias ? 1.0 : 0.0, device, stream);
  }
}

// dcol[n, g] (kg x plane) = W_g^T (kg x og) @ grad_out[n, g] (og x plane) in op_math_t (Note [Column gradient in
// f32]), then col2im into grad_x.
template <class T>
void input_grad_typed(const Tensor& grad_out, const Tensor& weight, const ConvShape& s, const Tensor& grad_x,
                      int device, cudaStream_t stream) {
  using acc_t = op_math_t<T>;
  constexpr bool kWiden = !std::is_same_v<acc_t, T>;
  const DType adt = dtype_of_v<acc_t>;
  const Device dev = grad_x.device();
  Tensor wpack;
  const acc_t* wp = weight_matrix<T, acc_t>(weight, s, wpack, device, stream);
  // grad_out as (image, group) matrices: in place when it is contiguous and needs no widening, else packed per batch
  // into a contiguous [nb, o, plane] of acc_t (any strides, broadcast ones included).
  const int64_t gs0 = grad_out.stride(0), gs1 = grad_out.stride(1), gs2 = grad_out.stride(2), gs3 = grad_out.stride(3);
  const bool gout_view = !kWiden && grad_out.is_contiguous();
  const int64_t rows = s.c * s.kh * s.kw;
  const int64_t per_image = (rows * s.plane + (gout_view ? 0 : s.o * s.plane)) * static_cast<int64_t>(sizeof(acc_t));
  const int64_t nb = images_per_batch(per_image, s.n);
  const Tensor dcol = empty({nb * rows * s.plane}, TensorOptions(adt, dev));
  const Tensor gpack = gout_view ? Tensor() : empty({nb * s.o * s.plane}, TensorOptions(adt, dev));
  acc_t* dp = static_cast<acc_t*>(dcol.raw_data());
  const T* gp = static_cast<const T*>(grad_out.raw_data());
  T* gx = static_cast<T*>(grad_x.raw_data());
  const int64_t col_ns = rows * s.plane;
  for (int64_t n0 = 0; n0 < s.n; n0 += nb) {
    const int64_t cnt = std::min(nb, s.n - n0);
    GroupedOperand b{};
    if (gout_view) {
      b = {gp + n0 * s.o * s.plane, s.o * s.plane, s.og * s.plane, s.plane, 1};
    } else {
      acc_t* pp = static_cast<acc_t*>(gpack.raw_data());
      launch_pack4<T, acc_t>(gp + n0 * gs0, Pack4{{cnt, s.o, s.oh, s.ow}, {gs0, gs1, gs2, gs3}}, pp, device, stream);
      b = {pp, s.o * s.plane, s.og * s.plane, s.plane, 1};
    }
    const GroupedOperand a{wp, 0, s.og * s.kg, 1, s.kg};  // W_g^T: element (k, r) at r * kg + k
    grouped_gemm(adt, cnt, s.groups, s.kg, s.plane, s.og, a, b, dp, col_ns, s.kg * s.plane, s.plane, 0.0, device,
                 stream);
    launch_col2im<T>(dp, col_ns, s, cnt, gx + n0 * s.c * s.h * s.w, device, stream);
  }
}

// grad_w_g (og x kg) = sum over the batch's images of grad_out[n, g] @ col[n, g]^T, as one product per group whose K
// runs over (image, output position) (Note [Column layouts]); later batches accumulate (beta = 1).
template <class T>
void weight_grad_typed(const Tensor& grad_out, const Tensor& x, const ConvShape& s, const Tensor& grad_w, int device,
                       cudaStream_t stream) {
  const DType dt = dtype_of_v<T>;
  const Device dev = grad_w.device();
  const int64_t rows = s.c * s.kh * s.kw;
  const int64_t nb = images_per_batch((rows + s.o) * s.plane * static_cast<int64_t>(sizeof(T)), s.n);
  const Tensor col = empty({rows * nb * s.plane}, TensorOptions(dt, dev));
  const Tensor gpack = empty({s.o * nb * s.plane}, TensorOptions(dt, dev));
  T* cp = static_cast<T*>(col.raw_data());
  T* pp = static_cast<T*>(gpack.raw_data());
  const T* gp = static_cast<const T*>(grad_out.raw_data());
  const T* xp = static_cast<const T*>(x.raw_data());
  const int64_t gs0 = grad_out.stride(0), gs1 = grad_out.stride(1), gs2 = grad_out.stride(2), gs3 = grad_out.stride(3);
  const int64_t xs0 = x.stride(0), xs1 = x.stride(1), xs2 = x.stride(2), xs3 = x.stride(3);
  for (int64_t n0 = 0; n0 < s.n; n0 += nb) {
    const int64_t cnt = std::min(nb, s.n - n0);
    const int64_t span = cnt * s.plane;  // the product's K
    // grad_out of the batch as [o, cnt, plane]: row r of group g's [og, span] matrix is channel g*og + r.
    launch_pack4<T, T>(gp + n0 * gs0, Pack4{{s.o, cnt, s.oh, s.ow}, {gs1, gs0, gs2, gs3}}, pp, device, stream);
    launch_im2col<T>(xp + n0 * xs0, xs0, xs1, xs2, xs3, s, cnt, cp, s.plane, span, device, stream);
    const MatrixRef a{pp, s.og * span, span, 1};
    const MatrixRef b{cp, s.kg * span, 1, span};  // col_g^T: element (m, k) at k * span + m
    ::ember::cuda::gemm(dt, s.groups, s.og, s.kg, span, a, b, grad_w.raw_data(), s.og * s.kg, s.kg, 1.0,
                        n0 == 0 ? 0.0 : 1.0, device, stream);
  }
}

}  // namespace

// ---- entry points of the path (conv_impl.h) -----------------------------------------------------------------------

void fill_conv_bias(const Tensor& bias, const Tensor& out, int device, cudaStream_t stream) {
  const int64_t total = out.numel();
  if (total == 0) return;
  const int64_t o = out.size(1), plane = out.size(2) * out.size(3);
  EMBER_DISPATCH_FLOAT(out.dtype(), "conv2d", [&] {
    const scalar_t* bp = bias.defined() ? static_cast<const scalar_t*>(bias.raw_data()) : nullptr;
    const int64_t bs = bias.defined() ? bias.stride(0) : 0;
    bias_fill_kernel<scalar_t><<<grid_for(total, device), kElementwiseThreads, 0, stream>>>(
        bp, bs, o, plane, total, static_cast<scalar_t*>(out.raw_data()));
    EMBER_CUDA_LAUNCH_CHECK();
  });
}

void conv2d_im2col(const Tensor& x, const Tensor& weight, const Tensor& bias, const ConvShape& s, const Tensor& out,
                   int device, cudaStream_t stream) {
  EMBER_DISPATCH_FLOAT(out.dtype(), "conv2d", [&] { conv2d_typed<scalar_t>(x, weight, bias, s, out, device, stream); });
}

void conv2d_input_grad_im2col(const Tensor& grad_out, const Tensor& weight, const ConvShape& s, const Tensor& grad_x,
                              int device, cudaStream_t stream) {
  EMBER_DISPATCH_FLOAT(grad_x.dtype(), "conv2d_backward",
                       [&] { input_grad_typed<scalar_t>(grad_out, weight, s, grad_x, device, stream); });
}

void conv2d_weight_grad_im2col(const Tensor& grad_out, const Tensor& x, const ConvShape& s, const Tensor& grad_w,
                               int device, cudaStream_t stream) {
  EMBER_DISPATCH_FLOAT(grad_w.dtype(), "conv2d_backward",
                       [&] { weight_grad_typed<scalar_t>(grad_out, x, s, grad_w, device, stream); });
}

}  // namespace ember::kernels::cuda

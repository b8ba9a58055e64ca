// CUDA max/avg pool2d (NCHW) and their backward kernels, registered for the `max_pool2d`, `avg_pool2d`,
// `max_pool2d_backward` and `avg_pool2d_backward` stubs; inputs of any strides, contiguous outputs.
// Invariant: windows, NaN and tie rules, divisors and the order of every sum are the CPU kernels' (cpu/conv_pool.cpp,
// cpu/conv_pool_backward.cpp), in op_math_t with one rounding per stored element; only max_pool2d_backward's
// scatter-add of overlapping windows sums in scheduling order (Note [Max pool backward scatter]).
#include <cstdint>
#include <limits>
#include <type_traits>

#include "ember/base/cuda_check.h"
#include "ember/kernels/cuda/index_check.cuh"
#include "ember/kernels/cuda/stream.h"
#include "ember/kernels/cuda/tensor_iter.cuh"
#include "ember/kernels/stubs.h"

namespace ember::kernels::cuda {
namespace {

using ::ember::cuda::BadIndex;
using ::ember::cuda::DeviceGuard;
using ::ember::cuda::find_bad_index;
using ::ember::cuda::grid_for;
using ::ember::cuda::grid_stride_begin;
using ::ember::cuda::grid_stride_step;
using ::ember::cuda::kElementwiseThreads;
using ::ember::cuda::make_offset_calculator;
using ::ember::cuda::OffsetCalculator;

// Sizes and parameters of one pooling sweep: the input [N, C, H, W] (strides s0..s3 of the strided operand, x in the
// forward and grad_out in the avg backward), the output [N, C, OH, OW], the window.
struct PoolGeom {
  int64_t c, h, w, oh, ow;
  int64_t kh, kw, sh, sw, ph, pw;
  int64_t s0, s1, s2, s3;
  bool count_include_pad;
};

PoolGeom make_geom(const Shape& in, const Shape& out, const Tensor& strided, const Pool2dParams& p) {
  PoolGeom g;
  g.c = in[1];
  g.h = in[2];
  g.w = in[3];
  g.oh = out[2];
  g.ow = out[3];
  g.kh = p.kernel[0];
  g.kw = p.kernel[1];
  g.sh = p.stride[0];
  g.sw = p.stride[1];
  g.ph = p.padding[0];
  g.pw = p.padding[1];
  g.s0 = strided.stride(0);
  g.s1 = strided.stride(1);
  g.s2 = strided.stride(2);
  g.s3 = strided.stride(3);
  g.count_include_pad = p.count_include_pad;
  return g;
}

__device__ __forceinline__ int64_t imax(int64_t a, int64_t b) { return a > b ? a : b; }
__device__ __forceinline__ int64_t imin(int64_t a, int64_t b) { return a < b ? a : b; }

// ---- forward kernels (one thread per output element of the contiguous out) -------------------------------------

// Padding counts as -inf: only the window's in-bounds part is read. A value is taken when it is greater than the best
// so far or NaN, so the first maximum wins ties and the last NaN wins; the index starts at the window's first
// in-bounds element (kept when every value is -inf), as the CPU kernel does.
template <class T>
__global__ void max_pool2d_kernel(const T* x, PoolGeom g, T* out, int64_t* indices, int64_t total) {
  using acc_t = op_math_t<T>;
  for (int64_t e = grid_stride_begin(); e < total; e += grid_stride_step()) {
    const int64_t z = e % g.ow, t = e / g.ow;
    const int64_t y = t % g.oh, plane = t / g.oh;
    const T* xc = x + (plane / g.c) * g.s0 + (plane % g.c) * g.s1;
    const int64_t y0 = y * g.sh - g.ph, z0 = z * g.sw - g.pw;
    const int64_t ya = imax(y0, 0), yb = imin(y0 + g.kh, g.h);
    const int64_t za = imax(z0, 0), zb = imin(z0 + g.kw, g.w);
    acc_t best = -std::numeric_limits<acc_t>::infinity();
    int64_t best_i = ya * g.w + za;
    for (int64_t yy = ya; yy < yb; ++yy)
      for (int64_t zz = za; zz < zb; ++zz) {
        const acc_t v = static_cast<acc_t>(xc[yy * g.s2 + zz * g.s3]);
        const bool take = v > best || v != v;
        best = take ? v : best;
        best_i = take ? yy * g.w + zz : best_i;
      }
    out[e] = T(best);
    if (indices != nullptr) indices[e] = best_i;
  }
}

// The window sum in row-major window order, divided by the CPU kernel's count.
template <class T>
__global__ void avg_pool2d_kernel(const T* x, PoolGeom g, T* out, int64_t total) {
  using acc_t = op_math_t<T>;
  for (int64_t e = grid_stride_begin(); e < total; e += grid_stride_step()) {
    const int64_t z = e % g.ow, t = e / g.ow;
    const int64_t y = t % g.oh, plane = t / g.oh;
    const T* xc = x + (plane / g.c) * g.s0 + (plane % g.c) * g.s1;
    const int64_t y0 = y * g.sh - g.ph, y1 = imin(y0 + g.kh, g.h + g.ph);
    const int64_t z0 = z * g.sw - g.pw, z1 = imin(z0 + g.kw, g.w + g.pw);
    const int64_t ya = imax(y0, 0), yb = imin(y1, g.h);
    const int64_t za = imax(z0, 0), zb = imin(z1, g.w);
    acc_t sum = 0;
    for (int64_t yy = ya; yy < yb; ++yy)
      for (int64_t zz = za; zz < zb; ++zz) sum += static_cast<acc_t>(xc[yy * g.s2 + zz * g.s3]);
    const int64_t count = g.count_include_pad ? (y1 - y0) * (z1 - z0) : (yb - ya) * (zb - za);
    out[e] = T(sum / static_cast<acc_t>(count));
  }
}

// ---- backward kernels ---------------------------------------------------------------------------------------------

// Note [Avg pool backward by gather]
// The CPU kernel scatters each grad_out element, divided by its window's count, over the window's in-bounds inputs,
// visiting windows in row-major (y, z) order. Here one thread per grad_in element gathers instead: it visits the
// windows that cover its element, y in [y_lo, y_hi] and z in [z_lo, z_hi] in the same row-major order, computes each
// share exactly as the CPU does and adds them from zero in op_math_t. Every element thus receives the same terms in
// the same order as on the CPU (bit-identical results), without atomics. Window y covers row h iff
// y * sh - ph <= h < y * sh - ph + kh (its clipping to the input and to the padded input never excludes an in-bounds
// row), so y_lo = max(0, floor((h + ph - kh) / sh) + 1) and y_hi = min(OH - 1, floor((h + ph) / sh)).
template <class T>
__global__ void avg_pool2d_backward_kernel(const T* grad_out, PoolGeom g, T* grad_in, int64_t total) {
  using acc_t = op_math_t<T>;
  for (int64_t e = grid_stride_begin(); e < total; e += grid_stride_step()) {
    const int64_t col = e % g.w, t = e / g.w;
    const int64_t row = t % g.h, plane = t / g.h;
    const T* gp = grad_out + (plane / g.c) * g.s0 + (plane % g.c) * g.s1;
    const int64_t y_lo = row + g.ph - g.kh < 0 ? 0 : (row + g.ph - g.kh) / g.sh + 1;
    const int64_t y_hi = imin((row + g.ph) / g.sh, g.oh - 1);
    const int64_t z_lo = col + g.pw - g.kw < 0 ? 0 : (col + g.pw - g.kw) / g.sw + 1;
    const int64_t z_hi = imin((col + g.pw) / g.sw, g.ow - 1);
    acc_t acc = 0;
    for (int64_t y = y_lo; y <= y_hi; ++y) {
      const int64_t y0 = y * g.sh - g.ph, y1 = imin(y0 + g.kh, g.h + g.ph);
      const int64_t ya = imax(y0, 0), yb = imin(y1, g.h);
      for (int64_t z = z_lo; z <= z_hi; ++z) {
        const int64_t z0 = z * g.sw - g.pw, z1 = imin(z0 + g.kw, g.w + g.pw);
        const int64_t za = imax(z0, 0), zb = imin(z1, g.w);
        const int64_t count = g.count_include_pad ? (y1 - y0) * (z1 - z0) : (yb - ya) * (zb - za);
        acc += static_cast<acc_t>(gp[y * g.s2 + z * g.s3]) / static_cast<acc_t>(count);
      }
    }
    grad_in[e] = T(acc);
  }
}

// Note [Max pool backward scatter]
// The stub receives no window parameters, only the saved flat plane indices, so each grad_out element is added at
// its index: one thread per grad_out element, atomicAdd into an op_math_t accumulator zeroed first (grad_in itself
// for f32/f64; for f16/bf16 an f32 scratch tensor of grad_in's size, rounded into grad_in once by a second kernel, so
// half values are rounded once as on the CPU and no 16-bit atomics are needed). Inputs chosen by one window only (no
// overlap, the common stride == kernel case) or by two get exactly the CPU's value (a sum of two terms from zero does
// not depend on their order); three or more overlapping windows sum in scheduling order, within rounding of the CPU.
// Indices are checked before the scatter (Note [Index checks on the device]), so every atomic lands in its plane.
template <class T>
__global__ void max_pool2d_backward_kernel(const T* grad_out, const int64_t* indices, OffsetCalculator<2> calc,
                                           int64_t plane_out, int64_t plane_in, op_math_t<T>* acc, int64_t total) {
  using acc_t = op_math_t<T>;
  for (int64_t e = grid_stride_begin(); e < total; e += grid_stride_step()) {
    const auto o = calc.get(e);
    atomicAdd(acc + (e / plane_out) * plane_in + indices[o.v[1]], static_cast<acc_t>(grad_out[o.v[0]]));
  }
}

template <class T>
__global__ void round_from_float_kernel(const float* acc, T* out, int64_t total) {
  for (int64_t e = grid_stride_begin(); e < total; e += grid_stride_step()) out[e] = T(acc[e]);
}

// ---- launchers --------------------------------------------------------------------------------------------------

template <class T>
void launch_max_pool2d(const Tensor& x, const Pool2dParams& p, const Tensor& out, const Tensor& indices,
                       cudaStream_t stream) {
  const int64_t total = out.numel();
  max_pool2d_kernel<T><<<grid_for(total, out.device().index), kElementwiseThreads, 0, stream>>>(
      static_cast<const T*>(x.raw_data()), make_geom(x.sizes(), out.sizes(), x, p), static_cast<T*>(out.raw_data()),
      indices.defined() ? static_cast<int64_t*>(indices.raw_data()) : nullptr, total);
  EMBER_CUDA_LAUNCH_CHECK();
}

template <class T>
void launch_avg_pool2d(const Tensor& x, const Pool2dParams& p, const Tensor& out, cudaStream_t stream) {
  const int64_t total = out.numel();
  avg_pool2d_kernel<T><<<grid_for(total, out.device().index), kElementwiseThreads, 0, stream>>>(
      static_cast<const T*>(x.raw_data()), make_geom(x.sizes(), out.sizes(), x, p), static_cast<T*>(out.raw_data()),
      total);
  EMBER_CUDA_LAUNCH_CHECK();
}

template <class T>
void launch_avg_pool2d_backward(const Tensor& grad_out, const Pool2dParams& p, const Tensor& grad_in,
                                cudaStream_t stream) {
  const int64_t total = grad_in.numel();
  avg_pool2d_backward_kernel<T><<<grid_for(total, grad_in.device().index), kElementwiseThreads, 0, stream>>>(
      static_cast<const T*>(grad_out.raw_data()), make_geom(grad_in.sizes(), grad_out.sizes(), grad_out, p),
      static_cast<T*>(grad_in.raw_data()), total);
  EMBER_CUDA_LAUNCH_CHECK();
}

template <class T>
void launch_max_pool2d_backward(const Tensor& grad_out, const Tensor& indices, const Tensor& grad_in,
                                cudaStream_t stream) {
  using acc_t = op_math_t<T>;
  constexpr bool kWiden = !std::is_same_v<acc_t, T>;
  const int device = grad_in.device().index;
  const int64_t total_in = grad_in.numel(), total_out = grad_out.numel();
  // Note [Max pool backward scatter]: the f32 accumulator of f16/bf16 gradients is allocator scratch.
  const Tensor scratch = kWiden ? empty(grad_in.sizes(), TensorOptions(DType::f32, grad_in.device())) : Tensor();
  acc_t* acc = static_cast<acc_t*>(kWiden ? scratch.raw_data() : grad_in.raw_data());
  EMBER_CUDA_CHECK(cudaMemsetAsync(acc, 0, static_cast<size_t>(total_in) * sizeof(acc_t), stream));  // +0.0 bits
  const OffsetCalculator<2> calc = make_offset_calculator<2>({&grad_out, &indices}, "max_pool2d_backward");
  max_pool2d_backward_kernel<T><<<grid_for(total_out, device), kElementwiseThreads, 0, stream>>>(
      static_cast<const T*>(grad_out.raw_data()), static_cast<const int64_t*>(indices.raw_data()), calc,
      grad_out.size(2) * grad_out.size(3), grad_in.size(2) * grad_in.size(3), acc, total_out);
  EMBER_CUDA_LAUNCH_CHECK();
  if constexpr (kWiden) {
    round_from_float_kernel<T><<<grid_for(total_in, device), kElementwiseThreads, 0, stream>>>(
        acc, static_cast<T*>(grad_in.raw_data()), total_in);
    EMBER_CUDA_LAUNCH_CHECK();
  }
}

// ---- entry points -----------------------------------------------------------------------------------------------

void check_on_device(const char* op, const Tensor& t, Device device) {
  EMBER_CHECK(t.device() == device, DeviceError, op, ": the CUDA kernel got ", t.description(), " (expected ",
              device.str(), ")");
}

// in and out are [N, C, *, *] with the same N and C and the same dtype, out is contiguous, both on `device`.
void check_pool_operands(const char* op, const Tensor& in, const Tensor& out, Device device) {
  EMBER_CHECK(device.is_cuda(), DeviceError, op, ": the CUDA kernel got ", out.description());
  check_on_device(op, in, device);
  EMBER_CHECK(in.dim() == 4 && out.dim() == 4 && in.size(0) == out.size(0) && in.size(1) == out.size(1), ShapeError, op,
              ": ", in.description(), " and ", out.description(), " must be [N, C, *, *] with the same N and C");
  EMBER_CHECK(in.dtype() == out.dtype(), DTypeError, op, ": ", in.description(), " and ", out.description(),
              " differ in dtype");
  EMBER_CHECK(out.is_contiguous(), ValueError, op, ": the CUDA kernel needs a contiguous output, got ",
              out.description());
}

void max_pool2d_cuda(const Tensor& x, const Pool2dParams& p, const Tensor& out, const Tensor& indices) {
  const char* op = "max_pool2d";
  const Device device = out.device();
  check_pool_operands(op, x, out, device);
  if (indices.defined()) {
    check_on_device(op, indices, device);
    EMBER_CHECK(indices.dtype() == DType::i64 && indices.sizes() == out.sizes() && indices.is_contiguous(), ValueError,
                op, ": indices ", indices.description(), " must be a contiguous i64 tensor of shape ",
                shape_str(out.sizes()));
  }
  if (out.numel() == 0) return;
  DeviceGuard guard(device.index);
  const cudaStream_t stream = ::ember::cuda::current_stream(device.index).get();
  EMBER_DISPATCH_FLOAT(x.dtype(), op, [&] { launch_max_pool2d<scalar_t>(x, p, out, indices, stream); });
}

void avg_pool2d_cuda(const Tensor& x, const Pool2dParams& p, const Tensor& out) {
  const char* op = "avg_pool2d";
  const Device device = out.device();
  check_pool_operands(op, x, out, device);
  if (out.numel() == 0) return;
  DeviceGuard guard(device.index);
  const cudaStream_t stream = ::ember::cuda::current_stream(device.index).get();
  EMBER_DISPATCH_FLOAT(x.dtype(), op, [&] { launch_avg_pool2d<scalar_t>(x, p, out, stream); });
}

void max_pool2d_backward_cuda(const Tensor& grad_out, const Tensor& indices, const Tensor& grad_in) {
  const char* op = "max_pool2d_backward";
  const Device device = grad_in.device();
  check_pool_operands(op, grad_out, grad_in, device);
  check_on_device(op, indices, device);
  EMBER_CHECK(indices.dtype() == DType::i64 && indices.sizes() == grad_out.sizes(), ShapeError, op, ": indices ",
              indices.description(), " must be i64 of grad_out's shape ", shape_str(grad_out.sizes()));
  if (!is_floating(grad_out.dtype())) throw_unsupported_dtype(op, grad_out.dtype());
  if (grad_out.numel() == 0 && grad_in.numel() == 0) return;
  DeviceGuard guard(device.index);
  const cudaStream_t stream = ::ember::cuda::current_stream(device.index).get();
  // The CPU kernel's IndexError, naming the first bad output in row-major order (Note [Index checks on the device]).
  const int64_t hw = grad_in.size(2) * grad_in.size(3);
  const BadIndex bad = find_bad_index(indices, hw, op, stream);
  if (bad.position >= 0) {
    const int64_t ow = grad_out.size(3), oh = grad_out.size(2), c = grad_out.size(1);
    const int64_t z = bad.position % ow, y = (bad.position / ow) % oh, plane = bad.position / (ow * oh);
    EMBER_THROW(IndexError, op, ": index ", bad.value, " at output (", plane / c, ", ", plane % c, ", ", y, ", ", z,
                ") is out of range for an input plane of ", hw, " elements");
  }
  EMBER_DISPATCH_FLOAT(grad_out.dtype(), op,
                       [&] { launch_max_pool2d_backward<scalar_t>(grad_out, indices, grad_in, stream); });
}

void avg_pool2d_backward_cuda(const Tensor& grad_out, const Pool2dParams& p, const Tensor& grad_in) {
  const char* op = "avg_pool2d_backward";
  const Device device = grad_in.device();
  check_pool_operands(op, grad_out, grad_in, device);
  if (grad_in.numel() == 0) return;
  DeviceGuard guard(device.index);
  const cudaStream_t stream = ::ember::cuda::current_stream(device.index).get();
  EMBER_DISPATCH_FLOAT(grad_out.dtype(), op,
                       [&] { launch_avg_pool2d_backward<scalar_t>(grad_out, p, grad_in, stream); });
}

}  // namespace

EMBER_REGISTER_KERNEL(max_pool2d, DeviceType::CUDA, max_pool2d_cuda);
EMBER_REGISTER_KERNEL(avg_pool2d, DeviceType::CUDA, avg_pool2d_cuda);
EMBER_REGISTER_KERNEL(max_pool2d_backward, DeviceType::CUDA, max_pool2d_backward_cuda);
EMBER_REGISTER_KERNEL(avg_pool2d_backward, DeviceType::CUDA, avg_pool2d_backward_cuda);

}  // namespace ember::kernels::cuda

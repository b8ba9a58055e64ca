// CUDA kernels of the elementwise family (binary ops and comparisons, unary ops, where, unary backward) over strided
// operands, registered for the `binary`, `unary`, `where` and `unary_backward` stubs. Three levels per op (DESIGN.md
// §3): __global__ kernel, launcher (grid math on the current stream), entry point (dtype/shape/device checks).
// Invariant: one kernel instantiation per dtype; the op is a runtime argument; f16/bf16 load into op_math_t (float),
// compute with the element math the CPU reference uses (elementwise_math.h), and round once when stored.
#include <cstdint>
#include <type_traits>

#include "ember/base/cuda_check.h"
#include "ember/kernels/convert.h"
#include "ember/kernels/cuda/stream.h"
#include "ember/kernels/cuda/tensor_iter.cuh"
#include "ember/kernels/elementwise_math.h"
#include "ember/kernels/stubs.h"

namespace ember::kernels::cuda {
namespace {

using ::ember::cuda::DeviceGuard;
using ::ember::cuda::grid_for;
using ::ember::cuda::grid_stride_begin;
using ::ember::cuda::grid_stride_step;
using ::ember::cuda::kElementwiseThreads;
using ::ember::cuda::make_offset_calculator;
using ::ember::cuda::OffsetCalculator;
using ::ember::cuda::Pack;

// ---- kernels ----------------------------------------------------------------------------------------------------

// An operand element loaded into the compute type: stored as T, or as op_math_t<T> itself (`is_acc`: a scalar
// operand, Note [Scalar operands] in ops_elementwise.cpp). The flag is uniform across the grid.
template <class T>
__device__ __forceinline__ op_math_t<T> load_operand(const void* base, bool is_acc, int64_t off) {
  using acc_t = op_math_t<T>;
  return is_acc ? static_cast<const acc_t*>(base)[off] : static_cast<acc_t>(static_cast<const T*>(base)[off]);
}

// out = op(a, b) in op_math_t<T>; comparisons write bool to `out`, arithmetic ops write T.
template <class T>
__global__ void binary_kernel(BinaryOp op, bool comparison, const void* a, bool a_acc, const void* b, bool b_acc,
                              void* out, int64_t n, OffsetCalculator<3> calc) {
  using acc_t = op_math_t<T>;
  for (int64_t i = grid_stride_begin(); i < n; i += grid_stride_step()) {
    const auto o = calc.get(i);
    const acc_t x = load_operand<T>(a, a_acc, o.v[1]);
    const acc_t y = load_operand<T>(b, b_acc, o.v[2]);
    if (comparison) {
      static_cast<bool*>(out)[o.v[0]] = compare_fn<acc_t>(op, x, y);
    } else {
      static_cast<T*>(out)[o.v[0]] = T(binary_fn<acc_t>(op, x, y));
    }
  }
}

// Floating unary ops (f32/f64/f16/bf16) in op_math_t<T>.
template <class T>
__global__ void unary_float_kernel(UnaryOp op, double p0, double p1, const T* in, T* out, int64_t n,
                                   OffsetCalculator<2> calc) {
  using acc_t = op_math_t<T>;
  for (int64_t i = grid_stride_begin(); i < n; i += grid_stride_step()) {
    const auto o = calc.get(i);
    out[o.v[0]] = T(unary_fn<acc_t>(op, static_cast<acc_t>(in[o.v[1]]), p0, p1));
  }
}

// Integer unary ops that need no floating math (unary_integer_fn, as the CPU kernel): neg, abs, relu, clamp.
template <class T>
__global__ void unary_integer_kernel(UnaryOp op, T lo, T hi, const T* in, T* out, int64_t n, OffsetCalculator<2> calc) {
  for (int64_t i = grid_stride_begin(); i < n; i += grid_stride_step()) {
    const auto o = calc.get(i);
    out[o.v[0]] = unary_integer_fn(op, in[o.v[1]], lo, hi);
  }
}

// out = cond ? a : b, any dtype T.
template <class T>
__global__ void where_kernel(const bool* cond, const T* a, const T* b, T* out, int64_t n, OffsetCalculator<4> calc) {
  for (int64_t i = grid_stride_begin(); i < n; i += grid_stride_step()) {
    const auto o = calc.get(i);
    out[o.v[0]] = cond[o.v[1]] ? a[o.v[2]] : b[o.v[3]];
  }
}

// out = grad * d op/dx (unary_backward_fn, the CPU reference's formula) in op_math_t<T>.
template <class T>
__global__ void unary_backward_kernel(UnaryOp op, double p0, double p1, const T* grad, const T* saved, T* out,
                                      int64_t n, OffsetCalculator<3> calc) {
  using acc_t = op_math_t<T>;
  for (int64_t i = grid_stride_begin(); i < n; i += grid_stride_step()) {
    const auto o = calc.get(i);
    out[o.v[0]] =
        T(unary_backward_fn<acc_t>(op, static_cast<acc_t>(grad[o.v[1]]), static_cast<acc_t>(saved[o.v[2]]), p0, p1));
  }
}

// Note [Dense elementwise path]
// When the output is contiguous and every input is either contiguous (same layout as the output) or one value
// repeated (all strides 0: a broadcast scalar), the floating binary, unary and unary-backward ops take a dense path:
// each thread handles packs of 16 bytes (4 f32, 2 f64, 8 f16/bf16) with one 128-bit load per dense input and one
// 128-bit store, and the last n % pack elements one by one; a repeated input is loaded once per thread. The offset
// calculator's per-element index math is gone too. Pointers must be 16-byte aligned (the caching allocator's blocks
// are; a view at an odd storage offset takes the strided kernels). Results equal the strided kernels' exactly: the
// same element math per element. The unary kernels choose the element function once per thread: GELU, ReLU, SiLU
// and exp (and their backward) run loops with the op a compile-time constant. Dispatching per element costs a chain of
// compares and branches per element, which bf16 GELU (8 elements per 16 bytes) paid in full: it was compute-bound at
// 58% of a copy's bandwidth while f32 GELU reached 94% (bench/RESULTS.md).

// An input of the dense path: a contiguous array of T, or one value repeated (stored as T, or as op_math_t<T> when
// `is_acc`: Note [Scalar operands] in ops_elementwise.cpp).
struct DenseOperand {
  const void* p;
  bool repeated;
  bool is_acc;
};

// The repeated value of an input (0 for a dense one; not read then).
template <class T>
__device__ __forceinline__ op_math_t<T> repeated_value(const DenseOperand& o) {
  return o.repeated ? load_operand<T>(o.p, o.is_acc, 0) : op_math_t<T>(0);
}

// Element k of pack x of a dense input, or its repeated value r.
template <class T>
__device__ __forceinline__ op_math_t<T> pick(const DenseOperand& o, const Pack<T>& x, int k, op_math_t<T> r) {
  return o.repeated ? r : static_cast<op_math_t<T>>(x.v[k]);
}

// Element i of an input, for the tail.
template <class T>
__device__ __forceinline__ op_math_t<T> element(const DenseOperand& o, int64_t i, op_math_t<T> r) {
  return o.repeated ? r : static_cast<op_math_t<T>>(static_cast<const T*>(o.p)[i]);
}

// Pack i of a dense input (zeros for a repeated one, whose pack is not read).
template <class T>
__device__ __forceinline__ Pack<T> load_pack(const DenseOperand& o, int64_t i) {
  if (o.repeated) return Pack<T>{};
  return static_cast<const Pack<T>*>(o.p)[i];
}

template <class T>
__global__ void binary_dense_kernel(BinaryOp op, DenseOperand a, DenseOperand b, T* out, int64_t n) {
  using acc_t = op_math_t<T>;
  constexpr int V = Pack<T>::kSize;
  const acc_t ra = repeated_value<T>(a), rb = repeated_value<T>(b);
  const int64_t packs = n / V;
  for (int64_t i = grid_stride_begin(); i < packs; i += grid_stride_step()) {
    const Pack<T> x = load_pack<T>(a, i), y = load_pack<T>(b, i);
    Pack<T> r;
    EMBER_UNROLL
    for (int k = 0; k < V; ++k) r.v[k] = T(binary_fn<acc_t>(op, pick<T>(a, x, k, ra), pick<T>(b, y, k, rb)));
    reinterpret_cast<Pack<T>*>(out)[i] = r;
  }
  for (int64_t i = packs * V + grid_stride_begin(); i < n; i += grid_stride_step())
    out[i] = T(binary_fn<acc_t>(op, element<T>(a, i, ra), element<T>(b, i, rb)));
}

// The dense unary loops, over whole packs then the tail, with `fn` applied in op_math_t<T>.
template <class T, class Fn>
__device__ __forceinline__ void unary_dense_loop(const T* in, T* out, int64_t n, Fn fn) {
  using acc_t = op_math_t<T>;
  constexpr int V = Pack<T>::kSize;
  const int64_t packs = n / V;
  for (int64_t i = grid_stride_begin(); i < packs; i += grid_stride_step()) {
    const Pack<T> x = reinterpret_cast<const Pack<T>*>(in)[i];
    Pack<T> r;
    EMBER_UNROLL
    for (int k = 0; k < V; ++k) r.v[k] = T(fn(static_cast<acc_t>(x.v[k])));
    reinterpret_cast<Pack<T>*>(out)[i] = r;
  }
  for (int64_t i = packs * V + grid_stride_begin(); i < n; i += grid_stride_step())
    out[i] = T(fn(static_cast<acc_t>(in[i])));
}

template <class T, class Fn>
__device__ __forceinline__ void unary_backward_dense_loop(const T* grad, const T* saved, T* out, int64_t n, Fn fn) {
  using acc_t = op_math_t<T>;
  constexpr int V = Pack<T>::kSize;
  const int64_t packs = n / V;
  for (int64_t i = grid_stride_begin(); i < packs; i += grid_stride_step()) {
    const Pack<T> g = reinterpret_cast<const Pack<T>*>(grad)[i], s = reinterpret_cast<const Pack<T>*>(saved)[i];
    Pack<T> r;
    EMBER_UNROLL
    for (int k = 0; k < V; ++k) r.v[k] = T(fn(static_cast<acc_t>(g.v[k]), static_cast<acc_t>(s.v[k])));
    reinterpret_cast<Pack<T>*>(out)[i] = r;
  }
  for (int64_t i = packs * V + grid_stride_begin(); i < n; i += grid_stride_step())
    out[i] = T(fn(static_cast<acc_t>(grad[i]), static_cast<acc_t>(saved[i])));
}

// One dispatch on the op per thread, not per element (Note [Dense elementwise path]): calls fn once, with the op as a
// std::integral_constant for the activations a training step runs over whole tensors (GELU, ReLU, SiLU, exp), so that
// fn's loop folds the element function's switch, and as a RuntimeUnaryOp for the rest; either way `k.value` is the op.
struct RuntimeUnaryOp {
  UnaryOp value;
};
template <class Fn>
__device__ __forceinline__ void with_unary_op(UnaryOp op, Fn fn) {
  switch (op) {
    case UnaryOp::GeluErf:
      return fn(std::integral_constant<UnaryOp, UnaryOp::GeluErf>{});
    case UnaryOp::GeluTanh:
      return fn(std::integral_constant<UnaryOp, UnaryOp::GeluTanh>{});
    case UnaryOp::Relu:
      return fn(std::integral_constant<UnaryOp, UnaryOp::Relu>{});
    case UnaryOp::Silu:
      return fn(std::integral_constant<UnaryOp, UnaryOp::Silu>{});
    case UnaryOp::Exp:
      return fn(std::integral_constant<UnaryOp, UnaryOp::Exp>{});
    default:
      return fn(RuntimeUnaryOp{op});
  }
}

template <class T>
__global__ void unary_dense_kernel(UnaryOp op, double p0, double p1, const T* in, T* out, int64_t n) {
  using acc_t = op_math_t<T>;
  with_unary_op(
      op, [&](auto k) { unary_dense_loop(in, out, n, [=](acc_t x) { return unary_fn<acc_t>(k.value, x, p0, p1); }); });
}

template <class T>
__global__ void unary_backward_dense_kernel(UnaryOp op, double p0, double p1, const T* grad, const T* saved, T* out,
                                            int64_t n) {
  using acc_t = op_math_t<T>;
  with_unary_op(op, [&](auto k) {
    unary_backward_dense_loop(grad, saved, out, n,
                              [=](acc_t g, acc_t s) { return unary_backward_fn<acc_t>(k.value, g, s, p0, p1); });
  });
}

// ---- launchers --------------------------------------------------------------------------------------------------

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

// Whether t is one value repeated: every dim of more than one element has stride 0.
bool is_repeated(const Tensor& t) {
  for (int64_t d = 0; d < t.dim(); ++d)
    if (t.size(d) > 1 && t.stride(d) != 0) return false;
  return true;
}

// Whether t can be a dense input or output of the dense path: contiguous, 16-byte aligned.
bool is_dense(const Tensor& t) { return t.is_contiguous() && aligned16(t.raw_data()); }

// Blocks for the dense path: one thread per pack (at least one block).
template <class T>
unsigned int dense_grid(int64_t n, int device) {
  return grid_for(n / Pack<T>::kSize, device);
}

template <class T>
void launch_binary(BinaryOp op, const Tensor& a, const Tensor& b, const Tensor& out, cudaStream_t stream) {
  const int64_t n = out.numel();
  const DType dt = dtype_of_v<T>;  // operands of another dtype hold op_math_t<T> (checked by binary_cuda)
  if constexpr (std::is_floating_point_v<T> || detail::is_half_v<T>) {
    // Note [Dense elementwise path]: arithmetic (not comparisons, which write bool) over dense or repeated inputs.
    const bool a_acc = a.dtype() != dt, b_acc = b.dtype() != dt;
    auto operand = [](const Tensor& t, bool acc, bool* ok) {
      const bool repeated = is_repeated(t);
      *ok = *ok && (repeated || (!acc && is_dense(t)));
      return DenseOperand{t.raw_data(), repeated, acc};
    };
    bool ok = !is_comparison(op) && is_dense(out);
    const DenseOperand da = operand(a, a_acc, &ok), db = operand(b, b_acc, &ok);
    if (ok) {
      binary_dense_kernel<T><<<dense_grid<T>(n, out.device().index), kElementwiseThreads, 0, stream>>>(
          op, da, db, static_cast<T*>(out.raw_data()), n);
      EMBER_CUDA_LAUNCH_CHECK();
      return;
    }
  }
  const auto calc = make_offset_calculator<3>({&out, &a, &b}, binary_op_name(op));
  binary_kernel<T><<<grid_for(n, out.device().index), kElementwiseThreads, 0, stream>>>(
      op, is_comparison(op), a.raw_data(), a.dtype() != dt, b.raw_data(), b.dtype() != dt, out.raw_data(), n, calc);
  EMBER_CUDA_LAUNCH_CHECK();
}

template <class T>
void launch_unary_float(UnaryOp op, UnaryParams p, const Tensor& in, const Tensor& out, cudaStream_t stream) {
  const int64_t n = out.numel();
  if (is_dense(in) && is_dense(out)) {  // Note [Dense elementwise path]
    unary_dense_kernel<T><<<dense_grid<T>(n, out.device().index), kElementwiseThreads, 0, stream>>>(
        op, p.p0, p.p1, static_cast<const T*>(in.raw_data()), static_cast<T*>(out.raw_data()), n);
    EMBER_CUDA_LAUNCH_CHECK();
    return;
  }
  const auto calc = make_offset_calculator<2>({&out, &in}, unary_op_name(op));
  unary_float_kernel<T><<<grid_for(n, out.device().index), kElementwiseThreads, 0, stream>>>(
      op, p.p0, p.p1, static_cast<const T*>(in.raw_data()), static_cast<T*>(out.raw_data()), n, calc);
  EMBER_CUDA_LAUNCH_CHECK();
}

template <class T>
void launch_unary_integer(UnaryOp op, UnaryParams p, const Tensor& in, const Tensor& out, cudaStream_t stream) {
  const int64_t n = out.numel();
  // Clamp bounds arrive saturated to T's range (front end); convert is defined for +-inf as well.
  const T lo = convert<T>(p.p0), hi = convert<T>(p.p1);
  const auto calc = make_offset_calculator<2>({&out, &in}, unary_op_name(op));
  unary_integer_kernel<T><<<grid_for(n, out.device().index), kElementwiseThreads, 0, stream>>>(
      op, lo, hi, static_cast<const T*>(in.raw_data()), static_cast<T*>(out.raw_data()), n, calc);
  EMBER_CUDA_LAUNCH_CHECK();
}

template <class T>
void launch_where(const Tensor& cond, const Tensor& a, const Tensor& b, const Tensor& out, cudaStream_t stream) {
  const int64_t n = out.numel();
  const auto calc = make_offset_calculator<4>({&out, &cond, &a, &b}, "where");
  where_kernel<T><<<grid_for(n, out.device().index), kElementwiseThreads, 0, stream>>>(
      static_cast<const bool*>(cond.raw_data()), static_cast<const T*>(a.raw_data()),
      static_cast<const T*>(b.raw_data()), static_cast<T*>(out.raw_data()), n, calc);
  EMBER_CUDA_LAUNCH_CHECK();
}

template <class T>
void launch_unary_backward(UnaryOp op, UnaryParams p, const Tensor& grad, const Tensor& saved, const Tensor& out,
                           cudaStream_t stream) {
  const int64_t n = out.numel();
  if (is_dense(grad) && is_dense(saved) && is_dense(out)) {  // Note [Dense elementwise path]
    unary_backward_dense_kernel<T><<<dense_grid<T>(n, out.device().index), kElementwiseThreads, 0, stream>>>(
        op, p.p0, p.p1, static_cast<const T*>(grad.raw_data()), static_cast<const T*>(saved.raw_data()),
        static_cast<T*>(out.raw_data()), n);
    EMBER_CUDA_LAUNCH_CHECK();
    return;
  }
  const auto calc = make_offset_calculator<3>({&out, &grad, &saved}, unary_op_name(op));
  unary_backward_kernel<T><<<grid_for(n, out.device().index), kElementwiseThreads, 0, stream>>>(
      op, p.p0, p.p1, static_cast<const T*>(grad.raw_data()), static_cast<const T*>(saved.raw_data()),
      static_cast<T*>(out.raw_data()), n, calc);
  EMBER_CUDA_LAUNCH_CHECK();
}

// ---- entry points -----------------------------------------------------------------------------------------------

void check_on_device(const char* op, const Tensor& t, Device device) {
  EMBER_CHECK(t.device() == device, DeviceError, op, ": the CUDA kernel got ", t.description(), " (expected ",
              device.str(), ")");
}

void binary_cuda(BinaryOp op, const Tensor& a, const Tensor& b, const Tensor& out) {
  const char* name = binary_op_name(op);
  const Device device = out.device();
  EMBER_CHECK(device.is_cuda(), DeviceError, name, ": the CUDA kernel got ", out.description());
  check_on_device(name, a, device);
  check_on_device(name, b, device);
  // Comparisons: a and b share a dtype, out is bool. Arithmetic: each operand has out's dtype or, for a scalar
  // operand, out's compute dtype (Note [Scalar operands] in ops_elementwise.cpp).
  if (is_comparison(op)) {
    EMBER_CHECK(a.dtype() == b.dtype(), DTypeError, name, ": operands differ in dtype (", a.description(), ", ",
                b.description(), ")");
    EMBER_CHECK(out.dtype() == DType::b8, DTypeError, name, ": output ", out.description(), " should be bool");
  } else {
    for (const Tensor* t : {&a, &b})
      EMBER_CHECK(t->dtype() == out.dtype() || t->dtype() == op_math_dtype(out.dtype()), DTypeError, name, ": operand ",
                  t->description(), " has neither the output's dtype nor its compute dtype (output ", out.description(),
                  ")");
  }
  EMBER_CHECK(a.sizes() == out.sizes() && b.sizes() == out.sizes(), ShapeError, name, ": operands ", a.description(),
              " and ", b.description(), " are not expanded to the output ", out.description());
  if (out.numel() == 0) return;
  DeviceGuard guard(device.index);
  const cudaStream_t stream = ::ember::cuda::current_stream(device.index).get();
  EMBER_DISPATCH_ALL(is_comparison(op) ? a.dtype() : out.dtype(), name,
                     [&] { launch_binary<scalar_t>(op, a, b, out, stream); });
}

void unary_cuda(UnaryOp op, UnaryParams p, const Tensor& in, const Tensor& out) {
  const char* name = unary_op_name(op);
  const Device device = out.device();
  EMBER_CHECK(device.is_cuda(), DeviceError, name, ": the CUDA kernel got ", out.description());
  check_on_device(name, in, device);
  EMBER_CHECK(in.dtype() == out.dtype(), DTypeError, name, ": input ", in.description(), " and output ",
              out.description(), " differ in dtype");
  EMBER_CHECK(in.sizes() == out.sizes(), ShapeError, name, ": input ", in.description(), " and output ",
              out.description(), " differ in shape");
  if (out.numel() == 0) return;
  DeviceGuard guard(device.index);
  const cudaStream_t stream = ::ember::cuda::current_stream(device.index).get();
  switch (in.dtype()) {
    case DType::f32:
      return launch_unary_float<float>(op, p, in, out, stream);
    case DType::f64:
      return launch_unary_float<double>(op, p, in, out, stream);
    case DType::f16:
      return launch_unary_float<Half>(op, p, in, out, stream);
    case DType::bf16:
      return launch_unary_float<BFloat16>(op, p, in, out, stream);
    case DType::i32:
    case DType::i64:
    case DType::u8:
    case DType::i8:
    case DType::i16: {
      EMBER_CHECK(is_integer_unary(op), DTypeError, name, ": dtype ", dtype_name(in.dtype()),
                  " is not supported (needs a floating tensor)");
      if (in.dtype() == DType::i32) return launch_unary_integer<int32_t>(op, p, in, out, stream);
      if (in.dtype() == DType::i64) return launch_unary_integer<int64_t>(op, p, in, out, stream);
      if (in.dtype() == DType::i8) return launch_unary_integer<int8_t>(op, p, in, out, stream);
      if (in.dtype() == DType::i16) return launch_unary_integer<int16_t>(op, p, in, out, stream);
      return launch_unary_integer<uint8_t>(op, p, in, out, stream);
    }
    default:
      throw_unsupported_dtype(name, in.dtype());
  }
}

void where_cuda(const Tensor& cond, const Tensor& a, const Tensor& b, const Tensor& out) {
  const Device device = out.device();
  EMBER_CHECK(device.is_cuda(), DeviceError, "where: the CUDA kernel got ", out.description());
  check_on_device("where", cond, device);
  check_on_device("where", a, device);
  check_on_device("where", b, device);
  EMBER_CHECK(cond.dtype() == DType::b8, DTypeError, "where: condition ", cond.description(), " should be bool");
  EMBER_CHECK(a.dtype() == out.dtype() && b.dtype() == out.dtype(), DTypeError, "where: operands ", a.description(),
              " and ", b.description(), " should have the output's dtype (", out.description(), ")");
  EMBER_CHECK(cond.sizes() == out.sizes() && a.sizes() == out.sizes() && b.sizes() == out.sizes(), ShapeError,
              "where: operands are not expanded to the output ", out.description());
  if (out.numel() == 0) return;
  DeviceGuard guard(device.index);
  const cudaStream_t stream = ::ember::cuda::current_stream(device.index).get();
  EMBER_DISPATCH_ALL(out.dtype(), "where", [&] { launch_where<scalar_t>(cond, a, b, out, stream); });
}

void unary_backward_cuda(UnaryOp op, UnaryParams p, const Tensor& grad, const Tensor& saved, const Tensor& out) {
  const char* name = unary_op_name(op);
  const Device device = out.device();
  EMBER_CHECK(device.is_cuda(), DeviceError, name, " backward: the CUDA kernel got ", out.description());
  check_on_device(name, grad, device);
  check_on_device(name, saved, device);
  EMBER_CHECK(grad.dtype() == out.dtype() && saved.dtype() == out.dtype(), DTypeError, name, " backward: grad ",
              grad.description(), " and saved ", saved.description(), " should have the output's dtype (",
              out.description(), ")");
  EMBER_CHECK(grad.sizes() == out.sizes() && saved.sizes() == out.sizes(), ShapeError, name, " backward: grad ",
              grad.description(), " and saved ", saved.description(), " differ in shape from ", out.description());
  if (out.numel() == 0) return;
  DeviceGuard guard(device.index);
  const cudaStream_t stream = ::ember::cuda::current_stream(device.index).get();
  EMBER_DISPATCH_FLOAT(out.dtype(), name, [&] { launch_unary_backward<scalar_t>(op, p, grad, saved, out, stream); });
}

}  // namespace

EMBER_REGISTER_KERNEL(binary, DeviceType::CUDA, binary_cuda);
EMBER_REGISTER_KERNEL(unary, DeviceType::CUDA, unary_cuda);
EMBER_REGISTER_KERNEL(where, DeviceType::CUDA, where_cuda);
EMBER_REGISTER_KERNEL(unary_backward, DeviceType::CUDA, unary_backward_cuda);

}  // namespace ember::kernels::cuda

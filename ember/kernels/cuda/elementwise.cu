// CUDA kernels of the elementwise family (binary ops and comparisons, unary ops) over strided operands, registered
// for the `binary` and `unary` stubs. Three levels per op (DESIGN.md §3): __global__ kernel, launcher (grid math on
// the current stream), entry point (dtype/shape/device checks).
// Invariant: one kernel instantiation per dtype; the op is a runtime argument; f16/bf16 load into op_math_t (float),
// compute with the element math the CPU reference uses (elementwise_math.h), and round once when stored.
#include <limits>
#include <type_traits>

#include "ember/base/cuda_check.h"
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

const char* binary_name(BinaryOp op) {
  switch (op) {
    case BinaryOp::Add: return "add";
    case BinaryOp::Sub: return "sub";
    case BinaryOp::Mul: return "mul";
    case BinaryOp::Div: return "div";
    case BinaryOp::Pow: return "pow";
    case BinaryOp::Maximum: return "maximum";
    case BinaryOp::Minimum: return "minimum";
    case BinaryOp::Eq: return "eq";
    case BinaryOp::Ne: return "ne";
    case BinaryOp::Lt: return "lt";
    case BinaryOp::Le: return "le";
    case BinaryOp::Gt: return "gt";
    case BinaryOp::Ge: return "ge";
  }
  return "binary";
}

const char* unary_name(UnaryOp op) {
  switch (op) {
    case UnaryOp::Neg: return "neg";
    case UnaryOp::Exp: return "exp";
    case UnaryOp::Log: return "log";
    case UnaryOp::Sqrt: return "sqrt";
    case UnaryOp::Rsqrt: return "rsqrt";
    case UnaryOp::Tanh: return "tanh";
    case UnaryOp::Sigmoid: return "sigmoid";
    case UnaryOp::Relu: return "relu";
    case UnaryOp::GeluTanh:
    case UnaryOp::GeluErf: return "gelu";
    case UnaryOp::Silu: return "silu";
    case UnaryOp::Abs: return "abs";
    case UnaryOp::Clamp: return "clamp";
    case UnaryOp::PowScalar: return "pow";
  }
  return "unary";
}

bool binary_implemented(BinaryOp op) {
  switch (op) {
    case BinaryOp::Add:
    case BinaryOp::Sub:
    case BinaryOp::Mul:
    case BinaryOp::Div:
    case BinaryOp::Pow:
    case BinaryOp::Maximum:
    case BinaryOp::Minimum:
    case BinaryOp::Eq:
    case BinaryOp::Ne:
    case BinaryOp::Lt:
    case BinaryOp::Le:
    case BinaryOp::Gt:
    case BinaryOp::Ge: return true;
  }
  return false;
}

// ---- kernels ----------------------------------------------------------------------------------------------------

// out = op(a, b) in op_math_t<T>; comparisons write bool to `out`, arithmetic ops write T.
template <class T>
__global__ void binary_kernel(BinaryOp op, bool comparison, const T* a, const T* b, void* out, int64_t n,
                              OffsetCalculator<3> calc) {
  using acc_t = op_math_t<T>;
  for (int64_t i = grid_stride_begin(); i < n; i += grid_stride_step()) {
    const auto o = calc.get(i);
    const acc_t x = static_cast<acc_t>(a[o.v[1]]);
    const acc_t y = static_cast<acc_t>(b[o.v[2]]);
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

// Integer unary ops that need no floating math (as the CPU kernel): neg, abs, relu, clamp with saturated bounds.
template <class T>
__global__ void unary_integer_kernel(UnaryOp op, T lo, T hi, const T* in, T* out, int64_t n,
                                     OffsetCalculator<2> calc) {
  for (int64_t i = grid_stride_begin(); i < n; i += grid_stride_step()) {
    const auto o = calc.get(i);
    const T x = in[o.v[1]];
    T r = x;
    switch (op) {
      case UnaryOp::Neg: r = static_cast<T>(-x); break;
      case UnaryOp::Abs:
        if constexpr (std::is_signed_v<T>) r = x < T(0) ? static_cast<T>(-x) : x;
        break;
      case UnaryOp::Relu: r = x > T(0) ? x : T(0); break;
      case UnaryOp::Clamp: r = x < lo ? lo : (x > hi ? hi : x); break;
      default: break;
    }
    out[o.v[0]] = r;
  }
}

// ---- launchers --------------------------------------------------------------------------------------------------

template <class T>
void launch_binary(BinaryOp op, const Tensor& a, const Tensor& b, const Tensor& out, cudaStream_t stream) {
  const int64_t n = out.numel();
  const auto calc = make_offset_calculator<3>({&out, &a, &b}, binary_name(op));
  binary_kernel<T><<<grid_for(n, out.device().index), kElementwiseThreads, 0, stream>>>(
      op, is_comparison(op), static_cast<const T*>(a.raw_data()), static_cast<const T*>(b.raw_data()),
      out.raw_data(), n, calc);
  EMBER_CUDA_LAUNCH_CHECK();
}

template <class T>
void launch_unary_float(UnaryOp op, UnaryParams p, const Tensor& in, const Tensor& out, cudaStream_t stream) {
  const int64_t n = out.numel();
  const auto calc = make_offset_calculator<2>({&out, &in}, unary_name(op));
  unary_float_kernel<T><<<grid_for(n, out.device().index), kElementwiseThreads, 0, stream>>>(
      op, p.p0, p.p1, static_cast<const T*>(in.raw_data()), static_cast<T*>(out.raw_data()), n, calc);
  EMBER_CUDA_LAUNCH_CHECK();
}

template <class T>
void launch_unary_integer(UnaryOp op, UnaryParams p, const Tensor& in, const Tensor& out, cudaStream_t stream) {
  const int64_t n = out.numel();
  constexpr T tmin = std::numeric_limits<T>::lowest(), tmax = std::numeric_limits<T>::max();
  T lo = tmin, hi = tmax;
  if (op == UnaryOp::Clamp) {  // bounds saturated to T's range, as the CPU kernel does
    lo = p.p0 <= static_cast<double>(tmin) ? tmin : (p.p0 >= static_cast<double>(tmax) ? tmax : static_cast<T>(p.p0));
    hi = p.p1 >= static_cast<double>(tmax) ? tmax : (p.p1 <= static_cast<double>(tmin) ? tmin : static_cast<T>(p.p1));
  }
  const auto calc = make_offset_calculator<2>({&out, &in}, unary_name(op));
  unary_integer_kernel<T><<<grid_for(n, out.device().index), kElementwiseThreads, 0, stream>>>(
      op, lo, hi, static_cast<const T*>(in.raw_data()), static_cast<T*>(out.raw_data()), n, calc);
  EMBER_CUDA_LAUNCH_CHECK();
}

// ---- entry points -----------------------------------------------------------------------------------------------

void check_on_device(const char* op, const Tensor& t, Device device) {
  EMBER_CHECK(t.device() == device, DeviceError, op, ": the CUDA kernel got ", t.description(), " (expected ",
              device.str(), ")");
}

void binary_cuda(BinaryOp op, const Tensor& a, const Tensor& b, const Tensor& out) {
  const char* name = binary_name(op);
  EMBER_CHECK(binary_implemented(op), DeviceError, name, ": BinaryOp ", static_cast<int>(op),
              " has no CUDA kernel");
  const Device device = out.device();
  EMBER_CHECK(device.is_cuda(), DeviceError, name, ": the CUDA kernel got ", out.description());
  check_on_device(name, a, device);
  check_on_device(name, b, device);
  EMBER_CHECK(a.dtype() == b.dtype(), DTypeError, name, ": operands differ in dtype (", a.description(), ", ",
              b.description(), ")");
  const DType want = is_comparison(op) ? DType::b8 : a.dtype();
  EMBER_CHECK(out.dtype() == want, DTypeError, name, ": output ", out.description(), " should have dtype ",
              dtype_name(want));
  EMBER_CHECK(a.sizes() == out.sizes() && b.sizes() == out.sizes(), ShapeError, name, ": operands ",
              a.description(), " and ", b.description(), " are not expanded to the output ", out.description());
  if (out.numel() == 0) return;
  DeviceGuard guard(device.index);
  const cudaStream_t stream = ::ember::cuda::current_stream(device.index).get();
  EMBER_DISPATCH_ALL(a.dtype(), name, [&] { launch_binary<scalar_t>(op, a, b, out, stream); });
}

void unary_cuda(UnaryOp op, UnaryParams p, const Tensor& in, const Tensor& out) {
  const char* name = unary_name(op);
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
    case DType::f32: return launch_unary_float<float>(op, p, in, out, stream);
    case DType::f64: return launch_unary_float<double>(op, p, in, out, stream);
    case DType::f16: return launch_unary_float<Half>(op, p, in, out, stream);
    case DType::bf16: return launch_unary_float<BFloat16>(op, p, in, out, stream);
    case DType::i32:
    case DType::i64:
    case DType::u8: {
      const bool integer_op =
          op == UnaryOp::Neg || op == UnaryOp::Abs || op == UnaryOp::Relu || op == UnaryOp::Clamp;
      EMBER_CHECK(integer_op, DTypeError, name, ": dtype ", dtype_name(in.dtype()),
                  " is not supported (needs a floating tensor)");
      if (in.dtype() == DType::i32) return launch_unary_integer<int32_t>(op, p, in, out, stream);
      if (in.dtype() == DType::i64) return launch_unary_integer<int64_t>(op, p, in, out, stream);
      return launch_unary_integer<uint8_t>(op, p, in, out, stream);
    }
    default: throw_unsupported_dtype(name, in.dtype());
  }
}

}  // namespace

EMBER_REGISTER_KERNEL(binary, DeviceType::CUDA, binary_cuda);
EMBER_REGISTER_KERNEL(unary, DeviceType::CUDA, unary_cuda);

}  // namespace ember::kernels::cuda

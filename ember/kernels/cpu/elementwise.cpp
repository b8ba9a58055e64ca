// CPU kernels of the elementwise family (unary, binary, comparisons, where) over strided operands.
// Invariant: one instantiation per dtype; the op is a runtime argument of the inner loop, and f16/bf16 are loaded
// into op_math_t (float), computed with elementwise_math.h, and rounded once when stored.
#include <limits>
#include <type_traits>

#include "ember/kernels/cpu/loops.h"
#include "ember/kernels/elementwise_math.h"
#include "ember/kernels/stubs.h"

namespace ember::kernels::cpu {
namespace {

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

// Integer dtypes support only the ops that need no floating math; bounds of Clamp are saturated to T's range.
template <class T>
void unary_integer(UnaryOp op, UnaryParams p, const Tensor& in, const Tensor& out) {
  switch (op) {
    case UnaryOp::Neg:
      map_elements<T, T>(out, {in}, [](T x) { return static_cast<T>(-x); });
      return;
    case UnaryOp::Abs:
      map_elements<T, T>(out, {in}, [](T x) { return x < T(0) ? static_cast<T>(-x) : x; });
      return;
    case UnaryOp::Relu:
      map_elements<T, T>(out, {in}, [](T x) { return x > T(0) ? x : T(0); });
      return;
    case UnaryOp::Clamp: {
      constexpr T tmin = std::numeric_limits<T>::lowest(), tmax = std::numeric_limits<T>::max();
      const auto saturate = [](double v) {
        return v <= static_cast<double>(tmin) ? tmin : (v >= static_cast<double>(tmax) ? tmax : static_cast<T>(v));
      };
      const T lo = saturate(p.p0), hi = saturate(p.p1);
      map_elements<T, T>(out, {in}, [lo, hi](T x) { return x < lo ? lo : (x > hi ? hi : x); });
      return;
    }
    default:
      EMBER_THROW(DTypeError, unary_name(op), ": dtype ", dtype_name(in.dtype()),
                  " is not supported (needs a floating tensor)");
  }
}

// One instantiation per dtype (called from the dispatch switch, so `if constexpr` discards the other paths).
template <class scalar_t>
void unary_typed(UnaryOp op, UnaryParams p, const Tensor& in, const Tensor& out) {
  using acc_t = op_math_t<scalar_t>;
  if constexpr (std::is_floating_point_v<acc_t>) {
    const double p0 = p.p0, p1 = p.p1;
    map_elements<scalar_t, scalar_t>(out, {in}, [op, p0, p1](scalar_t x) {
      return scalar_t(unary_fn<acc_t>(op, static_cast<acc_t>(x), p0, p1));
    });
  } else if constexpr (std::is_same_v<scalar_t, bool>) {
    throw_unsupported_dtype(unary_name(op), in.dtype());
  } else {
    unary_integer<scalar_t>(op, p, in, out);
  }
}

void unary_kernel(UnaryOp op, UnaryParams p, const Tensor& in, const Tensor& out) {
  EMBER_DISPATCH_ALL(in.dtype(), unary_name(op), [&] { unary_typed<scalar_t>(op, p, in, out); });
}

// Bool operands: Add/Maximum are logical or, Mul/Minimum logical and (the front end rejects Sub, Pow; Div is f32).
inline bool binary_bool(BinaryOp op, bool a, bool b) {
  switch (op) {
    case BinaryOp::Add:
    case BinaryOp::Maximum: return a || b;
    case BinaryOp::Mul:
    case BinaryOp::Minimum: return a && b;
    default: EMBER_THROW(DTypeError, "binary: op ", static_cast<int>(op), " is not supported for bool operands");
  }
}

template <class scalar_t>
void binary_typed(BinaryOp op, const Tensor& a, const Tensor& b, const Tensor& out) {
  using acc_t = op_math_t<scalar_t>;
  if (is_comparison(op)) {
    map_elements<bool, scalar_t, scalar_t>(out, {a, b}, [op](scalar_t x, scalar_t y) {
      return compare_fn<acc_t>(op, static_cast<acc_t>(x), static_cast<acc_t>(y));
    });
  } else if constexpr (std::is_same_v<scalar_t, bool>) {
    if (op != BinaryOp::Add && op != BinaryOp::Maximum && op != BinaryOp::Mul && op != BinaryOp::Minimum)
      binary_bool(op, false, false);  // throws
    map_elements<bool, bool, bool>(out, {a, b}, [op](bool x, bool y) { return binary_bool(op, x, y); });
  } else {
    map_elements<scalar_t, scalar_t, scalar_t>(out, {a, b}, [op](scalar_t x, scalar_t y) {
      return scalar_t(binary_fn<acc_t>(op, static_cast<acc_t>(x), static_cast<acc_t>(y)));
    });
  }
}

void binary_kernel(BinaryOp op, const Tensor& a, const Tensor& b, const Tensor& out) {
  EMBER_DISPATCH_ALL(a.dtype(), "binary", [&] { binary_typed<scalar_t>(op, a, b, out); });
}

void where_kernel(const Tensor& cond, const Tensor& a, const Tensor& b, const Tensor& out) {
  EMBER_DISPATCH_ALL(out.dtype(), "where", [&] {
    map_elements<scalar_t, bool, scalar_t, scalar_t>(out, {cond, a, b},
                                                     [](bool c, scalar_t x, scalar_t y) { return c ? x : y; });
  });
}

}  // namespace

EMBER_REGISTER_KERNEL(unary, DeviceType::CPU, unary_kernel);
EMBER_REGISTER_KERNEL(binary, DeviceType::CPU, binary_kernel);
EMBER_REGISTER_KERNEL(where, DeviceType::CPU, where_kernel);

}  // namespace ember::kernels::cpu

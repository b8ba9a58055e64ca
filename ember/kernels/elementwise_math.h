// Element math shared by the CPU reference and the CUDA kernels (DESIGN.md §3): one definition per UnaryOp and
// BinaryOp, templated on the compute type (float for f32/f16/bf16, double for f64, integers for integer dtypes), and
// the op names every layer reports. Invariant: CPU and CUDA run the same formula in the same type (float math goes
// through the ember_* overloads, never through libm's double functions); integer math wraps and is exact.
#pragma once

#include <cmath>
#include <type_traits>

#include "ember/base/host_device.h"
#include "ember/kernels/stubs.h"

namespace ember::kernels {

// ---- libm in the compute type ------------------------------------------------------------------------------------
// `::exp(x)` with a float x picks the double function on the host (libstdc++), so the CPU would compute f32 ops in
// double while CUDA uses expf. These overloads pin the float and the double versions on both devices.
#if defined(__CUDA_ARCH__)
#define EMBER_MATH_FN1(name, fname)                              \
  EMBER_HD_INLINE float ember_##name(float x) { return ::fname(x); } \
  EMBER_HD_INLINE double ember_##name(double x) { return ::name(x); }
#define EMBER_MATH_FN2(name, fname)                                       \
  EMBER_HD_INLINE float ember_##name(float x, float y) { return ::fname(x, y); } \
  EMBER_HD_INLINE double ember_##name(double x, double y) { return ::name(x, y); }
#else
#define EMBER_MATH_FN1(name, fname)                                    \
  EMBER_HD_INLINE float ember_##name(float x) { return std::name(x); } \
  EMBER_HD_INLINE double ember_##name(double x) { return std::name(x); }
#define EMBER_MATH_FN2(name, fname)                                             \
  EMBER_HD_INLINE float ember_##name(float x, float y) { return std::name(x, y); } \
  EMBER_HD_INLINE double ember_##name(double x, double y) { return std::name(x, y); }
#endif
EMBER_MATH_FN1(exp, expf)
EMBER_MATH_FN1(log, logf)
EMBER_MATH_FN1(sqrt, sqrtf)
EMBER_MATH_FN1(tanh, tanhf)
EMBER_MATH_FN1(erf, erff)
EMBER_MATH_FN2(pow, powf)
#undef EMBER_MATH_FN1
#undef EMBER_MATH_FN2

// ---- integer arithmetic ------------------------------------------------------------------------------------------
// Signed overflow is undefined in C++; ember's integer ops wrap modulo 2^bits (as PyTorch's do in practice), so they
// compute through the unsigned type. u8 operands promote to int, whose range holds every u8 sum and product.
template <class T>
using wide_unsigned_t = std::make_unsigned_t<T>;

template <class T>
EMBER_HD_INLINE T wrapping_add(T a, T b) {
  return static_cast<T>(static_cast<wide_unsigned_t<T>>(a) + static_cast<wide_unsigned_t<T>>(b));
}
template <class T>
EMBER_HD_INLINE T wrapping_sub(T a, T b) {
  return static_cast<T>(static_cast<wide_unsigned_t<T>>(a) - static_cast<wide_unsigned_t<T>>(b));
}
template <class T>
EMBER_HD_INLINE T wrapping_mul(T a, T b) {
  return static_cast<T>(static_cast<wide_unsigned_t<T>>(a) * static_cast<wide_unsigned_t<T>>(b));
}
template <class T>
EMBER_HD_INLINE T wrapping_neg(T a) {
  return wrapping_sub(T(0), a);
}

// Note [Integer pow]: base^exp by squaring, exact and wrapping modulo 2^bits (pow(i32 10, 10) = 1410065408, i64 3^39
// exact). A negative exponent follows PyTorch's integer rule, which needs no data inspection: 1 for base 1, +-1 for
// base -1 (by the exponent's parity), 0 for every other base (including 0).
template <class T>
EMBER_HD_INLINE T integer_pow(T base, T exp) {
  if constexpr (std::is_signed_v<T>) {
    if (exp < T(0)) {
      if (base == T(1)) return T(1);
      if (base == T(-1)) return (exp & T(1)) ? T(-1) : T(1);
      return T(0);
    }
  }
  T result = T(1);
  while (exp != T(0)) {
    if (exp & T(1)) result = wrapping_mul(result, base);
    exp = static_cast<T>(exp >> 1);
    if (exp != T(0)) base = wrapping_mul(base, base);
  }
  return result;
}

// ---- floating element functions ---------------------------------------------------------------------------------
template <class T>
EMBER_HD_INLINE T sigmoid_fn(T x) {
  return T(1) / (T(1) + ember_exp(-x));
}

// GELU, tanh approximation: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))).
template <class T>
EMBER_HD_INLINE T gelu_tanh_fn(T x) {
  const T k = T(0.7978845608028654);  // sqrt(2 / pi)
  return T(0.5) * x * (T(1) + ember_tanh(k * (x + T(0.044715) * x * x * x)));
}

// GELU, exact: 0.5 x (1 + erf(x / sqrt(2))).
template <class T>
EMBER_HD_INLINE T gelu_erf_fn(T x) {
  return T(0.5) * x * (T(1) + ember_erf(x * T(0.7071067811865476)));
}

// Floating unary ops (T is float or double).
template <class T>
EMBER_HD_INLINE T unary_fn(UnaryOp op, T x, double p0, double p1) {
  switch (op) {
    case UnaryOp::Neg: return -x;
    case UnaryOp::Exp: return ember_exp(x);
    case UnaryOp::Log: return ember_log(x);
    case UnaryOp::Sqrt: return ember_sqrt(x);
    case UnaryOp::Rsqrt: return T(1) / ember_sqrt(x);
    case UnaryOp::Tanh: return ember_tanh(x);
    case UnaryOp::Sigmoid: return sigmoid_fn(x);
    case UnaryOp::Relu: return x > T(0) ? x : (x != x ? x : T(0));  // NaN propagates
    case UnaryOp::GeluTanh: return gelu_tanh_fn(x);
    case UnaryOp::GeluErf: return gelu_erf_fn(x);
    case UnaryOp::Silu: return x * sigmoid_fn(x);
    case UnaryOp::Abs: return x < T(0) ? -x : x;
    case UnaryOp::Clamp: {
      if (x != x) return x;  // NaN propagates
      const T lo = T(p0), hi = T(p1);
      return x < lo ? lo : (x > hi ? hi : x);
    }
    case UnaryOp::PowScalar: return ember_pow(x, T(p0));
  }
  return x;
}

// grad * d op(x)/dx for the floating unary ops (T is float or double). `s` is the saved forward value: the output y
// where unary_backward_uses_output(op) (stubs.h), else the input x. Derivatives written in y avoid recomputing
// exp/tanh/sqrt. The non-smooth points take PyTorch's subgradients: relu' = 0 and abs' = 0 at 0 (and for NaN x),
// clamp passes the gradient where p0 <= x <= p1, and pow(x, 0)' is exactly 0 even where x^-1 is infinite.
template <class T>
EMBER_HD_INLINE T unary_backward_fn(UnaryOp op, T g, T s, double p0, double p1) {
  switch (op) {
    case UnaryOp::Neg: return -g;
    case UnaryOp::Exp: return g * s;                          // y
    case UnaryOp::Log: return g / s;                          // 1 / x
    case UnaryOp::Sqrt: return g / (T(2) * s);                // 1 / (2 y)
    case UnaryOp::Rsqrt: return T(-0.5) * g * (s * s * s);    // -x^-3/2 / 2 = -y^3 / 2
    case UnaryOp::Tanh: return g * (T(1) - s * s);            // 1 - y^2
    case UnaryOp::Sigmoid: return g * (s * (T(1) - s));       // y (1 - y)
    case UnaryOp::Relu: return s > T(0) ? g : T(0);
    case UnaryOp::GeluTanh: {
      // y = x/2 (1 + t), t = tanh(u), u = k (x + c x^3): y' = (1 + t)/2 + x/2 (1 - t^2) k (1 + 3 c x^2)
      const T k = T(0.7978845608028654), c = T(0.044715);
      const T x2 = s * s;
      const T t = ember_tanh(k * (s + c * x2 * s));
      return g * (T(0.5) * (T(1) + t) + T(0.5) * s * (T(1) - t * t) * k * (T(1) + T(3) * c * x2));
    }
    case UnaryOp::GeluErf: {
      // y = x Phi(x): y' = Phi(x) + x phi(x), phi(x) = exp(-x^2/2) / sqrt(2 pi)
      const T cdf = T(0.5) * (T(1) + ember_erf(s * T(0.7071067811865476)));
      const T pdf = ember_exp(T(-0.5) * s * s) * T(0.3989422804014327);
      return g * (cdf + s * pdf);
    }
    case UnaryOp::Silu: {
      const T sg = sigmoid_fn(s);  // y = x sg(x): y' = sg (1 + x (1 - sg))
      return g * (sg * (T(1) + s * (T(1) - sg)));
    }
    case UnaryOp::Abs: return s > T(0) ? g : (s < T(0) ? -g : T(0));
    case UnaryOp::Clamp: return (s >= T(p0) && s <= T(p1)) ? g : T(0);  // bounds in T, as the forward compares
    case UnaryOp::PowScalar:
      if (p0 == 0.0) return T(0);
      return g * (T(p0) * ember_pow(s, T(p0 - 1.0)));
  }
  return g;
}

// The unary ops integer dtypes support (i32/i64/u8; they need no floating math): neg and abs wrap (abs of the
// minimum is the minimum), relu, and clamp to [lo, hi] (bounds already in T; the front end saturates them).
inline bool is_integer_unary(UnaryOp op) {
  return op == UnaryOp::Neg || op == UnaryOp::Abs || op == UnaryOp::Relu || op == UnaryOp::Clamp;
}
template <class T>
EMBER_HD_INLINE T unary_integer_fn(UnaryOp op, T x, T lo, T hi) {
  switch (op) {
    case UnaryOp::Neg: return wrapping_neg(x);
    case UnaryOp::Abs:
      if constexpr (std::is_signed_v<T>) return x < T(0) ? wrapping_neg(x) : x;
      return x;
    case UnaryOp::Relu: return x > T(0) ? x : T(0);
    case UnaryOp::Clamp: return x < lo ? lo : (x > hi ? hi : x);
    default: return x;
  }
}

// Arithmetic binary ops (not comparisons) in compute type T. Integer types wrap (Note [Integer pow] for Pow); integer
// Div is not used: the front end promotes integer division to f32 (true division).
template <class T>
EMBER_HD_INLINE T binary_fn(BinaryOp op, T a, T b) {
  if constexpr (std::is_same_v<T, bool>) {  // Add/Maximum are logical or, Mul/Minimum logical and
    switch (op) {
      case BinaryOp::Add:
      case BinaryOp::Maximum: return a || b;
      case BinaryOp::Mul:
      case BinaryOp::Minimum: return a && b;
      default: return false;  // the front end rejects Sub and Pow on bool; Div is f32
    }
  } else if constexpr (std::is_integral_v<T>) {
    switch (op) {
      case BinaryOp::Add: return wrapping_add(a, b);
      case BinaryOp::Sub: return wrapping_sub(a, b);
      case BinaryOp::Mul: return wrapping_mul(a, b);
      case BinaryOp::Div: return b == T(0) ? T(0) : static_cast<T>(a / b);  // unused (see above); no trap
      case BinaryOp::Pow: return integer_pow(a, b);
      case BinaryOp::Maximum: return a > b ? a : b;
      case BinaryOp::Minimum: return a < b ? a : b;
      default: return T(0);
    }
  } else {
    switch (op) {
      case BinaryOp::Add: return a + b;
      case BinaryOp::Sub: return a - b;
      case BinaryOp::Mul: return a * b;
      case BinaryOp::Div: return a / b;
      case BinaryOp::Pow: return ember_pow(a, b);
      case BinaryOp::Maximum: return (a != a) ? a : ((b != b) ? b : (a > b ? a : b));  // NaN propagates
      case BinaryOp::Minimum: return (a != a) ? a : ((b != b) ? b : (a < b ? a : b));
      default: return T(0);
    }
  }
}

template <class T>
EMBER_HD_INLINE bool compare_fn(BinaryOp op, T a, T b) {
  switch (op) {
    case BinaryOp::Eq: return a == b;
    case BinaryOp::Ne: return a != b;
    case BinaryOp::Lt: return a < b;
    case BinaryOp::Le: return a <= b;
    case BinaryOp::Gt: return a > b;
    case BinaryOp::Ge: return a >= b;
    default: return false;
  }
}

// The dtype of op_math_t for elements of dtype `dt`: f32 for f16/bf16, else dt itself. A binary op's scalar operand
// arrives in this dtype of the output (Note [Scalar operands] in ops_elementwise.cpp).
inline DType op_math_dtype(DType dt) { return is_reduced_float(dt) ? DType::f32 : dt; }

// ---- op names (error messages of the front ends and of every device's kernels) ---------------------------------
inline const char* unary_op_name(UnaryOp op) {
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

inline const char* binary_op_name(BinaryOp op) {
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

}  // namespace ember::kernels

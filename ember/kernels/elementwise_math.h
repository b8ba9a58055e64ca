// Element math shared by the CPU reference and the CUDA kernels (DESIGN.md §3): one definition per UnaryOp and
// BinaryOp, templated on the compute type (float for f32/f16/bf16, double for f64, integers for integer dtypes).
// Invariant: CPU and CUDA produce the same formula; only the libm implementation underneath differs.
#pragma once

#include <cmath>

#include "ember/base/host_device.h"
#include "ember/kernels/stubs.h"

namespace ember::kernels {

template <class T>
EMBER_HD_INLINE T sigmoid_fn(T x) {
  return T(1) / (T(1) + ::exp(-x));
}

// GELU, tanh approximation: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))).
template <class T>
EMBER_HD_INLINE T gelu_tanh_fn(T x) {
  const T k = T(0.7978845608028654);  // sqrt(2 / pi)
  return T(0.5) * x * (T(1) + ::tanh(k * (x + T(0.044715) * x * x * x)));
}

// GELU, exact: 0.5 x (1 + erf(x / sqrt(2))).
template <class T>
EMBER_HD_INLINE T gelu_erf_fn(T x) {
  return T(0.5) * x * (T(1) + ::erf(x * T(0.7071067811865476)));
}

template <class T>
EMBER_HD_INLINE T unary_fn(UnaryOp op, T x, double p0, double p1) {
  switch (op) {
    case UnaryOp::Neg: return -x;
    case UnaryOp::Exp: return ::exp(x);
    case UnaryOp::Log: return ::log(x);
    case UnaryOp::Sqrt: return ::sqrt(x);
    case UnaryOp::Rsqrt: return T(1) / ::sqrt(x);
    case UnaryOp::Tanh: return ::tanh(x);
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
    case UnaryOp::PowScalar: return ::pow(x, T(p0));
  }
  return x;
}

// Arithmetic binary ops (not comparisons) in compute type T. Integer Div is not used: the front end promotes
// integer division to f32 (true division).
template <class T>
EMBER_HD_INLINE T binary_fn(BinaryOp op, T a, T b) {
  switch (op) {
    case BinaryOp::Add: return a + b;
    case BinaryOp::Sub: return a - b;
    case BinaryOp::Mul: return a * b;
    case BinaryOp::Div: return a / b;
    case BinaryOp::Pow: return static_cast<T>(::pow(a, b));
    case BinaryOp::Maximum: return (a != a) ? a : ((b != b) ? b : (a > b ? a : b));  // NaN propagates
    case BinaryOp::Minimum: return (a != a) ? a : ((b != b) ? b : (a < b ? a : b));
    default: return T(0);
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

}  // namespace ember::kernels

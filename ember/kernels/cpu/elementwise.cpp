// CPU kernels of the elementwise family (unary, binary, comparisons, where) over strided operands.
// Invariant: the hot (op, f32/f64) pairs get one loop each with the op fixed at compile time (Note [Unit-stride fast
// path] in loops.h); every other pair shares one instantiation per dtype with the op a runtime argument of the inner
// loop. f16/bf16 are loaded into op_math_t (float), computed with elementwise_math.h, and rounded once when stored.
#include <type_traits>

#include "ember/kernels/cpu/loops.h"
#include "ember/kernels/cpu/vec_math.h"
#include "ember/kernels/elementwise_math.h"
#include "ember/kernels/stubs.h"

namespace ember::kernels::cpu {
namespace {

// The generic path's formula (unary_fn) with Op a constant so the switch folds away; f32 exp, sigmoid and the exact
// GELU use the vectorisable forms of vec_math.h instead of libm's scalar calls (Note [Vectorisable float math]).
template <class T, UnaryOp Op>
T unary_fixed_fn(T x, double p0, double p1) {
  if constexpr (std::is_same_v<T, float> && Op == UnaryOp::GeluErf) return gelu_vec(x);
  if constexpr (std::is_same_v<T, float> && Op == UnaryOp::Exp) return exp_vec(x);
  if constexpr (std::is_same_v<T, float> && Op == UnaryOp::Sigmoid) return 1.0f / (1.0f + exp_vec(-x));
  return unary_fn<T>(Op, x, p0, p1);
}

template <class T, UnaryOp Op>
void unary_fixed(UnaryParams p, const Tensor& in, const Tensor& out) {
  const double p0 = p.p0, p1 = p.p1;
  map_elements_fast<T, T>(out, {in}, [p0, p1](T x) { return unary_fixed_fn<T, Op>(x, p0, p1); });
}

// Runs the hot unary ops of f32/f64 through unary_fixed; false for every other (op, dtype).
template <class T>
bool unary_hot(UnaryOp op, UnaryParams p, const Tensor& in, const Tensor& out) {
  if constexpr (std::is_same_v<T, float> || std::is_same_v<T, double>) {
    switch (op) {
      case UnaryOp::Relu: unary_fixed<T, UnaryOp::Relu>(p, in, out); return true;
      case UnaryOp::GeluTanh: unary_fixed<T, UnaryOp::GeluTanh>(p, in, out); return true;
      case UnaryOp::GeluErf: unary_fixed<T, UnaryOp::GeluErf>(p, in, out); return true;
      case UnaryOp::Exp: unary_fixed<T, UnaryOp::Exp>(p, in, out); return true;
      case UnaryOp::Tanh: unary_fixed<T, UnaryOp::Tanh>(p, in, out); return true;
      case UnaryOp::Sigmoid: unary_fixed<T, UnaryOp::Sigmoid>(p, in, out); return true;
      case UnaryOp::Neg: unary_fixed<T, UnaryOp::Neg>(p, in, out); return true;
      case UnaryOp::Rsqrt: unary_fixed<T, UnaryOp::Rsqrt>(p, in, out); return true;
      default: return false;
    }
  }
  return false;
}

// One instantiation per dtype (called from the dispatch switch, so `if constexpr` discards the other paths).
template <class scalar_t>
void unary_typed(UnaryOp op, UnaryParams p, const Tensor& in, const Tensor& out) {
  using acc_t = op_math_t<scalar_t>;
  if (unary_hot<scalar_t>(op, p, in, out)) return;
  if constexpr (std::is_floating_point_v<acc_t>) {
    const double p0 = p.p0, p1 = p.p1;
    map_elements<scalar_t, scalar_t>(out, {in}, [op, p0, p1](scalar_t x) {
      return scalar_t(unary_fn<acc_t>(op, static_cast<acc_t>(x), p0, p1));
    });
  } else if constexpr (std::is_same_v<scalar_t, bool>) {
    throw_unsupported_dtype(unary_op_name(op), in.dtype());
  } else {
    EMBER_CHECK(is_integer_unary(op), DTypeError, unary_op_name(op), ": dtype ", dtype_name(in.dtype()),
                " is not supported (needs a floating tensor)");
    // Clamp bounds arrive saturated to scalar_t's range (front end); convert is defined for +-inf as well.
    const scalar_t lo = convert<scalar_t>(p.p0), hi = convert<scalar_t>(p.p1);
    map_elements<scalar_t, scalar_t>(out, {in}, [op, lo, hi](scalar_t x) { return unary_integer_fn(op, x, lo, hi); });
  }
}

void unary_kernel(UnaryOp op, UnaryParams p, const Tensor& in, const Tensor& out) {
  EMBER_DISPATCH_ALL(in.dtype(), unary_op_name(op), [&] { unary_typed<scalar_t>(op, p, in, out); });
}

// Arithmetic op with output type scalar_t; each operand is stored as A / B (scalar_t, or op_math_t<scalar_t> for a
// scalar operand) and loaded into the compute type.
template <class scalar_t, class A, class B>
void binary_arith(BinaryOp op, const Tensor& a, const Tensor& b, const Tensor& out) {
  using acc_t = op_math_t<scalar_t>;
  map_elements<scalar_t, A, B>(out, {a, b}, [op](A x, B y) {
    return scalar_t(binary_fn<acc_t>(op, static_cast<acc_t>(x), static_cast<acc_t>(y)));
  });
}

// The same formula as the generic path (binary_fn), with Op a constant so the switch folds away.
template <class T, BinaryOp Op>
void binary_fixed(const Tensor& a, const Tensor& b, const Tensor& out) {
  map_elements_fast<T, T, T>(out, {a, b}, [](T x, T y) { return binary_fn<T>(Op, x, y); });
}

// Runs add/sub/mul/div of f32/f64 through binary_fixed; false for every other (op, dtype).
template <class T>
bool binary_hot(BinaryOp op, const Tensor& a, const Tensor& b, const Tensor& out) {
  if constexpr (std::is_same_v<T, float> || std::is_same_v<T, double>) {
    switch (op) {
      case BinaryOp::Add: binary_fixed<T, BinaryOp::Add>(a, b, out); return true;
      case BinaryOp::Sub: binary_fixed<T, BinaryOp::Sub>(a, b, out); return true;
      case BinaryOp::Mul: binary_fixed<T, BinaryOp::Mul>(a, b, out); return true;
      case BinaryOp::Div: binary_fixed<T, BinaryOp::Div>(a, b, out); return true;
      default: return false;
    }
  }
  return false;
}

template <class scalar_t>
void binary_typed(BinaryOp op, const Tensor& a, const Tensor& b, const Tensor& out) {
  using acc_t = op_math_t<scalar_t>;
  if (binary_hot<scalar_t>(op, a, b, out)) return;  // f32/f64: operands and output share the dtype
  if (is_comparison(op)) {
    map_elements<bool, scalar_t, scalar_t>(out, {a, b}, [op](scalar_t x, scalar_t y) {
      return compare_fn<acc_t>(op, static_cast<acc_t>(x), static_cast<acc_t>(y));
    });
    return;
  }
  if constexpr (std::is_same_v<scalar_t, bool>) {
    EMBER_CHECK(op == BinaryOp::Add || op == BinaryOp::Maximum || op == BinaryOp::Mul || op == BinaryOp::Minimum,
                DTypeError, binary_op_name(op), ": not supported for bool operands");
  }
  const bool a_acc = a.dtype() != out.dtype(), b_acc = b.dtype() != out.dtype();  // checked by binary_kernel
  if constexpr (std::is_same_v<acc_t, scalar_t>) {
    binary_arith<scalar_t, scalar_t, scalar_t>(op, a, b, out);
  } else if (a_acc && b_acc) {
    binary_arith<scalar_t, acc_t, acc_t>(op, a, b, out);
  } else if (a_acc) {
    binary_arith<scalar_t, acc_t, scalar_t>(op, a, b, out);
  } else if (b_acc) {
    binary_arith<scalar_t, scalar_t, acc_t>(op, a, b, out);
  } else {
    binary_arith<scalar_t, scalar_t, scalar_t>(op, a, b, out);
  }
}

void binary_kernel(BinaryOp op, const Tensor& a, const Tensor& b, const Tensor& out) {
  const char* name = binary_op_name(op);
  if (is_comparison(op)) {
    EMBER_CHECK(a.dtype() == b.dtype(), DTypeError, name, ": operands differ in dtype (", a.description(), ", ",
                b.description(), ")");
  } else {
    for (const Tensor* t : {&a, &b})
      EMBER_CHECK(t->dtype() == out.dtype() || t->dtype() == op_math_dtype(out.dtype()), DTypeError, name,
                  ": operand ", t->description(), " has neither the output's dtype nor its compute dtype (output ",
                  out.description(), ")");
  }
  EMBER_DISPATCH_ALL(is_comparison(op) ? a.dtype() : out.dtype(), name,
                     [&] { binary_typed<scalar_t>(op, a, b, out); });
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

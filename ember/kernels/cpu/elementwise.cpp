// CPU kernels of the elementwise family (unary, binary, comparisons, where) over strided operands.
// Invariant: one instantiation per dtype; the op is a runtime argument of the inner loop, and f16/bf16 are loaded
// into op_math_t (float), computed with elementwise_math.h, and rounded once when stored.
#include <type_traits>

#include "ember/kernels/cpu/loops.h"
#include "ember/kernels/elementwise_math.h"
#include "ember/kernels/stubs.h"

namespace ember::kernels::cpu {
namespace {

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

template <class scalar_t>
void binary_typed(BinaryOp op, const Tensor& a, const Tensor& b, const Tensor& out) {
  using acc_t = op_math_t<scalar_t>;
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

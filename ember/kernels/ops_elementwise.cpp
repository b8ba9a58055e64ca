// Front ends of the elementwise ops (unary, binary, comparisons, scalar operands, where, cast) and their stubs.
// Each checks its arguments, promotes dtypes (PyTorch rules), broadcasts and allocates a fresh contiguous output.
// Invariant: kernels receive inputs already cast to the compute dtype and expanded to the output's shape.
#include <cmath>
#include <limits>

#include "ember/kernels/ops.h"

namespace ember {

EMBER_DEFINE_STUB(unary, UnaryFn);
EMBER_DEFINE_STUB(binary, BinaryFn);
EMBER_DEFINE_STUB(where, WhereFn);

namespace {

void check_defined(const char* op, const Tensor& t, const char* what) {
  EMBER_CHECK(t.defined(), ValueError, op, ": ", what, " is an undefined tensor");
}

// Meta tensors hold no bytes and empty outputs have nothing to compute: the kernel is skipped for both.
bool needs_kernel(const Tensor& out) { return out.numel() > 0 && !out.device().is_meta(); }

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

Tensor binary_op(BinaryOp op, const Tensor& a, const Tensor& b) {
  const char* name = binary_name(op);
  check_defined(name, a, "first operand");
  check_defined(name, b, "second operand");
  const Device device = common_device(name, {&a, &b});
  DType ct = promote_types(a.dtype(), b.dtype());
  if (op == BinaryOp::Div && is_integral(ct)) ct = DType::f32;  // true division
  EMBER_CHECK(!(ct == DType::b8 && (op == BinaryOp::Sub || op == BinaryOp::Pow)), DTypeError, name,
              ": not supported for bool operands (", a.description(), ", ", b.description(), ")");
  const Shape shape = broadcast_shapes(a.sizes(), b.sizes(), name);
  Tensor out = empty(shape, {is_comparison(op) ? DType::b8 : ct, device});
  if (needs_kernel(out)) binary_stub.get(device.type)(op, a.to(ct).expand(shape), b.to(ct).expand(shape), out);
  return out;
}

// A Scalar operand takes the tensor's dtype; a floating scalar with an integer/bool tensor is f32, an integer
// scalar with a bool tensor is i64 (PyTorch's rules for Python numbers).
Tensor scalar_operand(const char* op, const Tensor& t, Scalar s) {
  check_defined(op, t, "tensor operand");
  DType dt = t.dtype();
  if (!is_floating(dt)) dt = !s.is_integral() ? DType::f32 : (dt == DType::b8 ? DType::i64 : dt);
  return scalar_tensor(s, {dt, t.device()});
}

// integer_ok: the op also runs on i32/i64/u8 (never bool); otherwise it needs a floating input.
Tensor unary_op(const char* name, UnaryOp op, const Tensor& x, UnaryParams p, bool integer_ok) {
  check_defined(name, x, "input");
  if (integer_ok) {
    EMBER_CHECK(x.dtype() != DType::b8, DTypeError, name, ": bool tensors are not supported, got ", x.description());
  } else {
    check_floating(name, x);
  }
  Tensor out = empty(x.sizes(), {x.dtype(), x.device()});
  if (needs_kernel(out)) unary_stub.get(x.device().type)(op, p, x, out);
  return out;
}

}  // namespace

// ---- binary ----------------------------------------------------------------------------------------------------
Tensor add(const Tensor& a, const Tensor& b) { return binary_op(BinaryOp::Add, a, b); }
Tensor sub(const Tensor& a, const Tensor& b) { return binary_op(BinaryOp::Sub, a, b); }
Tensor mul(const Tensor& a, const Tensor& b) { return binary_op(BinaryOp::Mul, a, b); }
Tensor div(const Tensor& a, const Tensor& b) { return binary_op(BinaryOp::Div, a, b); }
Tensor pow(const Tensor& a, const Tensor& b) { return binary_op(BinaryOp::Pow, a, b); }
Tensor maximum(const Tensor& a, const Tensor& b) { return binary_op(BinaryOp::Maximum, a, b); }
Tensor minimum(const Tensor& a, const Tensor& b) { return binary_op(BinaryOp::Minimum, a, b); }
Tensor eq(const Tensor& a, const Tensor& b) { return binary_op(BinaryOp::Eq, a, b); }
Tensor ne(const Tensor& a, const Tensor& b) { return binary_op(BinaryOp::Ne, a, b); }
Tensor lt(const Tensor& a, const Tensor& b) { return binary_op(BinaryOp::Lt, a, b); }
Tensor le(const Tensor& a, const Tensor& b) { return binary_op(BinaryOp::Le, a, b); }
Tensor gt(const Tensor& a, const Tensor& b) { return binary_op(BinaryOp::Gt, a, b); }
Tensor ge(const Tensor& a, const Tensor& b) { return binary_op(BinaryOp::Ge, a, b); }

Tensor add(const Tensor& a, Scalar b) { return binary_op(BinaryOp::Add, a, scalar_operand("add", a, b)); }
Tensor sub(const Tensor& a, Scalar b) { return binary_op(BinaryOp::Sub, a, scalar_operand("sub", a, b)); }
Tensor mul(const Tensor& a, Scalar b) { return binary_op(BinaryOp::Mul, a, scalar_operand("mul", a, b)); }
Tensor div(const Tensor& a, Scalar b) { return binary_op(BinaryOp::Div, a, scalar_operand("div", a, b)); }

// ---- unary -----------------------------------------------------------------------------------------------------
Tensor neg(const Tensor& x) { return unary_op("neg", UnaryOp::Neg, x, {}, true); }
Tensor exp(const Tensor& x) { return unary_op("exp", UnaryOp::Exp, x, {}, false); }
Tensor log(const Tensor& x) { return unary_op("log", UnaryOp::Log, x, {}, false); }
Tensor sqrt(const Tensor& x) { return unary_op("sqrt", UnaryOp::Sqrt, x, {}, false); }
Tensor rsqrt(const Tensor& x) { return unary_op("rsqrt", UnaryOp::Rsqrt, x, {}, false); }
Tensor tanh(const Tensor& x) { return unary_op("tanh", UnaryOp::Tanh, x, {}, false); }
Tensor sigmoid(const Tensor& x) { return unary_op("sigmoid", UnaryOp::Sigmoid, x, {}, false); }
Tensor relu(const Tensor& x) { return unary_op("relu", UnaryOp::Relu, x, {}, true); }
Tensor gelu(const Tensor& x, GeluApprox approx) {
  return unary_op("gelu", approx == GeluApprox::Tanh ? UnaryOp::GeluTanh : UnaryOp::GeluErf, x, {}, false);
}
Tensor silu(const Tensor& x) { return unary_op("silu", UnaryOp::Silu, x, {}, false); }
Tensor abs(const Tensor& x) { return unary_op("abs", UnaryOp::Abs, x, {}, true); }
Tensor pow(const Tensor& a, double exponent) {
  return unary_op("pow", UnaryOp::PowScalar, a, UnaryParams{exponent, 0.0}, false);
}

Tensor clamp(const Tensor& x, std::optional<double> min, std::optional<double> max) {
  check_defined("clamp", x, "input");
  EMBER_CHECK(min.has_value() || max.has_value(), ValueError,
              "clamp: at least one of min and max must be given (input ", x.description(), ")");
  // A fractional bound promotes an integer tensor to f32, as a Python float scalar does in PyTorch.
  const auto fractional = [](const std::optional<double>& v) {
    return v.has_value() && !(std::isfinite(*v) && std::floor(*v) == *v);
  };
  Tensor in = x;
  if (is_integral(x.dtype()) && x.dtype() != DType::b8 && (fractional(min) || fractional(max))) in = x.to(DType::f32);
  constexpr double inf = std::numeric_limits<double>::infinity();
  UnaryParams p{min.value_or(-inf), max.value_or(inf)};
  if (min && max && *min > *max) p.p0 = p.p1;  // min(max(x, lo), hi): every element becomes hi
  return unary_op("clamp", UnaryOp::Clamp, in, p, true);
}

Tensor where(const Tensor& cond, const Tensor& a, const Tensor& b) {
  check_defined("where", cond, "condition");
  check_defined("where", a, "first operand");
  check_defined("where", b, "second operand");
  const Device device = common_device("where", {&cond, &a, &b});
  EMBER_CHECK(cond.dtype() == DType::b8, DTypeError, "where: the condition must be a bool tensor, got ",
              cond.description());
  const DType ct = promote_types(a.dtype(), b.dtype());
  const Shape shape = broadcast_shapes(broadcast_shapes(cond.sizes(), a.sizes(), "where"), b.sizes(), "where");
  Tensor out = empty(shape, {ct, device});
  if (needs_kernel(out))
    where_stub.get(device.type)(cond.expand(shape), a.to(ct).expand(shape), b.to(ct).expand(shape), out);
  return out;
}

Tensor cast(const Tensor& x, DType dtype) {
  check_defined("cast", x, "input");
  return x.to(dtype);
}

// ---- operators -------------------------------------------------------------------------------------------------
Tensor operator+(const Tensor& a, const Tensor& b) { return add(a, b); }
Tensor operator-(const Tensor& a, const Tensor& b) { return sub(a, b); }
Tensor operator*(const Tensor& a, const Tensor& b) { return mul(a, b); }
Tensor operator/(const Tensor& a, const Tensor& b) { return div(a, b); }
Tensor operator-(const Tensor& a) { return neg(a); }
Tensor operator+(const Tensor& a, Scalar b) { return add(a, b); }
Tensor operator-(const Tensor& a, Scalar b) { return sub(a, b); }
Tensor operator*(const Tensor& a, Scalar b) { return mul(a, b); }
Tensor operator/(const Tensor& a, Scalar b) { return div(a, b); }

}  // namespace ember

// Front ends of the elementwise ops (unary, binary, comparisons, scalar operands, where, cast) and their stubs.
// Each checks its arguments, promotes dtypes (PyTorch rules), broadcasts and allocates a fresh contiguous output.
// Invariant: kernels receive inputs already cast to the result dtype (a Scalar operand: to the result's compute dtype,
// Note [Scalar operands]) and expanded to the output's shape.
#include <cmath>
#include <limits>
#include <type_traits>

#include "ember/kernels/elementwise_math.h"
#include "ember/kernels/ops.h"

namespace ember {

EMBER_DEFINE_STUB(unary, UnaryFn);
EMBER_DEFINE_STUB(binary, BinaryFn);
EMBER_DEFINE_STUB(where, WhereFn);

namespace ops {

namespace {

void check_defined(const char* op, const Tensor& t, const char* what) {
  EMBER_CHECK(t.defined(), ValueError, op, ": ", what, " is an undefined tensor");
}

// Meta tensors hold no bytes and empty outputs have nothing to compute: the kernel is skipped for both.
bool needs_kernel(const Tensor& out) { return out.numel() > 0 && !out.device().is_meta(); }
// The kernel call of ops whose operands are first cast (and scalars made tensors): run for meta too, where run_kernel
// skips only the kernel, so a dry run allocates the casts a real run does (Note [Meta kernels] in stubs.h).
bool has_elements(const Tensor& out) { return out.numel() > 0; }

// Note [Result type]: PyTorch's result_type for two tensor operands. Operands of the same kind (both 0-d or both
// with dims) promote normally. A 0-d tensor beside an n-d one counts only by category (bool < integer < floating):
// when its category is not higher, the n-d tensor's dtype wins (f16[3] + f32 0-d -> f16, i32[3] + i64 0-d -> i32);
// when it is higher, the two promote (i32[3] + f32 0-d -> f32, bool[3] + i64 0-d -> i64).
int category(DType d) { return d == DType::b8 ? 0 : (is_floating(d) ? 2 : 1); }

DType result_type(const Tensor& a, const Tensor& b) {
  const bool a0 = a.dim() == 0, b0 = b.dim() == 0;
  if (a0 == b0) return promote_types(a.dtype(), b.dtype());
  const DType dim_dt = a0 ? b.dtype() : a.dtype(), zero_dt = a0 ? a.dtype() : b.dtype();
  return category(zero_dt) > category(dim_dt) ? promote_types(dim_dt, zero_dt) : dim_dt;
}

// The output dtype of `op` on operands promoted to `ct`; checks the combinations no kernel supports.
DType binary_out_dtype(BinaryOp op, DType ct, const Tensor& a, const char* b_desc) {
  const char* name = kernels::binary_op_name(op);
  if (op == BinaryOp::Div && is_integral(ct)) ct = DType::f32;  // true division
  EMBER_CHECK(!(ct == DType::b8 && (op == BinaryOp::Sub || op == BinaryOp::Pow)), DTypeError, name,
              ": not supported for bool operands (", a.description(), ", ", b_desc, ")");
  return ct;
}

Tensor binary_op(BinaryOp op, const Tensor& a, const Tensor& b) {
  const char* name = kernels::binary_op_name(op);
  check_defined(name, a, "first operand");
  check_defined(name, b, "second operand");
  const Device device = common_device(name, {&a, &b});
  const DType ct = binary_out_dtype(op, result_type(a, b), a, b.description().c_str());
  const Shape shape = broadcast_shapes(a.sizes(), b.sizes(), name);
  Tensor out = empty(shape, {is_comparison(op) ? DType::b8 : ct, device});
  if (has_elements(out)) run_kernel(binary_stub, device, op, a.to(ct).expand(shape), b.to(ct).expand(shape), out);
  return out;
}

// Note [Scalar operands]: a Scalar (a Python number in PyTorch) gives the result the tensor's dtype, except that a
// floating scalar with an integer/bool tensor gives f32 and an integer scalar with a bool tensor gives i64. Its value
// is not rounded to that dtype: it becomes a 0-d tensor of the result's compute dtype (op_math_dtype: f32 for
// f16/bf16), expanded with stride 0, which the kernels load straight into the compute type. So f16 60000 / 100000.0
// is 0.6, not 60000 / f16(100000) = 60000 / inf = 0. Comparisons are the exception: their kernel takes operands of
// one dtype, so the scalar is rounded to the tensor's (PyTorch compares a half tensor with a number in half
// precision too), except that an integer scalar outside an integer tensor's range (u8 against -1, i32 against 2^32)
// compares in i64 rather than wrapping.
bool integer_fits(int64_t v, DType d) {
  switch (d) {
    case DType::u8: return v >= 0 && v <= 255;
    case DType::i8: return v >= -128 && v <= 127;
    case DType::i16: return v >= -32768 && v <= 32767;
    case DType::i32: return v >= std::numeric_limits<int32_t>::min() && v <= std::numeric_limits<int32_t>::max();
    default: return true;
  }
}

Tensor binary_scalar_op(BinaryOp op, const Tensor& t, Scalar s) {
  const char* name = kernels::binary_op_name(op);
  check_defined(name, t, "tensor operand");
  DType dt = t.dtype();
  if (!is_floating(dt)) dt = !s.is_integral() ? DType::f32 : (dt == DType::b8 ? DType::i64 : dt);
  if (is_comparison(op) && !is_floating(dt) && s.is_integral() && !integer_fits(s.to_int(), dt)) dt = DType::i64;
  const DType ct = binary_out_dtype(op, dt, t, s.is_integral() ? "an integer scalar" : "a floating scalar");
  Tensor out = empty(t.sizes(), {is_comparison(op) ? DType::b8 : ct, t.device()});
  if (has_elements(out)) {
    const Tensor scalar = scalar_tensor(s, {is_comparison(op) ? ct : kernels::op_math_dtype(ct), t.device()});
    run_kernel(binary_stub, t.device(), op, t.to(ct), scalar.expand(t.sizes()), out);
  }
  return out;
}

// integer_ok: the op also runs on i32/i64/u8 (never bool); otherwise it needs a floating input.
Tensor unary_op(UnaryOp op, const Tensor& x, UnaryParams p, bool integer_ok) {
  const char* name = kernels::unary_op_name(op);
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

void add_(const Tensor& a, const Tensor& b) {
  check_defined("add_", a, "destination");
  check_defined("add_", b, "operand");
  const Device device = common_device("add_", {&a, &b});
  check_floating("add_", a);
  EMBER_CHECK(a.is_contiguous(), ValueError, "add_: the destination ", a.description(),
              " must be contiguous (an in-place write into overlapping or strided memory)");
  EMBER_CHECK(broadcast_shapes(a.sizes(), b.sizes(), "add_") == a.sizes(), ShapeError, "add_: ", b.description(),
              " does not broadcast to the destination's shape ", a.description());
  // The kernel reads a[i] and b[i] before writing out[i] = a[i]: the same element, so out may alias a.
  const Tensor operand = b.to(a.dtype()).expand(a.sizes());  // made on meta too: a dry run allocates the same
  if (needs_kernel(a)) binary_stub.get(device.type)(BinaryOp::Add, a, operand, a);
  a.bump_version();
}
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

Tensor add(const Tensor& a, Scalar b) { return binary_scalar_op(BinaryOp::Add, a, b); }
Tensor sub(const Tensor& a, Scalar b) { return binary_scalar_op(BinaryOp::Sub, a, b); }
Tensor mul(const Tensor& a, Scalar b) { return binary_scalar_op(BinaryOp::Mul, a, b); }
Tensor div(const Tensor& a, Scalar b) { return binary_scalar_op(BinaryOp::Div, a, b); }
Tensor eq(const Tensor& a, Scalar b) { return binary_scalar_op(BinaryOp::Eq, a, b); }
Tensor ne(const Tensor& a, Scalar b) { return binary_scalar_op(BinaryOp::Ne, a, b); }
Tensor lt(const Tensor& a, Scalar b) { return binary_scalar_op(BinaryOp::Lt, a, b); }
Tensor le(const Tensor& a, Scalar b) { return binary_scalar_op(BinaryOp::Le, a, b); }
Tensor gt(const Tensor& a, Scalar b) { return binary_scalar_op(BinaryOp::Gt, a, b); }
Tensor ge(const Tensor& a, Scalar b) { return binary_scalar_op(BinaryOp::Ge, a, b); }

// ---- unary -----------------------------------------------------------------------------------------------------
Tensor neg(const Tensor& x) { return unary_op(UnaryOp::Neg, x, {}, true); }
Tensor exp(const Tensor& x) { return unary_op(UnaryOp::Exp, x, {}, false); }
Tensor log(const Tensor& x) { return unary_op(UnaryOp::Log, x, {}, false); }
Tensor sqrt(const Tensor& x) { return unary_op(UnaryOp::Sqrt, x, {}, false); }
Tensor rsqrt(const Tensor& x) { return unary_op(UnaryOp::Rsqrt, x, {}, false); }
Tensor tanh(const Tensor& x) { return unary_op(UnaryOp::Tanh, x, {}, false); }
Tensor sigmoid(const Tensor& x) { return unary_op(UnaryOp::Sigmoid, x, {}, false); }
Tensor relu(const Tensor& x) { return unary_op(UnaryOp::Relu, x, {}, true); }
void relu_(const Tensor& x) {
  check_defined("relu_", x, "destination");
  EMBER_CHECK(x.dtype() != DType::b8, DTypeError, "relu_: bool tensors are not supported, got ", x.description());
  EMBER_CHECK(x.is_contiguous(), ValueError, "relu_: the destination ", x.description(),
              " must be contiguous (an in-place write into overlapping or strided memory)");
  // The kernel reads x[i] before writing out[i]: the same element, so out may alias x (as add_'s).
  if (needs_kernel(x)) unary_stub.get(x.device().type)(UnaryOp::Relu, {}, x, x);
  x.bump_version();
}
Tensor gelu(const Tensor& x, GeluApprox approx) {
  return unary_op(approx == GeluApprox::Tanh ? UnaryOp::GeluTanh : UnaryOp::GeluErf, x, {}, false);
}
Tensor silu(const Tensor& x) { return unary_op(UnaryOp::Silu, x, {}, false); }
Tensor abs(const Tensor& x) { return unary_op(UnaryOp::Abs, x, {}, true); }
Tensor pow(const Tensor& a, double exponent) {
  return unary_op(UnaryOp::PowScalar, a, UnaryParams{exponent, 0.0}, false);
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
  if (is_integral(in.dtype()) && in.dtype() != DType::b8) {
    // Integer kernels take the bounds saturated to the dtype's range (1e30 on i32 clamps to 2147483647); the kernels
    // convert them to the element type (Note [Casts]: exact, except 2^63 for i64, which saturates to INT64_MAX).
    EMBER_DISPATCH_ALL(in.dtype(), "clamp", [&] {
      if constexpr (std::is_integral_v<scalar_t>) {
        const double lo = static_cast<double>(std::numeric_limits<scalar_t>::lowest());
        const double hi = static_cast<double>(std::numeric_limits<scalar_t>::max());  // i64: rounds to 2^63
        p.p0 = std::fmin(std::fmax(p.p0, lo), hi);
        p.p1 = std::fmin(std::fmax(p.p1, lo), hi);
      }
    });
  }
  return unary_op(UnaryOp::Clamp, in, p, true);
}

Tensor where(const Tensor& cond, const Tensor& a, const Tensor& b) {
  check_defined("where", cond, "condition");
  check_defined("where", a, "first operand");
  check_defined("where", b, "second operand");
  const Device device = common_device("where", {&cond, &a, &b});
  EMBER_CHECK(cond.dtype() == DType::b8, DTypeError, "where: the condition must be a bool tensor, got ",
              cond.description());
  const DType ct = result_type(a, b);  // Note [Result type]
  const Shape shape = broadcast_shapes(broadcast_shapes(cond.sizes(), a.sizes(), "where"), b.sizes(), "where");
  Tensor out = empty(shape, {ct, device});
  if (has_elements(out))
    run_kernel(where_stub, device, cond.expand(shape), a.to(ct).expand(shape), b.to(ct).expand(shape), out);
  return out;
}

Tensor cast(const Tensor& x, DType dtype) {
  check_defined("cast", x, "input");
  return x.to(dtype);
}

}  // namespace ops
}  // namespace ember

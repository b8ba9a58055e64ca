// Tests of unary_backward: every UnaryOp against a naive float64 loop of its derivative on random non-contiguous and
// broadcast operands, against central finite differences of the forward op in float64 (which catches a wrong
// formula), hand-checked non-smooth points (relu/abs at 0, clamp bounds, pow(x, 0)), and every error path.
#include <cmath>
#include <limits>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "tests/harness/op_harness.h"

namespace ember::testing {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr double kPi = 3.14159265358979323846;

struct UnaryCase {
  std::string name;
  UnaryOp op;
  double s_lo, s_hi;  // range of the saved tensor in the reference test (y for output-saving ops, else x)
  double x_lo, x_hi;  // range of the forward input in the finite-difference test
  std::optional<double> cmin = std::nullopt, cmax = std::nullopt;  // Clamp bounds
  double exponent = 0.0;                                           // PowScalar

  // The params the forward front end builds (ops::clamp: a missing bound is +-inf; ops::pow: p0 = exponent).
  UnaryParams params() const {
    if (op == UnaryOp::Clamp) return {cmin.value_or(-kInf), cmax.value_or(kInf)};
    if (op == UnaryOp::PowScalar) return {exponent, 0.0};
    return {};
  }
  Tensor forward(const Tensor& x) const {
    switch (op) {
      case UnaryOp::Neg: return ops::neg(x);
      case UnaryOp::Exp: return ops::exp(x);
      case UnaryOp::Log: return ops::log(x);
      case UnaryOp::Sqrt: return ops::sqrt(x);
      case UnaryOp::Rsqrt: return ops::rsqrt(x);
      case UnaryOp::Tanh: return ops::tanh(x);
      case UnaryOp::Sigmoid: return ops::sigmoid(x);
      case UnaryOp::Relu: return ops::relu(x);
      case UnaryOp::GeluTanh: return ops::gelu(x, GeluApprox::Tanh);
      case UnaryOp::GeluErf: return ops::gelu(x, GeluApprox::None);
      case UnaryOp::Silu: return ops::silu(x);
      case UnaryOp::Abs: return ops::abs(x);
      case UnaryOp::Clamp: return ops::clamp(x, cmin, cmax);
      case UnaryOp::PowScalar: return ops::pow(x, exponent);
    }
    return Tensor();
  }
  // Points where the op has a kink (finite differences are kept away from them).
  std::vector<double> kinks() const {
    if (op == UnaryOp::Relu || op == UnaryOp::Abs) return {0.0};
    if (op == UnaryOp::Clamp) return {cmin.value_or(-kInf), cmax.value_or(kInf)};
    return {};
  }
};

std::vector<UnaryCase> unary_cases() {
  std::vector<UnaryCase> cs = {
      {"neg", UnaryOp::Neg, -2, 2, -2, 2},
      {"exp", UnaryOp::Exp, 0.1, 3, -1, 1},
      {"log", UnaryOp::Log, 0.5, 2, 0.5, 2},
      {"sqrt", UnaryOp::Sqrt, 0.5, 2, 0.25, 4},
      {"rsqrt", UnaryOp::Rsqrt, 0.5, 2, 0.25, 4},
      {"tanh", UnaryOp::Tanh, -0.99, 0.99, -2, 2},
      {"sigmoid", UnaryOp::Sigmoid, 0.01, 0.99, -3, 3},
      {"relu", UnaryOp::Relu, -1, 1, -1, 1},
      {"gelu_tanh", UnaryOp::GeluTanh, -3, 3, -3, 3},
      {"gelu_erf", UnaryOp::GeluErf, -3, 3, -3, 3},
      {"silu", UnaryOp::Silu, -4, 4, -4, 4},
      {"abs", UnaryOp::Abs, -1, 1, -1, 1},
      {"clamp_both", UnaryOp::Clamp, -1, 1, -1, 1, -0.5, 0.25},
      {"clamp_min_only", UnaryOp::Clamp, -1, 1, -1, 1, -0.25, std::nullopt},
      {"clamp_max_only", UnaryOp::Clamp, -1, 1, -1, 1, std::nullopt, 0.5},
  };
  for (const auto& [name, e, lo, hi] : std::vector<std::tuple<std::string, double, double, double>>{
           {"pow_2", 2.0, -2, 2}, {"pow_3", 3.0, -1.5, 1.5}, {"pow_half", 0.5, 0.25, 2},
           {"pow_minus_1.5", -1.5, 0.5, 2}, {"pow_0", 0.0, -1, 1}}) {
    UnaryCase c{name, UnaryOp::PowScalar, lo, hi, lo, hi};
    c.exponent = e;
    cs.push_back(c);
  }
  return cs;
}

// d op / dx in float64, written from the textbook derivatives; s is the saved value (y or x, as the op saves).
double ref_derivative(const UnaryCase& c, double s) {
  switch (c.op) {
    case UnaryOp::Neg: return -1.0;
    case UnaryOp::Exp: return s;                    // (e^x)' = e^x = y
    case UnaryOp::Log: return 1.0 / s;              // 1/x
    case UnaryOp::Sqrt: return 0.5 / s;             // 1 / (2 sqrt(x))
    case UnaryOp::Rsqrt: return -0.5 * s * s * s;   // -x^(-3/2) / 2
    case UnaryOp::Tanh: return 1.0 - s * s;         // sech^2 = 1 - tanh^2
    case UnaryOp::Sigmoid: return s * (1.0 - s);
    case UnaryOp::Relu: return s > 0.0 ? 1.0 : 0.0;
    case UnaryOp::GeluErf:
      return 0.5 * (1.0 + std::erf(s / std::sqrt(2.0))) + s * std::exp(-0.5 * s * s) / std::sqrt(2.0 * kPi);
    case UnaryOp::GeluTanh: {
      const double k = std::sqrt(2.0 / kPi), u = k * (s + 0.044715 * s * s * s);
      const double sech = 1.0 / std::cosh(u);
      return 0.5 * (1.0 + std::tanh(u)) + 0.5 * s * sech * sech * k * (1.0 + 3.0 * 0.044715 * s * s);
    }
    case UnaryOp::Silu: {
      const double sg = 1.0 / (1.0 + std::exp(-s));
      return sg + s * sg * (1.0 - sg);
    }
    case UnaryOp::Abs: return s > 0.0 ? 1.0 : (s < 0.0 ? -1.0 : 0.0);
    case UnaryOp::Clamp: {
      const double lo = c.cmin.value_or(-kInf), hi = c.cmax.value_or(kInf);
      return (s >= lo && s <= hi) ? 1.0 : 0.0;
    }
    case UnaryOp::PowScalar: return c.exponent == 0.0 ? 0.0 : c.exponent * std::pow(s, c.exponent - 1.0);
  }
  return kInf;
}

Tensor ref_unary_backward(const UnaryCase& c, const Tensor& grad, const Tensor& saved) {
  const std::vector<double> g = grad.to_vector<double>(), s = saved.to_vector<double>();
  std::vector<double> out(g.size());
  for (size_t i = 0; i < g.size(); ++i) out[i] = g[i] * ref_derivative(c, s[i]);
  return from_vector(out, grad.sizes());
}

class UnaryBackwardTest : public DeviceTest {};

TEST_P(UnaryBackwardTest, MatchesReferenceNonContiguous) {
  EMBER_REQUIRE_KERNEL(unary_backward_stub);
  for (const UnaryCase& uc : unary_cases()) {
    SCOPED_TRACE("case " + uc.name);
    const UnaryParams p = uc.params();
    const UnaryOp op = uc.op;
    OpCase c{uc.name + "_backward",
             {noncontiguous_input({3, 4, 5}), noncontiguous_input({3, 4, 5}, uc.s_lo, uc.s_hi)},
             [op, p](const Inputs& t) { return ops::unary_backward(op, p, t[0], t[1]); }};
    c.reference = [uc](const Inputs& t) { return ref_unary_backward(uc, t[0], t[1]); };
    check_op(c, device());
  }
}

TEST_P(UnaryBackwardTest, BroadcastGradAndTransposedSaved) {
  EMBER_REQUIRE_KERNEL(unary_backward_stub);
  for (const UnaryCase& uc : unary_cases()) {
    SCOPED_TRACE("case " + uc.name);
    const UnaryParams p = uc.params();
    const UnaryOp op = uc.op;
    // grad has a stride-0 dim; saved is a transposed view.
    OpCase c{uc.name + "_backward", {rand_input({1, 7}).expand({6, 7}), rand_input({7, 6}, uc.s_lo, uc.s_hi)},
             [op, p](const Inputs& t) { return ops::unary_backward(op, p, t[0], t[1].transpose(0, 1)); }};
    c.reference = [uc](const Inputs& t) { return ref_unary_backward(uc, t[0], t[1].transpose(0, 1)); };
    check_op(c, device());
  }
}

// Central differences of the forward op in float64: (f(x + h) - f(x - h)) / 2h with h = 1e-6 agrees with the exact
// derivative to ~1e-9 for these smooth functions, far inside the 1e-6 tolerance; a wrong formula is off by O(1).
TEST_P(UnaryBackwardTest, MatchesFiniteDifferencesOfForward) {
  EMBER_REQUIRE_KERNEL(unary_backward_stub);
  EMBER_REQUIRE_KERNEL(unary_stub);
  const double h = 1e-6;
  const Shape shape{4, 9};
  for (const UnaryCase& uc : unary_cases()) {
    SCOPED_TRACE("case " + uc.name);
    std::vector<double> xv = rand_input(shape, uc.x_lo, uc.x_hi).to_vector<double>();
    for (double& x : xv)  // keep every point 1e-3 away from a kink, where the derivative jumps
      for (double k : uc.kinks())
        if (std::fabs(x - k) < 1e-3) x = k + (x >= k ? 1e-3 : -1e-3);
    std::vector<double> xp = xv, xm = xv;
    for (size_t i = 0; i < xv.size(); ++i) {
      xp[i] += h;
      xm[i] -= h;
    }
    const std::vector<double> g = rand_input(shape).to_vector<double>();
    const Tensor x = from_vector(xv, shape).to(device());
    const std::vector<double> fp = uc.forward(from_vector(xp, shape).to(device())).to_vector<double>();
    const std::vector<double> fm = uc.forward(from_vector(xm, shape).to(device())).to_vector<double>();
    std::vector<double> expected(xv.size());
    for (size_t i = 0; i < xv.size(); ++i) expected[i] = g[i] * (fp[i] - fm[i]) / (2.0 * h);
    const Tensor saved = unary_backward_uses_output(uc.op) ? uc.forward(x) : x;
    const Tensor actual = ops::unary_backward(uc.op, uc.params(), from_vector(g, shape).to(device()), saved);
    EXPECT_TRUE(allclose(actual, from_vector(expected, shape), Tolerance{1e-6, 1e-6}));
  }
}

TEST_P(UnaryBackwardTest, NonSmoothPointsAndExactZeros) {
  EMBER_REQUIRE_KERNEL(unary_backward_stub);
  for (DType dt : {DType::f64, DType::f32, DType::f16, DType::bf16}) {
    SCOPED_TRACE(dtype_name(dt));
    const Tensor g = from_vector<double>({2, 2, 2, 2, 2}, {5}).to(device()).to(dt);
    const Tensor x = from_vector<double>({-1, 0, 0.5, 1, 2}, {5}).to(device()).to(dt);
    auto bw = [&](UnaryOp op, UnaryParams p) { return ops::unary_backward(op, p, g, x).to_vector<double>(); };
    EXPECT_EQ(bw(UnaryOp::Relu, {}), (std::vector<double>{0, 0, 2, 2, 2}));
    EXPECT_EQ(bw(UnaryOp::Abs, {}), (std::vector<double>{-2, 0, 2, 2, 2}));
    // Clamp bounds are inclusive: the gradient passes at x == min and x == max.
    EXPECT_EQ(bw(UnaryOp::Clamp, {0, 1}), (std::vector<double>{0, 2, 2, 2, 0}));
    EXPECT_EQ(bw(UnaryOp::Clamp, {-kInf, 0.5}), (std::vector<double>{2, 2, 2, 0, 0}));
    EXPECT_EQ(bw(UnaryOp::Clamp, {0.5, kInf}), (std::vector<double>{0, 0, 2, 2, 2}));
    // pow(x, 0) is constant: its gradient is exactly 0, also at x = 0 where 0 * 0^-1 would be NaN.
    EXPECT_EQ(bw(UnaryOp::PowScalar, {0, 0}), (std::vector<double>{0, 0, 0, 0, 0}));
    EXPECT_EQ(bw(UnaryOp::PowScalar, {2, 0}), (std::vector<double>{-4, 0, 2, 4, 8}));
    EXPECT_EQ(bw(UnaryOp::Neg, {}), (std::vector<double>{-2, -2, -2, -2, -2}));
    const Tensor out = ops::unary_backward(UnaryOp::Tanh, {}, g, x);
    EXPECT_EQ(out.dtype(), dt);
    EXPECT_TRUE(out.is_contiguous());
  }
}

TEST_P(UnaryBackwardTest, EmptyTensors) {
  EMBER_REQUIRE_KERNEL(unary_backward_stub);
  const Tensor e = zeros({0, 3}, {DType::f32, device()});
  EXPECT_EQ(ops::unary_backward(UnaryOp::Exp, {}, e, e).sizes(), (Shape{0, 3}));
}

EMBER_INSTANTIATE_DEVICE_TESTS(UnaryBackwardTest);

TEST(UnaryBackward, UsesOutputForExactlyTheOpsWhoseDerivativeIsInY) {
  for (UnaryOp op : {UnaryOp::Exp, UnaryOp::Tanh, UnaryOp::Sigmoid, UnaryOp::Sqrt, UnaryOp::Rsqrt})
    EXPECT_TRUE(unary_backward_uses_output(op)) << static_cast<int>(op);
  for (UnaryOp op : {UnaryOp::Neg, UnaryOp::Log, UnaryOp::Relu, UnaryOp::GeluTanh, UnaryOp::GeluErf, UnaryOp::Silu,
                     UnaryOp::Abs, UnaryOp::Clamp, UnaryOp::PowScalar})
    EXPECT_FALSE(unary_backward_uses_output(op)) << static_cast<int>(op);
}

TEST(UnaryBackwardErrors, ShapesDTypesDevices) {
  const Tensor g = zeros({2, 3});
  EXPECT_THROW(ops::unary_backward(UnaryOp::Tanh, {}, g, zeros({3, 2})), ShapeError);
  EXPECT_THROW(ops::unary_backward(UnaryOp::Tanh, {}, g, zeros({2, 3, 1})), ShapeError);
  EXPECT_THROW(ops::unary_backward(UnaryOp::Tanh, {}, g, zeros({2, 3}, {DType::f64})), DTypeError);
  EXPECT_THROW(ops::unary_backward(UnaryOp::Tanh, {}, zeros({2, 3}, {DType::f16}), g), DTypeError);
  EXPECT_THROW(ops::unary_backward(UnaryOp::Relu, {}, zeros({2, 3}, {DType::i32}), zeros({2, 3}, {DType::i32})),
               DTypeError);
  EXPECT_THROW(ops::unary_backward(UnaryOp::Tanh, {}, g, zeros({2, 3}, {DType::f32, Device::meta()})), DeviceError);
  EXPECT_THROW(ops::unary_backward(UnaryOp::Tanh, {}, g, Tensor()), ValueError);
  EXPECT_THROW(ops::unary_backward(UnaryOp::Tanh, {}, Tensor(), g), ValueError);
  try {
    ops::unary_backward(UnaryOp::Sigmoid, {}, g, zeros({3, 2}));
    ADD_FAILURE() << "no error";
  } catch (const ShapeError& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("sigmoid_backward"), std::string::npos) << msg;
    EXPECT_NE(msg.find("[3, 2]"), std::string::npos) << msg;
  }
  const Tensor meta = empty({4, 5}, {DType::bf16, Device::meta()});
  const Tensor out = ops::unary_backward(UnaryOp::Exp, {}, meta, meta);
  EXPECT_EQ(out.sizes(), (Shape{4, 5}));
  EXPECT_TRUE(out.device().is_meta());
  EXPECT_EQ(out.dtype(), DType::bf16);
}

}  // namespace
}  // namespace ember::testing

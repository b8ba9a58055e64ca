// Finite-difference gradient checks of the elementwise ops, including broadcasting and non-contiguous inputs.
#include "tests/harness/grad_check.h"

namespace ember::testing {
namespace {

class ElementwiseGrad : public DeviceTest {};

TEST_P(ElementwiseGrad, BinaryBroadcastNoncontiguous) {
  EMBER_REQUIRE_KERNEL(binary_stub);
  EMBER_REQUIRE_KERNEL(unary_backward_stub);
  using F = Tensor (*)(const Tensor&, const Tensor&);
  const std::pair<const char*, F> ops_list[] = {
      {"add", [](const Tensor& a, const Tensor& b) { return a + b; }},
      {"sub", [](const Tensor& a, const Tensor& b) { return a - b; }},
      {"mul", [](const Tensor& a, const Tensor& b) { return a * b; }},
      {"div", [](const Tensor& a, const Tensor& b) { return a / b; }},
      {"maximum", [](const Tensor& a, const Tensor& b) { return maximum(a, b); }},
      {"minimum", [](const Tensor& a, const Tensor& b) { return minimum(a, b); }},
  };
  for (const auto& [name, f] : ops_list) {
    GradCase c{name, {noncontiguous_input({3, 4}), rand_input({4}, 0.5, 1.5)},
               [f = f](const Inputs& in) { return f(in[0], in[1]); }};
    check_grad(c, device());
    GradCase d{std::string(name) + " (broadcast both)", {rand_input({2, 1, 3}), rand_input({4, 1}, 0.5, 1.5)},
               [f = f](const Inputs& in) { return f(in[0], in[1]); }};
    check_grad(d, device());
  }
}

TEST_P(ElementwiseGrad, Pow) {
  EMBER_REQUIRE_KERNEL(unary_backward_stub);
  GradCase c{"pow", {rand_input({3, 4}, 0.5, 2.0), rand_input({4}, -1.5, 1.5)},
             [](const Inputs& in) { return pow(in[0], in[1]); }};
  check_grad(c, device());
  GradCase s{"pow scalar", {noncontiguous_input({3, 4}, 0.5, 2.0)}, [](const Inputs& in) { return pow(in[0], 2.5); }};
  check_grad(s, device());
}

TEST_P(ElementwiseGrad, ScalarOperands) {
  EMBER_REQUIRE_KERNEL(binary_stub);
  GradCase c{"scalar ops", {noncontiguous_input({5, 3})},
             [](const Inputs& in) { return ((in[0] + 2.0) * 3.0 - 1.0) / 4.0; }};
  check_grad(c, device());
}

TEST_P(ElementwiseGrad, Unary) {
  EMBER_REQUIRE_KERNEL(unary_backward_stub);
  using F = Tensor (*)(const Tensor&);
  const std::pair<const char*, F> ops_list[] = {
      {"neg", [](const Tensor& x) { return -x; }},
      {"exp", [](const Tensor& x) { return exp(x); }},
      {"log", [](const Tensor& x) { return log(abs(x) + 0.5); }},
      {"sqrt", [](const Tensor& x) { return sqrt(abs(x) + 0.5); }},
      {"rsqrt", [](const Tensor& x) { return rsqrt(abs(x) + 0.5); }},
      {"tanh", [](const Tensor& x) { return tanh(x); }},
      {"sigmoid", [](const Tensor& x) { return sigmoid(x); }},
      {"relu", [](const Tensor& x) { return relu(x); }},
      {"gelu", [](const Tensor& x) { return gelu(x); }},
      {"gelu_tanh", [](const Tensor& x) { return gelu(x, GeluApprox::Tanh); }},
      {"silu", [](const Tensor& x) { return silu(x); }},
      {"abs", [](const Tensor& x) { return abs(x); }},
      {"clamp", [](const Tensor& x) { return clamp(x, -0.5, 0.4); }},
      {"clamp_min", [](const Tensor& x) { return clamp(x, -0.5, std::nullopt); }},
  };
  for (const auto& [name, f] : ops_list) {
    GradCase c{name, {noncontiguous_input({4, 3}, -2.0, 2.0)}, [f = f](const Inputs& in) { return f(in[0]); }};
    check_grad(c, device());
  }
}

TEST_P(ElementwiseGrad, WhereAndCast) {
  EMBER_REQUIRE_KERNEL(where_stub);
  const Tensor cond = gt(rand_input({3, 4}), scalar_tensor(0.0, DType::f64));
  GradCase c{"where", {cond, rand_input({3, 4}), noncontiguous_input({4})},
             [](const Inputs& in) { return where(in[0], in[1], in[2]); }};
  check_grad(c, device());
  GradCase k{"cast", {noncontiguous_input({3, 4})},
             [](const Inputs& in) { return cast(cast(in[0], DType::f32), DType::f64) * in[0]; }};
  // The f32 round trip rounds the perturbation: a wide step (exact for this quadratic) keeps that error ~1e-5.
  k.eps = 1e-2;
  k.tolerance = {1e-4, 1e-5};
  k.dtypes = {};
  check_grad(k, device());
}

EMBER_INSTANTIATE_DEVICE_TESTS(ElementwiseGrad);

}  // namespace
}  // namespace ember::testing

// Anomaly mode: a NaN/Inf produced by a forward op or a backward node raises AnomalyError naming the op and the
// shapes; with the mode off the same computations run through and the non-finite values land in .grad.
#include <cmath>

#include "tests/autograd/engine_test_util.h"

namespace ember::testing {
namespace {

using autograd::AnomalyError;
using autograd::DetectAnomalyGuard;

TEST(Anomaly, GuardSetsAndRestoresTheMode) {
  EXPECT_FALSE(autograd::AnomalyMode::is_enabled());
  {
    DetectAnomalyGuard on;
    EXPECT_TRUE(autograd::AnomalyMode::is_enabled());
    {
      DetectAnomalyGuard off(false);
      EXPECT_FALSE(autograd::AnomalyMode::is_enabled());
    }
    EXPECT_TRUE(autograd::AnomalyMode::is_enabled());
  }
  EXPECT_FALSE(autograd::AnomalyMode::is_enabled());
}

TEST(Anomaly, HasNonFinite) {
  EXPECT_FALSE(autograd::has_non_finite(vals({1, -2, 0})));
  EXPECT_TRUE(autograd::has_non_finite(vals({1, NAN, 0})));
  EXPECT_TRUE(autograd::has_non_finite(vals({1, -INFINITY}, {}, DType::f32)));
  EXPECT_TRUE(autograd::has_non_finite(vals({INFINITY}, {}, DType::bf16)));
  EXPECT_FALSE(autograd::has_non_finite(vals({1e300, -1e300})));
  EXPECT_FALSE(autograd::has_non_finite(arange(0, 5, 1)));
  EXPECT_FALSE(autograd::has_non_finite(Tensor()));
}

TEST(Anomaly, ForwardLogOfANegativeNumberNamesTheOpAndShape) {
  Tensor x = vals({1, 2, 3, 4, 5, 6}, {2, 3}, DType::f32);
  x.requires_grad_();
  DetectAnomalyGuard guard;
  Tensor a = x * 2.0;
  Tensor b = a - 5.0;  // [-3, -1, 1, 3, 5, 7]: finite
  const std::string msg = error_message<AnomalyError>([&] { (void)log(b); });
  EXPECT_TRUE(contains(msg, "log")) << msg;
  EXPECT_TRUE(contains(msg, "[2, 3]")) << msg;
  EXPECT_TRUE(contains(msg, "f32")) << msg;
}

TEST(Anomaly, ForwardNonFiniteInputIsReported) {
  DetectAnomalyGuard guard;
  Tensor x = vals({1, NAN});
  x.requires_grad_();
  const std::string msg = error_message<AnomalyError>([&] { (void)(x * 2.0); });
  EXPECT_TRUE(contains(msg, "mul")) << msg;
  EXPECT_TRUE(contains(msg, "already non-finite")) << msg;
}

TEST(Anomaly, BackwardSqrtAtZeroNamesTheBackwardNode) {
  // sqrt(0) = 0 is finite; its derivative 1/(2 sqrt(0)) is inf.
  Tensor x = vals({0, 1, 4}, {3}, DType::f32);
  x.requires_grad_();
  DetectAnomalyGuard guard;
  Tensor y = sqrt(x) * vals({1, 1, 1}, {}, DType::f32);
  EXPECT_TRUE(values_near(y, {0, 1, 2}));
  const std::string msg = error_message<AnomalyError>([&] { y.backward(vals({1, 1, 1}, {}, DType::f32)); });
  EXPECT_TRUE(contains(msg, "SqrtBackward")) << msg;
  EXPECT_TRUE(contains(msg, "sqrt(f32[3])")) << msg;
  EXPECT_FALSE(x.grad().defined()) << "the pass stopped before reaching the leaf";
}

TEST(Anomaly, BackwardNaNPlantedByAHook) {
  Tensor x = vals({1, 2});
  x.requires_grad_();
  Tensor w = vals({3, 4});
  Tensor h = x * w;
  // The replacement comes from a factory, not a recorded op (whose forward check would fire first).
  autograd::register_hook(h, [](const Tensor& g) { return full(g.sizes(), NAN, {g.dtype(), g.device()}); });
  Tensor z = h * 2.0;
  DetectAnomalyGuard guard;
  const std::string msg = error_message<AnomalyError>([&] { z.backward(vals({1, 1})); });
  // The hook's NaN enters MulBackward of h = x * w, which then returns it for x.
  EXPECT_TRUE(contains(msg, "MulBackward")) << msg;
  EXPECT_TRUE(contains(msg, "mul(f64[2], f64[2])")) << msg;
}

TEST(Anomaly, NaNComputedInsideAHookIsCaughtByTheNextBackwardNode) {
  // Hooks run with grad mode off, so their ops are not recorded; the NaN they plant is caught by the node that
  // consumes it, which names its forward op.
  Tensor x = vals({1, 2});
  x.requires_grad_();
  Tensor h = x * vals({3, 4});
  autograd::register_hook(h, [](const Tensor& g) { return g * NAN; });
  DetectAnomalyGuard guard;
  const std::string msg = error_message<AnomalyError>([&] { (h * 2.0).backward(vals({1, 1})); });
  EXPECT_TRUE(contains(msg, "MulBackward")) << msg;
  EXPECT_TRUE(contains(msg, "mul(f64[2], f64[2])")) << msg;
}

TEST(Anomaly, InfThatCameInThroughAnInputIsLegitimate) {
  // Attention masks fill scores with -inf: the where/softmax of a masked row is not an anomaly.
  DetectAnomalyGuard guard;
  Tensor x = vals({1, 2, 3});
  x.requires_grad_();
  const Tensor mask = gt(vals({1, 0, 1}), vals({0.5, 0.5, 0.5}));
  Tensor scores = where(mask, x, full({}, -INFINITY, DType::f64));
  Tensor p = softmax(scores, 0);
  EXPECT_NO_THROW(p.backward(vals({1, 0, 0})));
}

TEST(Anomaly, InfProducedFromFiniteInputsIsReported) {
  DetectAnomalyGuard guard;
  Tensor x = vals({0, 1});
  x.requires_grad_();
  const std::string msg = error_message<AnomalyError>([&] { (void)log(x); });
  EXPECT_TRUE(contains(msg, "'log'")) << msg;
}

TEST(Anomaly, UnrecordedOpsAreNotChecked) {
  DetectAnomalyGuard guard;
  NoGradGuard no_grad;
  EXPECT_NO_THROW((void)log(vals({0, -1})));
}

TEST(Anomaly, OffNoError) {
  Tensor x = vals({0, 1}, {}, DType::f32);
  x.requires_grad_();
  ASSERT_FALSE(autograd::AnomalyMode::is_enabled());
  Tensor y = sqrt(x);
  ASSERT_NO_THROW(y.backward(vals({1, 1}, {}, DType::f32)));
  const std::vector<double> g = elems(x.grad());
  EXPECT_TRUE(std::isinf(g[0]) && g[0] > 0);
  EXPECT_NEAR(g[1], 0.5, 1e-7);
  Tensor n = vals({-1});
  Tensor l;
  ASSERT_NO_THROW(l = log(n));
  EXPECT_TRUE(std::isnan(elems(l)[0]));
}

TEST(Anomaly, FiniteComputationPassesUnderAnomalyMode) {
  Tensor x = vals({1, 4});
  x.requires_grad_();
  DetectAnomalyGuard guard;
  Tensor y = log(sqrt(x) + 1.0) * 2.0;
  y.backward(vals({1, 1}));
  // d/dx 2 log(sqrt(x) + 1) = 1 / ((sqrt(x) + 1) sqrt(x)).
  EXPECT_TRUE(values_near(x.grad(), {1.0 / 2.0, 1.0 / (3.0 * 2.0)}, 1e-12));
}

}  // namespace
}  // namespace ember::testing

// The backward engine against hand-computed gradients: accumulation into .grad across calls and paths (including
// broadcast paths), retain_graph, autograd::grad (no .grad side effects, allow_unused, non-leaf inputs, several
// outputs), and the errors of backward's entry point.
#include <cmath>

#include "tests/autograd/engine_test_util.h"

namespace ember::testing {
namespace {

using autograd::TensorList;

Tensor leaf(const std::vector<double>& v, Shape shape = {}) {
  Tensor t = vals(v, std::move(shape));
  t.requires_grad_();
  return t;
}

// --- 1. accumulation ------------------------------------------------------------------------------------------

TEST(Engine, TwoBackwardCallsAddIntoGrad) {
  Tensor x = leaf({1, 2, 3});
  const Tensor w = vals({4, 5, 6});
  (x * w).backward(vals({1, 1, 1}));
  EXPECT_TRUE(values_near(x.grad(), {4, 5, 6}));
  (x * w).backward(vals({1, 2, 3}));  // a fresh graph: d/dx = v * w, added to the first
  EXPECT_TRUE(values_near(x.grad(), {4 + 4, 5 + 10, 6 + 18}));
  EXPECT_EQ(x.grad().dtype(), DType::f64);
  EXPECT_EQ(x.grad().sizes(), (Shape{3}));
  EXPECT_FALSE(x.grad().requires_grad());
}

TEST(Engine, LaterGradientsAddIntoTheHeldGradInPlaceAndSetGradClears) {
  Tensor x = leaf({1, 2});
  (x * vals({3, 4})).backward(vals({1, 1}));
  const Tensor first = x.grad();
  const int64_t version = first.version();
  (x * vals({3, 4})).backward(vals({1, 1}));
  // PyTorch's rule (Note [Gradient accumulation]): the sum goes into the existing .grad, so no second weight-sized
  // tensor is made; a .grad the user holds sees it, and the write is on its version counter.
  EXPECT_TRUE(values_near(first, {6, 8}));
  EXPECT_EQ(first.unsafe_impl(), x.grad().unsafe_impl());
  EXPECT_GT(first.version(), version);
  EXPECT_TRUE(values_near(x.grad(), {6, 8}));
  x.set_grad(Tensor());
  EXPECT_FALSE(x.grad().defined());
  (x * vals({3, 4})).backward(vals({1, 1}));
  EXPECT_TRUE(values_near(x.grad(), {3, 4})) << "after clearing, accumulation starts from zero";
  x.set_grad(vals({10, 20}));
  (x * vals({3, 4})).backward(vals({1, 1}));
  EXPECT_TRUE(values_near(x.grad(), {13, 24}));
}

TEST(Engine, LeafUsedTwiceInOneGraphSumsGradients) {
  // z = x*x + (x+x): dz/dx = 2x + 2.
  Tensor x = leaf({1, -2, 3});
  Tensor z = x * x + (x + x);
  z.backward(vals({1, 10, 100}));
  EXPECT_TRUE(values_near(x.grad(), {1 * (2 + 2), 10 * (-4 + 2), 100 * (6 + 2)}));
}

TEST(Engine, SameTensorAsBothOperands) {
  // add passes one gradient tensor to both operands: the two contributions must add, not alias.
  Tensor x = leaf({1, 2});
  (x + x).backward(vals({3, 5}));
  EXPECT_TRUE(values_near(x.grad(), {6, 10}));
  Tensor y = leaf({2, 3});
  (y * y).backward(vals({1, 1}));
  EXPECT_TRUE(values_near(y.grad(), {4, 6}));
}

TEST(Engine, LeafThroughTwoBroadcastPaths) {
  // x: [1,3]; p1 = x * a (a [2,3]) -> [2,3]; p2 = x * b (b [4,1,1]) -> [4,1,3]; z = p1 + p2 -> [4,2,3].
  // dz/dx[j] = sum_{i,k} v[i,k,j] * (a[k,j] + b[i]).
  const std::vector<double> xv = {0.5, -1.0, 2.0};
  const std::vector<double> av = {1, 2, 3, 4, 5, 6};
  const std::vector<double> bv = {1, -1, 2, 0.5};
  std::vector<double> vv(24);
  for (size_t i = 0; i < vv.size(); ++i) vv[i] = 0.25 * static_cast<double>(i) - 2.0;
  Tensor x = leaf(xv, {1, 3});
  Tensor z = x * vals(av, {2, 3}) + x * vals(bv, {4, 1, 1});
  ASSERT_EQ(z.sizes(), (Shape{4, 2, 3}));
  z.backward(vals(vv, {4, 2, 3}));
  std::vector<double> expected(3, 0.0);
  for (int i = 0; i < 4; ++i)
    for (int k = 0; k < 2; ++k)
      for (int j = 0; j < 3; ++j) expected[j] += vv[(i * 2 + k) * 3 + j] * (av[k * 3 + j] + bv[i]);
  ASSERT_EQ(x.grad().sizes(), (Shape{1, 3}));
  EXPECT_TRUE(values_near(x.grad(), expected, 1e-12));
}

TEST(Engine, GradientFlowsThroughDtypeCast) {
  Tensor x = leaf({1.5, -2.0});
  Tensor y = cast(x, DType::f32) * vals({2, 3}, {}, DType::f32);
  y.backward(vals({1, 1}, {}, DType::f32));
  EXPECT_EQ(x.grad().dtype(), DType::f64);
  EXPECT_TRUE(values_near(x.grad(), {2, 3}));
}

TEST(Engine, ImpliedSeedForOneElementOutput) {
  Tensor x = leaf({3});
  Tensor y = x * x * x;  // d/dx = 3x^2 = 27
  y.backward();
  EXPECT_TRUE(values_near(x.grad(), {27}));
  Tensor s0 = vals({2}).reshape({}).detach();
  s0.requires_grad_();
  (s0 * s0).backward();
  EXPECT_TRUE(values_near(s0.grad(), {4}));
}

TEST(Engine, DiamondGraphRunsEachNodeOnce) {
  // h = x*w; a = h*2; b = h*3; z = a*b = 6h^2; dz/dx = 12 h w.
  Tensor x = leaf({1, 2});
  const Tensor w = vals({3, -1});
  Tensor h = x * w;
  Tensor z = (h * 2.0) * (h * 3.0);
  z.backward(vals({1, 1}));
  EXPECT_TRUE(values_near(x.grad(), {12 * 3 * 3, 12 * -2 * -1}));
}

TEST(Engine, BackwardOfSeveralOutputsAtOnce) {
  // y1 = x*2, y2 = (x*2)*x: backward({y1, y2}, {v1, v2}) with y2 depending on y1's graph.
  Tensor x = leaf({1, 3});
  Tensor y1 = x * 2.0;
  Tensor y2 = y1 * x;  // 2x^2
  autograd::backward({y1, y2}, {vals({1, 1}), vals({1, 10})});
  EXPECT_TRUE(values_near(x.grad(), {2 + 1 * 4 * 1, 2 + 10 * 4 * 3}));
}

TEST(Engine, SameOutputTwiceSumsItsSeeds) {
  Tensor x = leaf({1, 2});
  Tensor y = x * vals({3, 4});
  autograd::backward({y, y}, {vals({1, 1}), vals({10, 100})});
  EXPECT_TRUE(values_near(x.grad(), {33, 404}));
}

TEST(Engine, DeepChainDoesNotRecurse) {
  // 300000 nodes (an unrolled recurrence): backward walks the graph and the graph is destroyed without recursion,
  // either of which would overflow the stack.
  Tensor x = leaf({1.0});
  {
    Tensor y = x;
    for (int i = 0; i < 300000; ++i) y = y * 1.0;
    y.backward(Tensor(), /*retain_graph=*/true);
  }  // the last reference to the chain goes here
  EXPECT_TRUE(values_near(x.grad(), {1.0}));
  {
    Tensor y = x;
    for (int i = 0; i < 300000; ++i) y = y * 1.0;
  }  // never differentiated
}

TEST(Engine, ScalarLeafBroadcastAgainstAMatrix) {
  // s (0-d) * a ([2,3]): ds = sum(v * a).
  Tensor s = vals({2}).reshape({}).detach();
  s.requires_grad_();
  Tensor y = s * vals({1, 2, 3, 4, 5, 6}, {2, 3});
  y.backward(vals({1, 0, -1, 2, 0, 1}, {2, 3}));
  ASSERT_EQ(s.grad().dim(), 0);
  EXPECT_TRUE(values_near(s.grad(), {1 - 3 + 8 + 6}));
}

TEST(Engine, ExpandedSeedGradient) {
  // A stride-0 seed (a broadcast scalar) reaches a leaf's .grad as a dense copy of its own.
  Tensor x = leaf({1, 2, 3, 4, 5, 6}, {2, 3});
  const Tensor seed = vals({2}).reshape({}).expand({2, 3});
  x.backward(seed);
  EXPECT_TRUE(values_near(x.grad(), {2, 2, 2, 2, 2, 2}));
  EXPECT_TRUE(x.grad().is_contiguous());
  Tensor w = leaf({1, 2, 3, 4, 5, 6}, {2, 3});
  (w * w).backward(seed);
  EXPECT_TRUE(values_near(w.grad(), {4, 8, 12, 16, 20, 24}));
  {
    NoGradGuard no_grad;
    x.grad().fill_(0.0);
  }
  EXPECT_TRUE(values_near(seed, {2, 2, 2, 2, 2, 2})) << "the seed must not alias a .grad";
}

TEST(Engine, BackwardOnALeafItself) {
  Tensor x = leaf({1, 2});
  const Tensor v = vals({3, 4});
  x.backward(v);
  EXPECT_TRUE(values_near(x.grad(), {3, 4}));
  {
    NoGradGuard no_grad;
    x.grad().fill_(0.0);
  }
  EXPECT_TRUE(values_near(v, {3, 4})) << "the caller's gradient must not become .grad itself";
}

TEST(Engine, FailedBackwardRestoresGradMode) {
  Tensor x = leaf({1, 2});
  Tensor w = vals({3, 4});
  Tensor y = x * w;
  w.fill_(0.0);
  EXPECT_THROW(y.backward(vals({1, 1})), ValueError);
  EXPECT_TRUE(GradMode::is_enabled());
  EXPECT_TRUE((x * 2.0).requires_grad());
}

// --- 2. retain_graph ------------------------------------------------------------------------------------------

TEST(Engine, SecondBackwardWithoutRetainGraphRaises) {
  Tensor x = leaf({1, 2});
  Tensor w = leaf({3, 4});
  Tensor y = x * w;  // MulBackward saves x and w
  y.backward(vals({1, 1}));
  const std::string msg = error_message<ValueError>([&] { y.backward(vals({1, 1})); });
  EXPECT_TRUE(contains(msg, "retain_graph")) << msg;
  EXPECT_TRUE(contains(msg, "MulBackward")) << msg;
  EXPECT_TRUE(values_near(x.grad(), {3, 4})) << "the failed pass must not have touched .grad";
}

TEST(Engine, RetainGraphAllowsASecondBackward) {
  Tensor x = leaf({1, 2});
  Tensor w = leaf({3, 4});
  Tensor y = exp(x * w);
  const double e1 = std::exp(3.0), e2 = std::exp(8.0);
  y.backward(vals({1, 1}), /*retain_graph=*/true);
  EXPECT_TRUE(values_near(x.grad(), {3 * e1, 4 * e2}, 1e-9));
  y.backward(vals({1, 1}), /*retain_graph=*/true);
  EXPECT_TRUE(values_near(x.grad(), {6 * e1, 8 * e2}, 1e-9));
  EXPECT_TRUE(values_near(w.grad(), {2 * e1, 4 * e2}, 1e-9));
  y.backward(vals({1, 1}));  // the last one frees the graph
  EXPECT_TRUE(values_near(w.grad(), {3 * e1, 6 * e2}, 1e-9));
  EXPECT_THROW(y.backward(vals({1, 1})), ValueError);
}

// --- 3. autograd::grad ----------------------------------------------------------------------------------------

TEST(Engine, GradReturnsGradientsAndLeavesDotGradAlone) {
  Tensor x = leaf({1, 2, 3});
  Tensor w = leaf({4, 5, 6});
  Tensor y = x * w;
  const TensorList g = autograd::grad({y}, {x}, {vals({1, 2, 3})});
  ASSERT_EQ(g.size(), 1u);
  EXPECT_TRUE(values_near(g[0], {4, 10, 18}));
  EXPECT_FALSE(g[0].requires_grad());
  EXPECT_FALSE(x.grad().defined());
  EXPECT_FALSE(w.grad().defined()) << "grad() w.r.t. x must not accumulate into w.grad either";
}

TEST(Engine, GradDoesNotTouchExistingGradOrRunPostAccumulateHooks) {
  Tensor x = leaf({1, 2});
  x.set_grad(vals({7, 7}));
  int post = 0;
  auto h = autograd::register_post_accumulate_grad_hook(x, [&](const Tensor&) { ++post; });
  const TensorList g = autograd::grad({x * x}, {x}, {vals({1, 1})});
  EXPECT_TRUE(values_near(g[0], {2, 4}));
  EXPECT_TRUE(values_near(x.grad(), {7, 7}));
  EXPECT_EQ(post, 0);
  h.remove();
}

TEST(Engine, GradAllowUnused) {
  Tensor x = leaf({1, 2});
  Tensor u = leaf({5, 6});
  Tensor y = x * x;
  const std::string msg = error_message<ValueError>(
      [&] { autograd::grad({y}, {x, u}, {vals({1, 1})}, /*retain_graph=*/true); });
  EXPECT_TRUE(contains(msg, "allow_unused")) << msg;
  const TensorList g = autograd::grad({y}, {x, u}, {vals({1, 1})}, false, /*allow_unused=*/true);
  ASSERT_EQ(g.size(), 2u);
  EXPECT_TRUE(values_near(g[0], {2, 4}));
  EXPECT_FALSE(g[1].defined());
  EXPECT_FALSE(u.grad().defined());
}

TEST(Engine, GradWithRespectToAnIntermediate) {
  // h = x*w; z = h*h*u. dz/dh = 2 h u; dz/dx = 2 h u w.
  Tensor x = leaf({1, 2});
  const Tensor w = vals({3, -1});
  const Tensor u = vals({0.5, 2});
  Tensor h = x * w;
  Tensor z = h * h * u;
  const TensorList g = autograd::grad({z}, {h, x}, {vals({1, 1})});
  EXPECT_TRUE(values_near(g[0], {2 * 3 * 0.5, 2 * -2 * 2}));
  EXPECT_TRUE(values_near(g[1], {2 * 3 * 0.5 * 3, 2 * -2 * 2 * -1}));
  EXPECT_FALSE(x.grad().defined());
  EXPECT_FALSE(h.grad().defined());
}

TEST(Engine, GradOfAnOutputWithRespectToItself) {
  Tensor x = leaf({1, 2});
  Tensor y = x * 3.0;
  const TensorList g = autograd::grad({y}, {y}, {vals({4, 5})});
  EXPECT_TRUE(values_near(g[0], {4, 5}));
}

TEST(Engine, GradWithSeveralOutputsAndGradOutputs) {
  // z1 = x*w, z2 = x*x: with seeds v1, v2, dx = v1*w + 2 x v2, dw = v1*x.
  Tensor x = leaf({1, 2});
  Tensor w = leaf({3, 4});
  Tensor z1 = x * w;
  Tensor z2 = x * x;
  const TensorList g = autograd::grad({z1, z2}, {x, w}, {vals({1, 10}), vals({100, 1000})});
  EXPECT_TRUE(values_near(g[0], {1 * 3 + 2 * 1 * 100, 10 * 4 + 2 * 2 * 1000}));
  EXPECT_TRUE(values_near(g[1], {1 * 1, 10 * 2}));
  EXPECT_FALSE(x.grad().defined());
  EXPECT_FALSE(w.grad().defined());
}

TEST(Engine, GradOfBroadcastInputHasTheInputsShape) {
  Tensor b = leaf({1, 2, 3}, {1, 3});
  Tensor a = vals({1, 2, 3, 4, 5, 6}, {2, 3});
  const TensorList g = autograd::grad({a * b}, {b}, {vals({1, 1, 1, 1, 1, 1}, {2, 3})});
  ASSERT_EQ(g[0].sizes(), (Shape{1, 3}));
  EXPECT_TRUE(values_near(g[0], {5, 7, 9}));
}

TEST(Engine, GradInputThatDoesNotRequireGradRaises) {
  Tensor x = leaf({1});
  Tensor c = vals({2});
  EXPECT_THROW(autograd::grad({x * c}, {c}, {vals({1})}), ValueError);
}

// --- 11. errors -----------------------------------------------------------------------------------------------

TEST(Engine, BackwardOnATensorWithoutGradRaises) {
  Tensor c = vals({1, 2});
  const std::string msg = error_message<ValueError>([&] { (c * c).backward(vals({1, 1})); });
  EXPECT_TRUE(contains(msg, "does not require grad")) << msg;
  EXPECT_THROW(c.backward(vals({1, 1})), ValueError);
}

TEST(Engine, BackwardOnANonScalarWithoutGradientRaises) {
  Tensor x = leaf({1, 2});
  const std::string msg = error_message<ValueError>([&] { (x * x).backward(); });
  EXPECT_TRUE(contains(msg, "one-element")) << msg;
  EXPECT_FALSE(x.grad().defined());
}

TEST(Engine, GradientOfTheWrongShapeRaises) {
  Tensor x = leaf({1, 2, 3});
  Tensor y = x * x;
  const std::string msg = error_message<ShapeError>([&] { y.backward(vals({1, 1})); });
  EXPECT_TRUE(contains(msg, "[2]") && contains(msg, "[3]")) << msg;
  EXPECT_THROW(y.backward(vals({1, 1, 1}, {3, 1})), ShapeError);
  EXPECT_THROW(autograd::backward({y}, {vals({1, 1, 1}), vals({1, 1, 1})}), ValueError);  // count mismatch
  EXPECT_FALSE(x.grad().defined());
}

TEST(Engine, GradientOfAnotherDtypeIsCast) {
  Tensor x = leaf({1, 2});
  (x * x).backward(vals({1, 1}, {}, DType::f32));
  EXPECT_EQ(x.grad().dtype(), DType::f64);
  EXPECT_TRUE(values_near(x.grad(), {2, 4}));
}

}  // namespace
}  // namespace ember::testing

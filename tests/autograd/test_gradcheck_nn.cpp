// Finite-difference gradient checks of the neural-network ops (softmax, log_softmax, layer norm, the fused residual
// add + layer norm and bias + GELU, embedding, conv2d, max/avg pool2d, dropout) on non-contiguous inputs, plus
// hand-computed gradients where finite differences cannot reach (dropout's mask, embedding's repeated rows), the
// outputs that must carry no history, and the fused add_layer_norm against the composed add and layer_norm.
#include <algorithm>
#include <numeric>
#include <optional>
#include <random>

#include "ember/autograd/engine.h"
#include "tests/harness/grad_check.h"

namespace ember::testing {
namespace {

class NNGrad : public DeviceTest {};

// The elementwise and reduction kernels the composed backward formulas (softmax, layer norm, dropout) run on.
#define EMBER_REQUIRE_ELEMENTWISE()    \
  EMBER_REQUIRE_KERNEL(binary_stub); \
  EMBER_REQUIRE_KERNEL(unary_stub);  \
  EMBER_REQUIRE_KERNEL(reduce_stub)

// Values without ties (a seeded permutation of 0..n-1 scaled into [-1, 1)), laid out non-contiguously: the last two
// dims are built transposed. Max pooling then has one winner per window, at least 2/n from the runner-up, so central
// differences with a small step never switch winners.
Tensor distinct_input(const Shape& shape) {
  const int64_t n = numel_of(shape);
  std::vector<double> v(static_cast<size_t>(n));
  std::iota(v.begin(), v.end(), 0.0);
  std::mt19937_64 rng(next_seed());
  std::shuffle(v.begin(), v.end(), rng);
  for (double& x : v) x = 2.0 * x / static_cast<double>(n) - 1.0;
  Shape t = shape;
  std::swap(t[t.size() - 1], t[t.size() - 2]);
  const int64_t d = static_cast<int64_t>(shape.size());
  return from_vector(v, t).transpose(d - 2, d - 1);
}

// The gradient of fn(x) for the upstream gradient `g`, with x a fresh leaf on the device.
Tensor grad_of(const std::function<Tensor(const Tensor&)>& fn, const Tensor& x_in, const Tensor& g) {
  const Tensor x = x_in.detach();
  x.requires_grad_();
  const Tensor out = fn(x);
  return autograd::grad({out}, {x}, {g}, false, false)[0];
}

Tensor ones_on(const Shape& shape, Device device) { return ones(shape, {DType::f64, device}); }

// ---- softmax -------------------------------------------------------------------------------------------------

TEST_P(NNGrad, SoftmaxAndLogSoftmax) {
  EMBER_REQUIRE_KERNEL(softmax_stub);
  EMBER_REQUIRE_ELEMENTWISE();
  for (bool log : {false, true}) {
    for (int64_t dim : {0, 1, -1}) {
      GradCase c{std::string(log ? "log_softmax" : "softmax") + " dim " + std::to_string(dim),
                 {noncontiguous_input({3, 4, 5}, -2.0, 2.0)},
                 [log, dim](const Inputs& in) { return log ? log_softmax(in[0], dim) : softmax(in[0], dim); }};
      c.dtypes = {DType::f32, DType::f16, DType::bf16};
      check_grad(c, device());
    }
    GradCase s{std::string(log ? "log_softmax" : "softmax") + " 0-d", {rand_input({})},
               [log](const Inputs& in) { return log ? log_softmax(in[0], 0) : softmax(in[0], -1); }};
    check_grad(s, device());
  }
}

// ---- layer norm ------------------------------------------------------------------------------------------------

TEST_P(NNGrad, LayerNorm) {
  EMBER_REQUIRE_KERNEL(layer_norm_stub);
  EMBER_REQUIRE_ELEMENTWISE();
  const std::vector<Shape> normalized = {{5}, {4, 5}};
  for (const Shape& ns : normalized) {
    for (int affine = 0; affine < 4; ++affine) {
      const bool has_w = (affine & 1) != 0, has_b = (affine & 2) != 0;
      GradCase c{"layer_norm " + shape_str(ns) + (has_w ? " weight" : "") + (has_b ? " bias" : ""),
                 {noncontiguous_input({3, 4, 5}, -2.0, 2.0), has_w ? rand_input(ns, 0.5, 1.5) : Tensor(),
                  has_b ? noncontiguous_input(ns) : Tensor()},
                 [ns](const Inputs& in) { return layer_norm(in[0], ns, in[1], in[2], 1e-5); }};
      c.dtypes = {DType::f32, DType::f16, DType::bf16};
      check_grad(c, device());
    }
  }
  // No leading dims: one row, and the weight/bias gradients are not sums over anything.
  GradCase whole{"layer_norm over every dim",
                 {noncontiguous_input({4, 5}), rand_input({4, 5}, 0.5, 1.5), rand_input({4, 5})},
                 [](const Inputs& in) { return layer_norm(in[0], {4, 5}, in[1], in[2]); }};
  check_grad(whole, device());
  // Only the weight (x and bias as constants) and only x.
  for (size_t wrt : {size_t{0}, size_t{1}}) {
    GradCase part{"layer_norm wrt " + std::to_string(wrt),
                  {rand_input({2, 6}), rand_input({6}, 0.5, 1.5), rand_input({6})},
                  [](const Inputs& in) { return layer_norm(in[0], {6}, in[1], in[2]); }};
    part.wrt = {wrt};
    check_grad(part, device());
  }
}

TEST_P(NNGrad, LayerNormStatisticsCarryNoHistory) {
  EMBER_REQUIRE_KERNEL(layer_norm_stub);
  const Tensor x = rand_input({2, 3}).to(device(), DType::f16);
  x.requires_grad_();
  const LayerNormResult r = layer_norm_with_stats(x, {3}, Tensor(), Tensor());
  EXPECT_TRUE(r.out.requires_grad());
  EXPECT_EQ(r.out.grad_fn_name(), "LayerNormBackward");
  EXPECT_FALSE(r.mean.requires_grad());
  EXPECT_FALSE(r.rstd.requires_grad());
  EXPECT_EQ(r.mean.dtype(), DType::f32);
}

// ---- residual add + layer norm, bias + GELU ------------------------------------------------------------------

// Which outputs of add_layer_norm the checked function reads: both (sum * c1 + out * c2 with random constants c1, c2),
// only out, or only sum.
enum class AddNormUse { Both, Out, Sum };

// add_layer_norm over in[0] (x), in[1] (residual), in[2] (weight or none), in[3] (bias or none); in[4], in[5] the
// constants c1, c2.
OpFn add_layer_norm_fn(const Shape& ns, AddNormUse use) {
  return [ns, use](const Inputs& in) {
    const AddLayerNormOutputs r = add_layer_norm(in[0], in[1], ns, in[2], in[3]);
    switch (use) {
      case AddNormUse::Out: return r.out;
      case AddNormUse::Sum: return r.sum;
      case AddNormUse::Both: break;
    }
    return r.sum * in[4] + r.out * in[5];
  };
}

const char* use_name(AddNormUse use) {
  return use == AddNormUse::Both ? "sum and out" : use == AddNormUse::Out ? "out" : "sum";
}

TEST_P(NNGrad, AddLayerNorm) {
  EMBER_REQUIRE_KERNEL(add_layer_norm_stub);
  EMBER_REQUIRE_KERNEL(layer_norm_backward_stub);
  EMBER_REQUIRE_ELEMENTWISE();
  for (AddNormUse use : {AddNormUse::Both, AddNormUse::Out, AddNormUse::Sum}) {
    for (int affine = 0; affine < 4; ++affine) {
      const bool has_w = (affine & 1) != 0, has_b = (affine & 2) != 0;
      GradCase c{std::string("add_layer_norm using ") + use_name(use) + (has_w ? " weight" : "") +
                     (has_b ? " bias" : ""),
                 {noncontiguous_input({3, 4, 5}, -2.0, 2.0), rand_input({3, 4, 5}, -2.0, 2.0),
                  has_w ? rand_input({5}, 0.5, 1.5) : Tensor(), has_b ? noncontiguous_input({5}) : Tensor(),
                  rand_input({3, 4, 5}), rand_input({3, 4, 5})},
                 add_layer_norm_fn({5}, use)};
      c.wrt = {0, 1, 2, 3};
      c.dtypes = {DType::f32, DType::f16, DType::bf16};
      check_grad(c, device());
    }
  }
  // Two normalised dims, residual strided.
  GradCase two{"add_layer_norm over two dims",
               {rand_input({3, 4, 5}), noncontiguous_input({3, 4, 5}), rand_input({4, 5}, 0.5, 1.5),
                rand_input({4, 5}), rand_input({3, 4, 5}), rand_input({3, 4, 5})},
               add_layer_norm_fn({4, 5}, AddNormUse::Both)};
  two.wrt = {0, 1, 2, 3};
  check_grad(two, device());
  // A residual of x's shape expanded from one row (stride 0): still one dtype and one shape, the fused path.
  GradCase expanded{"add_layer_norm expanded residual",
                    {rand_input({3, 4, 5}), rand_input({1, 1, 5}).expand({3, 4, 5}), rand_input({5}, 0.5, 1.5),
                     Tensor(), rand_input({3, 4, 5}), rand_input({3, 4, 5})},
                    add_layer_norm_fn({5}, AddNormUse::Both)};
  expanded.wrt = {0, 1, 2};
  check_grad(expanded, device());
  // One input at a time: the node keeps only what that gradient reads.
  for (size_t wrt : {size_t{0}, size_t{1}, size_t{2}, size_t{3}}) {
    GradCase part{"add_layer_norm wrt " + std::to_string(wrt),
                  {rand_input({2, 6}), rand_input({2, 6}), rand_input({6}, 0.5, 1.5), rand_input({6}),
                   rand_input({2, 6}), rand_input({2, 6})},
                  add_layer_norm_fn({6}, AddNormUse::Both)};
    part.wrt = {wrt};
    check_grad(part, device());
  }
}

// The fused node and the composed add + layer_norm give the same values and gradients (f32), and the fused path is
// the one taken for operands of one dtype and one shape.
TEST_P(NNGrad, AddLayerNormMatchesComposedOps) {
  EMBER_REQUIRE_KERNEL(add_layer_norm_stub);
  EMBER_REQUIRE_KERNEL(layer_norm_backward_stub);
  EMBER_REQUIRE_ELEMENTWISE();
  for (int affine = 0; affine < 4; ++affine) {
    const bool has_w = (affine & 1) != 0, has_b = (affine & 2) != 0;
    SCOPED_TRACE(::testing::Message() << "weight " << has_w << " bias " << has_b);
    auto leaf = [&](const Tensor& t) {
      const Tensor l = t.to(device(), DType::f32);
      l.requires_grad_();
      return l;
    };
    const Tensor x = leaf(rand_input({4, 6, 32}, -2.0, 2.0)), res = leaf(rand_input({4, 6, 32}, -2.0, 2.0));
    const Tensor w = has_w ? leaf(rand_input({32}, 0.5, 1.5)) : Tensor();
    const Tensor b = has_b ? leaf(rand_input({32})) : Tensor();
    const AddLayerNormOutputs fused = add_layer_norm(x, res, {32}, w, b);
    const Tensor sum = add(x, res), out = layer_norm(sum, {32}, w, b);
    EXPECT_NE(fused.out.grad_fn_name(), "LayerNormBackward") << "the composed path was taken";
    EXPECT_EQ(fused.sum.grad_fn_name(), fused.out.grad_fn_name()) << "sum and out come from one node";
    EXPECT_EQ(fused.sum.dtype(), DType::f32);
    EXPECT_EQ(fused.out.dtype(), DType::f32);
    EXPECT_TRUE(allclose(fused.sum, sum.cpu(), {0.0, 0.0}));
    EXPECT_TRUE(allclose(fused.out, out.cpu(), {1e-5, 1e-5}));
    autograd::TensorList leaves = {x, res};
    if (has_w) leaves.push_back(w);
    if (has_b) leaves.push_back(b);
    const Tensor gs = rand_input({4, 6, 32}).to(device(), DType::f32);
    const Tensor go = rand_input({4, 6, 32}).to(device(), DType::f32);
    const autograd::TensorList gf = autograd::grad({fused.sum, fused.out}, leaves, {gs, go});
    const autograd::TensorList gc = autograd::grad({sum, out}, leaves, {gs, go});
    ASSERT_EQ(gf.size(), gc.size());
    for (size_t i = 0; i < gf.size(); ++i) {
      ASSERT_TRUE(gf[i].defined()) << "input " << i;
      EXPECT_EQ(gf[i].dtype(), DType::f32) << "input " << i;
      EXPECT_TRUE(allclose(gf[i], gc[i].cpu(), {1e-5, 1e-5})) << "gradient of input " << i;
    }
  }
}

// The fused node hands one gradient tensor to both x and residual: their .grad must stay separate tensors (a second
// backward accumulates into each once), and add_layer_norm(y, y) gives y the sum of both.
TEST_P(NNGrad, AddLayerNormGradientsOfXAndResidualStaySeparate) {
  EMBER_REQUIRE_KERNEL(add_layer_norm_stub);
  EMBER_REQUIRE_KERNEL(layer_norm_backward_stub);
  EMBER_REQUIRE_ELEMENTWISE();
  auto leaf = [&](const Tensor& t) {
    const Tensor l = t.to(device());
    l.requires_grad_();
    return l;
  };
  const Tensor x0 = rand_input({5, 16}), r0 = rand_input({5, 16}), w0 = rand_input({16}, 0.5, 1.5);
  const Tensor gs = rand_input({5, 16}).to(device()), go = rand_input({5, 16}).to(device());
  // Expected: the composed ops' gradients.
  const Tensor xc = leaf(x0), rc = leaf(r0), wc = leaf(w0);
  const Tensor sum = add(xc, rc), out = layer_norm(sum, {16}, wc, Tensor());
  const autograd::TensorList want = autograd::grad({sum, out}, {xc, rc, wc}, {gs, go});
  const Tensor x = leaf(x0), res = leaf(r0), w = leaf(w0);
  for (int pass = 0; pass < 2; ++pass) {
    const AddLayerNormOutputs r = add_layer_norm(x, res, {16}, w, Tensor());
    autograd::backward({r.sum, r.out}, {gs, go});
  }
  ASSERT_TRUE(x.grad().defined() && res.grad().defined() && w.grad().defined());
  EXPECT_NE(x.grad().raw_data(), res.grad().raw_data()) << "x.grad and residual.grad share memory";
  EXPECT_TRUE(allclose(x.grad(), (want[0] * 2.0).cpu(), {1e-12, 1e-12}));
  EXPECT_TRUE(allclose(res.grad(), (want[1] * 2.0).cpu(), {1e-12, 1e-12}));
  EXPECT_TRUE(allclose(w.grad(), (want[2] * 2.0).cpu(), {1e-12, 1e-12}));
  // One tensor as both operands.
  const Tensor y = leaf(x0), yc = leaf(x0);
  const AddLayerNormOutputs ry = add_layer_norm(y, y, {16});
  const Tensor sy = add(yc, yc), oy = layer_norm(sy, {16});
  EXPECT_TRUE(allclose(ry.out, oy.cpu(), {1e-12, 1e-12}));
  const Tensor gy = autograd::grad({ry.sum, ry.out}, {y}, {gs, go})[0];
  const Tensor gyc = autograd::grad({sy, oy}, {yc}, {gs, go})[0];
  EXPECT_TRUE(allclose(gy, gyc.cpu(), {1e-12, 1e-12}));
}

// Operands the fused kernel does not take (a broadcast residual, mixed dtypes) go through the composed add and
// layer_norm, with the same results and correct gradients.
TEST_P(NNGrad, AddLayerNormFallsBackToComposedOps) {
  EMBER_REQUIRE_KERNEL(layer_norm_stub);
  EMBER_REQUIRE_KERNEL(layer_norm_backward_stub);
  EMBER_REQUIRE_ELEMENTWISE();
  // A residual [1, C] broadcast over x [B, T, C].
  for (AddNormUse use : {AddNormUse::Both, AddNormUse::Out}) {
    GradCase c{std::string("add_layer_norm broadcast residual using ") + use_name(use),
               {noncontiguous_input({3, 4, 5}, -2.0, 2.0), rand_input({1, 5}, -2.0, 2.0), rand_input({5}, 0.5, 1.5),
                rand_input({5}), rand_input({3, 4, 5}), rand_input({3, 4, 5})},
               add_layer_norm_fn({5}, use)};
    c.wrt = {0, 1, 2, 3};
    c.dtypes = {DType::f32, DType::f16, DType::bf16};
    check_grad(c, device());
  }
  {
    const Tensor x = rand_input({3, 4, 5}).to(device(), DType::f32), res = rand_input({1, 5}).to(device(), DType::f32);
    x.requires_grad_();
    res.requires_grad_();
    const AddLayerNormOutputs r = add_layer_norm(x, res, {5});
    EXPECT_EQ(r.sum.sizes(), x.sizes());
    EXPECT_EQ(r.out.sizes(), x.sizes());
    EXPECT_EQ(r.sum.grad_fn_name(), "AddBackward");
    EXPECT_EQ(r.out.grad_fn_name(), "LayerNormBackward");
    const Tensor sum = add(x, res);
    EXPECT_TRUE(allclose(r.sum, sum.cpu(), {0.0, 0.0}));
    EXPECT_TRUE(allclose(r.out, layer_norm(sum, {5}).cpu(), {0.0, 0.0}));
  }
  // Mixed dtypes (as under autocast): an f16 x and an f32 residual.
  {
    const Tensor x = rand_input({4, 8}).to(device(), DType::f16), res = rand_input({4, 8}).to(device(), DType::f32);
    const Tensor w = rand_input({8}, 0.5, 1.5).to(device(), DType::f32);
    for (const Tensor& t : {x, res, w}) t.requires_grad_();
    const AddLayerNormOutputs r = add_layer_norm(x, res, {8}, w, Tensor());
    EXPECT_EQ(r.out.grad_fn_name(), "LayerNormBackward");
    const Tensor sum = add(x, res), out = layer_norm(sum, {8}, w, Tensor());
    EXPECT_EQ(r.sum.dtype(), sum.dtype());
    EXPECT_EQ(r.out.dtype(), out.dtype());
    EXPECT_TRUE(allclose(r.sum, sum.cpu(), {0.0, 0.0}));
    EXPECT_TRUE(allclose(r.out, out.cpu(), {0.0, 0.0}));
    const Tensor gs = rand_input({4, 8}).to(device(), sum.dtype()), go = rand_input({4, 8}).to(device(), out.dtype());
    const autograd::TensorList gf = autograd::grad({r.sum, r.out}, {x, res, w}, {gs, go});
    const autograd::TensorList gc = autograd::grad({sum, out}, {x, res, w}, {gs, go});
    for (size_t i = 0; i < gf.size(); ++i) {
      EXPECT_EQ(gf[i].dtype(), i == 0 ? DType::f16 : DType::f32) << "input " << i;
      EXPECT_TRUE(allclose(gf[i], gc[i].cpu(), {0.0, 0.0})) << "gradient of input " << i;
    }
  }
}

// The autocast residual stream: an f32 x with an f16/bf16 residual fuses (outside and inside an autocast region)
// and gives the composed ops' values and gradients; an f16 affine weight under autocast takes the composed ops.
TEST_P(NNGrad, AddLayerNormHalfResidualIntoF32) {
  EMBER_REQUIRE_KERNEL(layer_norm_stub);
  EMBER_REQUIRE_KERNEL(layer_norm_backward_stub);
  EMBER_REQUIRE_ELEMENTWISE();
  for (DType rdt : {DType::f16, DType::bf16}) {
    for (bool in_region : {false, true}) {
      SCOPED_TRACE(::testing::Message() << dtype_name(rdt) << (in_region ? " under autocast" : ""));
      const Tensor x = rand_input({4, 8}).to(device(), DType::f32), res = rand_input({4, 8}).to(device(), rdt);
      const Tensor w = rand_input({8}, 0.5, 1.5).to(device(), DType::f32), b = rand_input({8}).to(device(), DType::f32);
      for (const Tensor& t : {x, res, w, b}) t.requires_grad_();
      AddLayerNormOutputs r;
      Tensor sum, out;
      {
        std::optional<AutocastGuard> region;
        if (in_region) region.emplace(device().type, rdt);
        r = add_layer_norm(x, res, {8}, w, b);
        sum = add(x, res);
        out = layer_norm(sum, {8}, w, b);
      }
      EXPECT_NE(r.out.grad_fn_name(), "LayerNormBackward");
      EXPECT_EQ(r.sum.dtype(), DType::f32);
      EXPECT_EQ(out.dtype(), DType::f32);
      EXPECT_TRUE(allclose(r.sum, sum.cpu(), {0.0, 0.0}));
      EXPECT_TRUE(allclose(r.out, out.cpu(), {1e-6, 1e-6}));
      const Tensor gs = rand_input({4, 8}).to(device(), DType::f32), go = rand_input({4, 8}).to(device(), DType::f32);
      const autograd::TensorList gf = autograd::grad({r.sum, r.out}, {x, res, w, b}, {gs, go});
      const autograd::TensorList gc = autograd::grad({sum, out}, {x, res, w, b}, {gs, go});
      for (size_t i = 0; i < gf.size(); ++i) {
        EXPECT_EQ(gf[i].dtype(), i == 1 ? rdt : DType::f32) << "input " << i;
        EXPECT_TRUE(allclose(gf[i], gc[i].cpu(), {1e-5, 1e-5})) << "gradient of input " << i;
      }
    }
  }
  const Tensor x = rand_input({4, 8}).to(device(), DType::f32), res = rand_input({4, 8}).to(device(), DType::bf16);
  const Tensor w16 = rand_input({8}, 0.5, 1.5).to(device(), DType::bf16);
  AutocastGuard region(device().type, DType::bf16);
  EXPECT_EQ(add_layer_norm(x.requires_grad_(), res, {8}, w16, Tensor()).out.grad_fn_name(), "LayerNormBackward");
}

TEST_P(NNGrad, BiasGelu) {
  EMBER_REQUIRE_KERNEL(bias_gelu_stub);
  EMBER_REQUIRE_KERNEL(bias_gelu_backward_stub);
  for (GeluApprox approx : {GeluApprox::None, GeluApprox::Tanh}) {
    const std::string name = std::string("bias_gelu ") + (approx == GeluApprox::Tanh ? "tanh" : "erf");
    GradCase c{name, {noncontiguous_input({3, 4, 5}, -3.0, 3.0), noncontiguous_input({5})},
               [approx](const Inputs& in) { return bias_gelu(in[0], in[1], approx); }};
    c.dtypes = {DType::f32, DType::f16, DType::bf16};
    check_grad(c, device());
    GradCase one{name + " 1-d", {rand_input({6}, -3.0, 3.0), rand_input({6})},
                 [approx](const Inputs& in) { return bias_gelu(in[0], in[1], approx); }};
    check_grad(one, device());
    for (size_t wrt : {size_t{0}, size_t{1}}) {
      GradCase part{name + " wrt " + std::to_string(wrt), {rand_input({7, 4}, -3.0, 3.0), rand_input({4})},
                    [approx](const Inputs& in) { return bias_gelu(in[0], in[1], approx); }};
      part.wrt = {wrt};
      check_grad(part, device());
    }
  }
}

// ---- embedding -------------------------------------------------------------------------------------------------

TEST_P(NNGrad, Embedding) {
  EMBER_REQUIRE_KERNEL(embedding_stub);
  EMBER_REQUIRE_KERNEL(embedding_backward_stub);
  const std::vector<int64_t> idx = {1, 3, 1, 0, 3, 3, 4, 1};  // rows 1 and 3 repeat, row 2 unused
  const Tensor i64 = from_vector(idx, {2, 4});
  const Tensor i32 = from_vector(std::vector<int32_t>(idx.begin(), idx.end()), {2, 4});
  for (const Tensor& indices : {i64, i32}) {
    GradCase c{std::string("embedding ") + dtype_name(indices.dtype()), {noncontiguous_input({5, 3}), indices},
               [](const Inputs& in) {
                 EXPECT_TRUE(in[1].dtype() == DType::i64 || in[1].dtype() == DType::i32);
                 return embedding(in[0], in[1]);
               }};
    c.dtypes = {DType::f32, DType::f16, DType::bf16};
    check_grad(c, device());
  }
  // Hand-computed: with an all-ones upstream gradient, row r of grad_w is the number of times r occurs.
  const Tensor w = rand_input({5, 3}).to(device());
  const Tensor gw =
      grad_of([&](const Tensor& x) { return embedding(x, i32.to(device())); }, w, ones_on({2, 4, 3}, device()));
  const std::vector<double> counts = {1, 3, 0, 3, 1};
  std::vector<double> expected;
  for (double k : counts) expected.insert(expected.end(), 3, k);
  EXPECT_TRUE(allclose(gw, from_vector(expected, {5, 3}), {0, 0}));
}

// ---- convolution -----------------------------------------------------------------------------------------------

TEST_P(NNGrad, Conv2d) {
  EMBER_REQUIRE_KERNEL(conv2d_stub);
  EMBER_REQUIRE_KERNEL(conv2d_backward_stub);
  EMBER_REQUIRE_KERNEL(reduce_stub);
  Conv2dParams strided;
  strided.stride[0] = strided.stride[1] = 2;
  strided.padding[0] = strided.padding[1] = 1;
  strided.dilation[0] = strided.dilation[1] = 2;
  strided.groups = 2;
  auto conv = [](Conv2dParams p) { return [p](const Inputs& in) { return conv2d(in[0], in[1], in[2], p); }; };
  GradCase a{"conv2d stride 2 padding 1 dilation 2 groups 2 bias",
             {noncontiguous_input({2, 4, 7, 7}), rand_input({6, 2, 3, 3}), rand_input({6})}, conv(strided)};
  check_grad(a, device());
  GradCase b{"conv2d groups 2 no bias", {rand_input({2, 4, 7, 7}), noncontiguous_input({6, 2, 3, 3}), Tensor()},
             conv(strided)};
  check_grad(b, device());

  Conv2dParams mixed;
  mixed.stride[1] = 2;
  mixed.padding[1] = 1;
  mixed.dilation[0] = 2;
  GradCase c{"conv2d asymmetric no bias", {noncontiguous_input({2, 3, 6, 5}), rand_input({4, 3, 2, 3}), Tensor()},
             conv(mixed)};
  c.dtypes = {DType::f32, DType::f16, DType::bf16};
  check_grad(c, device());
  // One gradient at a time: the node saves only what that gradient reads.
  for (size_t wrt : {size_t{0}, size_t{1}, size_t{2}}) {
    GradCase d{"conv2d wrt " + std::to_string(wrt), {rand_input({1, 4, 5, 5}), rand_input({2, 2, 3, 3}),
                                                     rand_input({2})},
               conv(strided)};
    d.wrt = {wrt};
    check_grad(d, device());
  }
}

// ---- pooling ---------------------------------------------------------------------------------------------------

TEST_P(NNGrad, MaxPool2d) {
  EMBER_REQUIRE_KERNEL(max_pool2d_stub);
  EMBER_REQUIRE_KERNEL(max_pool2d_backward_stub);
  Pool2dParams overlap;  // kernel 3 stride 2: windows share a row/column
  overlap.kernel[0] = overlap.kernel[1] = 3;
  overlap.padding[0] = overlap.padding[1] = 1;
  GradCase a{"max_pool2d kernel 3 stride 2 padding 1", {distinct_input({2, 3, 9, 8})},
             [overlap](const Inputs& in) { return max_pool2d(in[0], overlap); }};
  check_grad(a, device());
  GradCase b{"max_pool2d_with_indices", {distinct_input({2, 3, 9, 8})},
             [overlap](const Inputs& in) { return max_pool2d_with_indices(in[0], overlap).out; }};
  check_grad(b, device());
  Pool2dParams rect;
  rect.kernel[0] = 2;
  rect.kernel[1] = 3;
  rect.stride[0] = 1;
  rect.padding[0] = 1;
  GradCase c{"max_pool2d kernel 2x3 stride 1x2 padding 1x0", {distinct_input({1, 2, 5, 7})},
             [rect](const Inputs& in) { return max_pool2d(in[0], rect); }};
  check_grad(c, device());

  const Tensor x = distinct_input({1, 2, 5, 5}).to(device());
  x.requires_grad_();
  const MaxPoolResult r = max_pool2d_with_indices(x, overlap);
  EXPECT_TRUE(r.out.requires_grad());
  EXPECT_FALSE(r.indices.requires_grad());
}

TEST_P(NNGrad, AvgPool2d) {
  EMBER_REQUIRE_KERNEL(avg_pool2d_stub);
  EMBER_REQUIRE_KERNEL(avg_pool2d_backward_stub);
  for (bool include_pad : {true, false}) {
    Pool2dParams p;
    p.kernel[0] = p.kernel[1] = 3;
    p.padding[0] = p.padding[1] = 1;
    p.count_include_pad = include_pad;
    GradCase a{std::string("avg_pool2d kernel 3 stride 2 padding 1 count_include_pad ") + (include_pad ? "1" : "0"),
               {noncontiguous_input({2, 3, 7, 8})}, [p](const Inputs& in) { return avg_pool2d(in[0], p); }};
    a.dtypes = {DType::f32, DType::f16, DType::bf16};
    check_grad(a, device());
    Pool2dParams q = p;
    q.kernel[1] = 2;
    q.stride[0] = 1;
    GradCase b{std::string("avg_pool2d kernel 3x2 stride 1x2 count_include_pad ") + (include_pad ? "1" : "0"),
               {rand_input({1, 2, 5, 6})}, [q](const Inputs& in) { return avg_pool2d(in[0], q); }};
    check_grad(b, device());
  }
}

// ---- dropout ---------------------------------------------------------------------------------------------------

TEST_P(NNGrad, DropoutFiniteDifferences) {
  EMBER_REQUIRE_KERNEL(dropout_stub);
  EMBER_REQUIRE_ELEMENTWISE();
  // Every evaluation reseeds the generator, so all of them (analytic and perturbed) draw the same mask.
  GradCase a{"dropout p 0.3", {noncontiguous_input({4, 6})}, [](const Inputs& in) {
               manual_seed(1234);
               return dropout(in[0], 0.3);
             }};
  a.dtypes = {DType::f32, DType::f16, DType::bf16};
  check_grad(a, device());
  GradCase b{"dropout_with_mask p 0.6", {rand_input({3, 5})}, [](const Inputs& in) {
               manual_seed(99);
               return dropout_with_mask(in[0], 0.6).out;
             }};
  check_grad(b, device());
}

TEST_P(NNGrad, DropoutGradientIsMaskOverKeep) {
  EMBER_REQUIRE_KERNEL(dropout_stub);
  EMBER_REQUIRE_ELEMENTWISE();
  const double p = 0.4;
  const Tensor x = rand_input({6, 7}).to(device());
  x.requires_grad_();
  const Tensor g = rand_input({6, 7});
  manual_seed(7);
  const DropoutResult r = dropout_with_mask(x, p);
  EXPECT_TRUE(r.out.requires_grad());
  EXPECT_FALSE(r.mask.requires_grad());
  EXPECT_EQ(r.out.grad_fn_name(), "DropoutBackward");
  r.out.backward(g.to(device()));
  const std::vector<double> m = r.mask.cpu().to(DType::f64).to_vector<double>();
  const std::vector<double> gv = g.to_vector<double>();
  std::vector<double> expected(gv.size());
  double kept = 0;
  for (size_t i = 0; i < gv.size(); ++i) {
    expected[i] = m[i] != 0.0 ? gv[i] / (1.0 - p) : 0.0;
    kept += m[i];
  }
  EXPECT_GT(kept, 0);
  EXPECT_LT(kept, static_cast<double>(m.size()));
  EXPECT_TRUE(allclose(x.grad(), from_vector(expected, {6, 7}), {1e-12, 1e-12}));
}

TEST_P(NNGrad, DropoutEdgeProbabilities) {
  EMBER_REQUIRE_KERNEL(dropout_stub);
  EMBER_REQUIRE_ELEMENTWISE();
  const Tensor g = rand_input({3, 4}).to(device());
  // p == 1: everything dropped, a zero (not NaN) gradient.
  {
    const Tensor x = rand_input({3, 4}).to(device());
    x.requires_grad_();
    const Tensor y = dropout(x, 1.0);
    EXPECT_TRUE(allclose(y, zeros({3, 4}, DType::f64), {0, 0}));
    y.backward(g);
    ASSERT_TRUE(x.grad().defined());
    EXPECT_TRUE(allclose(x.grad(), zeros({3, 4}, DType::f64), {0, 0}));
  }
  // train=false and p == 0: the input itself comes back (no node); gradients reach it unchanged.
  for (const auto& [p, train] : {std::pair{0.5, false}, std::pair{0.0, true}}) {
    const Tensor x = rand_input({3, 4}).to(device());
    x.requires_grad_();
    const Tensor y = dropout(x, p, train);
    EXPECT_TRUE(y.is_same(x));
    const DropoutResult r = dropout_with_mask(x, p, train);
    EXPECT_TRUE(r.out.is_same(x));
    EXPECT_FALSE(r.mask.requires_grad());
    const Tensor gx = autograd::grad({y * 3.0}, {x}, {g})[0];
    EXPECT_TRUE(allclose(gx, (g * 3.0).cpu(), {1e-12, 0}));
  }
}

// ---- strided upstream gradients ----------------------------------------------------------------------------------

// The backward formulas and kernels take the upstream gradient with any strides: a gradient expanded from one row
// (zero strides but the last) gives the same result as its materialised copy.
TEST_P(NNGrad, ExpandedUpstreamGradient) {
  EMBER_REQUIRE_KERNEL(conv2d_stub);
  EMBER_REQUIRE_KERNEL(conv2d_backward_stub);
  EMBER_REQUIRE_KERNEL(max_pool2d_backward_stub);
  EMBER_REQUIRE_KERNEL(avg_pool2d_backward_stub);
  EMBER_REQUIRE_KERNEL(layer_norm_stub);
  EMBER_REQUIRE_KERNEL(softmax_stub);
  EMBER_REQUIRE_ELEMENTWISE();
  Conv2dParams cp;
  cp.padding[0] = cp.padding[1] = 1;
  cp.groups = 2;
  Pool2dParams pp;
  pp.kernel[0] = pp.kernel[1] = 3;
  pp.padding[0] = pp.padding[1] = 1;
  const Tensor w = rand_input({4, 1, 3, 3}).to(device());
  const Tensor x = distinct_input({2, 2, 5, 5}).to(device());
  auto check = [&](const char* name, const Tensor& input, const std::function<Tensor(const Tensor&)>& fn) {
    SCOPED_TRACE(name);
    Shape out_shape;
    {
      NoGradGuard no_grad;
      out_shape = fn(input).sizes();
    }
    const Tensor expanded = rand_input({out_shape.back()}).to(device()).expand(out_shape);
    const Tensor dense = expanded.contiguous();
    EXPECT_TRUE(allclose(grad_of(fn, input, expanded), grad_of(fn, input, dense).cpu(), {1e-12, 1e-12}));
  };
  check("conv2d x", x, [&](const Tensor& t) { return conv2d(t, w, Tensor(), cp); });
  check("conv2d weight", w, [&](const Tensor& t) { return conv2d(x, t, Tensor(), cp); });
  check("max_pool2d", x, [&](const Tensor& t) { return max_pool2d(t, pp); });
  check("avg_pool2d", x, [&](const Tensor& t) { return avg_pool2d(t, pp); });
  check("layer_norm", x, [&](const Tensor& t) { return layer_norm(t, {5, 5}); });
  check("softmax", x, [&](const Tensor& t) { return softmax(t, -1); });
}

EMBER_INSTANTIATE_DEVICE_TESTS(NNGrad);

}  // namespace
}  // namespace ember::testing

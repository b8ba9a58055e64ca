// Tests of the lr schedulers (StepLR, LambdaLR, CosineWarmupLR: lr sequences against hand values, their effect on the
// optimizer's steps, state_dict, errors) and of gradient clipping (clip_grad_norm_ with 2-, 1-, 3- and inf-norms,
// in-place scaling, non-finite totals; clip_grad_value_) against hand-computed numbers.
#include <cmath>
#include <limits>
#include <vector>

#include "ember/optim/optim.h"
#include "tests/harness/op_harness.h"

namespace ember::testing {
namespace {

using optim::ParamGroup;
using optim::SGD;
using optim::SGDOptions;

Tensor leaf(const std::vector<double>& v, DType dtype = DType::f64) {
  Tensor t = from_vector(v, {static_cast<int64_t>(v.size())}).to(dtype);
  t.requires_grad_();
  return t;
}

// lr after construction (epoch 0) and after each of `steps` further scheduler steps, for group g.
std::vector<double> lr_sequence(optim::LRScheduler& s, int steps, size_t g = 0) {
  std::vector<double> lrs{s.optimizer().param_groups()[g].lr()};
  for (int k = 0; k < steps; ++k) {
    s.step();
    lrs.push_back(s.optimizer().param_groups()[g].lr());
    EXPECT_EQ(s.get_last_lr()[g], lrs.back());
  }
  return lrs;
}

void expect_near_all(const std::vector<double>& actual, const std::vector<double>& expected, double tol) {
  ASSERT_EQ(actual.size(), expected.size());
  for (size_t i = 0; i < actual.size(); ++i) EXPECT_NEAR(actual[i], expected[i], tol) << "epoch " << i;
}

// ---- schedulers ---------------------------------------------------------------------------------------------------

TEST(LRScheduler, StepLR) {
  const Tensor p = leaf({1.0});
  SGD opt({p}, SGDOptions{.lr = 1.0});
  optim::StepLR s(opt, 2, 0.5);
  EXPECT_EQ(s.last_epoch(), 0);
  EXPECT_EQ(s.get_last_lr(), std::vector<double>{1.0});
  // Epochs 0..6: halved at every multiple of 2.
  EXPECT_EQ(lr_sequence(s, 6), (std::vector<double>{1.0, 1.0, 0.5, 0.5, 0.25, 0.25, 0.125}));
  EXPECT_EQ(s.last_epoch(), 6);
  EXPECT_EQ(s.base_lrs(), std::vector<double>{1.0});
}

TEST(LRScheduler, LambdaLRPerGroup) {
  const Tensor a = leaf({1.0}), b = leaf({2.0});
  SGD opt({ParamGroup{{a}, {{"lr", 0.1}}}, ParamGroup{{b}, {{"lr", 2.0}}}});
  optim::LambdaLR s(opt, std::vector<optim::LambdaLR::LrLambda>{
                             [](int64_t e) { return 1.0 / static_cast<double>(e + 1); },
                             [](int64_t e) { return e < 2 ? 1.0 : 0.25; }});
  expect_near_all(lr_sequence(s, 3, 0), {0.1, 0.05, 0.1 / 3.0, 0.025}, 1e-15);
  EXPECT_EQ(opt.param_groups()[1].lr(), 0.5);  // epoch 3: 2.0 * 0.25
  EXPECT_EQ(s.get_last_lr(), (std::vector<double>{0.025, 0.5}));
  optim::LambdaLR one(opt, [](int64_t) { return 3.0; });  // one function for both groups; base lrs are the current
  expect_near_all(one.get_last_lr(), {0.075, 1.5}, 1e-15);
}

TEST(LRScheduler, CosineWarmupLikeNanoGPT) {
  const Tensor p = leaf({1.0});
  SGD opt({p}, SGDOptions{.lr = 1.0});
  optim::CosineWarmupLR s(opt, /*warmup_iters=*/2, /*lr_decay_iters=*/6, /*min_lr=*/0.1);
  // it 0, 1: 1 * (it + 1) / 3. it 2..6: 0.1 + 0.5 (1 + cos(pi (it - 2) / 4)) * 0.9, i.e. coefficients
  // 1, (1 + sqrt(2)/2) / 2, 1/2, (1 - sqrt(2)/2) / 2, 0. it 7, 8: min_lr.
  const double h = std::sqrt(2.0) / 2.0;
  const std::vector<double> expected = {1.0 / 3.0, 2.0 / 3.0, 1.0, 0.1 + 0.45 * (1.0 + h), 0.55,
                                        0.1 + 0.45 * (1.0 - h), 0.1, 0.1, 0.1};
  expect_near_all(lr_sequence(s, 8), expected, 1e-15);
  EXPECT_NEAR(optim::cosine_warmup_lr(4, 6e-4, 2, 6, 6e-5), 6e-5 + 0.5 * (6e-4 - 6e-5), 1e-18);
}

TEST(LRScheduler, DrivesTheOptimizer) {
  // SGD without momentum: each step moves p by -lr * g with the lr the scheduler set before it.
  const Tensor p = leaf({0.0});
  SGD opt({p}, SGDOptions{.lr = 1.0});
  optim::StepLR s(opt, 1, 0.5);  // 1, 0.5, 0.25
  for (int k = 0; k < 3; ++k) {
    p.set_grad(from_vector<double>({1.0}, {1}));
    opt.step();
    s.step();
  }
  EXPECT_EQ(p.item<double>(), -1.75);  // -(1 + 0.5 + 0.25)
}

TEST(LRScheduler, StateDictRoundTrip) {
  const Tensor p = leaf({1.0});
  SGD opt({p}, SGDOptions{.lr = 1.0});
  optim::CosineWarmupLR a(opt, 2, 10, 0.0);
  for (int k = 0; k < 4; ++k) a.step();
  const optim::StateDict sd = a.state_dict();
  ASSERT_EQ(sd.size(), 3u);
  EXPECT_EQ(sd[0].first, "last_epoch");
  EXPECT_EQ(sd[0].second.item<int64_t>(), 4);

  const Tensor q = leaf({1.0});
  SGD opt2({q}, SGDOptions{.lr = 1.0});
  optim::CosineWarmupLR b(opt2, 2, 10, 0.0);
  b.load_state_dict(sd);
  EXPECT_EQ(b.last_epoch(), 4);
  a.step();
  b.step();
  EXPECT_EQ(a.get_last_lr(), b.get_last_lr());
  EXPECT_EQ(opt2.param_groups()[0].lr(), opt.param_groups()[0].lr());

  optim::StateDict bad = sd;
  bad.emplace_back("base_lrs.1", scalar_tensor(1.0));
  EXPECT_THROW(b.load_state_dict(bad), ValueError);
  bad = sd;
  bad.pop_back();
  EXPECT_THROW(b.load_state_dict(bad), ValueError);
}

TEST(LRScheduler, Errors) {
  const Tensor p = leaf({1.0});
  SGD opt({p}, SGDOptions{.lr = 1.0});
  EXPECT_THROW(optim::StepLR(opt, 0), ValueError);
  EXPECT_THROW(optim::CosineWarmupLR(opt, 5, 5, 0.0), ValueError);
  EXPECT_THROW(optim::CosineWarmupLR(opt, -1, 5, 0.0), ValueError);
  EXPECT_THROW(optim::CosineWarmupLR(opt, 1, 5, -0.1), ValueError);
  EXPECT_THROW(optim::LambdaLR(opt, std::vector<optim::LambdaLR::LrLambda>{}), ValueError);
  EXPECT_THROW(optim::LambdaLR(opt, optim::LambdaLR::LrLambda()), ValueError);
  EXPECT_EQ(opt.param_groups()[0].lr(), 1.0);  // failed constructions never stepped
}

// ---- clip_grad_norm_ / clip_grad_value_ ---------------------------------------------------------------------------

struct Grads {
  Tensor a, b, c;  // c has no grad
  std::vector<Tensor> params() const { return {a, b, c}; }
};
// Grads [3, 4] and [0, -12]: 2-norm sqrt(9 + 16 + 144) = 13, 1-norm 19, inf-norm 12, 3-norm cbrt(27 + 64 + 1728).
Grads make_grads(DType dtype = DType::f64) {
  Grads g{leaf({1.0, 1.0}, dtype), leaf({1.0, 1.0}, dtype), leaf({1.0}, dtype)};
  g.a.set_grad(from_vector<double>({3.0, 4.0}, {2}).to(dtype));
  g.b.set_grad(from_vector<double>({0.0, -12.0}, {2}).to(dtype));
  return g;
}

TEST(ClipGradNorm, TwoNormScalesInPlace) {
  const Grads g = make_grads();
  const void* storage = g.a.grad().raw_data();
  const Tensor view = g.b.grad().slice(0, 1, 2);  // sees the in-place update
  const double total = optim::clip_grad_norm_(g.params(), 6.5);
  EXPECT_DOUBLE_EQ(total, 13.0);
  const double c = 6.5 / (13.0 + 1e-6);
  EXPECT_TRUE(allclose(g.a.grad(), from_vector<double>({3.0 * c, 4.0 * c}, {2}), {1e-15, 0.0}));
  EXPECT_TRUE(allclose(g.b.grad(), from_vector<double>({0.0, -12.0 * c}, {2}), {1e-15, 0.0}));
  EXPECT_EQ(g.a.grad().raw_data(), storage);
  EXPECT_DOUBLE_EQ(view.item<double>(), -12.0 * c);
  EXPECT_FALSE(g.c.grad().defined());
  EXPECT_NEAR(optim::grad_norm(g.params()), 6.5, 1e-6);  // clipped to max_norm (up to the 1e-6)
}

TEST(ClipGradNorm, OtherNorms) {
  {
    const Grads g = make_grads();
    EXPECT_DOUBLE_EQ(optim::clip_grad_norm_(g.params(), 6.0, optim::kInfNorm), 12.0);
    const double c = 6.0 / (12.0 + 1e-6);
    EXPECT_TRUE(allclose(g.b.grad(), from_vector<double>({0.0, -12.0 * c}, {2}), {1e-15, 0.0}));
    EXPECT_TRUE(allclose(g.a.grad(), from_vector<double>({3.0 * c, 4.0 * c}, {2}), {1e-15, 0.0}));
  }
  {
    const Grads g = make_grads();
    EXPECT_DOUBLE_EQ(optim::clip_grad_norm_(g.params(), 100.0, 1.0), 19.0);
    EXPECT_EQ(g.a.grad().to_vector<double>(), (std::vector<double>{3.0, 4.0}));  // below max_norm: unchanged
  }
  {
    const Grads g = make_grads();
    EXPECT_NEAR(optim::grad_norm(g.params(), 3.0), std::cbrt(1819.0), 1e-12);
  }
  // f16 / bf16 grads are summed in f32 (squares of 300 overflow f16): [300, 400] has 2-norm 500.
  for (DType dt : {DType::f16, DType::bf16, DType::f32}) {
    const Tensor p = leaf({0.0, 0.0}, dt);
    p.set_grad(from_vector<double>({300.0, 400.0}, {2}).to(dt));
    EXPECT_NEAR(optim::clip_grad_norm_({p}, 50.0), 500.0, 1e-3) << dtype_name(dt);
    EXPECT_TRUE(allclose(p.grad(), from_vector<double>({30.0, 40.0}, {2}), default_tolerance(dt)));
  }
  EXPECT_EQ(optim::grad_norm({leaf({1.0})}), 0.0);  // no grads at all
  EXPECT_THROW(optim::grad_norm(make_grads().params(), 0.0), ValueError);
  EXPECT_THROW(optim::grad_norm(make_grads().params(), -2.0), ValueError);
}

TEST(ClipGradNorm, NonFiniteTotal) {
  const double inf = std::numeric_limits<double>::infinity();
  const Tensor p = leaf({0.0, 0.0});
  p.set_grad(from_vector<double>({inf, 1.0}, {2}));
  EXPECT_THROW(optim::clip_grad_norm_({p}, 1.0, 2.0, /*error_if_nonfinite=*/true), ValueError);
  EXPECT_EQ(p.grad().to_vector<double>()[1], 1.0);  // unchanged
  // PyTorch semantics without the check: clip_coef = 1 / inf = 0, so finite grads become 0 and inf becomes NaN.
  EXPECT_EQ(optim::clip_grad_norm_({p}, 1.0), inf);
  const std::vector<double> after = p.grad().to_vector<double>();
  EXPECT_TRUE(std::isnan(after[0]));
  EXPECT_EQ(after[1], 0.0);
  // A NaN total makes every grad NaN.
  const Tensor q = leaf({0.0, 0.0});
  q.set_grad(from_vector<double>({std::nan(""), 1.0}, {2}));
  EXPECT_TRUE(std::isnan(optim::clip_grad_norm_({q}, 1.0)));
  EXPECT_TRUE(std::isnan(q.grad().to_vector<double>()[1]));
}

TEST(ClipGradValue, ClampsInPlace) {
  const Tensor p = leaf({0.0, 0.0, 0.0, 0.0});
  p.set_grad(from_vector<double>({-0.5, 2.0, 0.3, -7.0}, {4}));
  const void* storage = p.grad().raw_data();
  optim::clip_grad_value_({p, leaf({1.0})}, 1.0);
  EXPECT_EQ(p.grad().to_vector<double>(), (std::vector<double>{-0.5, 1.0, 0.3, -1.0}));
  EXPECT_EQ(p.grad().raw_data(), storage);
  EXPECT_THROW(optim::clip_grad_value_({p}, -1.0), ValueError);
}

}  // namespace
}  // namespace ember::testing

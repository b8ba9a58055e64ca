// Init tests: gains and fans against PyTorch's published formulas, sample statistics of the normal schemes on large
// tensors, hand-computed bounds of the uniform schemes, in-place fills through views and leaves that require grad,
// and seeded reproducibility.
#include <gtest/gtest.h>

#include <cmath>

#include "ember/ember.h"
#include "ember/nn/init.h"
#include "ember/nn/layers.h"

namespace ember::nn {
namespace {

std::vector<double> f64(const Tensor& t) { return t.to(DType::f64).contiguous().to_vector<double>(); }

struct Moments {
  double mean = 0, std = 0, min = 0, max = 0;
};

Moments moments(const Tensor& t) {
  const auto v = f64(t);
  Moments m;
  m.min = m.max = v[0];
  for (double x : v) {
    m.mean += x / double(v.size());
    m.min = std::min(m.min, x);
    m.max = std::max(m.max, x);
  }
  for (double x : v) m.std += (x - m.mean) * (x - m.mean) / double(v.size());
  m.std = std::sqrt(m.std);
  return m;
}

TEST(Init, CalculateGain) {
  EXPECT_EQ(init::calculate_gain("linear"), 1.0);
  EXPECT_EQ(init::calculate_gain("conv2d"), 1.0);
  EXPECT_EQ(init::calculate_gain("sigmoid"), 1.0);
  EXPECT_DOUBLE_EQ(init::calculate_gain("tanh"), 5.0 / 3.0);
  EXPECT_DOUBLE_EQ(init::calculate_gain("relu"), std::sqrt(2.0));
  EXPECT_DOUBLE_EQ(init::calculate_gain("leaky_relu"), std::sqrt(2.0 / (1 + 0.01 * 0.01)));
  EXPECT_DOUBLE_EQ(init::calculate_gain("leaky_relu", 0.2), std::sqrt(2.0 / 1.04));
  // a = sqrt(5), the Linear/Conv default: sqrt(2 / 6) = 1 / sqrt(3).
  EXPECT_DOUBLE_EQ(init::calculate_gain("leaky_relu", std::sqrt(5.0)), 1.0 / std::sqrt(3.0));
  EXPECT_DOUBLE_EQ(init::calculate_gain("selu"), 0.75);
  EXPECT_THROW(init::calculate_gain("softplus"), ValueError);
}

TEST(Init, FanInFanOut) {
  EXPECT_EQ(init::calculate_fan_in_and_fan_out(empty({16, 3, 5, 5})), (std::pair<int64_t, int64_t>{75, 400}));
  EXPECT_EQ(init::calculate_fan_in_and_fan_out(empty({128, 784})), (std::pair<int64_t, int64_t>{784, 128}));
  EXPECT_EQ(init::calculate_fan_in_and_fan_out(empty({4, 6, 3})), (std::pair<int64_t, int64_t>{18, 12}));
  EXPECT_THROW(init::calculate_fan_in_and_fan_out(empty({10})), ValueError);
  EXPECT_THROW(init::xavier_uniform_(empty({10})), ValueError);
  EXPECT_THROW(init::kaiming_normal_(empty({})), ValueError);
  EXPECT_THROW(init::kaiming_uniform_(empty({3, 3}), 0, "fan_avg"), ValueError);
  // Conv2d's weight [out, in / groups, kh, kw] has fan_in (in / groups) * kh * kw.
  Conv2d conv(8, 16, {3, 5}, 1, 0, 1, /*groups=*/2);
  EXPECT_EQ(init::calculate_fan_in_and_fan_out(conv.weight), (std::pair<int64_t, int64_t>{60, 240}));
}

TEST(Init, KaimingAndXavierNormalStatistics) {
  manual_seed(21);
  // 400,000 draws: the sample std is within ~0.2% of the true one; the mean within ~0.5% of std.
  const Tensor w = empty({1000, 400});
  init::kaiming_normal_(w, 0.0, "fan_in", "relu");
  Moments m = moments(w);
  double expected = std::sqrt(2.0 / 400.0);
  EXPECT_NEAR(m.mean, 0.0, 0.01 * expected);
  EXPECT_NEAR(m.std, expected, 0.01 * expected);

  init::kaiming_normal_(w, 0.0, "fan_out", "relu");
  m = moments(w);
  expected = std::sqrt(2.0 / 1000.0);
  EXPECT_NEAR(m.std, expected, 0.01 * expected);

  // Default nonlinearity leaky_relu with a = 0 has gain sqrt(2) too (PyTorch).
  init::kaiming_normal_(w);
  EXPECT_NEAR(moments(w).std, std::sqrt(2.0 / 400.0), 0.01 * std::sqrt(2.0 / 400.0));

  init::xavier_normal_(w, 2.0);
  m = moments(w);
  expected = 2.0 * std::sqrt(2.0 / 1400.0);
  EXPECT_NEAR(m.mean, 0.0, 0.01 * expected);
  EXPECT_NEAR(m.std, expected, 0.01 * expected);

  init::normal_(w, 3.0, 0.5);
  m = moments(w);
  EXPECT_NEAR(m.mean, 3.0, 0.005);
  EXPECT_NEAR(m.std, 0.5, 0.005);
}

TEST(Init, UniformBounds) {
  manual_seed(22);
  const Tensor w = empty({512, 256});
  // kaiming_uniform_(a = 0, fan_in, leaky_relu): bound = sqrt(2) * sqrt(3 / 256) = sqrt(6 / 256).
  init::kaiming_uniform_(w);
  double bound = std::sqrt(6.0 / 256.0);
  Moments m = moments(w);
  EXPECT_GE(m.min, -bound);
  EXPECT_LE(m.max, bound);
  EXPECT_GT(m.max, 0.99 * bound);
  EXPECT_LT(m.min, -0.99 * bound);
  EXPECT_NEAR(m.std, bound / std::sqrt(3.0), 0.01 * bound);  // U(-b, b) has std b / sqrt(3)

  // fan_out, tanh: bound = 5/3 * sqrt(3 / 512).
  init::kaiming_uniform_(w, 0.0, "fan_out", "tanh");
  bound = 5.0 / 3.0 * std::sqrt(3.0 / 512.0);
  m = moments(w);
  EXPECT_GE(m.min, -bound);
  EXPECT_LE(m.max, bound);
  EXPECT_GT(m.max, 0.99 * bound);

  // xavier_uniform_: bound = gain * sqrt(6 / (fan_in + fan_out)).
  init::xavier_uniform_(w, 0.5);
  bound = 0.5 * std::sqrt(6.0 / 768.0);
  m = moments(w);
  EXPECT_GE(m.min, -bound);
  EXPECT_LE(m.max, bound);
  EXPECT_GT(m.max, 0.99 * bound);

  // The Linear default, kaiming_uniform_(a = sqrt(5)): bound = 1 / sqrt(fan_in).
  init::kaiming_uniform_(w, std::sqrt(5.0));
  bound = 1.0 / 16.0;
  m = moments(w);
  EXPECT_GE(m.min, -bound);
  EXPECT_LE(m.max, bound);
  EXPECT_GT(m.max, 0.99 * bound);

  init::uniform_(w, 2.0, 3.0);
  m = moments(w);
  EXPECT_GE(m.min, 2.0);
  EXPECT_LT(m.max, 3.0);
  EXPECT_NEAR(m.mean, 2.5, 0.005);
  EXPECT_THROW(init::uniform_(w, 1.0, 0.0), ValueError);
}

TEST(Init, InPlaceOnLeavesViewsAndOtherDtypes) {
  // A leaf that requires grad: filled in place (the fill runs without recording), still a leaf.
  const Tensor p = zeros({4, 3});
  p.requires_grad_();
  const void* data = p.raw_data();
  const Tensor returned = init::ones_(p);
  EXPECT_TRUE(returned.is_same(p));
  EXPECT_EQ(p.raw_data(), data);
  EXPECT_EQ(f64(p), std::vector<double>(12, 1.0));
  EXPECT_TRUE(p.is_leaf());
  EXPECT_TRUE(p.requires_grad());
  init::kaiming_uniform_(p);
  EXPECT_TRUE(p.is_leaf());

  // A non-contiguous view: only its elements change.
  const Tensor base = zeros({4, 6});
  init::constant_(base.slice(1, 0, 6, 2).t(), 5.0);
  const auto b = f64(base);
  for (int r = 0; r < 4; ++r)
    for (int c = 0; c < 6; ++c) EXPECT_EQ(b[r * 6 + c], c % 2 == 0 ? 5.0 : 0.0);
  init::zeros_(base);
  EXPECT_EQ(f64(base), std::vector<double>(24, 0.0));

  // Half precision and f64 tensors draw in their dtype.
  const Tensor h = empty({256, 64}, DType::f16);
  init::xavier_uniform_(h);
  const double bound = std::sqrt(6.0 / 320.0);
  Moments m = moments(h);
  EXPECT_LE(m.max, bound * (1 + 1e-3));
  EXPECT_GE(m.min, -bound * (1 + 1e-3));
  const Tensor d = empty({64, 64}, DType::f64);
  init::normal_(d, 0.0, 2.0);
  EXPECT_NEAR(moments(d).std, 2.0, 0.1);

  // Integer tensors take constants but no random fills.
  const Tensor i = zeros({3}, DType::i64);
  init::constant_(i, 4);
  EXPECT_EQ(i.to_vector<int64_t>(), (std::vector<int64_t>{4, 4, 4}));
  EXPECT_THROW(init::uniform_(i), DTypeError);
  EXPECT_THROW(init::normal_(i), DTypeError);

  // Zero-element tensors are left alone.
  EXPECT_NO_THROW(init::kaiming_uniform_(empty({0, 5})));
}

TEST(Init, SeededReproducibility) {
  manual_seed(1234);
  const Tensor a = empty({32, 16});
  init::kaiming_normal_(a);
  Linear la(16, 8);
  manual_seed(1234);
  const Tensor b = empty({32, 16});
  init::kaiming_normal_(b);
  Linear lb(16, 8);
  EXPECT_EQ(f64(a), f64(b));
  EXPECT_EQ(f64(la.weight), f64(lb.weight));
  EXPECT_EQ(f64(la.bias), f64(lb.bias));
  // A different seed gives different values.
  manual_seed(4321);
  Linear lc(16, 8);
  EXPECT_NE(f64(la.weight), f64(lc.weight));
}

}  // namespace
}  // namespace ember::nn

// Layer tests: forwards against naive float64 loops (Linear, Conv2d, pools, AdaptiveAvgPool2d, LayerNorm,
// BatchNorm2d) and hand-computed values, gradients reaching every parameter (and BatchNorm2d's input gradient against
// finite differences), running statistics by hand, PyTorch's parameter names, and the ShapeErrors of bad inputs.
#include <gtest/gtest.h>

#include <cmath>
#include <set>

#include "ember/ember.h"
#include "ember/nn/layers.h"
#include "tests/harness/grad_check.h"
#include "tests/harness/op_harness.h"

namespace ember::nn {
namespace {

using ::ember::testing::allclose;
using ::ember::testing::rand_input;
using ::ember::testing::Tolerance;

std::vector<std::string> keys(const NamedTensors& named) {
  std::vector<std::string> out;
  for (const auto& [k, t] : named) out.push_back(k);
  return out;
}

std::vector<double> f64(const Tensor& t) { return t.to(DType::f64).contiguous().to_vector<double>(); }

using ember::testing::error_message;

// ---- Linear --------------------------------------------------------------------------------------------------

TEST(Linear, ForwardMatchesNaive) {
  Linear fc(5, 3);
  fc.to(DType::f64);
  const Tensor x = rand_input({2, 4, 5});
  const Tensor y = fc(x);
  ASSERT_EQ(y.sizes(), (Shape{2, 4, 3}));
  const auto w = f64(fc.weight), b = f64(fc.bias), xv = f64(x);
  std::vector<double> ref(2 * 4 * 3);
  for (int r = 0; r < 8; ++r) {
    for (int o = 0; o < 3; ++o) {
      double acc = b[o];
      for (int i = 0; i < 5; ++i) acc += xv[r * 5 + i] * w[o * 5 + i];
      ref[r * 3 + o] = acc;
    }
  }
  EXPECT_TRUE(allclose(y, from_vector(ref, {2, 4, 3}), {1e-12, 1e-12}));
  // No bias: only "weight" is registered.
  Linear nb(5, 3, false);
  EXPECT_EQ(keys(nb.state_dict()), std::vector<std::string>{"weight"});
  EXPECT_FALSE(nb.bias.defined());
}

TEST(Linear, DefaultInitBounds) {
  manual_seed(3);
  Linear fc(64, 200);
  const double bound = 1.0 / std::sqrt(64.0);  // kaiming_uniform_(a = sqrt(5)) and the bias both give 1/sqrt(in)
  double max_w = 0;
  for (double v : f64(fc.weight)) {
    EXPECT_LE(std::abs(v), bound);
    max_w = std::max(max_w, std::abs(v));
  }
  EXPECT_GT(max_w, 0.98 * bound);
  for (double v : f64(fc.bias)) EXPECT_LE(std::abs(v), bound);
}

TEST(Linear, ShapeErrorNamesLayer) {
  Linear fc(4, 2);
  const std::string msg = error_message<ShapeError>([&] { fc(zeros({3, 5})); });
  EXPECT_NE(msg.find("Linear"), std::string::npos) << msg;
  EXPECT_NE(msg.find("[3, 5]"), std::string::npos) << msg;
  EXPECT_THROW(fc(zeros({})), ShapeError);
}

// ---- Conv2d ------------------------------------------------------------------------------------------------

// Naive f64 convolution: x [N, C, H, W], w [O, C/g, KH, KW].
std::vector<double> naive_conv(const Tensor& xt, const Tensor& wt, const Tensor& bt, Size2 s, Size2 p, Size2 d,
                               int64_t g, int64_t& oh, int64_t& ow) {
  const auto x = f64(xt), w = f64(wt);
  const std::vector<double> b = bt.defined() ? f64(bt) : std::vector<double>();
  const int64_t n = xt.size(0), c = xt.size(1), h = xt.size(2), wd = xt.size(3);
  const int64_t o = wt.size(0), cg = wt.size(1), kh = wt.size(2), kw = wt.size(3);
  oh = (h + 2 * p.h - d.h * (kh - 1) - 1) / s.h + 1;
  ow = (wd + 2 * p.w - d.w * (kw - 1) - 1) / s.w + 1;
  std::vector<double> out(static_cast<size_t>(n * o * oh * ow));
  const int64_t og = o / g;
  for (int64_t in = 0; in < n; ++in)
    for (int64_t oc = 0; oc < o; ++oc)
      for (int64_t y = 0; y < oh; ++y)
        for (int64_t xx = 0; xx < ow; ++xx) {
          double acc = b.empty() ? 0.0 : b[oc];
          const int64_t grp = oc / og;
          for (int64_t ci = 0; ci < cg; ++ci)
            for (int64_t i = 0; i < kh; ++i)
              for (int64_t j = 0; j < kw; ++j) {
                const int64_t hy = y * s.h - p.h + i * d.h, wx = xx * s.w - p.w + j * d.w;
                if (hy < 0 || hy >= h || wx < 0 || wx >= wd) continue;
                const int64_t cin = grp * cg + ci;
                acc += x[((in * c + cin) * h + hy) * wd + wx] * w[((oc * cg + ci) * kh + i) * kw + j];
              }
          out[((in * o + oc) * oh + y) * ow + xx] = acc;
        }
  (void)c;
  return out;
}

TEST(Conv2d, ForwardMatchesNaive) {
  struct Case {
    int64_t in, out;
    Size2 k, s, p, d;
    int64_t g;
    bool bias;
  };
  const std::vector<Case> cases = {
      {3, 4, 3, 1, 0, 1, 1, true},
      {4, 6, {3, 2}, {2, 1}, {1, 0}, {1, 2}, 2, true},
      {2, 2, 1, 1, 0, 1, 2, false},
      {3, 5, {2, 3}, 2, 1, 1, 1, true},
  };
  for (const Case& c : cases) {
    Conv2d conv(c.in, c.out, c.k, c.s, c.p, c.d, c.g, c.bias);
    conv.to(DType::f64);
    EXPECT_EQ(conv.weight.sizes(), (Shape{c.out, c.in / c.g, c.k.h, c.k.w}));
    const Tensor x = rand_input({2, c.in, 7, 6});
    int64_t oh = 0, ow = 0;
    const auto ref = naive_conv(x, conv.weight, conv.bias, c.s, c.p, c.d, c.g, oh, ow);
    const Tensor y = conv(x);
    EXPECT_TRUE(allclose(y, from_vector(ref, {2, c.out, oh, ow}), {1e-12, 1e-12})) << conv.describe();
  }
}

TEST(Conv2d, OptionsUnbatchedAndRepr) {
  Conv2d a(Conv2dOptions(3, 8, 3).stride(2).padding(1).bias(false));
  EXPECT_EQ(a.options.stride(), Size2(2, 2));
  EXPECT_FALSE(a.bias.defined());
  EXPECT_EQ(a.describe(), "Conv2d(3, 8, kernel_size=(3, 3), stride=(2, 2), padding=(1, 1), bias=False)  # 216 parameters\n");
  Conv2d b(1, 32, 3);
  EXPECT_EQ(b.describe(), "Conv2d(1, 32, kernel_size=(3, 3), stride=(1, 1))  # 320 parameters\n");
  // An unbatched [C, H, W] input gives an unbatched output equal to the batched one.
  const Tensor x = randn({3, 9, 9});
  const Tensor y = a(x);
  EXPECT_EQ(y.sizes(), (Shape{8, 5, 5}));
  EXPECT_TRUE(allclose(y, a(x.unsqueeze(0)).squeeze(0), {0, 0}));
  EXPECT_THROW(Conv2d(3, 4, 3, 1, 0, 1, /*groups=*/2), ValueError);
}

TEST(Conv2d, ShapeErrors) {
  Conv2d conv(3, 4, 3);
  std::string msg = error_message<ShapeError>([&] { conv(zeros({2, 5, 8, 8})); });
  EXPECT_NE(msg.find("Conv2d"), std::string::npos) << msg;
  EXPECT_NE(msg.find("[2, 5, 8, 8]"), std::string::npos) << msg;
  msg = error_message<ShapeError>([&] { conv(zeros({8, 8})); });
  EXPECT_NE(msg.find("Conv2d"), std::string::npos) << msg;
}

TEST(Conv2d, GradientsByHand) {
  // out = conv(x) summed: d/d bias[o] = N * OH * OW; d/d w[o, c, i, j] = sum over n, y, x of the input under tap
  // (i, j). With x all ones and no padding every tap sees N * OH * OW ones.
  Conv2d conv(2, 3, 2);
  const Tensor x = ones({4, 2, 5, 6});
  sum(conv(x)).backward();
  EXPECT_EQ(f64(conv.bias.grad()), std::vector<double>(3, 4.0 * 4 * 5));
  EXPECT_EQ(f64(conv.weight.grad()), std::vector<double>(3 * 2 * 2 * 2, 4.0 * 4 * 5));
}

// ---- pools ------------------------------------------------------------------------------------------------------

TEST(Pooling, MaxAndAvgByHand) {
  // 1x1x4x4 input 0..15.
  const Tensor x = arange(0, 16, 1, DType::f32).view({1, 1, 4, 4});
  EXPECT_EQ(f64(MaxPool2d(2)(x)), (std::vector<double>{5, 7, 13, 15}));
  EXPECT_EQ(f64(AvgPool2d(2)(x)), (std::vector<double>{2.5, 4.5, 10.5, 12.5}));
  // kernel 3, stride 1: windows at (0,0),(0,1),(1,0),(1,1).
  EXPECT_EQ(f64(MaxPool2d(3, 1)(x)), (std::vector<double>{10, 11, 14, 15}));
  // kernel 2, stride 2, padding 1, count_include_pad false: corners average their single in-bounds element.
  const auto avg = f64(AvgPool2d(2, 2, 1, false)(x));
  ASSERT_EQ(avg.size(), 9u);
  EXPECT_EQ(avg[0], 0.0);
  EXPECT_EQ(avg[1], 1.5);
  EXPECT_EQ(avg[4], 7.5);
  // With count_include_pad the corner divides by 4.
  EXPECT_EQ(f64(AvgPool2d(2, 2, 1)(x))[0], 0.0);
  EXPECT_EQ(f64(AvgPool2d(2, 2, 1)(x))[8], 15.0 / 4);
  EXPECT_THROW(MaxPool2d(2)(zeros({4, 4})), ShapeError);
  EXPECT_EQ(MaxPool2d(2)(zeros({3, 4, 4})).sizes(), (Shape{3, 2, 2}));
}

std::vector<double> naive_adaptive(const Tensor& xt, int64_t oh, int64_t ow) {
  const auto x = f64(xt);
  const int64_t nc = xt.size(0) * xt.size(1), h = xt.size(2), w = xt.size(3);
  std::vector<double> out;
  for (int64_t p = 0; p < nc; ++p)
    for (int64_t i = 0; i < oh; ++i)
      for (int64_t j = 0; j < ow; ++j) {
        const int64_t h0 = static_cast<int64_t>(std::floor(double(i) * h / oh));
        const int64_t h1 = static_cast<int64_t>(std::ceil(double(i + 1) * h / oh));
        const int64_t w0 = static_cast<int64_t>(std::floor(double(j) * w / ow));
        const int64_t w1 = static_cast<int64_t>(std::ceil(double(j + 1) * w / ow));
        double acc = 0;
        for (int64_t a = h0; a < h1; ++a)
          for (int64_t b = w0; b < w1; ++b) acc += x[(p * h + a) * w + b];
        out.push_back(acc / double((h1 - h0) * (w1 - w0)));
      }
  return out;
}

TEST(AdaptiveAvgPool2d, MatchesNaiveWindows) {
  struct Case {
    int64_t h, w, oh, ow;
  };
  for (const Case& c : std::vector<Case>{{7, 5, 3, 2}, {4, 6, 2, 3}, {6, 6, 1, 1}, {3, 3, 5, 4}, {10, 7, 4, 7},
                                         {5, 5, 5, 5}, {9, 4, 2, 4}}) {
    AdaptiveAvgPool2d pool(Size2(c.oh, c.ow));
    const Tensor x = rand_input({2, 3, c.h, c.w});
    const Tensor y = pool(x);
    ASSERT_EQ(y.sizes(), (Shape{2, 3, c.oh, c.ow}));
    EXPECT_TRUE(allclose(y, from_vector(naive_adaptive(x, c.oh, c.ow), {2, 3, c.oh, c.ow}), {1e-12, 1e-14}))
        << c.h << "x" << c.w << " -> " << c.oh << "x" << c.ow;
    const Tensor y32 = pool(x.to(DType::f32));
    EXPECT_TRUE(allclose(y32, from_vector(naive_adaptive(x, c.oh, c.ow), {2, 3, c.oh, c.ow}), {1e-5, 1e-6}));
  }
  EXPECT_EQ(AdaptiveAvgPool2d(1)(zeros({3, 4, 4})).sizes(), (Shape{3, 1, 1}));
  EXPECT_THROW(AdaptiveAvgPool2d(0), ValueError);
}

TEST(AdaptiveAvgPool2d, GradientMatchesFiniteDifferences) {
  for (int64_t oh : {3, 2}) {
    testing::GradCase c{"adaptive_avg_pool2d", {rand_input({2, 2, 7, 4})}, [oh](const testing::Inputs& in) {
                          return AdaptiveAvgPool2d(Size2(oh, 3))(in[0]);
                        }};
    check_grad(c, Device::cpu());
  }
}

// ---- BatchNorm2d -------------------------------------------------------------------------------------------------

struct ChannelStats {
  std::vector<double> mean, biased_var, unbiased_var;
};

ChannelStats channel_stats(const Tensor& xt) {
  const auto x = f64(xt);
  const int64_t n = xt.size(0), c = xt.size(1), hw = xt.size(2) * xt.size(3);
  ChannelStats s;
  for (int64_t ch = 0; ch < c; ++ch) {
    double sum = 0;
    for (int64_t i = 0; i < n; ++i)
      for (int64_t k = 0; k < hw; ++k) sum += x[(i * c + ch) * hw + k];
    const double m = sum / double(n * hw);
    double sq = 0;
    for (int64_t i = 0; i < n; ++i)
      for (int64_t k = 0; k < hw; ++k) sq += (x[(i * c + ch) * hw + k] - m) * (x[(i * c + ch) * hw + k] - m);
    s.mean.push_back(m);
    s.biased_var.push_back(sq / double(n * hw));
    s.unbiased_var.push_back(sq / double(n * hw - 1));
  }
  return s;
}

TEST(BatchNorm2d, TrainNormalisesAndUpdatesRunningStats) {
  BatchNorm2d bn(3);
  EXPECT_EQ(keys(bn.state_dict()), (std::vector<std::string>{"weight", "bias", "running_mean", "running_var",
                                                              "num_batches_tracked"}));
  EXPECT_EQ(bn.num_batches_tracked.dim(), 0);
  EXPECT_EQ(bn.num_batches_tracked.dtype(), DType::i64);
  bn.to(DType::f64);
  const Tensor x = add(mul(rand_input({4, 3, 5, 6}), 3.0), 2.0);
  const ChannelStats s = channel_stats(x);
  const Tensor y = bn(x);
  // Output: per channel mean 0, biased variance var / (var + eps) (= 1 up to eps).
  const ChannelStats ys = channel_stats(y);
  for (int c = 0; c < 3; ++c) {
    EXPECT_NEAR(ys.mean[c], 0.0, 1e-12);
    EXPECT_NEAR(ys.biased_var[c], s.biased_var[c] / (s.biased_var[c] + 1e-5), 1e-12);
    EXPECT_NEAR(ys.biased_var[c], 1.0, 1e-4);
  }
  // Running stats: 0.9 * init + 0.1 * batch, with the unbiased variance.
  const auto rm = f64(bn.running_mean), rv = f64(bn.running_var);
  for (int c = 0; c < 3; ++c) {
    EXPECT_NEAR(rm[c], 0.9 * 0.0 + 0.1 * s.mean[c], 1e-12);
    EXPECT_NEAR(rv[c], 0.9 * 1.0 + 0.1 * s.unbiased_var[c], 1e-12);
  }
  EXPECT_EQ(bn.num_batches_tracked.item<int64_t>(), 1);
  // The running stats carry no autograd history.
  EXPECT_FALSE(bn.running_mean.requires_grad());
  EXPECT_TRUE(bn.running_mean.is_leaf());

  // Eval: normalise with the running stats (and weight/bias), statistics left alone.
  {
    NoGradGuard g;
    bn.weight.copy_(from_vector<double>({2.0, -1.0, 0.5}, {3}));
    bn.bias.copy_(from_vector<double>({0.1, 0.2, 0.3}, {3}));
  }
  bn.eval();
  const Tensor x2 = rand_input({2, 3, 2, 2});
  const Tensor y2 = bn(x2);
  const auto xv = f64(x2);
  std::vector<double> ref(xv.size());
  const double w[3] = {2.0, -1.0, 0.5}, b[3] = {0.1, 0.2, 0.3};
  for (size_t i = 0; i < xv.size(); ++i) {
    const int c = static_cast<int>((i / 4) % 3);
    ref[i] = (xv[i] - rm[c]) / std::sqrt(rv[c] + 1e-5) * w[c] + b[c];
  }
  EXPECT_TRUE(allclose(y2, from_vector(ref, {2, 3, 2, 2}), {1e-12, 1e-12}));
  EXPECT_EQ(f64(bn.running_mean), rm);
  EXPECT_EQ(bn.num_batches_tracked.item<int64_t>(), 1);
}

TEST(BatchNorm2d, CumulativeAverageAndNoTracking) {
  BatchNorm2d bn(2, 1e-5, std::nullopt);  // momentum None: running stats are the plain average of batch stats
  bn.to(DType::f64);
  const Tensor a = rand_input({3, 2, 2, 2}), b = add(rand_input({3, 2, 2, 2}), 1.0);
  bn(a);
  bn(b);
  const ChannelStats sa = channel_stats(a), sb = channel_stats(b);
  const auto rm = f64(bn.running_mean), rv = f64(bn.running_var);
  for (int c = 0; c < 2; ++c) {
    EXPECT_NEAR(rm[c], (sa.mean[c] + sb.mean[c]) / 2, 1e-12);
    EXPECT_NEAR(rv[c], (sa.unbiased_var[c] + sb.unbiased_var[c]) / 2, 1e-12);
  }
  EXPECT_EQ(bn.num_batches_tracked.item<int64_t>(), 2);

  // Without running stats there are no buffers and eval still uses the batch statistics.
  BatchNorm2d plain(2, 1e-5, 0.1, /*affine=*/false, /*track_running_stats=*/false);
  EXPECT_TRUE(plain.state_dict().empty());
  plain.eval();
  plain.to(DType::f64);
  const ChannelStats ys = channel_stats(plain(a));
  for (int c = 0; c < 2; ++c) EXPECT_NEAR(ys.mean[c], 0.0, 1e-12);
}

TEST(BatchNorm2d, Errors) {
  BatchNorm2d bn(3);
  std::string msg = error_message<ShapeError>([&] { bn(zeros({2, 3, 4})); });
  EXPECT_NE(msg.find("BatchNorm2d"), std::string::npos) << msg;
  msg = error_message<ShapeError>([&] { bn(zeros({2, 4, 3, 3})); });
  EXPECT_NE(msg.find("[2, 4, 3, 3]"), std::string::npos) << msg;
  EXPECT_THROW(bn(zeros({1, 3, 1, 1})), ValueError);  // one value per channel while training
  bn.eval();
  EXPECT_EQ(bn(zeros({1, 3, 1, 1})).sizes(), (Shape{1, 3, 1, 1}));
}

TEST(BatchNorm2d, InputGradientMatchesFiniteDifferences) {
  for (bool training : {true, false}) {
    auto bn = std::make_shared<BatchNorm2d>(3);
    bn->to(DType::f64);
    {
      NoGradGuard g;
      bn->weight.copy_(from_vector<double>({1.5, -0.5, 2.0}, {3}));
      bn->bias.copy_(from_vector<double>({0.3, 0.0, -1.0}, {3}));
      bn->running_mean.copy_(from_vector<double>({0.1, -0.2, 0.3}, {3}));
      bn->running_var.copy_(from_vector<double>({0.5, 1.5, 2.0}, {3}));
    }
    bn->train(training);
    testing::GradCase c{"batch_norm2d", {rand_input({3, 3, 2, 3})},
                        [bn](const testing::Inputs& in) { return (*bn)(in[0]); }};
    c.dtypes = {};
    check_grad(c, Device::cpu());
  }
}

TEST(BatchNorm2d, ParameterGradientsByHand) {
  // L = sum(v * y), y = xhat * w + b: dL/dw[c] = sum v * xhat over channel c, dL/db[c] = sum v over channel c.
  BatchNorm2d bn(2);
  bn.to(DType::f64);
  const Tensor x = rand_input({3, 2, 2, 2}), v = rand_input({3, 2, 2, 2});
  sum(mul(bn(x), v)).backward();
  const ChannelStats s = channel_stats(x);
  const auto xv = f64(x), vv = f64(v);
  double gw[2] = {0, 0}, gb[2] = {0, 0};
  for (size_t i = 0; i < xv.size(); ++i) {
    const int c = static_cast<int>((i / 4) % 2);
    gw[c] += vv[i] * (xv[i] - s.mean[c]) / std::sqrt(s.biased_var[c] + 1e-5);
    gb[c] += vv[i];
  }
  EXPECT_TRUE(allclose(bn.weight.grad(), from_vector<double>({gw[0], gw[1]}, {2}), {1e-10, 1e-12}));
  EXPECT_TRUE(allclose(bn.bias.grad(), from_vector<double>({gb[0], gb[1]}, {2}), {1e-10, 1e-12}));
}

// ---- LayerNorm, Embedding, Dropout, activations, Flatten -----------------------------------------------------------

TEST(LayerNorm, MatchesNaiveAndChecksShape) {
  LayerNorm ln(Shape{2, 3});
  EXPECT_EQ(keys(ln.state_dict()), (std::vector<std::string>{"weight", "bias"}));
  EXPECT_EQ(f64(ln.weight), std::vector<double>(6, 1.0));
  ln.to(DType::f64);
  {
    NoGradGuard g;
    ln.weight.copy_(from_vector<double>({1, 2, 3, 4, 5, 6}, {2, 3}));
  }
  const Tensor x = rand_input({4, 2, 3});
  const auto xv = f64(x);
  std::vector<double> ref;
  for (int r = 0; r < 4; ++r) {
    double m = 0, v = 0;
    for (int k = 0; k < 6; ++k) m += xv[r * 6 + k] / 6;
    for (int k = 0; k < 6; ++k) v += (xv[r * 6 + k] - m) * (xv[r * 6 + k] - m) / 6;
    for (int k = 0; k < 6; ++k) ref.push_back((xv[r * 6 + k] - m) / std::sqrt(v + 1e-5) * (k + 1));
  }
  EXPECT_TRUE(allclose(ln(x), from_vector(ref, {4, 2, 3}), {1e-12, 1e-12}));
  const std::string msg = error_message<ShapeError>([&] { ln(zeros({4, 3, 2}, DType::f64)); });
  EXPECT_NE(msg.find("LayerNorm"), std::string::npos) << msg;
  // Variants without parameters.
  EXPECT_EQ(keys(LayerNorm(8, 1e-5, false).state_dict()), std::vector<std::string>{});
  EXPECT_EQ(keys(LayerNorm(8, 1e-5, true, false).state_dict()), std::vector<std::string>{"weight"});
  EXPECT_EQ(LayerNorm(8).describe(), "LayerNorm((8,), eps=1e-05, elementwise_affine=True)  # 16 parameters\n");
}

TEST(Embedding, PicksRowsAndInitIsStandardNormal) {
  manual_seed(11);
  Embedding emb(1000, 64);
  EXPECT_EQ(keys(emb.state_dict()), std::vector<std::string>{"weight"});
  const auto w = f64(emb.weight);
  double m = 0, sq = 0;
  for (double v : w) m += v / double(w.size());
  for (double v : w) sq += (v - m) * (v - m) / double(w.size());
  EXPECT_NEAR(m, 0.0, 0.01);             // 64000 draws: standard error 0.004
  EXPECT_NEAR(std::sqrt(sq), 1.0, 0.01);
  const Tensor idx = from_vector<int64_t>({3, 999, 3, 0}, {2, 2});
  const Tensor y = emb(idx);
  ASSERT_EQ(y.sizes(), (Shape{2, 2, 64}));
  const auto yv = f64(y);
  for (int k = 0; k < 64; ++k) {
    EXPECT_EQ(yv[k], w[3 * 64 + k]);
    EXPECT_EQ(yv[64 + k], w[999 * 64 + k]);
    EXPECT_EQ(yv[3 * 64 + k], w[k]);
  }
  EXPECT_THROW(emb(zeros({2})), DTypeError);
}

TEST(Dropout, IdentityInEvalScaledInTraining) {
  Dropout drop(0.5);
  const Tensor x = ones({100, 100});
  drop.eval();
  EXPECT_TRUE(allclose(drop(x), x, {0, 0}));
  drop.train();
  const auto y = f64(drop(x));
  int64_t zeros_n = 0;
  for (double v : y) {
    EXPECT_TRUE(v == 0.0 || v == 2.0) << v;
    zeros_n += v == 0.0;
  }
  EXPECT_NEAR(double(zeros_n) / 10000.0, 0.5, 0.03);
  EXPECT_THROW(Dropout(1.5), ValueError);
}

TEST(Activations, HandValues) {
  const Tensor x = from_vector<double>({-1.0, 0.0, 1.0, 2.0}, {4});
  EXPECT_TRUE(allclose(ReLU()(x), from_vector<double>({0, 0, 1, 2}, {4}), {0, 0}));
  // GELU(x) = x * Phi(x): Phi(1) = 0.8413447460685429, Phi(2) = 0.9772498680518208.
  EXPECT_TRUE(allclose(GELU()(x),
                       from_vector<double>({-1 + 0.8413447460685429, 0, 0.8413447460685429, 2 * 0.9772498680518208}, {4}),
                       {1e-12, 1e-12}));
  // tanh form: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))).
  std::vector<double> tanh_ref;
  for (double v : {-1.0, 0.0, 1.0, 2.0})
    tanh_ref.push_back(0.5 * v * (1 + std::tanh(std::sqrt(2 / M_PI) * (v + 0.044715 * v * v * v))));
  EXPECT_TRUE(allclose(GELU("tanh")(x), from_vector(tanh_ref, {4}), {1e-12, 1e-12}));
  EXPECT_THROW(GELU("erf"), ValueError);
  // SiLU(x) = x sigmoid(x): sigmoid(1) = 0.7310585786300049.
  EXPECT_NEAR(f64(SiLU()(x))[2], 0.7310585786300049, 1e-12);
  EXPECT_NEAR(f64(Sigmoid()(x))[0], 1 - 0.7310585786300049, 1e-12);
  EXPECT_NEAR(f64(Tanh()(x))[3], std::tanh(2.0), 1e-12);
  EXPECT_TRUE(Identity()(x).is_same(x));
}

TEST(Flatten, ShapesAndErrors) {
  EXPECT_EQ(Flatten()(zeros({2, 3, 4, 5})).sizes(), (Shape{2, 60}));
  EXPECT_EQ(Flatten(0)(zeros({2, 3, 4})).sizes(), (Shape{24}));
  EXPECT_EQ(Flatten(1, 2)(zeros({2, 3, 4, 5})).sizes(), (Shape{2, 12, 5}));
  EXPECT_EQ(Flatten(-3, -2)(zeros({2, 3, 4, 5})).sizes(), (Shape{2, 12, 5}));
  const std::string msg = error_message<ShapeError>([&] { Flatten(2)(zeros({2, 3})); });
  EXPECT_NE(msg.find("Flatten"), std::string::npos) << msg;
}

// ---- containers --------------------------------------------------------------------------------------------------

TEST(Sequential, CnnShapeNamesAndGradients) {
  auto net = std::make_shared<Sequential>(std::make_shared<Conv2d>(1, 8, 3), std::make_shared<BatchNorm2d>(8),
                                          std::make_shared<ReLU>(), std::make_shared<MaxPool2d>(2),
                                          std::make_shared<Flatten>(), std::make_shared<Linear>(8 * 13 * 13, 10));
  EXPECT_EQ(net->size(), 6u);
  EXPECT_EQ(keys(net->state_dict()),
            (std::vector<std::string>{"0.weight", "0.bias", "1.weight", "1.bias", "1.running_mean", "1.running_var",
                                      "1.num_batches_tracked", "5.weight", "5.bias"}));
  EXPECT_EQ(net->at<Linear>(5)->in_features, 8 * 13 * 13);
  EXPECT_THROW(net->at<Linear>(0), ValueError);
  EXPECT_THROW((*net)[6], IndexError);
  const Tensor y = (*net)(randn({2, 1, 28, 28}));
  EXPECT_EQ(y.sizes(), (Shape{2, 10}));
  sum(mul(y, randn({2, 10}))).backward();
  for (const auto& [name, p] : net->named_parameters()) {
    ASSERT_TRUE(p.grad().defined()) << name;
    EXPECT_EQ(p.grad().sizes(), p.sizes()) << name;
    double mx = 0;
    for (double v : f64(p.grad())) mx = std::max(mx, std::abs(v));
    EXPECT_GT(mx, 0.0) << name;
  }
  // Named children and an empty Sequential (identity).
  Sequential named;
  named.push_back("features", std::make_shared<ReLU>());
  named.push_back(std::make_shared<Tanh>());
  EXPECT_EQ(named.named_children()[0].first, "features");
  EXPECT_EQ(named.named_children()[1].first, "1");
  const Tensor x = randn({3});
  EXPECT_TRUE(Sequential()(x).is_same(x));
}

TEST(ModuleList, RegistersAndIterates) {
  struct Stack : Module {
    Stack() : Module("Stack") {
      blocks = register_module("blocks", std::make_shared<ModuleList>());
      for (int i = 0; i < 3; ++i) blocks->push_back(std::make_shared<Linear>(4, 4));
      norm = register_module("norm", std::make_shared<LayerNorm>(4));
    }
    Tensor forward(const Tensor& x) override {
      Tensor h = x;
      for (const auto& b : *blocks) h = b->forward(h);
      return norm->forward(h);
    }
    std::shared_ptr<ModuleList> blocks;
    std::shared_ptr<LayerNorm> norm;
  };
  Stack s;
  EXPECT_EQ(s.blocks->size(), 3u);
  EXPECT_EQ(keys(s.named_parameters()),
            (std::vector<std::string>{"blocks.0.weight", "blocks.0.bias", "blocks.1.weight", "blocks.1.bias",
                                      "blocks.2.weight", "blocks.2.bias", "norm.weight", "norm.bias"}));
  EXPECT_EQ(s.blocks->at<Linear>(2)->out_features, 4);
  EXPECT_THROW((*s.blocks)[3], IndexError);
  sum(mul(s(randn({5, 4})), randn({5, 4}))).backward();
  for (const Tensor& p : s.parameters()) EXPECT_TRUE(p.grad().defined());
}

}  // namespace
}  // namespace ember::nn

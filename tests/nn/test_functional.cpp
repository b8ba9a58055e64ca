// nn::functional against hand-computed values and float64 loop references: cross-entropy (ignore_index, label
// smoothing, reductions, gradient = softmax - one-hot), nll, mse, batch_norm statistics and running-stat updates,
// scaled dot-product attention (causal, masks) and finite-difference gradients through it.
#include <cmath>
#include <limits>
#include <vector>

#include "ember/nn/functional.h"
#include "tests/harness/grad_check.h"

namespace ember::testing {
namespace {

namespace F = ember::nn::functional;
using F::Reduction;

// The 2x3 example worked out by hand: logits [[1, 2, 3], [1, 0, -1]], targets [2, 1]. Both rows have
// logsumexp = max + log(1 + e^-1 + e^-2), so the losses are L and 1 + L with L = log(1 + e^-1 + e^-2).
const double kL = std::log(1.0 + std::exp(-1.0) + std::exp(-2.0));  // 0.40760596444438...

class FunctionalTest : public DeviceTest {
 protected:
  void SetUp() override {
    DeviceTest::SetUp();
    if (IsSkipped()) return;
    EMBER_REQUIRE_KERNEL(softmax_stub);
    EMBER_REQUIRE_KERNEL(reduce_stub);
    EMBER_REQUIRE_KERNEL(binary_stub);
    EMBER_REQUIRE_KERNEL(where_stub);
    EMBER_REQUIRE_KERNEL(unary_stub);
    EMBER_REQUIRE_KERNEL(unary_backward_stub);
    EMBER_REQUIRE_KERNEL(bmm_stub);
  }
  Tensor logits() const {
    return from_vector<double>({1, 2, 3, 1, 0, -1}, {2, 3}).to(device());
  }
  Tensor targets(std::vector<int64_t> t) const {
    const int64_t n = static_cast<int64_t>(t.size());
    return from_vector<int64_t>(t, {n}).to(device());
  }
};

double value(const Tensor& t) { return t.cpu().item_double(); }

TEST_P(FunctionalTest, CrossEntropyHandComputed) {
  EXPECT_NEAR(kL, 0.40760596444438, 1e-13);
  const Tensor x = logits(), t = targets({2, 1});
  EXPECT_NEAR(value(F::cross_entropy(x, t)), (kL + 1.0 + kL) / 2.0, 1e-12);
  EXPECT_NEAR(value(F::cross_entropy(x, t, -100, 0.0, Reduction::Sum)), kL + 1.0 + kL, 1e-12);
  const Tensor none = F::cross_entropy(x, t, -100, 0.0, Reduction::None);
  ASSERT_EQ(none.sizes(), Shape{2});
  EXPECT_TRUE(allclose(none, from_vector<double>({kL, 1.0 + kL}, {2}), {1e-12, 1e-12}));
  // f32 logits give an f32 loss of the same value.
  const Tensor l32 = F::cross_entropy(x.to(DType::f32), t);
  EXPECT_EQ(l32.dtype(), DType::f32);
  EXPECT_NEAR(value(l32), 0.90760596444438, 1e-6);
}

TEST_P(FunctionalTest, CrossEntropyIgnoreIndex) {
  // Three rows; the middle one is ignored: mean over the two others, and 0 in the unreduced loss.
  const Tensor x = from_vector<double>({1, 2, 3, 5, -5, 0, 1, 0, -1}, {3, 3}).to(device());
  EXPECT_NEAR(value(F::cross_entropy(x, targets({2, -100, 1}))), (kL + 1.0 + kL) / 2.0, 1e-12);
  EXPECT_NEAR(value(F::cross_entropy(x, targets({2, -100, 1}), -100, 0.0, Reduction::Sum)), 1.0 + 2 * kL, 1e-12);
  EXPECT_TRUE(allclose(F::cross_entropy(x, targets({2, -100, 1}), -100, 0.0, Reduction::None),
                       from_vector<double>({kL, 0.0, 1.0 + kL}, {3}), {1e-12, 1e-12}));
  // An ignore_index that is also a valid class: rows with target 0 are left out, others are not.
  EXPECT_NEAR(value(F::cross_entropy(x, targets({2, 0, 1}), /*ignore_index=*/0)), (kL + 1.0 + kL) / 2.0, 1e-12);
  // Every target ignored: 0 / 0, as PyTorch.
  EXPECT_TRUE(std::isnan(value(F::cross_entropy(x, targets({-100, -100, -100})))));
}

TEST_P(FunctionalTest, CrossEntropyLabelSmoothing) {
  // Per row: (1 - eps) * nll + eps * mean_c(-log p_c). Row 0: -log p = [2 + L, 1 + L, L], target 2;
  // row 1: -log p = [L, 1 + L, 2 + L], target 1. mean_c(-log p) = 1 + L in both rows.
  const double eps = 0.1;
  const double l0 = (1 - eps) * kL + eps * (1.0 + kL);
  const double l1 = (1 - eps) * (1.0 + kL) + eps * (1.0 + kL);
  EXPECT_NEAR(l0, 0.50760596444438, 1e-12);
  const Tensor x = logits();
  EXPECT_NEAR(value(F::cross_entropy(x, targets({2, 1}), -100, eps)), (l0 + l1) / 2.0, 1e-12);
  EXPECT_NEAR(value(F::cross_entropy(x, targets({2, 1}), -100, eps, Reduction::Sum)), l0 + l1, 1e-12);
  EXPECT_TRUE(allclose(F::cross_entropy(x, targets({2, 1}), -100, eps, Reduction::None),
                       from_vector<double>({l0, l1}, {2}), {1e-12, 1e-12}));
  // Ignored rows take no part in the smoothing term either.
  EXPECT_NEAR(value(F::cross_entropy(x, targets({2, -100}), -100, eps)), l0, 1e-12);
  EXPECT_THROW(F::cross_entropy(x, targets({2, 1}), -100, 1.5), ValueError);
}

TEST_P(FunctionalTest, CrossEntropyGradientIsSoftmaxMinusOneHot) {
  const int64_t N = 4, C = 5;
  const Tensor x0 = rand_input({N, C}, -2.0, 2.0);
  const std::vector<int64_t> tv{3, -100, 0, 4};
  const Tensor x = x0.to(device());
  x.requires_grad_(true);
  const Tensor loss = F::cross_entropy(x, targets(tv));
  loss.backward();
  // Reference by hand: (softmax(x) - onehot(t)) / (number of non-ignored rows), ignored rows 0.
  const std::vector<double> xs = x0.to_vector<double>();
  std::vector<double> expected(N * C, 0.0);
  const double count = 3.0;
  for (int64_t i = 0; i < N; ++i) {
    if (tv[i] == -100) continue;
    double z = 0.0;
    for (int64_t c = 0; c < C; ++c) z += std::exp(xs[i * C + c]);
    for (int64_t c = 0; c < C; ++c)
      expected[i * C + c] = (std::exp(xs[i * C + c]) / z - (c == tv[i] ? 1.0 : 0.0)) / count;
  }
  ASSERT_TRUE(x.grad().defined());
  EXPECT_TRUE(allclose(x.grad(), from_vector<double>(expected, {N, C}), {1e-10, 1e-12}));
}

TEST_P(FunctionalTest, CrossEntropyFiniteDifferences) {
  const Tensor t = from_vector<int64_t>({1, 0, -100, 2, 2, 1}, {2, 3});
  GradCase c{"cross_entropy [N, C, d] smoothed", {rand_input({2, 4, 3}, -2.0, 2.0), t},
             [](const Inputs& in) { return F::cross_entropy(in[0], in[1], -100, 0.2); }};
  check_grad(c, device());
  GradCase n{"cross_entropy none", {noncontiguous_input({5, 3}), rand_indices({5}, 3)},
             [](const Inputs& in) { return F::cross_entropy(in[0], in[1], -100, 0.0, Reduction::None); }};
  check_grad(n, device());
}

TEST_P(FunctionalTest, CrossEntropyLayouts) {
  // [C] with a 0-d target = one row.
  const Tensor row = from_vector<double>({1, 0, -1}, {3}).to(device());
  const Tensor l = F::cross_entropy(row, from_vector<int64_t>({1}, {}).to(device()));
  EXPECT_EQ(l.dim(), 0);
  EXPECT_NEAR(value(l), 1.0 + kL, 1e-12);
  // [N, C, d]: class dim 1; equals the [N*d, C] rows.
  const Tensor x = rand_input({2, 4, 3});
  const Tensor t = rand_indices({2, 3}, 4);
  const Tensor per = F::cross_entropy(x.to(device()), t.to(device()), -100, 0.0, Reduction::None);
  ASSERT_EQ(per.sizes(), (Shape{2, 3}));
  const std::vector<double> xs = x.to_vector<double>();
  const std::vector<int64_t> ts = t.to_vector<int64_t>();
  std::vector<double> expected;
  for (int64_t n = 0; n < 2; ++n)
    for (int64_t d = 0; d < 3; ++d) {
      double z = 0.0;
      for (int64_t c = 0; c < 4; ++c) z += std::exp(xs[(n * 4 + c) * 3 + d]);
      expected.push_back(std::log(z) - xs[(n * 4 + ts[n * 3 + d]) * 3 + d]);
    }
  EXPECT_TRUE(allclose(per, from_vector<double>(expected, {2, 3}), {1e-12, 1e-12}));
}

TEST_P(FunctionalTest, CrossEntropyErrors) {
  const Tensor x = logits();
  try {
    F::cross_entropy(x, targets({2, 7}));
    FAIL() << "expected IndexError";
  } catch (const IndexError& e) {
    EXPECT_NE(std::string(e.what()).find("target 7"), std::string::npos) << e.what();
  }
  EXPECT_THROW(F::cross_entropy(x, targets({-1, 0})), IndexError);
  EXPECT_THROW(F::cross_entropy(x, targets({2, 1}).to(DType::i32)), DTypeError);
  EXPECT_THROW(F::cross_entropy(x, targets({2, 1, 0})), ShapeError);
  // Logits [B, T, V] with targets [B, T]: the message says how to lay them out.
  try {
    F::cross_entropy(zeros({2, 3, 5}, {DType::f32, device()}), zeros({2, 3}, {DType::i64, device()}));
    FAIL() << "expected ShapeError";
  } catch (const ShapeError& e) {
    EXPECT_NE(std::string(e.what()).find("flatten to input [B*T, V]"), std::string::npos) << e.what();
  }
}

TEST_P(FunctionalTest, NllLoss) {
  const Tensor logp = from_vector<double>({-0.5, -1.5, -2.5, -3.0, -0.1, -4.0}, {2, 3}).to(device());
  EXPECT_NEAR(value(F::nll_loss(logp, targets({1, 2}))), (1.5 + 4.0) / 2, 1e-12);
  EXPECT_NEAR(value(F::nll_loss(logp, targets({1, -100}), -100, Reduction::Sum)), 1.5, 1e-12);
  EXPECT_NEAR(value(F::nll_loss(logp, targets({1, -100}))), 1.5, 1e-12);
}

TEST_P(FunctionalTest, MseLoss) {
  const Tensor a = from_vector<double>({1, 2, 3, 4}, {2, 2}).to(device());
  const Tensor b = from_vector<double>({0, 2, 5, 1}, {2, 2}).to(device());
  EXPECT_NEAR(value(F::mse_loss(a, b)), (1.0 + 0.0 + 4.0 + 9.0) / 4.0, 1e-12);
  EXPECT_NEAR(value(F::mse_loss(a, b, Reduction::Sum)), 14.0, 1e-12);
  EXPECT_TRUE(allclose(F::mse_loss(a, b, Reduction::None), from_vector<double>({1, 0, 4, 9}, {2, 2}), {0, 0}));
  const Tensor p = a.clone();
  p.requires_grad_(true);
  F::mse_loss(p, b).backward();
  // d/da mean((a - b)^2) = 2 (a - b) / n
  EXPECT_TRUE(allclose(p.grad(), from_vector<double>({0.5, 0.0, -1.0, 1.5}, {2, 2}), {1e-12, 1e-12}));
  // [N, 1] against [N] would broadcast to [N, N]: refused.
  EXPECT_THROW(F::mse_loss(a.reshape({4, 1}), b.reshape({4})), ShapeError);
}

// Batch statistics over (N, L) per channel of x [N, C, L], by loops.
void channel_stats(const std::vector<double>& x, int64_t N, int64_t C, int64_t L, std::vector<double>& mean,
                   std::vector<double>& var_biased) {
  mean.assign(C, 0.0);
  var_biased.assign(C, 0.0);
  for (int64_t c = 0; c < C; ++c) {
    for (int64_t n = 0; n < N; ++n)
      for (int64_t l = 0; l < L; ++l) mean[c] += x[(n * C + c) * L + l];
    mean[c] /= double(N * L);
    for (int64_t n = 0; n < N; ++n)
      for (int64_t l = 0; l < L; ++l) {
        const double d = x[(n * C + c) * L + l] - mean[c];
        var_biased[c] += d * d;
      }
    var_biased[c] /= double(N * L);
  }
}

TEST_P(FunctionalTest, BatchNormTrainingAndRunningStats) {
  const int64_t N = 4, C = 3, L = 2;
  const Tensor x = rand_input({N, C, L}, -2.0, 3.0);
  const std::vector<double> xs = x.to_vector<double>();
  const std::vector<double> w{0.5, -1.0, 2.0}, b{0.1, 0.2, -0.3};
  std::vector<double> mean, var;
  channel_stats(xs, N, C, L, mean, var);
  const double eps = 1e-5, momentum = 0.1;

  const Tensor rm = zeros({C}, {DType::f64, device()}), rv = ones({C}, {DType::f64, device()});
  const Tensor out = F::batch_norm(x.to(device()), rm, rv, from_vector<double>(w, {C}).to(device()),
                                   from_vector<double>(b, {C}).to(device()), /*training=*/true, momentum, eps);
  std::vector<double> expected(xs.size());
  for (int64_t n = 0; n < N; ++n)
    for (int64_t c = 0; c < C; ++c)
      for (int64_t l = 0; l < L; ++l) {
        const int64_t i = (n * C + c) * L + l;
        expected[i] = (xs[i] - mean[c]) / std::sqrt(var[c] + eps) * w[c] + b[c];
      }
  EXPECT_TRUE(allclose(out, from_vector<double>(expected, {N, C, L}), {1e-10, 1e-12}));
  // running = 0.9 * running + 0.1 * batch stat, the variance unbiased (n / (n - 1)).
  std::vector<double> rm_expected(C), rv_expected(C);
  const double n = double(N * L);
  for (int64_t c = 0; c < C; ++c) {
    rm_expected[c] = 0.9 * 0.0 + 0.1 * mean[c];
    rv_expected[c] = 0.9 * 1.0 + 0.1 * var[c] * n / (n - 1.0);
  }
  EXPECT_TRUE(allclose(rm, from_vector<double>(rm_expected, {C}), {1e-12, 1e-12}));
  EXPECT_TRUE(allclose(rv, from_vector<double>(rv_expected, {C}), {1e-12, 1e-12}));

  // Evaluation normalises with the running statistics and leaves them as they are.
  const Tensor y = F::batch_norm(x.to(device()), rm, rv);
  for (int64_t i = 0; i < N * C * L; ++i) {
    const int64_t c = (i / L) % C;
    expected[i] = (xs[i] - rm_expected[c]) / std::sqrt(rv_expected[c] + eps);
  }
  EXPECT_TRUE(allclose(y, from_vector<double>(expected, {N, C, L}), {1e-10, 1e-12}));
  EXPECT_TRUE(allclose(rm, from_vector<double>(rm_expected, {C}), {0, 0}));

  EXPECT_THROW(F::batch_norm(x.to(device()), Tensor(), Tensor()), ValueError);
  EXPECT_THROW(F::batch_norm(rand_input({1, C}).to(device()), Tensor(), Tensor(), Tensor(), Tensor(), true),
               ValueError);
  // Half inputs: statistics in f32, result in the input dtype.
  const Tensor h = F::batch_norm(x.to(device()).to(DType::f16), Tensor(), Tensor(), Tensor(), Tensor(), true);
  EXPECT_EQ(h.dtype(), DType::f16);
}

TEST_P(FunctionalTest, BatchNormGradients) {
  GradCase c{"batch_norm training [N, C, H, W]",
             {rand_input({3, 2, 2, 2}, -1.0, 2.0), rand_input({2}, 0.5, 1.5), rand_input({2})},
             [](const Inputs& in) {
               return F::batch_norm(in[0], Tensor(), Tensor(), in[1], in[2], /*training=*/true);
             }};
  check_grad(c, device());
}

// softmax(q k^T * scale + mask) v by loops in f64: q [B, L, E], k [B, S, E], v [B, S, Ev] flattened batch.
Tensor naive_attention(const Tensor& q, const Tensor& k, const Tensor& v, bool causal, const Tensor& bool_mask) {
  const Shape qs = q.sizes();
  const int64_t D = static_cast<int64_t>(qs.size());
  const int64_t L = qs[D - 2], E = qs[D - 1], S = k.size(D - 2), Ev = v.size(D - 1);
  const int64_t B = q.numel() / (L * E);
  const std::vector<double> Q = q.to_vector<double>(), K = k.to_vector<double>(), V = v.to_vector<double>();
  std::vector<int64_t> M;
  if (bool_mask.defined()) M = bool_mask.to_vector<int64_t>();  // [L, S]
  std::vector<double> out(B * L * Ev, 0.0);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t i = 0; i < L; ++i) {
      std::vector<double> s(S);
      double mx = -std::numeric_limits<double>::infinity();
      for (int64_t j = 0; j < S; ++j) {
        const bool allowed = causal ? j <= i : (M.empty() || M[i * S + j] != 0);
        double dot = 0.0;
        for (int64_t e = 0; e < E; ++e) dot += Q[(b * L + i) * E + e] * K[(b * S + j) * E + e];
        s[j] = allowed ? dot / std::sqrt(double(E)) : -std::numeric_limits<double>::infinity();
        mx = std::max(mx, s[j]);
      }
      double z = 0.0;
      for (int64_t j = 0; j < S; ++j) z += (s[j] = std::exp(s[j] - mx));
      for (int64_t j = 0; j < S; ++j)
        for (int64_t e = 0; e < Ev; ++e) out[(b * L + i) * Ev + e] += s[j] / z * V[(b * S + j) * Ev + e];
    }
  Shape os = qs;
  os[D - 1] = Ev;
  return from_vector<double>(out, os);
}

TEST_P(FunctionalTest, AttentionCausalFirstRowIsFirstValue) {
  const Tensor q = rand_input({2, 3, 5, 4}).to(device()), k = rand_input({2, 3, 5, 4}).to(device());
  const Tensor v = rand_input({2, 3, 5, 4}).to(device());
  const Tensor y = F::scaled_dot_product_attention(q, k, v, Tensor(), 0.0, /*is_causal=*/true);
  ASSERT_EQ(y.sizes(), (Shape{2, 3, 5, 4}));
  // Query 0 sees key 0 only: weight exactly 1, so the output row is v's row 0 bit for bit.
  const Tensor y0 = y.select(2, 0).contiguous().cpu(), v0 = v.select(2, 0).contiguous().cpu();
  EXPECT_EQ(y0.to_vector<double>(), v0.to_vector<double>());
}

TEST_P(FunctionalTest, AttentionMatchesNaiveReference) {
  OpCase causal{"sdpa causal", {rand_input({2, 2, 6, 4}), rand_input({2, 2, 6, 4}), rand_input({2, 2, 6, 3})},
                [](const Inputs& in) {
                  return F::scaled_dot_product_attention(in[0], in[1], in[2], Tensor(), 0.0, true);
                }};
  causal.reference = [](const Inputs& in) { return naive_attention(in[0], in[1], in[2], true, Tensor()); };
  check_op(causal, device());

  OpCase full{"sdpa L != S", {rand_input({3, 4, 5}), rand_input({3, 7, 5}), rand_input({3, 7, 2})},
              [](const Inputs& in) { return F::scaled_dot_product_attention(in[0], in[1], in[2]); }};
  full.reference = [](const Inputs& in) { return naive_attention(in[0], in[1], in[2], false, Tensor()); };
  check_op(full, device());

  // A bool mask (true = may attend), every row keeping at least one key.
  const Tensor mask = gt(rand_input({4, 6}), scalar_tensor(-0.3, DType::f64));
  Tensor m = mask.clone();
  m.select(1, 2).fill_(true);
  OpCase masked{"sdpa bool mask", {rand_input({2, 4, 3}), rand_input({2, 6, 3}), rand_input({2, 6, 3}), m},
                [](const Inputs& in) { return F::scaled_dot_product_attention(in[0], in[1], in[2], in[3]); }};
  masked.reference = [](const Inputs& in) { return naive_attention(in[0], in[1], in[2], false, in[3]); };
  masked.keep_dtype_inputs = {3};
  check_op(masked, device());

  // A float mask is added to the scores: -inf where the bool mask is false gives the same result.
  const Tensor q = rand_input({2, 4, 3}), k = rand_input({2, 6, 3}), v = rand_input({2, 6, 3});
  const Tensor additive = where(m, scalar_tensor(0.0, DType::f64),
                                scalar_tensor(-std::numeric_limits<double>::infinity(), DType::f64));
  EXPECT_TRUE(allclose(F::scaled_dot_product_attention(q.to(device()), k.to(device()), v.to(device()),
                                                       additive.to(device())),
                       naive_attention(q, k, v, false, m), {1e-12, 1e-12}));
  EXPECT_THROW(F::scaled_dot_product_attention(q, k, v, m, 0.0, true), ValueError);
  EXPECT_THROW(F::scaled_dot_product_attention(q, rand_input({2, 6, 4}), v), ShapeError);
  // A mask that does not broadcast to the scores [2, 4, 6] (or would widen them) is named as the attn_mask.
  for (const Shape& bad : {Shape{4, 5}, Shape{3, 4, 6}, Shape{1, 2, 4, 6}}) {
    try {
      F::scaled_dot_product_attention(q, k, v, zeros(bad, DType::b8));
      ADD_FAILURE() << shape_str(bad);
    } catch (const ShapeError& e) {
      EXPECT_NE(std::string(e.what()).find("attn_mask"), std::string::npos) << e.what();
    }
  }
  EXPECT_THROW(F::scaled_dot_product_attention(q, k, v, zeros({4, 6}, DType::i64)), DTypeError);
}

TEST_P(FunctionalTest, AttentionGradients) {
  GradCase c{"sdpa causal", {rand_input({1, 2, 4, 3}), rand_input({1, 2, 4, 3}), noncontiguous_input({1, 2, 4, 3})},
             [](const Inputs& in) { return F::scaled_dot_product_attention(in[0], in[1], in[2], Tensor(), 0, true); }};
  check_grad(c, device());
  GradCase s{"sdpa scale", {rand_input({2, 3, 2}), rand_input({2, 5, 2}), rand_input({2, 5, 3})},
             [](const Inputs& in) {
               return F::scaled_dot_product_attention(in[0], in[1], in[2], Tensor(), 0.0, false, 0.7);
             }};
  check_grad(s, device());
}

TEST_P(FunctionalTest, AttentionDropout) {
  EMBER_REQUIRE_KERNEL(dropout_stub);
  const Tensor q = rand_input({1, 4, 3}).to(device()), k = rand_input({1, 4, 3}).to(device());
  const Tensor v = rand_input({1, 4, 3}).to(device());
  // p = 1 drops every attention weight.
  const Tensor y = F::scaled_dot_product_attention(q, k, v, Tensor(), 1.0);
  EXPECT_TRUE(allclose(y, zeros({1, 4, 3}, DType::f64), {0, 0}));
  // The same seed draws the same mask.
  manual_seed(7);
  const Tensor a = F::scaled_dot_product_attention(q, k, v, Tensor(), 0.5);
  manual_seed(7);
  const Tensor b = F::scaled_dot_product_attention(q, k, v, Tensor(), 0.5);
  EXPECT_TRUE(allclose(a, b, {0, 0}));
  EXPECT_THROW(F::dropout(q, 1.5), ValueError);
}

EMBER_INSTANTIATE_DEVICE_TESTS(FunctionalTest);

TEST(CrossEntropy, HalfInputsAccumulateInF32) {
  // 70000 rows of two equal logits: each row's loss is log 2. Summing 70000 rows (or counting them) in f16 would
  // overflow its 65504 maximum.
  for (DType dt : {DType::f16, DType::bf16}) {
    const Tensor loss = F::cross_entropy(zeros({70000, 2}, dt), zeros({70000}, DType::i64));
    EXPECT_EQ(loss.dtype(), dt);
    EXPECT_NEAR(loss.item_double(), std::log(2.0), 5e-3) << dtype_name(dt);
  }
}

TEST(CrossEntropy, MaskedLogitsOfOtherClassesStayFinite) {
  // A -inf logit of a class that is not the target must not turn the loss into NaN.
  const Tensor logits = from_vector(std::vector<double>{0.0, -INFINITY, 1.0}, {1, 3});
  const Tensor target = from_vector(std::vector<int64_t>{2}, {1});
  const double expected = -(1.0 - std::log(1.0 + std::exp(1.0)));  // -log softmax = logsumexp - x_t
  EXPECT_NEAR(F::cross_entropy(logits, target).item_double(), expected, 1e-12);
}

}  // namespace
}  // namespace ember::testing

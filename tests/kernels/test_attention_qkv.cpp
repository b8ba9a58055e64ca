// The fused attention over packed qkv (Note [Fused attention] in ember/kernels/cpu/attention.cpp): the forward
// against naive float64 loops (causal and not, one and several heads, T not a multiple of anything), the gradient
// of qkv against central finite differences and the composed path (slices + scaled_dot_product_attention) in f32,
// results independent of the thread count, the attention weights it saves, every error path.
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "ember/nn/functional.h"
#include "tests/harness/grad_check.h"

namespace ember::testing {
namespace {

namespace F = nn::functional;

// out[b, t, h * hd + e] = sum_j softmax_j(q_t . k_j / sqrt(hd), j <= t when causal) v[j, e], from qkv [B, T, 3 C].
Tensor naive_attention_qkv(const Tensor& qkv, int64_t H, bool causal) {
  const int64_t B = qkv.size(0), T = qkv.size(1), C = qkv.size(2) / 3, hd = C / H;
  const std::vector<double> x = qkv.contiguous().to_vector<double>();
  auto at = [&](int64_t b, int64_t t, int64_t part, int64_t h, int64_t e) {
    return x[static_cast<size_t>((b * T + t) * 3 * C + part * C + h * hd + e)];
  };
  std::vector<double> out(static_cast<size_t>(B * T * C), 0.0);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t i = 0; i < T; ++i) {
        const int64_t n = causal ? i + 1 : T;
        std::vector<double> s(static_cast<size_t>(n));
        double mx = -std::numeric_limits<double>::infinity(), z = 0.0;
        for (int64_t j = 0; j < n; ++j) {
          double dot = 0.0;
          for (int64_t e = 0; e < hd; ++e) dot += at(b, i, 0, h, e) * at(b, j, 1, h, e);
          s[j] = dot / std::sqrt(double(hd));
          mx = std::max(mx, s[j]);
        }
        for (int64_t j = 0; j < n; ++j) z += (s[j] = std::exp(s[j] - mx));
        for (int64_t j = 0; j < n; ++j)
          for (int64_t e = 0; e < hd; ++e)
            out[static_cast<size_t>((b * T + i) * C + h * hd + e)] += s[j] / z * at(b, j, 2, h, e);
      }
  return from_vector(out, {B, T, C});
}

// The composed path nn::CausalSelfAttention takes without the kernel.
Tensor composed_attention_qkv(const Tensor& qkv, int64_t H, bool causal) {
  const int64_t B = qkv.size(0), T = qkv.size(1), C = qkv.size(2) / 3;
  auto heads = [&](int64_t i) { return qkv.slice(2, i * C, (i + 1) * C).view({B, T, H, C / H}).transpose(1, 2); };
  const Tensor y = F::scaled_dot_product_attention(heads(0), heads(1), heads(2), Tensor(), 0.0, causal);
  return y.transpose(1, 2).reshape({B, T, C});
}

// Runs f, expects E with a message containing needle.
template <class E, class F>
void expect_error(F&& f, const std::string& needle) {
  const std::string msg = error_message<E>(f);
  EXPECT_NE(msg.find(needle), std::string::npos) << msg;
}

struct Case {
  int64_t B, T, C, H;
  bool causal;
};
// T = 40 and 70 run in causal row blocks of 32 (32 + 8, 32 + 32 + 6; Note [Causal attention by row blocks]).
const std::vector<Case> kCases = {{2, 7, 12, 3, true}, {1, 5, 8, 1, false}, {3, 13, 16, 4, true}, {1, 1, 6, 2, true},
                                  {2, 40, 4, 1, true}, {1, 70, 8, 2, true},  {1, 40, 8, 2, false}};
// Too long for finite differences: eight blocks of 40 rows, the last of 20.
const std::vector<Case> kLongCases = {{1, 300, 8, 2, true}};
std::vector<Case> all_cases() {
  std::vector<Case> out = kCases;
  out.insert(out.end(), kLongCases.begin(), kLongCases.end());
  return out;
}

TEST(FusedAttention, ForwardMatchesNaiveLoops) {
  for (const Case& k : all_cases()) {
    SCOPED_TRACE(::testing::Message() << "B " << k.B << " T " << k.T << " C " << k.C << " H " << k.H << " causal "
                                      << k.causal);
    OpCase c{"attention_qkv", {rand_input({k.B, k.T, 3 * k.C}, -2.0, 2.0)}, [k](const Inputs& in) {
               return ops::attention_qkv(in[0], k.H, k.causal).out;
             }};
    c.reference = [k](const Inputs& in) { return naive_attention_qkv(in[0], k.H, k.causal); };
    c.dtypes = {DType::f32, DType::f16, DType::bf16};  // Note [16-bit attention on the CPU]
    check_op(c, Device::cpu());
  }
}

// Note [Attention saves lse]: what the forward keeps for backward is each query row's log-sum-exp of its scaled,
// masked scores.
TEST(FusedAttention, SavedLseIsEachRowsLogSumExp) {
  const int64_t B = 2, T = 6, C = 8, H = 2, hd = C / H;
  const Tensor qkv = rand_input({B, T, 3 * C});
  const Tensor lse = ops::attention_qkv(qkv, H, true).lse;
  ASSERT_EQ(lse.sizes(), Shape({B, H, T}));
  ASSERT_EQ(lse.dtype(), DType::f64);
  const std::vector<double> x = qkv.to_vector<double>(), l = lse.to_vector<double>();
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t i = 0; i < T; ++i) {
        double sum = 0.0;
        for (int64_t j = 0; j <= i; ++j) {  // causal: keys up to the query
          double s = 0.0;
          for (int64_t e = 0; e < hd; ++e)
            s += x[static_cast<size_t>((b * T + i) * 3 * C + h * hd + e)] *
                 x[static_cast<size_t>((b * T + j) * 3 * C + C + h * hd + e)];
          sum += std::exp(s / std::sqrt(static_cast<double>(hd)));
        }
        EXPECT_NEAR(l[static_cast<size_t>((b * H + h) * T + i)], std::log(sum), 1e-12) << b << " " << h << " " << i;
      }
  EXPECT_EQ(ops::attention_qkv(qkv.to(DType::f32), H, false).lse.dtype(), DType::f32);
}

TEST(FusedAttention, GradientMatchesFiniteDifferences) {
  for (const Case& k : kCases) {
    SCOPED_TRACE(::testing::Message() << "B " << k.B << " T " << k.T << " C " << k.C << " H " << k.H);
    GradCase c{"attention_qkv", {rand_input({k.B, k.T, 3 * k.C})}, [k](const Inputs& in) {
                 return attention_qkv(in[0], k.H, k.causal);
               }};
    check_grad(c, Device::cpu());
  }
}

// f32: the fused forward and gradient equal the composed ops' within rounding.
TEST(FusedAttention, MatchesTheComposedPathInF32) {
  for (const Case& k : all_cases()) {
    SCOPED_TRACE(::testing::Message() << "B " << k.B << " T " << k.T << " C " << k.C << " H " << k.H);
    const Tensor x = rand_input({k.B, k.T, 3 * k.C}, -2.0, 2.0).to(DType::f32);
    const Tensor w = rand_input({k.B, k.T, k.C}).to(DType::f32);
    Tensor grads[2], outs[2];
    for (int path = 0; path < 2; ++path) {
      const Tensor qkv = x.clone();
      qkv.requires_grad_();
      outs[path] = path == 0 ? attention_qkv(qkv, k.H, k.causal) : composed_attention_qkv(qkv, k.H, k.causal);
      sum(mul(outs[path], w)).backward();
      grads[path] = qkv.grad();
    }
    EXPECT_TRUE(allclose(outs[0], outs[1].to(DType::f64), Tolerance{1e-5, 1e-6}));
    EXPECT_TRUE(allclose(grads[0], grads[1].to(DType::f64), Tolerance{1e-4, 1e-5}));
  }
}

// Note [16-bit attention on the CPU]: f16/bf16 qkv computes in f32 and rounds once, so its forward and gradient are
// the f64 kernel's on the same (rounded) inputs within one 16-bit rounding of each result (relative to the largest
// magnitude); lse is f32.
TEST(FusedAttention, SixteenBitRunsInF32AndRoundsOnce) {
  for (DType dt : {DType::f16, DType::bf16}) {
    for (const Case& k : kCases) {
      SCOPED_TRACE(::testing::Message() << dtype_name(dt) << " B " << k.B << " T " << k.T << " C " << k.C);
      const Tensor x = rand_input({k.B, k.T, 3 * k.C}, -2.0, 2.0).to(dt);
      const Tensor g = rand_input({k.B, k.T, k.C}).to(dt);
      const AttentionResult r = ops::attention_qkv(x, k.H, k.causal);
      ASSERT_EQ(r.out.dtype(), dt);
      ASSERT_EQ(r.lse.dtype(), DType::f32);
      const Tensor gx = ops::attention_qkv_backward(g, x, r.lse, k.H, k.causal);
      ASSERT_EQ(gx.dtype(), dt);
      const Tensor x64 = x.to(DType::f64), g64 = g.to(DType::f64);
      const AttentionResult r64 = ops::attention_qkv(x64, k.H, k.causal);
      const Tensor gx64 = ops::attention_qkv_backward(g64, x64, r64.lse, k.H, k.causal);
      const double unit = dt == DType::f16 ? 1.0 / 1024 : 1.0 / 128;  // one ulp at 1 (2^-10, 2^-7)
      EXPECT_TRUE(allclose(r.out, r64.out, Tolerance{unit, unit}));
      EXPECT_TRUE(allclose(r.lse, r64.lse, Tolerance{1e-5, 1e-5}));
      EXPECT_TRUE(allclose(gx, gx64, Tolerance{unit, unit}));
    }
  }
}

TEST(FusedAttention, ResultsDoNotDependOnTheThreadCount) {
  const Tensor qkv = rand_input({3, 45, 3 * 16}).to(DType::f32);  // two causal row blocks
  const Tensor g = rand_input({3, 45, 16}).to(DType::f32);
  std::vector<float> first_out, first_grad;
  for (int threads : {1, 2, 3}) {
    ScopedNumThreads tc(threads);
    const AttentionResult r = ops::attention_qkv(qkv, 4, true);
    const std::vector<float> out = r.out.to_vector<float>();
    const std::vector<float> grad = ops::attention_qkv_backward(g, qkv, r.lse, 4, true).to_vector<float>();
    if (threads == 1) {
      first_out = out;
      first_grad = grad;
    } else {
      EXPECT_EQ(out, first_out) << threads << " threads";
      EXPECT_EQ(grad, first_grad) << threads << " threads";
    }
  }
}

TEST(FusedAttention, BadArgumentsAreTypedErrors) {
  const Tensor qkv = rand_input({2, 4, 12});
  expect_error<ShapeError>([&] { ops::attention_qkv(rand_input({4, 12}), 2, true); }, "attention_qkv");
  expect_error<ShapeError>([&] { ops::attention_qkv(rand_input({2, 4, 10}), 2, true); }, "multiple of n_head");
  expect_error<ShapeError>([&] { ops::attention_qkv(qkv, 3, true); }, "multiple of n_head");
  expect_error<ValueError>([&] { ops::attention_qkv(qkv, 0, true); }, "n_head");
  expect_error<DTypeError>([&] { ops::attention_qkv(qkv.to(DType::i32), 2, true); }, "attention_qkv");
  const AttentionResult r = ops::attention_qkv(qkv, 2, true);
  expect_error<ShapeError>(
      [&] {
        ops::attention_qkv_backward(rand_input({2, 4, 5}), qkv, r.lse, 2, true);
      },
      "do not fit");
  expect_error<DTypeError>(
      [&] {
        ops::attention_qkv_backward(rand_input({2, 4, 4}).to(DType::f32), qkv, r.lse, 2, true);
      },
      "must have qkv's dtype");
}

}  // namespace
}  // namespace ember::testing

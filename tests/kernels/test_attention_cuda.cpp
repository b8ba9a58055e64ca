// The fused attention over packed qkv on every device with the kernel, against naive float64 loops: out, the saved
// lse and the gradient of qkv for f16/bf16/f32/f64 on CUDA (f32/f64 on the CPU, its kernel's dtypes) at T = 1, 7, 64,
// 300, causal and not, 1 to 4 heads; and, on CUDA only, shapes that take the block-per-row path and more than one
// tile (Note [Attention tiles] in ember/kernels/cuda/attention.cu). Errors are normalised: max |actual - expected| /
// max |expected|. cuda instances skip without a GPU.
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "tests/harness/op_harness.h"

namespace ember::testing {
namespace {

class AttentionCudaTest : public DeviceTest {};

// out [B, T, C], lse [B, H, T] and grad_qkv [B, T, 3 C] for grad_out [B, T, C], in float64.
struct Reference {
  std::vector<double> out, lse, grad;
};

Reference naive_attention(const std::vector<double>& x, const std::vector<double>& go, int64_t B, int64_t T, int64_t C,
                          int64_t H, bool causal) {
  const int64_t hd = C / H, R = 3 * C;
  const double scale = 1.0 / std::sqrt(static_cast<double>(hd));
  Reference r{std::vector<double>(static_cast<size_t>(B * T * C), 0.0),
              std::vector<double>(static_cast<size_t>(B * H * T)),
              std::vector<double>(static_cast<size_t>(B * T * R), 0.0)};
  std::vector<double> p(static_cast<size_t>(T)), dp(static_cast<size_t>(T));
  auto qkv_index = [&](int64_t b, int64_t t, int64_t part, int64_t h) {
    return static_cast<size_t>((b * T + t) * R + part * C + h * hd);
  };
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t i = 0; i < T; ++i) {
        const int64_t n = causal ? i + 1 : T;
        const size_t qi = qkv_index(b, i, 0, h);
        double mx = -std::numeric_limits<double>::infinity();
        for (int64_t j = 0; j < n; ++j) {
          const size_t kj = qkv_index(b, j, 1, h);
          double s = 0.0;
          for (int64_t e = 0; e < hd; ++e) s += x[qi + e] * x[kj + e];
          p[j] = s * scale;
          mx = std::max(mx, p[j]);
        }
        double sum = 0.0;
        for (int64_t j = 0; j < n; ++j) sum += std::exp(p[j] - mx);
        const double lse = mx + std::log(sum);
        r.lse[static_cast<size_t>((b * H + h) * T + i)] = lse;
        const size_t oi = static_cast<size_t>((b * T + i) * C + h * hd);
        double dot = 0.0;  // <d weights, weights> of row i
        for (int64_t j = 0; j < n; ++j) {
          const size_t vj = qkv_index(b, j, 2, h);
          p[j] = std::exp(p[j] - lse);
          double d = 0.0;
          for (int64_t e = 0; e < hd; ++e) {
            r.out[oi + e] += p[j] * x[vj + e];
            d += go[oi + e] * x[vj + e];
          }
          dp[j] = d;
          dot += p[j] * d;
        }
        for (int64_t j = 0; j < n; ++j) {
          const double ds = p[j] * (dp[j] - dot) * scale;  // d score ij
          const size_t kj = qkv_index(b, j, 1, h), vj = qkv_index(b, j, 2, h);
          for (int64_t e = 0; e < hd; ++e) {
            r.grad[qi + e] += ds * x[kj + e];
            r.grad[kj + e] += ds * x[qi + e];
            r.grad[vj + e] += p[j] * go[oi + e];
          }
        }
      }
  return r;
}

// max |actual - expected| / max |expected| (infinite when actual holds a NaN or the sizes differ).
double normalised_error(const Tensor& actual, const std::vector<double>& expected) {
  const std::vector<double> a = actual.to_vector<double>();
  if (a.size() != expected.size()) return std::numeric_limits<double>::infinity();
  double diff = 0.0, ref = 0.0;
  for (size_t i = 0; i < a.size(); ++i) {
    const double d = std::abs(a[i] - expected[i]);
    if (std::isnan(d)) return std::numeric_limits<double>::infinity();
    diff = std::max(diff, d);
    ref = std::max(ref, std::abs(expected[i]));
  }
  return ref > 0.0 ? diff / ref : diff;
}

// f16/bf16: scores, weights and d scores are stored in 16 bits between the products (Note [Attention precision] in
// ember/kernels/cuda/attention.cu).
double tolerance_for(DType dt) {
  switch (dt) {
    case DType::f64:
      return 1e-10;
    case DType::f32:
      return 1e-4;
    default:
      return 1e-2;
  }
}

DType lse_dtype_for(DType dt) { return is_reduced_float(dt) ? DType::f32 : dt; }

struct Shape4 {
  int64_t B, T, C, H;
};

// Forward and backward of one shape in one dtype on `device`, against naive_attention on the rounded inputs.
void check_attention(Device device, DType dt, const Shape4& s, bool causal) {
  SCOPED_TRACE(::testing::Message() << dtype_name(dt) << " B " << s.B << " T " << s.T << " C " << s.C << " H " << s.H
                                    << (causal ? " causal" : " full"));
  const Tensor x = rand_input({s.B, s.T, 3 * s.C}).to(dt).to(DType::f64);  // rounded to dt once
  const Tensor g = rand_input({s.B, s.T, s.C}).to(dt).to(DType::f64);
  const Reference ref = naive_attention(x.to_vector<double>(), g.to_vector<double>(), s.B, s.T, s.C, s.H, causal);
  const Tensor qkv = x.to(device, dt);
  const AttentionResult r = ops::attention_qkv(qkv, s.H, causal);
  ASSERT_EQ(r.out.sizes(), Shape({s.B, s.T, s.C}));
  ASSERT_EQ(r.lse.sizes(), Shape({s.B, s.H, s.T}));
  ASSERT_EQ(r.lse.dtype(), lse_dtype_for(dt));
  const double tol = tolerance_for(dt);
  EXPECT_LE(normalised_error(r.out, ref.out), tol) << "out";
  EXPECT_LE(normalised_error(r.lse, ref.lse), tol) << "lse";
  const Tensor grad = ops::attention_qkv_backward(g.to(device, dt), qkv, r.lse, s.H, causal);
  ASSERT_EQ(grad.sizes(), qkv.sizes());
  ASSERT_EQ(grad.dtype(), dt);
  EXPECT_LE(normalised_error(grad, ref.grad), tol) << "grad_qkv";
}

TEST_P(AttentionCudaTest, MatchesFloat64Reference) {
  EMBER_REQUIRE_KERNEL(attention_stub);
  EMBER_REQUIRE_KERNEL(attention_backward_stub);
  // The CPU kernel computes in f32/f64 only; the CUDA one also takes f16/bf16.
  const std::vector<DType> dtypes = device().is_cuda()
                                        ? std::vector<DType>{DType::f16, DType::bf16, DType::f32, DType::f64}
                                        : std::vector<DType>{DType::f32, DType::f64};
  for (DType dt : dtypes)
    for (int64_t T : {1, 7, 64, 300})
      for (bool causal : {true, false})
        for (const auto& [H, C] : std::vector<std::pair<int64_t, int64_t>>{{1, 16}, {2, 16}, {3, 12}, {4, 16}})
          check_attention(device(), dt, {2, T, C, H}, causal);
}

// Rows longer than 1024 keys take a block each; with 128 MiB of f32 scratch per buffer, B = 10 at T = 2048 runs as
// tiles of 8 and 2 batch elements, and T = 6144 as two tiles of query rows whose dk and dv add up across the tiles.
// CUDA only: the CPU kernel holds [T, T] buffers per thread, which at these sizes is not a unit test.
TEST_P(AttentionCudaTest, LongRowsAndSeveralTiles) {
  EMBER_REQUIRE_KERNEL(attention_stub);
  EMBER_REQUIRE_KERNEL(attention_backward_stub);
  if (!device().is_cuda()) GTEST_SKIP() << "shapes for the CUDA kernel's tiles";
  check_attention(device(), DType::f32, {10, 2048, 4, 1}, false);
  check_attention(device(), DType::f32, {1, 6144, 4, 1}, true);
  check_attention(device(), DType::f32, {1, 6144, 4, 1}, false);
  check_attention(device(), DType::bf16, {2, 1500, 8, 2}, true);
}

EMBER_INSTANTIATE_DEVICE_TESTS(AttentionCudaTest);

}  // namespace
}  // namespace ember::testing

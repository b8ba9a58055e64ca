// The vectorisable float math of the CPU kernels (ember/kernels/cpu/vec_math.h) against float64 libm: e^x within
// 2 ulp over a sweep of every float's range (subnormal results within 2 units of the smallest subnormal), the normal
// cdf and pdf within 1e-6 relative wherever the result is a normal float, GELU and its derivative likewise, the
// special values (+-inf, NaN, -0, the overflow edge); then the f32 ops that use them (gelu, its backward, exp,
// sigmoid, softmax, log-softmax) on rows of every length 1..40 (vector bodies and tails), masked rows and NaNs.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "ember/kernels/cpu/vec_math.h"
#include "tests/harness/op_harness.h"

namespace ember::testing {
namespace {

using kernels::cpu::exp_vec;
using kernels::cpu::gelu_backward_vec;
using kernels::cpu::gelu_vec;
using kernels::cpu::normal_cdf_pdf;

constexpr double kSqrt2Pi = 2.5066282746310002;
constexpr float kInfF = std::numeric_limits<float>::infinity();
constexpr double kMinNormal = 1.1754943508222875e-38;
constexpr double kMinSubnormal = 1.401298464324817e-45;

// |got - want| in units of the last place of want rounded to float (of the smallest subnormal below the normals).
double ulps(float got, double want) {
  if (std::fabs(want) < kMinNormal) return std::fabs(got - want) / kMinSubnormal;
  const float w = static_cast<float>(want);
  const double ulp = std::fabs(static_cast<double>(std::nextafter(w, kInfF)) - w);
  return std::fabs(got - want) / ulp;
}

TEST(CpuVecMath, ExpWithinTwoUlpOverEveryFloatRange) {
  double worst = 0.0;
  float worst_x = 0.0f;
  for (uint64_t bits = 0; bits <= 0xFFFFFFFFu; bits += 1009) {
    const uint32_t b = static_cast<uint32_t>(bits);
    float x;
    std::memcpy(&x, &b, sizeof x);
    if (std::isnan(x)) continue;
    const double want = std::exp(static_cast<double>(x));
    const float got = exp_vec(x);
    if (want > std::numeric_limits<float>::max()) {
      // Beyond the largest float, e^x rounds to +inf unless it is within half an ulp of it.
      if (want > 3.4028235677973366e38) EXPECT_EQ(got, kInfF) << x;
      continue;
    }
    const double e = ulps(got, want);
    if (e > worst) worst = e, worst_x = x;
  }
  EXPECT_LE(worst, 2.0) << "at x = " << worst_x;
  EXPECT_TRUE(std::isnan(exp_vec(std::numeric_limits<float>::quiet_NaN())));
  EXPECT_EQ(exp_vec(kInfF), kInfF);
  EXPECT_EQ(exp_vec(-kInfF), 0.0f);
  EXPECT_EQ(exp_vec(0.0f), 1.0f);
  EXPECT_EQ(exp_vec(-0.0f), 1.0f);
  EXPECT_TRUE(std::isfinite(exp_vec(88.72f)));  // e^88.72 = 3.39e38 < FLT_MAX
  EXPECT_EQ(exp_vec(88.73f), kInfF);
  EXPECT_GT(exp_vec(-103.0f), 0.0f);  // subnormal, not flushed
  EXPECT_EQ(exp_vec(-104.0f), 0.0f);
}

TEST(CpuVecMath, NormalCdfPdfAndGeluMatchFloat64) {
  double worst_cdf = 0, worst_pdf = 0, worst_gelu = 0, worst_grad = 0;
  for (float x = -14.0f; x <= 14.0f; x += 3.0517578125e-4f) {  // 2^-15 * 10: 91751 points
    const double xd = x;
    const double cdf = 0.5 * std::erfc(-xd / std::sqrt(2.0));
    const double pdf = std::exp(-0.5 * xd * xd) / kSqrt2Pi;
    const auto n = normal_cdf_pdf(x);
    if (cdf >= kMinNormal) worst_cdf = std::max(worst_cdf, std::fabs(n.cdf - cdf) / cdf);
    if (pdf >= kMinNormal) worst_pdf = std::max(worst_pdf, std::fabs(n.pdf - pdf) / pdf);
    if (cdf < kMinNormal) continue;  // x below -13.1: Phi(x) is a subnormal float, with fewer significant bits
    const double gelu = xd * cdf;
    if (std::fabs(gelu) >= kMinNormal)
      worst_gelu = std::max(worst_gelu, std::fabs(gelu_vec(x) - gelu) / std::fabs(gelu));
    // gelu' = cdf + x pdf crosses 0 near x = -0.75: measured against the size of its two terms.
    const double grad = cdf + xd * pdf, scale = cdf + std::fabs(xd) * pdf;
    if (scale >= kMinNormal) worst_grad = std::max(worst_grad, std::fabs(gelu_backward_vec(1.0f, x) - grad) / scale);
  }
  EXPECT_LE(worst_cdf, 1e-6);
  EXPECT_LE(worst_pdf, 1e-6);
  EXPECT_LE(worst_gelu, 1e-6);
  EXPECT_LE(worst_grad, 1e-6);
  // The gradient scales with g.
  EXPECT_FLOAT_EQ(gelu_backward_vec(-2.5f, 0.3f), -2.5f * gelu_backward_vec(1.0f, 0.3f));
  // Specials: Phi(+inf) = 1, Phi(-inf) = 0, phi(+-inf) = 0; NaN propagates; gelu(-0) = -0; gelu(+inf) = +inf.
  EXPECT_EQ(normal_cdf_pdf(kInfF).cdf, 1.0f);
  EXPECT_EQ(normal_cdf_pdf(-kInfF).cdf, 0.0f);
  EXPECT_EQ(normal_cdf_pdf(kInfF).pdf, 0.0f);
  EXPECT_EQ(normal_cdf_pdf(-kInfF).pdf, 0.0f);
  EXPECT_EQ(normal_cdf_pdf(0.0f).cdf, 0.5f);
  const float nan = std::numeric_limits<float>::quiet_NaN();
  EXPECT_TRUE(std::isnan(gelu_vec(nan)));
  EXPECT_TRUE(std::isnan(gelu_backward_vec(1.0f, nan)));
  EXPECT_EQ(gelu_vec(kInfF), kInfF);
  EXPECT_TRUE(std::signbit(gelu_vec(-0.0f)));
  EXPECT_EQ(gelu_vec(-0.0f), 0.0f);
}

// The f32 ops on contiguous rows of every length 1..40 (whole vectors and every tail) with values spread over the
// tails of each function, against float64 formulas.
TEST(CpuVecMath, F32OpsOnEveryRowLengthMatchFloat64) {
  for (int64_t n = 1; n <= 40; ++n) {
    SCOPED_TRACE("length " + std::to_string(n));
    const Tensor x64 = rand_input_seeded({n}, static_cast<uint64_t>(n), -12.0, 12.0);
    const Tensor g64 = rand_input_seeded({n}, static_cast<uint64_t>(100 + n), -2.0, 2.0);
    const Tensor x = x64.to(DType::f32), g = g64.to(DType::f32);
    const std::vector<double> xs = x.to_vector<double>(), gs = g.to_vector<double>();
    std::vector<double> gelu(n), grad(n), ex(n), sig(n);
    for (int64_t i = 0; i < n; ++i) {
      const double v = xs[i], cdf = 0.5 * std::erfc(-v / std::sqrt(2.0));
      gelu[i] = v * cdf;
      grad[i] = gs[i] * (cdf + v * std::exp(-0.5 * v * v) / kSqrt2Pi);
      ex[i] = std::exp(v);
      sig[i] = 1.0 / (1.0 + std::exp(-v));
    }
    const Tolerance tol{2e-6, 1e-30};
    EXPECT_TRUE(allclose(ops::gelu(x).to(DType::f64), from_vector(gelu, {n}), tol));
    EXPECT_TRUE(allclose(ops::unary_backward(UnaryOp::GeluErf, {}, g, x).to(DType::f64), from_vector(grad, {n}),
                         Tolerance{2e-6, 2e-6}));
    EXPECT_TRUE(allclose(ops::exp(x).to(DType::f64), from_vector(ex, {n}), tol));
    EXPECT_TRUE(allclose(ops::sigmoid(x).to(DType::f64), from_vector(sig, {n}), tol));
  }
}

// Softmax rows of every length 1..40, some with masked (-inf) entries in every lane position, one with a NaN.
TEST(CpuVecMath, F32SoftmaxRowsOfEveryLength) {
  for (int64_t n = 1; n <= 40; ++n) {
    SCOPED_TRACE("length " + std::to_string(n));
    std::vector<double> v = rand_input_seeded({3, n}, static_cast<uint64_t>(n), -20.0, 20.0).to_vector<double>();
    for (int64_t j = 1; j < n; j += 3) v[static_cast<size_t>(n + j)] = -std::numeric_limits<double>::infinity();
    const Tensor x = from_vector(v, {3, n}).to(DType::f32);
    const std::vector<double> xs = x.to_vector<double>();
    std::vector<double> want(xs.size()), want_log(xs.size());
    for (int64_t r = 0; r < 3; ++r) {
      double mx = -std::numeric_limits<double>::infinity(), sum = 0.0;
      for (int64_t j = 0; j < n; ++j) mx = std::max(mx, xs[r * n + j]);
      for (int64_t j = 0; j < n; ++j) sum += std::exp(xs[r * n + j] - mx);
      for (int64_t j = 0; j < n; ++j) {
        want[r * n + j] = std::exp(xs[r * n + j] - mx) / sum;
        want_log[r * n + j] = xs[r * n + j] - mx - std::log(sum);
      }
    }
    // x - max is rounded to float before the exponential: up to half an ulp of 40 (1.9e-6) relative in e^(x - max).
    EXPECT_TRUE(allclose(ops::softmax(x, 1).to(DType::f64), from_vector(want, {3, n}), Tolerance{4e-6, 1e-30}));
    EXPECT_TRUE(allclose(ops::log_softmax(x, 1).to(DType::f64), from_vector(want_log, {3, n}), Tolerance{2e-6, 2e-6}));
    // A NaN in the last position makes its whole row NaN and leaves the others alone.
    v[static_cast<size_t>(3 * n - 1)] = std::numeric_limits<double>::quiet_NaN();
    const std::vector<double> p = ops::softmax(from_vector(v, {3, n}).to(DType::f32), 1).to_vector<double>();
    for (int64_t j = 0; j < n; ++j) {
      EXPECT_TRUE(std::isnan(p[static_cast<size_t>(2 * n + j)])) << j;
      EXPECT_FALSE(std::isnan(p[static_cast<size_t>(j)])) << j;
    }
  }
}

}  // namespace
}  // namespace ember::testing

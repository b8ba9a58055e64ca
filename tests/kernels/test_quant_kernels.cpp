// Int8 quantization kernels (ember/kernels/ops_quant.h) against references written here: the per-element round-trip
// bound scale / 2 in f64 (zero rows, a row with one huge value), round half to even on planted values, the
// weight-only linear and conv2d against naive f64 loops over the dequantized weights, the int8 x int8 linear against
// a naive f64 model of the same integer math and against the f32 linear within the quantization error bound,
// workspace bounds (no whole f32 weight), meta replay, and every error path.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <optional>
#include <vector>

#include "ember/core/meta_scope.h"
#include "ember/kernels/ops_quant.h"
#include "ember/memory/cpu_allocator.h"
#include "tests/harness/op_harness.h"
#include "tests/kernels/compression_test_util.h"
#include "tests/kernels/conv_pool_test_util.h"

namespace ember::testing {
namespace {

std::vector<double> as_doubles(const Tensor& t) { return t.to_vector<double>(); }

// Checks q in [-127, 127], |q * scale - w| <= scale / 2 for every element (in f64, with room for the f64 quotient's
// own rounding), scale = max|w_o| / 127 (1 for an all-zero row), and that the largest |w| of a row maps to +-127.
void expect_round_trip(const Tensor& w, const QuantizedPerChannel& r) {
  const int64_t o = w.size(0), k = w.numel() / o;
  const std::vector<double> wv = as_doubles(w), qv = as_doubles(r.q), sv = as_doubles(r.scale);
  ASSERT_EQ(r.q.dtype(), DType::i8);
  ASSERT_EQ(r.q.sizes(), w.sizes());
  ASSERT_EQ(r.scale.dtype(), DType::f32);
  for (int64_t i = 0; i < o; ++i) {
    double amax = 0.0;
    for (int64_t j = 0; j < k; ++j) amax = std::max(amax, std::fabs(wv[i * k + j]));
    const double s = sv[i];
    if (amax == 0.0) {
      EXPECT_EQ(s, 1.0) << "zero row " << i;
    } else {
      EXPECT_NEAR(s, amax / 127.0, amax / 127.0 * 1e-7) << "row " << i;
    }
    for (int64_t j = 0; j < k; ++j) {
      const double q = qv[i * k + j], x = wv[i * k + j];
      ASSERT_LE(std::fabs(q), 127.0);
      EXPECT_LE(std::fabs(q * s - x), s / 2 * (1 + 1e-12)) << "row " << i << " col " << j << ": w " << x << " q "
                                                              << q << " scale " << s;
      if (amax > 0 && std::fabs(x) == amax) EXPECT_EQ(std::fabs(q), 127.0) << "row " << i;
    }
  }
}

TEST(QuantKernels, RoundTripWithinHalfScale) {
  std::vector<double> v = rand_input({6, 37}, -2.0, 2.0).to_vector<double>();
  for (int64_t j = 0; j < 37; ++j) v[2 * 37 + j] = 0.0;  // a zero row
  v[3 * 37 + 7] = 1e4;                                  // one huge value: the rest of row 3 collapses near 0
  v[5 * 37 + 11] = -3.0;                                // the row maximum is negative
  const Tensor w64 = from_vector(v, {6, 37});
  for (DType dt : {DType::f32, DType::f64, DType::f16, DType::bf16}) {
    SCOPED_TRACE(dtype_name(dt));
    const Tensor w = w64.to(dt);
    const QuantizedPerChannel r = ops::quantize_per_channel_symmetric(w);
    expect_round_trip(w, r);
    const std::vector<double> q = as_doubles(r.q);
    for (int64_t j = 0; j < 37; ++j) EXPECT_EQ(q[2 * 37 + j], 0.0);
    EXPECT_EQ(q[3 * 37 + 7], 127.0);
    EXPECT_EQ(q[5 * 37 + 11], -127.0);
    // The dequantized zero row is exactly zero.
    const std::vector<double> d = as_doubles(ops::dequantize_per_channel(r.q, r.scale));
    for (int64_t j = 0; j < 37; ++j) EXPECT_EQ(d[2 * 37 + j], 0.0);
  }
}

TEST(QuantKernels, ConvWeightAndNonContiguousInput) {
  // A 4-d weight is quantized per output channel over (C, KH, KW); a transposed view quantizes its own values.
  const Tensor w = rand_input({5, 3, 3, 2}).to(DType::f32);
  expect_round_trip(w, ops::quantize_per_channel_symmetric(w));
  const Tensor wt = rand_input({9, 4}).to(DType::f32).t();  // [4, 9], not contiguous
  expect_round_trip(wt, ops::quantize_per_channel_symmetric(wt));
}

TEST(QuantKernels, RoundsHalfToEven) {
  // Row 0: max 127 -> scale exactly 1; row 1: max 254 -> scale exactly 2. Quotients land on .5 exactly.
  const Tensor w = from_vector<float>({127, 2.5f, 3.5f, -2.5f, 0.5f, 1.5f, -0.5f, 126.5f,  //
                                       -254, 5, 7, 1, 3, -3, 253, 0},
                                      {2, 8});
  const QuantizedPerChannel r = ops::quantize_per_channel_symmetric(w);
  EXPECT_EQ(r.scale.to_vector<double>(), (std::vector<double>{1.0, 2.0}));
  EXPECT_EQ(r.q.to_vector<int64_t>(),
            (std::vector<int64_t>{127, 2, 4, -2, 0, 2, 0, 126, -127, 2, 4, 0, 2, -2, 126, 0}));
  const Tensor d = ops::dequantize_per_channel(r.q, r.scale, DType::f64);
  EXPECT_EQ(d.dtype(), DType::f64);
  EXPECT_EQ(d.to_vector<double>(),
            (std::vector<double>{127, 2, 4, -2, 0, 2, 0, 126, -254, 4, 8, 0, 4, -4, 252, 0}));
}

TEST(QuantKernels, DequantizeHandValues) {
  const Tensor q = from_vector<int8_t>({-127, 0, 5, 127, -1, 3}, {2, 3});
  const Tensor s = from_vector<float>({0.5f, 0.25f}, {2});
  EXPECT_EQ(ops::dequantize_per_channel(q, s).to_vector<double>(),
            (std::vector<double>{-63.5, 0, 2.5, 31.75, -0.25, 0.75}));
  EXPECT_EQ(ops::dequantize_per_channel(q, s, DType::bf16).dtype(), DType::bf16);
}

// y[m, n] = sum_k x[m, k] * q[n, k] * s[n] + b[n] in f64 from the int8 weights and f32 scales.
Tensor ref_weight_linear(const Tensor& x, const Tensor& q, const Tensor& s, const Tensor& b) {
  const int64_t k = q.size(1), n = q.size(0), m = x.numel() / std::max<int64_t>(k, 1);
  const std::vector<double> xv = as_doubles(x), qv = as_doubles(q), sv = as_doubles(s);
  const std::vector<double> bv = b.defined() ? as_doubles(b) : std::vector<double>(n, 0.0);
  std::vector<double> y(static_cast<size_t>(m * n));
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) {
      double acc = 0.0;
      for (int64_t t = 0; t < k; ++t) acc += xv[i * k + t] * (qv[j * k + t] * sv[j]);
      y[i * n + j] = acc + bv[j];
    }
  Shape shape(x.sizes().begin(), x.sizes().end() - 1);
  shape.push_back(n);
  return from_vector(y, shape);
}

TEST(QuantKernels, WeightLinearMatchesNaiveDequantized) {
  struct Case {
    Shape x;
    int64_t n;
  };
  // The last case crosses row chunks (129 > 128 rows) and weight blocks (1100 f32 per row: 59 rows per block).
  for (const Case& c : {Case{{3, 5, 40}, 7}, Case{{1, 16}, 1}, Case{{129, 1100}, 64}}) {
    const int64_t k = c.x.back();
    const QuantizedPerChannel w = ops::quantize_per_channel_symmetric(rand_input({c.n, k}).to(DType::f32));
    const Tensor b = rand_input({c.n}).to(DType::f32);
    const bool big = c.x.front() > 100;  // the big case runs two dtypes only (test time)
    for (DType dt : big ? std::vector<DType>{DType::f32, DType::bf16}
                        : std::vector<DType>{DType::f32, DType::f64, DType::f16, DType::bf16}) {
      SCOPED_TRACE(dtype_name(dt) + std::string(" ") + shape_str(c.x));
      const Tensor x = rand_input(c.x).to(dt);
      const Tensor y = ops::int8_weight_linear(x, w.q, w.scale, b);
      ASSERT_EQ(y.dtype(), dt);
      Tolerance tol = default_tolerance(dt);
      tol.atol *= std::sqrt(static_cast<double>(k));  // random-sign sums of k terms
      EXPECT_TRUE(allclose(y, ref_weight_linear(x, w.q, w.scale, b), tol));
      if (dt == DType::f32) {  // without bias
        EXPECT_TRUE(allclose(ops::int8_weight_linear(x, w.q, w.scale), ref_weight_linear(x, w.q, w.scale, {}), tol));
      }
    }
  }
}

TEST(QuantKernels, WeightLinearEmptyDims) {
  const QuantizedPerChannel w = ops::quantize_per_channel_symmetric(rand_input({4, 6}).to(DType::f32));
  EXPECT_EQ(ops::int8_weight_linear(empty({0, 6}), w.q, w.scale).sizes(), (Shape{0, 4}));
  // K = 0: every sum is empty, the result is the bias.
  const Tensor q0 = empty({3, 0}, TensorOptions(DType::i8));
  const Tensor b = from_vector<float>({1, 2, 3}, {3});
  EXPECT_EQ(ops::int8_weight_linear(empty({2, 0}), q0, ones({3}), b).to_vector<double>(),
            (std::vector<double>{1, 2, 3, 1, 2, 3}));
}

TEST(QuantKernels, DynamicLinearMatchesIntegerModel) {
  for (const Shape& xs : {Shape{4, 33}, Shape{2, 3, 50}, Shape{130, 9}}) {
    SCOPED_TRACE(shape_str(xs));
    const int64_t k = xs.back(), n = 11;  // 11 outputs: two groups of four and a tail of three
    const Tensor wf = rand_input({n, k}).to(DType::f32);
    const QuantizedPerChannel w = ops::quantize_per_channel_symmetric(wf);
    const Tensor b = rand_input({n}).to(DType::f32);
    const Tensor x = rand_input(xs, -3.0, 3.0).to(DType::f32);
    double sx = 0.0;
    const Tensor ref = ref_dynamic_linear(x, w.q, w.scale, b, std::nullopt, &sx);
    const Tensor y = ops::int8_dynamic_linear(x, w.q, w.scale, b);
    ASSERT_EQ(y.dtype(), DType::f32);
    // The integer sums are exact on both sides; only the f32 scaling and bias add round.
    EXPECT_TRUE(allclose(y, ref, {1e-6, 1e-6}));

    // Against the f32 linear with the original weights: per output the error is at most
    // sum_k (sx/2)|w| + |x|(s_n/2) + (sx/2)(s_n/2) (activation rounding, weight rounding, their product).
    const Tensor dense = ops::linear(x, wf, b);
    const std::vector<double> yv = as_doubles(y), dv = as_doubles(dense), xv = as_doubles(x), wv = as_doubles(wf);
    const std::vector<double> sv = as_doubles(w.scale);
    const int64_t m = x.numel() / k;
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < n; ++j) {
        double bound = 0.0;
        for (int64_t t = 0; t < k; ++t)
          bound += sx / 2 * std::fabs(wv[j * k + t]) + std::fabs(xv[i * k + t]) * sv[j] / 2 + sx * sv[j] / 4;
        EXPECT_LE(std::fabs(yv[i * n + j] - dv[i * n + j]), bound * 1.001 + 1e-5) << "row " << i << " col " << j;
      }
  }
}

TEST(QuantKernels, StaticLinearClampsToCalibratedScale) {
  const Tensor wf = rand_input({5, 20}).to(DType::f32);
  const QuantizedPerChannel w = ops::quantize_per_channel_symmetric(wf);
  const Tensor x = rand_input({3, 20}, -4.0, 4.0).to(DType::f32);
  // act_scale 2/127: every |x| > 2 clamps to +-127.
  const float act = 2.0f / 127.0f;
  double sx = 0.0;
  const Tensor ref = ref_dynamic_linear(x, w.q, w.scale, Tensor(), act, &sx);
  EXPECT_TRUE(allclose(ops::int8_dynamic_linear(x, w.q, w.scale, Tensor(), act), ref, {1e-6, 1e-6}));
  // An all-zero input in dynamic mode: scale 1, result = bias.
  const Tensor b = from_vector<float>({1, -2, 3, 0, 5}, {5});
  EXPECT_EQ(ops::int8_dynamic_linear(zeros({2, 20}), w.q, w.scale, b).to_vector<double>(),
            (std::vector<double>{1, -2, 3, 0, 5, 1, -2, 3, 0, 5}));
}

// Naive f64 convolution with the dequantized weights q * s.
Tensor ref_conv(const Tensor& x, const Tensor& q, const Tensor& s, const Tensor& b, const Conv2dParams& p) {
  const int64_t N = x.size(0), C = x.size(1), H = x.size(2), W = x.size(3);
  const int64_t O = q.size(0), CG = q.size(1), KH = q.size(2), KW = q.size(3), OG = O / p.groups;
  const int64_t OH = (H + 2 * p.padding[0] - p.dilation[0] * (KH - 1) - 1) / p.stride[0] + 1;
  const int64_t OW = (W + 2 * p.padding[1] - p.dilation[1] * (KW - 1) - 1) / p.stride[1] + 1;
  const std::vector<double> xv = as_doubles(x), qv = as_doubles(q), sv = as_doubles(s);
  const std::vector<double> bv = b.defined() ? as_doubles(b) : std::vector<double>(O, 0.0);
  std::vector<double> y(static_cast<size_t>(N * O * OH * OW));
  for (int64_t n = 0; n < N; ++n)
    for (int64_t o = 0; o < O; ++o)
      for (int64_t yy = 0; yy < OH; ++yy)
        for (int64_t xx = 0; xx < OW; ++xx) {
          double acc = bv[o];
          const int64_t g = o / OG;
          for (int64_t c = 0; c < CG; ++c)
            for (int64_t i = 0; i < KH; ++i)
              for (int64_t j = 0; j < KW; ++j) {
                const int64_t iy = yy * p.stride[0] - p.padding[0] + i * p.dilation[0];
                const int64_t ix = xx * p.stride[1] - p.padding[1] + j * p.dilation[1];
                if (iy < 0 || iy >= H || ix < 0 || ix >= W) continue;
                acc += xv[((n * C + g * CG + c) * H + iy) * W + ix] * qv[((o * CG + c) * KH + i) * KW + j] * sv[o];
              }
          y[((n * O + o) * OH + yy) * OW + xx] = acc;
        }
  return from_vector(y, {N, O, OH, OW});
}

TEST(QuantKernels, WeightConv2dMatchesDequantizedReference) {
  struct Case {
    int64_t c, o, kh, kw;
    Conv2dParams p;
  };
  for (const Case& cs : {Case{3, 4, 3, 3, conv_params(1, 1, 1, 1, 1, 1, 1)},
                         Case{4, 6, 3, 2, conv_params(2, 1, 1, 0, 1, 2, 2)}}) {
    const QuantizedPerChannel w =
        ops::quantize_per_channel_symmetric(rand_input({cs.o, cs.c / cs.p.groups, cs.kh, cs.kw}).to(DType::f32));
    const Tensor b = rand_input({cs.o}).to(DType::f32);
    for (DType dt : {DType::f32, DType::f64, DType::bf16}) {
      SCOPED_TRACE(dtype_name(dt));
      const Tensor x = rand_input({2, cs.c, 7, 6}).to(dt);
      const Tensor y = ops::int8_weight_conv2d(x, w.q, w.scale, b, cs.p);
      EXPECT_EQ(y.dtype(), dt);
      EXPECT_TRUE(allclose(y, ref_conv(x, w.q, w.scale, b.to(dt), cs.p), default_tolerance(dt)));
    }
  }
}

TEST(QuantKernels, WeightLinearNeverHoldsTheF32Weight) {
  const int64_t n = 512, k = 1024, m = 4;  // the f32 weight would be 2 MiB
  const QuantizedPerChannel w = ops::quantize_per_channel_symmetric(rand_input({n, k}).to(DType::f32));
  const Tensor x = rand_input({m, k}).to(DType::f32);
  const int64_t out_bytes = m * n * 4;
  const int64_t rise = peak_rise(memory::cpu_allocator(), [&] { Tensor y = ops::int8_weight_linear(x, w.q, w.scale); });
  EXPECT_GE(rise, out_bytes + kInt8DequantBlockBytes);  // one dequantized block is taken, from the allocator
  // The rest: the [4, 64] block product and the GEMM panels (a fraction of a block), far below the 2 MiB weight.
  EXPECT_LE(rise, out_bytes + 2 * kInt8DequantBlockBytes) << "more than one block of f32 weight held";
}

TEST(QuantKernels, MetaReplaysTheWorkspace) {
  struct Case {
    Shape x;
    int64_t n;
    DType dt;
  };
  for (const Case& c :
       {Case{{129, 2048}, 70, DType::f32}, Case{{5, 64}, 9, DType::f16}, Case{{3, 40}, 80, DType::f64}}) {
    SCOPED_TRACE(shape_str(c.x) + " " + dtype_name(c.dt));
    const int64_t k = c.x.back();
    int64_t cpu = 0, meta = 0, cpu_dyn = 0, meta_dyn = 0;
    {
      const QuantizedPerChannel w = ops::quantize_per_channel_symmetric(rand_input({c.n, k}).to(DType::f32));
      const Tensor x = rand_input(c.x).to(c.dt), x32 = x.to(DType::f32);
      memory::Allocator& a = memory::cpu_allocator();
      cpu = peak_rise(a, [&] { Tensor y = ops::int8_weight_linear(x, w.q, w.scale); });
      cpu_dyn = peak_rise(a, [&] { Tensor y = ops::int8_dynamic_linear(x32, w.q, w.scale); });
    }
    {
      MetaAllocationScope scope;
      const Tensor q = empty({c.n, k}, TensorOptions(DType::i8, Device::meta()));
      const Tensor s = empty({c.n}, TensorOptions(DType::f32, Device::meta()));
      const Tensor x = empty(c.x, TensorOptions(c.dt, Device::meta()));
      const Tensor x32 = empty(c.x, TensorOptions(DType::f32, Device::meta()));
      memory::Allocator& a = scope.allocator();
      meta = peak_rise(a, [&] { Tensor y = ops::int8_weight_linear(x, q, s); });
      meta_dyn = peak_rise(a, [&] { Tensor y = ops::int8_dynamic_linear(x32, q, s); });
    }
    EXPECT_GT(cpu, 0);
    EXPECT_EQ(meta, cpu);
    EXPECT_EQ(meta_dyn, cpu_dyn);
  }
}

TEST(QuantKernels, Errors) {
  const QuantizedPerChannel w = ops::quantize_per_channel_symmetric(rand_input({4, 6}).to(DType::f32));
  const Tensor x = rand_input({2, 6}).to(DType::f32);
  // quantize
  EXPECT_THROW(ops::quantize_per_channel_symmetric(ones({3, 2}, TensorOptions(DType::i32))), DTypeError);
  EXPECT_THROW(ops::quantize_per_channel_symmetric(scalar_tensor(1.0)), ShapeError);
  EXPECT_NE(error_message<ValueError>([] {
              ops::quantize_per_channel_symmetric(from_vector<float>({1, NAN, 2, 3}, {2, 2}));
            }).find("non-finite"),
            std::string::npos);
  EXPECT_THROW(ops::quantize_per_channel_symmetric(from_vector<float>({1, INFINITY}, {1, 2})), ValueError);
  // operands
  EXPECT_THROW(ops::int8_weight_linear(x, w.q.to(DType::f32), w.scale), DTypeError);
  EXPECT_THROW(ops::int8_weight_linear(x.to(DType::i32), w.q, w.scale), DTypeError);
  EXPECT_THROW(ops::int8_weight_linear(rand_input({2, 5}).to(DType::f32), w.q, w.scale), ShapeError);
  EXPECT_THROW(ops::int8_weight_linear(x, w.q, ones({3})), ShapeError);
  EXPECT_THROW(ops::int8_weight_linear(x, w.q, w.scale, ones({5})), ShapeError);
  EXPECT_THROW(ops::int8_weight_linear(x, w.q.view({4, 6, 1}), w.scale), ShapeError);
  EXPECT_THROW(ops::int8_dynamic_linear(x.to(DType::f64), w.q, w.scale), DTypeError);
  EXPECT_THROW(ops::int8_dynamic_linear(x, w.q, w.scale, Tensor(), 0.0f), ValueError);
  EXPECT_THROW(ops::int8_dynamic_linear(x, w.q, w.scale, Tensor(), -1.0f), ValueError);
  EXPECT_THROW(ops::int8_dynamic_linear(x, w.q, w.scale, Tensor(), NAN), ValueError);
  EXPECT_THROW(ops::int8_dynamic_linear(from_vector<float>({1, 2, NAN, 0, 0, 0}, {1, 6}), w.q, w.scale), ValueError);
  EXPECT_THROW(ops::int8_weight_conv2d(rand_input({1, 6, 4, 4}).to(DType::f32), w.q, w.scale), ShapeError);
  EXPECT_THROW(ops::dequantize_per_channel(w.q, w.scale, DType::i32), DTypeError);
  // K beyond the int32-safe bound.
  const int64_t k = kInt8DotMaxK + 1;
  EXPECT_EQ(kInt8DotMaxK, 132104);
  const std::string msg = error_message<ValueError>([&] {
    ops::int8_dynamic_linear(zeros({1, k}), zeros({1, k}, TensorOptions(DType::i8)), ones({1}));
  });
  EXPECT_NE(msg.find("132104"), std::string::npos) << msg;
}

}  // namespace
}  // namespace ember::testing

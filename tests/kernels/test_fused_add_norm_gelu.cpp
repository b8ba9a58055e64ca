// The fused residual add + layer norm (ops::add_layer_norm_with_stats, layer_norm_backward's grad_add) and bias +
// GELU (ops::bias_gelu, bias_gelu_backward) against naive float64 loops written here: every float dtype and the mixed
// f16/bf16-input f32-affine layer norm, short, long (> 1024, the CUDA block path) and many rows, strided and broadcast
// operands, empty shapes and the errors. Invariants: sum equals ops::add bitwise, and on the CPU out/mean/rstd equal
// ops::layer_norm_with_stats(sum) bitwise; bias_gelu rounds x + bias only once, after the GELU (thread-count
// independence: tests/kernels/test_parallel_kernels.cpp). Device-parameterised: cuda instances skip without a GPU.
#include <cmath>
#include <cstring>
#include <numbers>
#include <optional>
#include <vector>

#include "ember/kernels/ops.h"
#include "tests/harness/op_harness.h"
#include "tests/kernels/layer_norm_test_util.h"

namespace ember::testing {
namespace {

// Same dtype, sizes and bytes (contiguous copies on the CPU).
::testing::AssertionResult same_bits(const Tensor& a, const Tensor& b) {
  if (a.dtype() != b.dtype() || a.sizes() != b.sizes())
    return ::testing::AssertionFailure() << a.description() << " vs " << b.description();
  const Tensor ca = a.cpu().contiguous(), cb = b.cpu().contiguous();
  if (std::memcmp(ca.raw_data(), cb.raw_data(), static_cast<size_t>(ca.nbytes())) == 0)
    return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "bits differ; " << allclose(a, cb, {0.0, 0.0}).message();
}

Tensor on(const Tensor& t, Device device, DType dtype) { return t.defined() ? t.to(device, dtype) : Tensor(); }
Tensor as_f64(const Tensor& t) { return t.defined() ? t.cpu().to(DType::f64) : Tensor(); }

// A device other than `device`, for the device-mismatch errors: the CPU for cuda, meta for the CPU.
Device other_device(Device device) { return device.is_cuda() ? Device::cpu() : Device::meta(); }

// ---- float64 references --------------------------------------------------------------------------------------------

// Textbook layer norm of x viewed as [rows, cols]: (x - mean) / sqrt(biased var + eps) * w + b.
struct RefLayerNorm {
  std::vector<double> out, mean, rstd;
};
RefLayerNorm ref_layer_norm(const Tensor& x, int64_t cols, const Tensor& w, const Tensor& b, double eps) {
  const std::vector<double> v = x.to_vector<double>();
  const std::vector<double> vw = w.defined() ? w.to_vector<double>() : std::vector<double>();
  const std::vector<double> vb = b.defined() ? b.to_vector<double>() : std::vector<double>();
  const int64_t rows = cols > 0 ? static_cast<int64_t>(v.size()) / cols : 0;
  RefLayerNorm r;
  r.out.resize(v.size());
  for (int64_t i = 0; i < rows; ++i) {
    const double* xr = v.data() + i * cols;
    double mu = 0.0, var = 0.0;
    for (int64_t j = 0; j < cols; ++j) mu += xr[j];
    mu /= static_cast<double>(cols);
    for (int64_t j = 0; j < cols; ++j) var += (xr[j] - mu) * (xr[j] - mu);
    const double rstd = 1.0 / std::sqrt(var / static_cast<double>(cols) + eps);
    r.mean.push_back(mu);
    r.rstd.push_back(rstd);
    for (int64_t j = 0; j < cols; ++j) {
      double y = (xr[j] - mu) * rstd;
      if (!vw.empty()) y *= vw[static_cast<size_t>(j)];
      if (!vb.empty()) y += vb[static_cast<size_t>(j)];
      r.out[static_cast<size_t>(i * cols + j)] = y;
    }
  }
  return r;
}


// GELU and its derivative, exact (x Phi(x)) or the tanh approximation 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))).
constexpr double kTanhK = 0.79788456080286535588;  // sqrt(2 / pi)
double ref_gelu(double s, GeluApprox approx) {
  if (approx == GeluApprox::Tanh) return 0.5 * s * (1.0 + std::tanh(kTanhK * (s + 0.044715 * s * s * s)));
  return 0.5 * s * (1.0 + std::erf(s / std::numbers::sqrt2));
}
double ref_gelu_grad(double s, GeluApprox approx) {
  if (approx == GeluApprox::Tanh) {
    const double t = std::tanh(kTanhK * (s + 0.044715 * s * s * s));
    return 0.5 * (1.0 + t) + 0.5 * s * (1.0 - t * t) * kTanhK * (1.0 + 3.0 * 0.044715 * s * s);
  }
  const double cdf = 0.5 * (1.0 + std::erf(s / std::numbers::sqrt2));
  const double pdf = std::exp(-0.5 * s * s) / std::sqrt(2.0 * std::numbers::pi);
  return cdf + s * pdf;
}

// gelu(x + b) with b [cols] broadcast over x viewed as [rows, cols]; the sum is not rounded.
Tensor ref_bias_gelu(const Tensor& x, const Tensor& b, GeluApprox approx) {
  const std::vector<double> xv = x.to_vector<double>(), bv = b.to_vector<double>();
  std::vector<double> out(xv.size());
  for (size_t i = 0; i < xv.size(); ++i) out[i] = ref_gelu(xv[i] + bv[i % bv.size()], approx);
  return from_vector(out, x.sizes());
}

// grad_x = g * gelu'(x + b) and grad_bias = its column sums, both in f64.
struct RefBiasGeluGrads {
  Tensor x, bias;
};
RefBiasGeluGrads ref_bias_gelu_backward(const Tensor& g, const Tensor& x, const Tensor& b, GeluApprox approx) {
  const std::vector<double> gv = g.to_vector<double>(), xv = x.to_vector<double>(), bv = b.to_vector<double>();
  std::vector<double> gx(xv.size()), gb(bv.size(), 0.0);
  for (size_t i = 0; i < xv.size(); ++i) {
    const size_t j = i % bv.size();
    gx[i] = gv[i] * ref_gelu_grad(xv[i] + bv[j], approx);
    gb[j] += gx[i];
  }
  return {from_vector(gx, x.sizes()), from_vector(gb, b.sizes())};
}

// ---- add_layer_norm_with_stats -------------------------------------------------------------------------------------

class AddLayerNormTest : public DeviceTest {};

enum Affine { kNone = 0, kWeight = 1, kBias = 2, kBoth = 3 };

// Runs ops::add_layer_norm_with_stats on x_src and r_src (f64 CPU, any strides) rounded to dt on `device`, with
// weight/bias per `affine` in dt (or f32 when `mixed`), and checks the results' shapes and dtypes, sum against
// ops::add (bitwise) and the f64 sum, out/mean/rstd against ops::layer_norm_with_stats(sum) (bitwise, on the CPU)
// and against the f64 layer norm of the rounded sum. res_dt: the residual's dtype (dt unless given: f16/bf16 with an
// f32 dt is the autocast residual stream's pairing).
void check_add_layer_norm(const Tensor& x_src, const Tensor& r_src, const Shape& ns, DType dt, bool mixed, int affine,
                          Device device, double eps = 1e-5, std::optional<DType> res_dt = std::nullopt) {
  SCOPED_TRACE(::testing::Message() << dtype_name(dt) << (mixed ? " with f32 affine" : "") << " x "
                                    << x_src.description() << " residual " << r_src.description() << " normalised "
                                    << shape_str(ns) << " weight " << ((affine & kWeight) != 0) << " bias "
                                    << ((affine & kBias) != 0) << " eps " << eps);
  const DType pdt = mixed ? DType::f32 : dt;
  const Tensor x = convert_keep_strides(x_src, dt, device);
  const Tensor r = convert_keep_strides(r_src, res_dt.value_or(dt), device);
  const Tensor w = (affine & kWeight) != 0 ? rand_input(ns, 0.5, 1.5).to(device, pdt) : Tensor();
  const Tensor b = (affine & kBias) != 0 ? rand_input(ns).to(device, pdt) : Tensor();
  const AddLayerNormResult res = ops::add_layer_norm_with_stats(x, r, ns, w, b, eps);

  const Shape lead(x.sizes().begin(), x.sizes().end() - static_cast<int64_t>(ns.size()));
  const DType out_dt = affine != kNone ? pdt : dt, stats_dt = dt == DType::f64 ? DType::f64 : DType::f32;
  ASSERT_TRUE(res.sum.defined() && res.out.defined() && res.mean.defined() && res.rstd.defined());
  EXPECT_EQ(res.sum.dtype(), dt);
  EXPECT_EQ(res.out.dtype(), out_dt);
  EXPECT_EQ(res.mean.dtype(), stats_dt);
  EXPECT_EQ(res.rstd.dtype(), stats_dt);
  EXPECT_EQ(res.sum.sizes(), x.sizes());
  EXPECT_EQ(res.out.sizes(), x.sizes());
  EXPECT_EQ(res.mean.sizes(), lead);
  EXPECT_EQ(res.rstd.sizes(), lead);
  EXPECT_EQ(res.sum.device(), device);
  EXPECT_EQ(res.out.device(), device);

  // sum: x + residual rounded once to dt, as the elementwise add computes it.
  EXPECT_TRUE(same_bits(res.sum, ops::add(x, r))) << "sum vs ops::add";
  const Tensor x64 = as_f64(x), r64 = as_f64(r);
  EXPECT_TRUE(allclose(res.sum, ops::add(x64, r64), default_tolerance(dt))) << "sum vs f64";
  // out, mean, rstd: the layer norm of the rounded sum.
  if (device.is_cpu()) {
    const LayerNormResult ln = ops::layer_norm_with_stats(res.sum, ns, w, b, eps);
    EXPECT_TRUE(same_bits(res.out, ln.out)) << "out vs layer_norm_with_stats(sum)";
    EXPECT_TRUE(same_bits(res.mean, ln.mean)) << "mean vs layer_norm_with_stats(sum)";
    EXPECT_TRUE(same_bits(res.rstd, ln.rstd)) << "rstd vs layer_norm_with_stats(sum)";
  }
  const int64_t cols = numel_of(ns);
  const RefLayerNorm ref = ref_layer_norm(as_f64(res.sum), cols, as_f64(w), as_f64(b), eps);
  // Rows of a few values include some with a tiny spread, whose rstd (up to ~1e2) scales the rounding of x - mean.
  const bool short_rows = cols < 16;
  Tolerance out_tol = default_tolerance(out_dt), stats_tol = default_tolerance(stats_dt);
  if (out_dt == DType::f32) out_tol = short_rows ? Tolerance{1e-4, 1e-4} : Tolerance{1e-5, 2e-5};
  if (stats_dt == DType::f32 && short_rows) stats_tol = {1e-4, 1e-5};
  EXPECT_TRUE(allclose(res.out, from_vector(ref.out, x.sizes()), out_tol)) << "out vs f64";
  EXPECT_TRUE(allclose(res.mean, from_vector(ref.mean, lead), stats_tol)) << "mean vs f64";
  EXPECT_TRUE(allclose(res.rstd, from_vector(ref.rstd, lead), stats_tol)) << "rstd vs f64";
}

TEST_P(AddLayerNormTest, MatchesReferenceForEveryDTypeAndShapePath) {
  EMBER_REQUIRE_KERNEL(add_layer_norm_stub);
  EMBER_REQUIRE_KERNEL(layer_norm_stub);
  EMBER_REQUIRE_KERNEL(binary_stub);
  // 7, 64 and 768 columns: short rows (the CUDA warp path); 3000 and 9000: rows over 1024 (the block path, cached
  // and too long to cache); 20000 x 7 and 1500 x 64: many rows.
  const std::vector<Shape> shapes = {{3, 7}, {2, 5, 64}, {40, 768}, {3, 3000}, {2, 9000}, {20000, 7}, {1500, 64}};
  for (DType dt : {DType::f32, DType::f64, DType::f16, DType::bf16}) {
    for (const Shape& shape : shapes) {
      const Tensor x = rand_input(shape, -2.0, 2.0), r = rand_input(shape, -2.0, 2.0);
      for (int affine : {kBoth, kNone, kWeight, kBias})
        check_add_layer_norm(x, r, {shape.back()}, dt, false, affine, device());
    }
    // Two normalised dims, and a large eps that visibly matters.
    check_add_layer_norm(rand_input({3, 5, 8}), rand_input({3, 5, 8}), {5, 8}, dt, false, kBoth, device());
    check_add_layer_norm(rand_input({4, 16}, -0.1, 0.1), rand_input({4, 16}, -0.1, 0.1), {16}, dt, false, kNone,
                         device(), 1e-2);
  }
}

// Note [Mixed layer norm]: f16/bf16 x and residual with f32 weight and/or bias: sum in x's dtype, out f32.
TEST_P(AddLayerNormTest, MixedHalfInputWithF32Affine) {
  EMBER_REQUIRE_KERNEL(add_layer_norm_stub);
  EMBER_REQUIRE_KERNEL(layer_norm_stub);
  EMBER_REQUIRE_KERNEL(binary_stub);
  for (DType dt : {DType::f16, DType::bf16}) {
    for (const Shape& shape : std::vector<Shape>{{5, 7}, {4, 768}, {3, 3000}, {1500, 64}}) {
      const Tensor x = rand_input(shape, -2.0, 2.0), r = rand_input(shape, -2.0, 2.0);
      for (int affine : {kBoth, kWeight, kBias}) check_add_layer_norm(x, r, {shape.back()}, dt, true, affine, device());
    }
  }
}

TEST_P(AddLayerNormTest, HalfResidualIntoF32) {
  // Under autocast the residual stream is f32 and the sub-layer's output f16/bf16: the sum is f32, as ops::add
  // promotes it. Short rows, cached and uncached block rows (3000 and 9000 f32 columns), a transposed residual.
  EMBER_REQUIRE_KERNEL(add_layer_norm_stub);
  EMBER_REQUIRE_KERNEL(layer_norm_stub);
  EMBER_REQUIRE_KERNEL(binary_stub);
  for (DType rdt : {DType::f16, DType::bf16}) {
    for (const Shape& shape : std::vector<Shape>{{5, 7}, {40, 768}, {3, 3000}, {2, 9000}}) {
      const Tensor x = rand_input(shape, -2.0, 2.0), r = rand_input(shape, -2.0, 2.0);
      check_add_layer_norm(x, r, {shape.back()}, DType::f32, false, kBoth, device(), 1e-5, rdt);
    }
    const Tensor x = rand_input({64, 96}, -2.0, 2.0), r = rand_input({96, 64}, -2.0, 2.0).t();
    check_add_layer_norm(x, r, {96}, DType::f32, false, kWeight, device(), 1e-5, rdt);
  }
}

TEST_P(AddLayerNormTest, StridedAndBroadcastOperands) {
  EMBER_REQUIRE_KERNEL(add_layer_norm_stub);
  EMBER_REQUIRE_KERNEL(layer_norm_stub);
  EMBER_REQUIRE_KERNEL(binary_stub);
  for (DType dt : {DType::f32, DType::f16, DType::bf16, DType::f64}) {
    for (int64_t cols : {64, 3000}) {
      // x transposed (no unit stride), residual strided in every dim; and the other way round.
      const Tensor xt = rand_input({cols, 6}).t(), rn = noncontiguous_input({6, cols});
      check_add_layer_norm(xt, rn, {cols}, dt, false, kBoth, device());
      check_add_layer_norm(rn, xt, {cols}, dt, false, kNone, device());
      // Rows that are not adjacent (a select of a middle dim): unit stride within a row.
      const Tensor xs = rand_input({4, 3, cols}).select(1, 1), rs = rand_input({4, 2, cols}).select(1, 0);
      check_add_layer_norm(xs, rs, {cols}, dt, false, kBoth, device());
      // A residual of x's shape expanded from one row (stride 0), as the gradient of a broadcast would be.
      const Tensor re = rand_input({1, cols}).expand({5, cols});
      check_add_layer_norm(rand_input({5, cols}), re, {cols}, dt, false, kWeight, device());
    }
  }
  // Strided x in the mixed form.
  check_add_layer_norm(rand_input({768, 6}).t(), noncontiguous_input({6, 768}), {768}, DType::bf16, true, kBoth,
                       device());
  // Rows too long for the CUDA block kernel's shared-memory cache (9000 f32 / f64 values): every pass recomputes
  // x + residual from strided operands.
  for (DType dt : {DType::f32, DType::f64})
    check_add_layer_norm(rand_input({9000, 3}).t(), noncontiguous_input({3, 9000}), {9000}, dt, false, kBoth, device());
}

TEST_P(AddLayerNormTest, EmptyShapes) {
  EMBER_REQUIRE_KERNEL(add_layer_norm_stub);
  const Tensor x = zeros({0, 8}, {DType::f32, device()}), w = ones({8}, {DType::f32, device()});
  const AddLayerNormResult r = ops::add_layer_norm_with_stats(x, x, {8}, w, w);
  EXPECT_EQ(r.sum.sizes(), (Shape{0, 8}));
  EXPECT_EQ(r.out.sizes(), (Shape{0, 8}));
  EXPECT_EQ(r.mean.sizes(), (Shape{0}));
  EXPECT_EQ(r.rstd.sizes(), (Shape{0}));
  const Tensor y = zeros({2, 0, 8}, {DType::bf16, device()});
  const AddLayerNormResult s = ops::add_layer_norm_with_stats(y, y, {8}, Tensor(), Tensor());
  EXPECT_EQ(s.sum.sizes(), (Shape{2, 0, 8}));
  EXPECT_EQ(s.out.dtype(), DType::bf16);
  EXPECT_EQ(s.mean.sizes(), (Shape{2, 0}));
  // Rows of no elements: the sum is empty, the statistics are those of layer norm over nothing (NaN mean).
  const Tensor z = zeros({3, 0}, {DType::f32, device()});
  const AddLayerNormResult e = ops::add_layer_norm_with_stats(z, z, {0}, Tensor(), Tensor());
  const LayerNormResult l = ops::layer_norm_with_stats(z, {0}, Tensor(), Tensor());
  EXPECT_EQ(e.sum.sizes(), (Shape{3, 0}));
  EXPECT_EQ(e.mean.sizes(), (Shape{3}));
  EXPECT_TRUE(allclose(e.mean, l.mean.cpu(), {0.0, 0.0}));
  EXPECT_TRUE(allclose(e.rstd, l.rstd.cpu(), {0.0, 0.0}));
}

TEST_P(AddLayerNormTest, Errors) {
  const Device d = device();
  const Tensor x = zeros({4, 6}, {DType::f32, d}), w = ones({6}, {DType::f32, d});
  auto run = [](const Tensor& a, const Tensor& b, const Shape& ns, const Tensor& wt, const Tensor& bt) {
    (void)ops::add_layer_norm_with_stats(a, b, ns, wt, bt);
  };
  // x and residual: one floating dtype and one shape (no broadcasting).
  (void)error_message<DTypeError>([&] { run(x, zeros({4, 6}, {DType::f64, d}), {6}, w, w); });
  (void)error_message<DTypeError>([&] { run(x.to(DType::f16), x, {6}, Tensor(), Tensor()); });
  (void)error_message<DTypeError>([&] { run(x.to(DType::bf16), x, {6}, Tensor(), Tensor()); });
  (void)error_message<DTypeError>([&] { run(x.to(DType::f16), x.to(DType::bf16), {6}, Tensor(), Tensor()); });
  (void)error_message<DTypeError>([&] {
    run(zeros({4, 6}, {DType::i32, d}), zeros({4, 6}, {DType::i32, d}), {6}, Tensor(), Tensor());
  });
  (void)error_message<ShapeError>([&] { run(x, zeros({4, 7}, {DType::f32, d}), {6}, w, w); });
  (void)error_message<ShapeError>([&] { run(x, zeros({1, 6}, {DType::f32, d}), {6}, w, w); });
  (void)error_message<ShapeError>([&] { run(x, zeros({6}, {DType::f32, d}), {6}, w, w); });
  (void)error_message<ShapeError>([&] { run(x, zeros({2, 4, 6}, {DType::f32, d}), {6}, w, w); });
  // The layer norm's own checks.
  (void)error_message<ShapeError>([&] { run(x, x, {5}, Tensor(), Tensor()); });
  (void)error_message<ShapeError>([&] { run(x, x, {6}, ones({5}, {DType::f32, d}), Tensor()); });
  (void)error_message<ShapeError>([&] { run(x, x, {6}, Tensor(), ones({4, 6}, {DType::f32, d})); });
  (void)error_message<DTypeError>([&] { run(x, x, {6}, ones({6}, {DType::f64, d}), Tensor()); });
  (void)error_message<DTypeError>([&] { run(x.to(DType::f16), x.to(DType::f16), {6}, w, w.to(DType::f16)); });
  // Devices.
  const Tensor elsewhere = empty({4, 6}, {DType::f32, other_device(d)});
  (void)error_message<DeviceError>([&] { run(x, elsewhere, {6}, w, w); });
  (void)error_message<DeviceError>([&] { run(x, x, {6}, empty({6}, {DType::f32, other_device(d)}), Tensor()); });
  // The message names the op and the shapes.
  const std::string msg = error_message<ShapeError>([&] { run(x, zeros({4, 7}, {DType::f32, d}), {6}, w, w); });
  EXPECT_NE(msg.find("add_layer_norm"), std::string::npos) << msg;
  EXPECT_NE(msg.find("[4, 7]"), std::string::npos) << msg;
}

EMBER_INSTANTIATE_DEVICE_TESTS(AddLayerNormTest);

// ---- layer_norm_backward with grad_add (add_layer_norm's backward) -------------------------------------------------

class AddLayerNormBackwardTest : public DeviceTest {};

// layer_norm_backward(..., grad_add) against the f64 grad_x plus grad_add (ga_src: f64 CPU, any strides, rounded to
// x's dtype), and the affine gradients bitwise equal to those computed without grad_add.
void check_grad_add(const Shape& shape, DType dt, bool mixed, bool with_weight, const Tensor& ga_src, Device device) {
  SCOPED_TRACE(::testing::Message() << dtype_name(dt) << (mixed ? " with f32 weight and gradient" : "") << " "
                                    << shape_str(shape) << (with_weight ? " weight" : "") << " grad_add "
                                    << ga_src.description());
  const int64_t cols = shape.back();
  const DType pdt = mixed ? DType::f32 : dt;
  const Tensor x = rand_input(shape, -2.0, 2.0).to(device, dt);
  const Tensor w = with_weight ? rand_input({cols}, 0.5, 1.5).to(device, pdt) : Tensor();
  const Tensor g = rand_input(shape).to(device, pdt);
  const Tensor ga = convert_keep_strides(ga_src, dt, device);
  const LayerNormResult f = ops::layer_norm_with_stats(x, {cols}, w, Tensor());
  const LayerNormGrads with = ops::layer_norm_backward(g, x, w, f.mean, f.rstd, 1, true, true, true, ga);
  const LayerNormGrads without = ops::layer_norm_backward(g, x, w, f.mean, f.rstd, 1, true, true, true);
  ASSERT_TRUE(with.x.defined() && with.weight.defined() && with.bias.defined());
  EXPECT_EQ(with.x.dtype(), dt);
  EXPECT_EQ(with.x.sizes(), x.sizes());
  std::vector<double> want = ref_layer_norm_backward(as_f64(g), as_f64(x), as_f64(w), cols, 1e-5).gx;
  const std::vector<double> add = ga.to_vector<double>();
  for (size_t i = 0; i < want.size(); ++i) want[i] += add[i];
  Tolerance tol = default_tolerance(dt);
  if (dt == DType::f32) tol.atol = 1e-5;  // a difference of O(1) terms, as in test_layer_norm_backward.cpp
  EXPECT_TRUE(allclose(with.x, from_vector(want, shape), tol)) << "grad_x + grad_add vs f64";
  EXPECT_TRUE(same_bits(with.weight, without.weight)) << "grad_weight with and without grad_add";
  EXPECT_TRUE(same_bits(with.bias, without.bias)) << "grad_bias with and without grad_add";
}

TEST_P(AddLayerNormBackwardTest, GradAddIsAddedToGradX) {
  EMBER_REQUIRE_KERNEL(layer_norm_backward_stub);
  EMBER_REQUIRE_KERNEL(layer_norm_stub);
  // 8 and 1000 columns: the warp path on CUDA; 1500 and 4100: the block path; 700 and 2100 rows: grouped column sums.
  const std::vector<Shape> shapes = {{1, 1}, {4, 6, 8}, {3, 1000}, {2, 1500}, {1, 4100}, {700, 24}, {2100, 5}};
  for (DType dt : {DType::f32, DType::f64, DType::f16, DType::bf16}) {
    for (const Shape& shape : shapes) check_grad_add(shape, dt, false, true, rand_input(shape), device());
    check_grad_add({5, 33}, dt, false, false, rand_input({5, 33}), device());
  }
  for (DType dt : {DType::f16, DType::bf16}) {
    for (const Shape& shape : std::vector<Shape>{{6, 300}, {2, 1500}, {700, 24}})
      check_grad_add(shape, dt, true, true, rand_input(shape), device());
  }
  // More rows than the CUDA warp kernel's grid covers in one pass (it loops over the rest).
  check_grad_add({20000, 8}, DType::f32, false, true, rand_input({20000, 8}), device());
}

TEST_P(AddLayerNormBackwardTest, StridedAndBroadcastGradAdd) {
  EMBER_REQUIRE_KERNEL(layer_norm_backward_stub);
  EMBER_REQUIRE_KERNEL(layer_norm_stub);
  for (DType dt : {DType::f32, DType::f16, DType::bf16, DType::f64}) {
    for (int64_t cols : {40, 1500}) {
      check_grad_add({9, cols}, dt, false, true, rand_input({cols, 9}).t(), device());                // transposed
      check_grad_add({9, cols}, dt, false, true, noncontiguous_input({9, cols}), device());           // strided
      check_grad_add({9, cols}, dt, false, true, rand_input({1, cols}).expand({9, cols}), device());  // stride 0
      check_grad_add({9, cols}, dt, false, true, rand_input({9, 1}).expand({9, cols}), device());     // stride 0
    }
  }
  check_grad_add({9, 40}, DType::bf16, true, true, rand_input({40, 9}).t(), device());
}

// With grad_add, each subset of the affine gradients gives the same grad_x (bits on the CPU).
TEST_P(AddLayerNormBackwardTest, EachSubsetOfGradients) {
  EMBER_REQUIRE_KERNEL(layer_norm_backward_stub);
  EMBER_REQUIRE_KERNEL(layer_norm_stub);
  for (DType dt : {DType::f32, DType::bf16}) {
    const Tensor x = rand_input({7, 3, 20}).to(device(), dt), w = rand_input({3, 20}, 0.5, 1.5).to(device(), dt);
    const Tensor g = rand_input({7, 3, 20}).to(device(), dt), ga = rand_input({7, 3, 20}).to(device(), dt);
    const LayerNormResult f = ops::layer_norm_with_stats(x, {3, 20}, w, Tensor());
    const LayerNormGrads all = ops::layer_norm_backward(g, x, w, f.mean, f.rstd, 2, true, true, true, ga);
    for (int mask = 0; mask < 4; ++mask) {
      const bool nw = (mask & 1) != 0, nb = (mask & 2) != 0;
      const LayerNormGrads r = ops::layer_norm_backward(g, x, w, f.mean, f.rstd, 2, true, nw, nb, ga);
      ASSERT_TRUE(r.x.defined());
      EXPECT_EQ(r.weight.defined(), nw);
      EXPECT_EQ(r.bias.defined(), nb);
      if (device().is_cpu())
        EXPECT_TRUE(same_bits(r.x, all.x)) << dtype_name(dt) << " mask " << mask;
      else
        EXPECT_TRUE(allclose(r.x, all.x.cpu(), default_tolerance(dt))) << dtype_name(dt) << " mask " << mask;
    }
  }
}

TEST_P(AddLayerNormBackwardTest, EmptyRows) {
  EMBER_REQUIRE_KERNEL(layer_norm_backward_stub);
  EMBER_REQUIRE_KERNEL(layer_norm_stub);
  const Tensor x = zeros({0, 5}, {DType::f32, device()}), w = ones({5}, {DType::f32, device()});
  const LayerNormResult f = ops::layer_norm_with_stats(x, {5}, w, Tensor());
  const LayerNormGrads r = ops::layer_norm_backward(x, x, w, f.mean, f.rstd, 1, true, true, true, x);
  EXPECT_EQ(r.x.sizes(), (Shape{0, 5}));
  EXPECT_TRUE(allclose(r.weight, zeros({5}, DType::f64), {0.0, 0.0}));
  EXPECT_TRUE(allclose(r.bias, zeros({5}, DType::f64), {0.0, 0.0}));
}

TEST_P(AddLayerNormBackwardTest, Errors) {
  EMBER_REQUIRE_KERNEL(layer_norm_stub);
  EMBER_REQUIRE_KERNEL(layer_norm_backward_stub);
  const Device d = device();
  const Tensor x = rand_input({4, 6}).to(d, DType::f32), w = ones({6}, {DType::f32, d});
  const LayerNormResult f = ops::layer_norm_with_stats(x, {6}, w, Tensor());
  const Tensor g = ones({4, 6}, {DType::f32, d});
  auto run = [&](const Tensor& xx, const Tensor& gg, const Tensor& ww, const LayerNormResult& ff, const Tensor& ga) {
    (void)ops::layer_norm_backward(gg, xx, ww, ff.mean, ff.rstd, 1, true, true, true, ga);
  };
  (void)error_message<ShapeError>([&] { run(x, g, w, f, zeros({4, 7}, {DType::f32, d})); });
  (void)error_message<ShapeError>([&] { run(x, g, w, f, zeros({6, 4}, {DType::f32, d})); });
  (void)error_message<ShapeError>([&] { run(x, g, w, f, zeros({24}, {DType::f32, d})); });
  (void)error_message<DTypeError>([&] { run(x, g, w, f, zeros({4, 6}, {DType::f64, d})); });
  (void)error_message<DTypeError>([&] { run(x, g, w, f, zeros({4, 6}, {DType::f16, d})); });
  (void)error_message<DeviceError>([&] { run(x, g, w, f, empty({4, 6}, {DType::f32, other_device(d)})); });
  // Mixed form: grad_add has x's dtype (f16), not the gradient's (f32).
  const Tensor xh = x.to(DType::f16);
  const LayerNormResult fh = ops::layer_norm_with_stats(xh, {6}, w, Tensor());
  (void)error_message<DTypeError>([&] { run(xh, g, w, fh, zeros({4, 6}, {DType::f32, d})); });
  const LayerNormGrads ok =
      ops::layer_norm_backward(g, xh, w, fh.mean, fh.rstd, 1, true, false, false, zeros({4, 6}, {DType::f16, d}));
  EXPECT_EQ(ok.x.dtype(), DType::f16);
}

EMBER_INSTANTIATE_DEVICE_TESTS(AddLayerNormBackwardTest);

// ---- bias_gelu ----------------------------------------------------------------------------------------------------

class BiasGeluTest : public DeviceTest {};

const char* approx_name(GeluApprox a) { return a == GeluApprox::Tanh ? "tanh" : "erf"; }

TEST_P(BiasGeluTest, MatchesReference) {
  EMBER_REQUIRE_KERNEL(bias_gelu_stub);
  for (GeluApprox approx : {GeluApprox::None, GeluApprox::Tanh}) {
    for (const Shape& shape : std::vector<Shape>{{7}, {5, 7}, {2, 3, 64}, {1, 1}, {300, 3072}}) {
      SCOPED_TRACE(::testing::Message() << approx_name(approx) << " " << shape_str(shape));
      OpCase c{"bias_gelu", {rand_input(shape, -4.0, 4.0), rand_input({shape.back()})}, [=](const Inputs& in) {
                 return ops::bias_gelu(in[0], in[1], approx);
               }};
      c.reference = [=](const Inputs& in) { return ref_bias_gelu(in[0], in[1], approx); };
      c.dtypes = {DType::f32, DType::f16, DType::bf16};
      check_op(c, device());
    }
  }
}

TEST_P(BiasGeluTest, StridedOperands) {
  EMBER_REQUIRE_KERNEL(bias_gelu_stub);
  for (GeluApprox approx : {GeluApprox::None, GeluApprox::Tanh}) {
    // x transposed and a bias with stride 2, both views taken inside the op call so every dtype sees them.
    OpCase c{"bias_gelu strided", {rand_input({40, 6}, -4.0, 4.0), rand_input({80})}, [=](const Inputs& in) {
               return ops::bias_gelu(in[0].t(), in[1].slice(0, 0, 80, 2), approx);
             }};
    c.reference = [=](const Inputs& in) { return ref_bias_gelu(in[0].t(), in[1].slice(0, 0, 80, 2), approx); };
    check_op(c, device());
    OpCase n{"bias_gelu non-contiguous",
             {noncontiguous_input({3, 4, 9}, -4.0, 4.0), rand_input({9})},
             [=](const Inputs& in) { return ops::bias_gelu(in[0], in[1], approx); }};
    n.reference = [=](const Inputs& in) { return ref_bias_gelu(in[0], in[1], approx); };
    check_op(n, device());
  }
}

// Note [Bias and GELU]: x + bias is not rounded to x's dtype before the GELU. Where gelu is steep relative to its
// value (x + bias in [-4, -2.5]), rounding the sum to f16/bf16 moves the output by several of its ulps; there the op's
// result must be within an ulp and a quarter of gelu of the exact sum (half an ulp of rounding, and f32's error in
// 1 + erf(s / sqrt 2) ~ 5e-4, up to half an f16 ulp), which an op rounding the sum first misses by over 1.9 ulps.
TEST_P(BiasGeluTest, SumIsNotRoundedBeforeTheGelu) {
  EMBER_REQUIRE_KERNEL(bias_gelu_stub);
  for (DType dt : {DType::f16, DType::bf16}) {
    const int precision = dt == DType::f16 ? 11 : 8;  // significand bits
    auto ulp = [&](double v) {
      int e = 0;
      (void)std::frexp(v, &e);
      return std::max(std::ldexp(1.0, e - precision), dt == DType::f16 ? std::ldexp(1.0, -24) : 0.0);
    };
    for (GeluApprox approx : {GeluApprox::None, GeluApprox::Tanh}) {
      SCOPED_TRACE(::testing::Message() << dtype_name(dt) << " " << approx_name(approx));
      const Tensor x = rand_input({64, 32}, -3.6, -2.9).to(dt), b = rand_input({32}, -0.4, 0.4).to(dt);
      const std::vector<double> got = ops::bias_gelu(x.to(device()), b.to(device()), approx).to_vector<double>();
      const std::vector<double> xv = x.to_vector<double>(), bv = b.to_vector<double>();
      int64_t telling = 0;  // elements where rounding the sum first would give a visibly different output
      for (size_t i = 0; i < xv.size(); ++i) {
        const double s = xv[i] + bv[i % 32];
        const double s_rounded = from_vector<double>({s}, {1}).to(dt).to_vector<double>()[0];
        const double exact = ref_gelu(s, approx), u = ulp(exact);
        if (std::fabs(ref_gelu(s_rounded, approx) - exact) <= 3.0 * u) continue;
        ++telling;
        EXPECT_LE(std::fabs(got[i] - exact), 1.25 * u)
            << "element " << i << ": x " << xv[i] << " + bias " << bv[i % 32] << " = " << s << " (rounded " << s_rounded
            << "): got " << got[i] << ", gelu of the exact sum " << exact << ", of the rounded sum "
            << ref_gelu(s_rounded, approx);
      }
      EXPECT_GT(telling, 100) << "too few elements tell a rounded sum from an exact one";
    }
  }
}

TEST_P(BiasGeluTest, EmptyShapes) {
  EMBER_REQUIRE_KERNEL(bias_gelu_stub);
  const Tensor x = zeros({0, 8}, {DType::f32, device()}), b = zeros({8}, {DType::f32, device()});
  const Tensor y = ops::bias_gelu(x, b);
  EXPECT_EQ(y.sizes(), (Shape{0, 8}));
  EXPECT_EQ(y.dtype(), DType::f32);
  EXPECT_EQ(ops::bias_gelu(zeros({3, 0}, {DType::bf16, device()}), zeros({0}, {DType::bf16, device()})).sizes(),
            (Shape{3, 0}));
}

TEST_P(BiasGeluTest, Errors) {
  const Device d = device();
  const Tensor x = zeros({5, 8}, {DType::f32, d}), b = zeros({8}, {DType::f32, d});
  (void)error_message<ShapeError>([&] { (void)ops::bias_gelu(x, zeros({7}, {DType::f32, d})); });
  (void)error_message<ShapeError>([&] { (void)ops::bias_gelu(x, zeros({5}, {DType::f32, d})); });
  (void)error_message<ShapeError>([&] { (void)ops::bias_gelu(x, zeros({1, 8}, {DType::f32, d})); });
  (void)error_message<ShapeError>([&] { (void)ops::bias_gelu(x, zeros({5, 8}, {DType::f32, d})); });
  (void)error_message<ShapeError>([&] { (void)ops::bias_gelu(x, zeros({}, {DType::f32, d})); });
  (void)error_message<DTypeError>([&] { (void)ops::bias_gelu(x, zeros({8}, {DType::f64, d})); });
  (void)error_message<DTypeError>([&] { (void)ops::bias_gelu(x.to(DType::bf16), b); });
  (void)error_message<DTypeError>([&] {
    (void)ops::bias_gelu(zeros({5, 8}, {DType::i32, d}), zeros({8}, {DType::i32, d}));
  });
  (void)error_message<DeviceError>([&] { (void)ops::bias_gelu(x, empty({8}, {DType::f32, other_device(d)})); });
  const std::string msg = error_message<ShapeError>([&] { (void)ops::bias_gelu(x, zeros({7}, {DType::f32, d})); });
  EXPECT_NE(msg.find("bias_gelu"), std::string::npos) << msg;
  // Backward: g has x's sizes and dtype.
  const Tensor g = zeros({5, 8}, {DType::f32, d});
  auto back = [&](const Tensor& gg, const Tensor& xx, const Tensor& bb) {
    (void)ops::bias_gelu_backward(gg, xx, bb, GeluApprox::None, true, true);
  };
  (void)error_message<ShapeError>([&] { back(zeros({5, 7}, {DType::f32, d}), x, b); });
  (void)error_message<ShapeError>([&] { back(zeros({8, 5}, {DType::f32, d}), x, b); });
  (void)error_message<DTypeError>([&] { back(zeros({5, 8}, {DType::f64, d}), x, b); });
  (void)error_message<ShapeError>([&] { back(g, x, zeros({7}, {DType::f32, d})); });
  (void)error_message<DTypeError>([&] { back(g, x, zeros({8}, {DType::f16, d})); });
  (void)error_message<DeviceError>([&] { back(empty({5, 8}, {DType::f32, other_device(d)}), x, b); });
}

EMBER_INSTANTIATE_DEVICE_TESTS(BiasGeluTest);

// ---- bias_gelu_backward -------------------------------------------------------------------------------------------

class BiasGeluBackwardTest : public DeviceTest {};

// An OpCase for grad_x (or grad_bias) of bias_gelu over in[0] = x, in[1] = bias, in[2] = g.
OpCase bias_gelu_backward_case(const Shape& shape, GeluApprox approx, bool bias_grad) {
  const int64_t cols = shape.back(), rows = numel_of(shape) / std::max<int64_t>(cols, 1);
  OpCase c{bias_grad ? "bias_gelu_backward bias" : "bias_gelu_backward x",
           {rand_input(shape, -4.0, 4.0), rand_input({cols}), rand_input(shape)},
           [=](const Inputs& in) {
             const BiasGeluGrads r = ops::bias_gelu_backward(in[2], in[0], in[1], approx, !bias_grad, bias_grad);
             EXPECT_EQ(r.x.defined(), !bias_grad);
             EXPECT_EQ(r.bias.defined(), bias_grad);
             return bias_grad ? r.bias : r.x;
           }};
  c.reference = [=](const Inputs& in) {
    const RefBiasGeluGrads r = ref_bias_gelu_backward(in[2], in[0], in[1], approx);
    return bias_grad ? r.bias : r.x;
  };
  c.dtypes = {DType::f32, DType::f16, DType::bf16};
  // grad_bias sums `rows` products of magnitude below ~1.2: an absolute floor that grows with the rows (f32
  // accumulation on CUDA), on top of the dtype's relative rounding of the result.
  c.tolerance = [=](DType dt) {
    Tolerance t = default_tolerance(dt);
    if (bias_grad && dt != DType::f64) t.atol += 2e-7 * static_cast<double>(rows);
    return t;
  };
  return c;
}

TEST_P(BiasGeluBackwardTest, MatchesReference) {
  EMBER_REQUIRE_KERNEL(bias_gelu_backward_stub);
  // Rows of 3072 (many column blocks); 600, 4096 and 17000 rows: the column sums' partial sums over several row
  // groups on CUDA (17000: the most groups, with rows left over in the last).
  for (GeluApprox approx : {GeluApprox::None, GeluApprox::Tanh}) {
    for (const Shape& shape :
         std::vector<Shape>{{7}, {1, 1}, {5, 7}, {2, 3, 64}, {40, 3072}, {600, 1030}, {4096, 96}, {17000, 8}}) {
      for (bool bias_grad : {false, true}) {
        SCOPED_TRACE(::testing::Message() << approx_name(approx) << " " << shape_str(shape));
        check_op(bias_gelu_backward_case(shape, approx, bias_grad), device());
      }
    }
  }
}

TEST_P(BiasGeluBackwardTest, StridedGradient) {
  EMBER_REQUIRE_KERNEL(bias_gelu_backward_stub);
  for (bool bias_grad : {false, true}) {
    // g transposed, g broadcast from one row (the gradient of a sum), x strided.
    OpCase c{"bias_gelu_backward strided",
             {noncontiguous_input({30, 17}, -4.0, 4.0), rand_input({17}), rand_input({17, 30})},
             [=](const Inputs& in) {
               const BiasGeluGrads r =
                   ops::bias_gelu_backward(in[2].t(), in[0], in[1], GeluApprox::Tanh, !bias_grad, bias_grad);
               return bias_grad ? r.bias : r.x;
             }};
    c.reference = [=](const Inputs& in) {
      const RefBiasGeluGrads r = ref_bias_gelu_backward(in[2].t(), in[0], in[1], GeluApprox::Tanh);
      return bias_grad ? r.bias : r.x;
    };
    check_op(c, device());
    OpCase e{"bias_gelu_backward broadcast gradient",
             {rand_input({30, 17}, -4.0, 4.0), rand_input({17}), rand_input({1, 17}).expand({30, 17})},
             [=](const Inputs& in) {
               const BiasGeluGrads r =
                   ops::bias_gelu_backward(in[2], in[0], in[1], GeluApprox::None, !bias_grad, bias_grad);
               return bias_grad ? r.bias : r.x;
             }};
    e.reference = [=](const Inputs& in) {
      const RefBiasGeluGrads r = ref_bias_gelu_backward(in[2], in[0], in[1], GeluApprox::None);
      return bias_grad ? r.bias : r.x;
    };
    check_op(e, device());
  }
}

// Each subset of the two gradients: only those asked for are defined, each matches the f64 reference, and on the
// CPU each has the bits of the one computed with both.
TEST_P(BiasGeluBackwardTest, EachSubsetOfGradients) {
  EMBER_REQUIRE_KERNEL(bias_gelu_backward_stub);
  for (DType dt : {DType::f32, DType::f64, DType::bf16}) {
    const Tensor x = rand_input({600, 48}, -4.0, 4.0).to(dt), b = rand_input({48}).to(dt),
                 g = rand_input({600, 48}).to(dt);
    const RefBiasGeluGrads want = ref_bias_gelu_backward(g, x, b, GeluApprox::None);
    const Tensor xd = x.to(device()), bd = b.to(device()), gd = g.to(device());
    const BiasGeluGrads both = ops::bias_gelu_backward(gd, xd, bd, GeluApprox::None, true, true);
    Tolerance bias_tol = default_tolerance(dt);
    if (dt != DType::f64) bias_tol.atol += 2e-7 * 600;
    for (int mask = 0; mask < 4; ++mask) {
      SCOPED_TRACE(::testing::Message() << dtype_name(dt) << " mask " << mask);
      const bool nx = (mask & 1) != 0, nb = (mask & 2) != 0;
      const BiasGeluGrads r = ops::bias_gelu_backward(gd, xd, bd, GeluApprox::None, nx, nb);
      EXPECT_EQ(r.x.defined(), nx);
      EXPECT_EQ(r.bias.defined(), nb);
      if (nx) {
        EXPECT_EQ(r.x.dtype(), dt);
        EXPECT_TRUE(allclose(r.x, want.x, default_tolerance(dt)));
        if (device().is_cpu()) EXPECT_TRUE(same_bits(r.x, both.x));
      }
      if (nb) {
        EXPECT_EQ(r.bias.dtype(), dt);
        EXPECT_EQ(r.bias.sizes(), (Shape{48}));
        EXPECT_TRUE(allclose(r.bias, want.bias, bias_tol));
        if (device().is_cpu()) EXPECT_TRUE(same_bits(r.bias, both.bias));
      }
    }
  }
}

TEST_P(BiasGeluBackwardTest, EmptyShapes) {
  EMBER_REQUIRE_KERNEL(bias_gelu_backward_stub);
  // No rows: grad_bias is a sum over nothing, 0.
  const Tensor x = zeros({0, 8}, {DType::f32, device()}), b = ones({8}, {DType::f32, device()});
  const BiasGeluGrads r = ops::bias_gelu_backward(x, x, b, GeluApprox::Tanh, true, true);
  EXPECT_EQ(r.x.sizes(), (Shape{0, 8}));
  EXPECT_TRUE(allclose(r.bias, zeros({8}, DType::f64), {0.0, 0.0}));
  const Tensor e = zeros({3, 0}, {DType::f16, device()});
  const BiasGeluGrads s =
      ops::bias_gelu_backward(e, e, zeros({0}, {DType::f16, device()}), GeluApprox::None, true, true);
  EXPECT_EQ(s.x.sizes(), (Shape{3, 0}));
  EXPECT_EQ(s.bias.sizes(), (Shape{0}));
}

EMBER_INSTANTIATE_DEVICE_TESTS(BiasGeluBackwardTest);

}  // namespace
}  // namespace ember::testing

// softmax / log_softmax and layer_norm against naive float64 formulas written here: every dim (negative too),
// strided views, rows summing to 1, extreme inputs (+-1000 stay finite), -inf / NaN / +inf entries, rows over 1024
// and many rows, 0-d, saved mean/rstd, the mixed f16/bf16-input f32-affine layer norm, and error paths.
#include <cmath>
#include <limits>
#include <vector>

#include "tests/harness/op_harness.h"

namespace ember::testing {
namespace {

// Naive softmax (or log-softmax) of x along dim: exp(x_i - max) / sum_j exp(x_j - max).
Tensor ref_softmax(const Tensor& x, int64_t dim, bool log) {
  const Shape shape = x.sizes();
  const int64_t nd = static_cast<int64_t>(shape.size());
  if (dim < 0) dim += nd;
  const std::vector<double> v = x.to_vector<double>();
  std::vector<double> out(v.size());
  int64_t inner = 1;
  for (int64_t d = dim + 1; d < nd; ++d) inner *= shape[d];
  const int64_t n = shape[dim], outer = static_cast<int64_t>(v.size()) / (n * inner);
  for (int64_t o = 0; o < outer; ++o)
    for (int64_t i = 0; i < inner; ++i) {
      auto at = [&](int64_t k) { return o * n * inner + k * inner + i; };
      double mx = -std::numeric_limits<double>::infinity();
      for (int64_t k = 0; k < n; ++k) mx = std::max(mx, v[at(k)]);
      double s = 0.0;
      for (int64_t k = 0; k < n; ++k) s += std::exp(v[at(k)] - mx);
      for (int64_t k = 0; k < n; ++k)
        out[at(k)] = log ? v[at(k)] - mx - std::log(s) : std::exp(v[at(k)] - mx) / s;
    }
  return from_vector(out, shape);
}

// Textbook layer norm over the last `nd_norm` dims: (x - mean) / sqrt(biased var + eps) * w + b.
struct RefLayerNorm {
  std::vector<double> out, mean, rstd;
};
RefLayerNorm ref_layer_norm(const Tensor& x, int64_t nd_norm, const Tensor& w, const Tensor& b, double eps) {
  const std::vector<double> v = x.to_vector<double>();
  int64_t cols = 1;
  for (int64_t d = x.dim() - nd_norm; d < x.dim(); ++d) cols *= x.size(d);
  const int64_t rows = x.numel() / cols;
  const std::vector<double> vw = w.defined() ? w.to_vector<double>() : std::vector<double>();
  const std::vector<double> vb = b.defined() ? b.to_vector<double>() : std::vector<double>();
  RefLayerNorm r;
  r.out.resize(v.size());
  for (int64_t i = 0; i < rows; ++i) {
    double mu = 0.0;
    for (int64_t j = 0; j < cols; ++j) mu += v[i * cols + j];
    mu /= static_cast<double>(cols);
    double var = 0.0;
    for (int64_t j = 0; j < cols; ++j) var += (v[i * cols + j] - mu) * (v[i * cols + j] - mu);
    var /= static_cast<double>(cols);
    const double rstd = 1.0 / std::sqrt(var + eps);
    r.mean.push_back(mu);
    r.rstd.push_back(rstd);
    for (int64_t j = 0; j < cols; ++j) {
      double y = (v[i * cols + j] - mu) * rstd;
      if (!vw.empty()) y *= vw[j];
      if (!vb.empty()) y += vb[j];
      r.out[i * cols + j] = y;
    }
  }
  return r;
}

class SoftmaxTest : public DeviceTest {};

TEST_P(SoftmaxTest, MatchesReferenceAlongEveryDim) {
  EMBER_REQUIRE_KERNEL(softmax_stub);
  for (bool log : {false, true}) {
    for (int64_t dim : {0, 1, 2, -1, -2, -3}) {
      SCOPED_TRACE(::testing::Message() << (log ? "log_softmax" : "softmax") << " dim " << dim);
      OpCase c{"softmax", {rand_input({3, 4, 5}, -3.0, 3.0)},
               [=](const Inputs& in) { return log ? log_softmax(in[0], dim) : softmax(in[0], dim); }};
      c.reference = [=](const Inputs& in) { return ref_softmax(in[0], dim, log); };
      check_op(c, device());
    }
  }
}

TEST_P(SoftmaxTest, NonContiguousInputs) {
  EMBER_REQUIRE_KERNEL(softmax_stub);
  for (bool log : {false, true}) {
    for (int64_t dim : {0, -1}) {
      OpCase c{"softmax", {rand_input({6, 3, 5}, -3.0, 3.0)}, [=](const Inputs& in) {
                 const Tensor v = in[0].transpose(0, 2);
                 return log ? log_softmax(v, dim) : softmax(v, dim);
               }};
      c.reference = [=](const Inputs& in) { return ref_softmax(in[0].transpose(0, 2), dim, log); };
      check_op(c, device());
      OpCase n{"softmax", {noncontiguous_input({4, 7}, -3.0, 3.0)},
               [=](const Inputs& in) { return log ? log_softmax(in[0], dim) : softmax(in[0], dim); }};
      n.reference = [=](const Inputs& in) { return ref_softmax(in[0], dim, log); };
      check_op(n, device());
    }
  }
}

TEST_P(SoftmaxTest, RowsSumToOne) {
  EMBER_REQUIRE_KERNEL(softmax_stub);
  for (DType dt : {DType::f32, DType::f64, DType::f16, DType::bf16}) {
    SCOPED_TRACE(dtype_name(dt));
    const Tensor x = rand_input({5, 300}, -10.0, 10.0).to(device(), dt);
    const std::vector<double> p = softmax(x, 1).to_vector<double>();
    const double tol = dt == DType::f64 ? 1e-12 : dt == DType::f32 ? 1e-5 : 3e-2;
    for (int64_t r = 0; r < 5; ++r) {
      double s = 0.0;
      for (int64_t j = 0; j < 300; ++j) {
        EXPECT_GE(p[r * 300 + j], 0.0);
        s += p[r * 300 + j];
      }
      EXPECT_NEAR(s, 1.0, tol) << "row " << r;
    }
  }
}

TEST_P(SoftmaxTest, ExtremeInputsStayFinite) {
  EMBER_REQUIRE_KERNEL(softmax_stub);
  for (bool log : {false, true}) {
    OpCase c{"softmax", {rand_input({4, 9}, -1000.0, 1000.0)},
             [=](const Inputs& in) { return log ? log_softmax(in[0], -1) : softmax(in[0], -1); }};
    c.reference = [=](const Inputs& in) { return ref_softmax(in[0], -1, log); };
    check_op(c, device());
  }
  // Hand values: exp(1000) overflows any float type unless the max is subtracted first.
  for (DType dt : {DType::f32, DType::f16, DType::bf16}) {
    const Tensor x = from_vector<double>({1000, 1000, -1000}, {3}).to(device(), dt);
    const std::vector<double> p = softmax(x, 0).to_vector<double>();
    EXPECT_NEAR(p[0], 0.5, 1e-3);
    EXPECT_NEAR(p[1], 0.5, 1e-3);
    EXPECT_EQ(p[2], 0.0);
    const std::vector<double> lp = log_softmax(x, 0).to_vector<double>();
    EXPECT_NEAR(lp[0], -std::log(2.0), 1e-2);
    EXPECT_TRUE(std::isfinite(lp[2]));
    EXPECT_NEAR(lp[2], -2000.0 - std::log(2.0), 20.0);
  }
}

TEST_P(SoftmaxTest, ZeroDimAndEmpty) {
  EMBER_REQUIRE_KERNEL(softmax_stub);
  const Tensor x = full({}, 3.0, TensorOptions(DType::f32, device()));
  EXPECT_EQ(softmax(x, 0).dim(), 0);
  EXPECT_EQ(softmax(x, -1).item_double(), 1.0);
  EXPECT_EQ(log_softmax(x, 0).item_double(), 0.0);
  EXPECT_EQ(softmax(empty({0, 4}, TensorOptions(DType::f32, device())), 1).sizes(), Shape({0, 4}));
}

TEST_P(SoftmaxTest, LongRowsStridedDimsAndManyRows) {
  EMBER_REQUIRE_KERNEL(softmax_stub);
  // Shapes chosen for the CUDA kernel's paths (Note [Softmax and layer norm kernel shapes] in
  // kernels/cuda/softmax_layernorm.cu): rows over 1024 (row cached in shared memory, and too long to cache), a strided
  // softmax dim with few rows (long and short rows), with many rows and with short rows, and more rows than one grid.
  struct Case {
    Shape shape;
    int64_t dim;
  };
  for (const Case& k : {Case{{3, 3000}, -1}, Case{{2, 9000}, -1}, Case{{2000, 3}, 0}, Case{{9000, 2}, 0},
                        Case{{300, 5}, 0}, Case{{6, 40, 32}, 1}, Case{{6, 40, 32}, 0}, Case{{40, 1100}, 0},
                        Case{{20000, 3}, -1}, Case{{600, 1030}, 1}}) {
    for (bool log : {false, true}) {
      SCOPED_TRACE(::testing::Message() << (log ? "log_softmax " : "softmax ") << shape_str(k.shape) << " dim "
                                        << k.dim);
      const int64_t dim = k.dim;
      OpCase c{"softmax", {rand_input(k.shape, -3.0, 3.0)},
               [=](const Inputs& in) { return log ? log_softmax(in[0], dim) : softmax(in[0], dim); }};
      c.reference = [=](const Inputs& in) { return ref_softmax(in[0], dim, log); };
      check_op(c, device());
    }
  }
}

TEST_P(SoftmaxTest, InfinitiesAndNaN) {
  EMBER_REQUIRE_KERNEL(softmax_stub);
  const double inf = std::numeric_limits<double>::infinity(), nan = std::numeric_limits<double>::quiet_NaN();
  // Rows: masked (-inf) entries, all masked (NaN, as exp(-inf - -inf)), a NaN (row NaN), a +inf (row NaN), a single
  // unmasked entry (1 there, 0 elsewhere; log: 0 and -inf), plain values.
  const Tensor hand = from_vector<double>({0.5,  -inf, 1.0,  -inf, -2.0,  //
                                           -inf, -inf, -inf, -inf, -inf,  //
                                           0.1,  nan,  0.3,  0.2,  0.0,   //
                                           1.0,  inf,  2.0,  3.0,  4.0,   //
                                           -inf, -inf, 7.0,  -inf, -inf,  //
                                           1.0,  2.0,  3.0,  4.0,  5.0},
                                          {6, 5});
  // Long rows (one block per row): every third entry masked, and a fully masked row.
  std::vector<double> v = rand_input({2, 3000}, -3.0, 3.0).to_vector<double>();
  for (size_t i = 0; i < v.size(); ++i)
    if (i % 3 == 0 || i >= 3000) v[i] = -inf;
  const Tensor long_rows = from_vector(v, {2, 3000});
  struct Case {
    Tensor x;
    int64_t dim;
  };
  for (const Case& k : {Case{hand, -1}, Case{hand, 0}, Case{long_rows, -1}, Case{long_rows, 0},
                        Case{long_rows.t().contiguous(), 0}}) {
    for (bool log : {false, true}) {
      SCOPED_TRACE(::testing::Message() << (log ? "log_softmax " : "softmax ") << k.x.description() << " dim "
                                        << k.dim);
      const int64_t dim = k.dim;
      OpCase c{"softmax", {k.x}, [=](const Inputs& in) { return log ? log_softmax(in[0], dim) : softmax(in[0], dim); }};
      c.reference = [=](const Inputs& in) { return ref_softmax(in[0], dim, log); };
      check_op(c, device());
    }
  }
}

EMBER_INSTANTIATE_DEVICE_TESTS(SoftmaxTest);

class LayerNormTest : public DeviceTest {};

TEST_P(LayerNormTest, MatchesTextbookFormula) {
  EMBER_REQUIRE_KERNEL(layer_norm_stub);
  for (const Shape& ns : {Shape{8}, Shape{6, 8}}) {
    const int64_t nn = static_cast<int64_t>(ns.size());
    SCOPED_TRACE(shape_str(ns));
    // With weight and bias.
    OpCase c{"layer_norm", {rand_input({4, 6, 8}), rand_input(ns, 0.5, 1.5), rand_input(ns)},
             [=](const Inputs& in) { return layer_norm(in[0], ns, in[1], in[2]); }};
    c.reference = [=](const Inputs& in) {
      return from_vector(ref_layer_norm(in[0], nn, in[1], in[2], 1e-5).out, in[0].sizes());
    };
    check_op(c, device());
    // Without affine parameters, and with a large eps so eps visibly matters.
    OpCase p{"layer_norm", {rand_input({4, 6, 8}, -0.1, 0.1)},
             [=](const Inputs& in) { return layer_norm(in[0], ns, Tensor(), Tensor(), 1e-2); }};
    p.reference = [=](const Inputs& in) {
      return from_vector(ref_layer_norm(in[0], nn, Tensor(), Tensor(), 1e-2).out, in[0].sizes());
    };
    check_op(p, device());
  }
  // Weight only, on a 1-d input.
  OpCase w{"layer_norm", {rand_input({16}, 2.0, 5.0), rand_input({16})},
           [](const Inputs& in) { return layer_norm(in[0], {16}, in[1]); }};
  w.reference = [](const Inputs& in) {
    return from_vector(ref_layer_norm(in[0], 1, in[1], Tensor(), 1e-5).out, in[0].sizes());
  };
  check_op(w, device());
}

TEST_P(LayerNormTest, NonContiguousInputs) {
  EMBER_REQUIRE_KERNEL(layer_norm_stub);
  for (const Shape& ns : {Shape{8}, Shape{5, 8}}) {
    const int64_t nn = static_cast<int64_t>(ns.size());
    // The transpose happens inside the op call, so every dtype sees the strided view.
    OpCase c{"layer_norm", {rand_input({8, 5})},
             [=](const Inputs& in) { return layer_norm(in[0].t(), ns, Tensor(), Tensor()); }};
    c.reference = [=](const Inputs& in) {
      return from_vector(ref_layer_norm(in[0].t(), nn, Tensor(), Tensor(), 1e-5).out, {5, 8});
    };
    check_op(c, device());
  }
  OpCase s{"layer_norm", {rand_input({3, 5, 8}), rand_input({16}, 0.5, 1.5)}, [](const Inputs& in) {
             return layer_norm(in[0].transpose(0, 1), {8}, in[1].slice(0, 0, 16, 2), Tensor());
           }};
  s.reference = [](const Inputs& in) {
    return from_vector(ref_layer_norm(in[0].transpose(0, 1), 1, in[1].slice(0, 0, 16, 2), Tensor(), 1e-5).out,
                       {5, 3, 8});
  };
  check_op(s, device());
}

TEST_P(LayerNormTest, SavedStatistics) {
  EMBER_REQUIRE_KERNEL(layer_norm_stub);
  const Tensor x64 = rand_input({2, 3, 10}, -2.0, 3.0);
  for (DType dt : {DType::f64, DType::f32, DType::f16, DType::bf16}) {
    SCOPED_TRACE(dtype_name(dt));
    const Tensor x = x64.to(dt);
    // The reference sees the rounded input, as the op does.
    const RefLayerNorm r = ref_layer_norm(x.to(DType::f64), 1, Tensor(), Tensor(), 1e-5);
    const LayerNormResult res = layer_norm_with_stats(x.to(device()), {10}, Tensor(), Tensor());
    const DType stats = dt == DType::f64 ? DType::f64 : DType::f32;
    EXPECT_EQ(res.mean.dtype(), stats);
    EXPECT_EQ(res.rstd.dtype(), stats);
    EXPECT_EQ(res.mean.sizes(), Shape({2, 3}));
    EXPECT_EQ(res.rstd.sizes(), Shape({2, 3}));
    EXPECT_EQ(res.out.dtype(), dt);
    const Tolerance tol = stats == DType::f64 ? Tolerance{1e-12, 1e-12} : Tolerance{1e-5, 1e-6};
    EXPECT_TRUE(allclose(res.mean, from_vector(r.mean, {2, 3}), tol));
    EXPECT_TRUE(allclose(res.rstd, from_vector(r.rstd, {2, 3}), tol));
  }
}

TEST_P(LayerNormTest, LongRowsAndManyRows) {
  EMBER_REQUIRE_KERNEL(layer_norm_stub);
  // Rows over 1024 (row cached in shared memory, and too long to cache), more rows than one grid, and x strided along
  // its rows (given as [cols, rows] and transposed inside the op call), each with and without weight and bias.
  struct Case {
    Shape shape;
    bool transpose;
  };
  for (const Case& k : {Case{{3, 3000}, false}, Case{{2, 9000}, false}, Case{{600, 1030}, false},
                        Case{{20000, 4}, false}, Case{{3000, 3}, true}, Case{{40, 6}, true}}) {
    const bool tr = k.transpose;
    const int64_t cols = tr ? k.shape[0] : k.shape[1];
    for (bool affine : {true, false}) {
      SCOPED_TRACE(::testing::Message() << shape_str(k.shape) << (tr ? " transposed" : "")
                                        << (affine ? " with weight and bias" : ""));
      Inputs inputs{rand_input(k.shape)};
      if (affine) inputs.insert(inputs.end(), {rand_input({cols}, 0.5, 1.5), rand_input({cols})});
      OpCase c{"layer_norm", inputs, [=](const Inputs& in) {
                 const Tensor x = tr ? in[0].t() : in[0];
                 return layer_norm(x, {cols}, affine ? in[1] : Tensor(), affine ? in[2] : Tensor());
               }};
      c.reference = [=](const Inputs& in) {
        const Tensor x = tr ? in[0].t() : in[0];
        return from_vector(ref_layer_norm(x, 1, affine ? in[1] : Tensor(), affine ? in[2] : Tensor(), 1e-5).out,
                           x.sizes());
      };
      if (cols < 8) {
        // Thousands of rows of 3 or 4 values include some with a tiny spread: x - mean keeps the f32 rounding of x
        // (~6e-8) and rstd (up to ~1e2 there) scales it, so the absolute error reaches a few 1e-6.
        c.tolerance = [](DType dt) { return dt == DType::f32 ? Tolerance{1e-4, 1e-4} : default_tolerance(dt); };
      }
      check_op(c, device());
    }
  }
  // Saved statistics of long rows: f64 (too long to cache) and f32 (cached).
  for (DType dt : {DType::f64, DType::f32}) {
    SCOPED_TRACE(dtype_name(dt));
    const Tensor x = rand_input({4, 5000}, -2.0, 3.0).to(dt);
    const RefLayerNorm r = ref_layer_norm(x.to(DType::f64), 1, Tensor(), Tensor(), 1e-5);
    const LayerNormResult res = layer_norm_with_stats(x.to(device()), {5000}, Tensor(), Tensor());
    const Tolerance tol = dt == DType::f64 ? Tolerance{1e-12, 1e-12} : Tolerance{1e-5, 1e-6};
    EXPECT_TRUE(allclose(res.mean, from_vector(r.mean, {4}), tol));
    EXPECT_TRUE(allclose(res.rstd, from_vector(r.rstd, {4}), tol));
  }
}

TEST_P(LayerNormTest, MixedHalfInputWithF32Affine) {
  EMBER_REQUIRE_KERNEL(layer_norm_stub);
  // Note [Mixed layer norm]: an f16/bf16 x with f32 weight and/or bias gives an f32 output and f32 statistics, equal
  // to the float64 layer norm of x's (rounded) values to f32 accuracy. Short rows and rows over 1024.
  for (DType low : {DType::f16, DType::bf16}) {
    for (int64_t cols : {40, 3000}) {
      const Tensor x = rand_input({5, cols}).to(low);
      const Tensor w = rand_input({cols}, 0.5, 1.5).to(DType::f32), b = rand_input({cols}).to(DType::f32);
      for (int which = 0; which < 3; ++which) {  // weight and bias, weight only, bias only
        SCOPED_TRACE(::testing::Message() << dtype_name(low) << " cols " << cols << " affine " << which);
        const Tensor wt = which != 2 ? w : Tensor(), bt = which != 1 ? b : Tensor();
        const LayerNormResult res =
            ops::layer_norm_with_stats(x.to(device()), {cols}, wt.defined() ? wt.to(device()) : Tensor(),
                                       bt.defined() ? bt.to(device()) : Tensor(), 1e-5);
        EXPECT_EQ(res.out.dtype(), DType::f32);
        EXPECT_EQ(res.mean.dtype(), DType::f32);
        EXPECT_EQ(res.rstd.dtype(), DType::f32);
        const RefLayerNorm r = ref_layer_norm(x.to(DType::f64), 1, wt.defined() ? wt.to(DType::f64) : Tensor(),
                                              bt.defined() ? bt.to(DType::f64) : Tensor(), 1e-5);
        EXPECT_TRUE(allclose(res.out, from_vector(r.out, {5, cols}), Tolerance{1e-5, 2e-5}));
        EXPECT_TRUE(allclose(res.mean, from_vector(r.mean, {5}), Tolerance{1e-5, 1e-6}));
        EXPECT_TRUE(allclose(res.rstd, from_vector(r.rstd, {5}), Tolerance{1e-5, 1e-6}));
      }
    }
  }
}

EMBER_INSTANTIATE_DEVICE_TESTS(LayerNormTest);

TEST(SoftmaxErrors, DTypeAndDim) {
  EXPECT_THROW(softmax(zeros({2, 3}, DType::i64), 1), DTypeError);
  EXPECT_THROW(log_softmax(zeros({2, 3}, DType::b8), 1), DTypeError);
  EXPECT_THROW(softmax(zeros({2, 3}), 2), IndexError);
  EXPECT_THROW(log_softmax(zeros({2, 3}), -3), IndexError);
  EXPECT_THROW(softmax(zeros({}), 1), IndexError);
}

TEST(LayerNormErrors, ShapesDTypesDevices) {
  const Tensor x = zeros({4, 6, 8});
  EXPECT_THROW(layer_norm(x, {6}), ShapeError);          // not x's trailing dims
  EXPECT_THROW(layer_norm(x, {4, 6, 8, 1}), ShapeError);  // more dims than x
  EXPECT_THROW(layer_norm(x, {8}, zeros({6})), ShapeError);
  EXPECT_THROW(layer_norm(x, {6, 8}, zeros({48})), ShapeError);
  EXPECT_THROW(layer_norm(x, {8}, Tensor(), zeros({7})), ShapeError);
  EXPECT_THROW(layer_norm(zeros({4, 8}, DType::i32), {8}), DTypeError);
  EXPECT_THROW(layer_norm(x, {8}, zeros({8}, DType::f64)), DTypeError);
  EXPECT_THROW(layer_norm(x, {8}, zeros({8}), zeros({8}, DType::f16)), DTypeError);
  EXPECT_THROW(layer_norm(x, {8}, empty({8}, TensorOptions(DType::f32, Device::meta()))), DeviceError);
  try {
    layer_norm(x, {5});
    FAIL() << "expected ShapeError";
  } catch (const ShapeError& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("layer_norm"), std::string::npos) << msg;
    EXPECT_NE(msg.find("[4, 6, 8]"), std::string::npos) << msg;
  }
}

}  // namespace
}  // namespace ember::testing

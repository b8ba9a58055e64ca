// softmax / log_softmax and layer_norm against naive float64 formulas written here: every dim (negative too),
// strided views, rows summing to 1, extreme inputs (+-1000 stay finite), 0-d, saved mean/rstd, and error paths.
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

// Reductions (sum, mean, amax, amin, var, argmax, argmin) against naive float64 loops written here: dim sets,
// keepdim, negative dims, non-contiguous views, 0-d and empty inputs, integer sums, NaN/tie rules, error paths.
// f16/bf16: the harness rounds inputs before the reference sees them, so the output rounding dominates the error.
#include <cmath>
#include <limits>
#include <vector>

#include "tests/harness/op_harness.h"

namespace ember::testing {
namespace {

enum class Red { Sum, Mean, Max, Min, Var, ArgMax, ArgMin };

// Naive reduction of x (any dtype, read as double) over dims (may be negative; empty = all).
// Arg reductions take exactly one dim and give i64 indices; everything else gives f64.
Tensor ref_reduce(const Tensor& x, std::vector<int64_t> dims, bool keepdim, Red op, int64_t correction = 1) {
  const Shape shape = x.sizes();
  const int64_t nd = static_cast<int64_t>(shape.size());
  const std::vector<double> v = x.to_vector<double>();
  if (dims.empty())
    for (int64_t d = 0; d < nd; ++d) dims.push_back(d);
  std::vector<bool> red(static_cast<size_t>(nd), false);
  for (int64_t d : dims) red[static_cast<size_t>(d < 0 ? d + nd : d)] = true;
  Shape keep_shape = shape, out_shape;
  for (int64_t d = 0; d < nd; ++d) {
    if (red[d]) keep_shape[d] = 1;
    else out_shape.push_back(shape[d]);
    if (red[d] && keepdim) out_shape.push_back(1);
  }
  const int64_t n_out = numel_of(keep_shape);
  std::vector<std::vector<double>> groups(static_cast<size_t>(n_out));
  for (int64_t i = 0; i < static_cast<int64_t>(v.size()); ++i) {
    int64_t rem = i, o = 0, mul = 1;
    for (int64_t d = nd - 1; d >= 0; --d) {
      const int64_t idx = rem % shape[d];
      rem /= shape[d];
      if (!red[d]) o += idx * mul;
      mul *= keep_shape[d];
    }
    groups[o].push_back(v[i]);
  }
  std::vector<double> out(static_cast<size_t>(n_out));
  std::vector<int64_t> out_idx(static_cast<size_t>(n_out));
  for (int64_t o = 0; o < n_out; ++o) {
    const std::vector<double>& g = groups[o];
    const double n = static_cast<double>(g.size());
    double s = 0.0;
    for (double e : g) s += e;
    switch (op) {
      case Red::Sum: out[o] = s; break;
      case Red::Mean: out[o] = s / n; break;
      case Red::Var: {
        double ss = 0.0;
        for (double e : g) ss += (e - s / n) * (e - s / n);
        out[o] = ss / (n - static_cast<double>(correction));
        break;
      }
      case Red::Max:
      case Red::Min: {
        double best = g[0];
        for (double e : g) {
          if (std::isnan(e)) { best = e; break; }
          best = op == Red::Max ? std::max(best, e) : std::min(best, e);
        }
        out[o] = best;
        break;
      }
      case Red::ArgMax:
      case Red::ArgMin: {
        int64_t bi = 0;
        for (int64_t k = 0; k < static_cast<int64_t>(g.size()); ++k) {
          if (std::isnan(g[k])) { bi = k; break; }
          if (op == Red::ArgMax ? g[k] > g[bi] : g[k] < g[bi]) bi = k;
        }
        out_idx[o] = bi;
        break;
      }
    }
  }
  if (op == Red::ArgMax || op == Red::ArgMin) return from_vector(out_idx, out_shape);
  return from_vector(out, out_shape);
}

Tensor run(Red op, const Tensor& x, const std::vector<int64_t>& dims, bool keepdim, int64_t correction = 1) {
  switch (op) {
    case Red::Sum: return sum(x, dims, keepdim);
    case Red::Mean: return mean(x, dims, keepdim);
    case Red::Max: return amax(x, dims, keepdim);
    case Red::Min: return amin(x, dims, keepdim);
    case Red::Var: return var(x, dims, correction, keepdim);
    case Red::ArgMax: return argmax(x, dims[0], keepdim);
    case Red::ArgMin: return argmin(x, dims[0], keepdim);
  }
  return Tensor();
}

const char* red_name(Red op) {
  static const char* names[] = {"sum", "mean", "amax", "amin", "var", "argmax", "argmin"};
  return names[static_cast<int>(op)];
}

class ReduceTest : public DeviceTest {};

TEST_P(ReduceTest, ValueReductionsMatchReferenceOverDimSets) {
  EMBER_REQUIRE_KERNEL(reduce_stub);
  const std::vector<std::vector<int64_t>> dim_sets = {{}, {0}, {1}, {2}, {-1}, {0, 2}, {-1, 0}, {1, 2}, {0, 1, 2}};
  for (Red op : {Red::Sum, Red::Mean, Red::Max, Red::Min, Red::Var}) {
    for (const auto& dims : dim_sets) {
      for (bool keepdim : {false, true}) {
        SCOPED_TRACE(::testing::Message() << red_name(op) << " dims " << shape_str(dims) << " keepdim " << keepdim);
        OpCase c{red_name(op), {rand_input({3, 4, 5})},
                 [=](const Inputs& in) { return run(op, in[0], dims, keepdim); }};
        c.reference = [=](const Inputs& in) { return ref_reduce(in[0], dims, keepdim, op); };
        check_op(c, device());
      }
    }
  }
}

TEST_P(ReduceTest, NonContiguousInputs) {
  EMBER_REQUIRE_KERNEL(reduce_stub);
  for (Red op : {Red::Sum, Red::Mean, Red::Max, Red::Min, Red::Var, Red::ArgMax, Red::ArgMin}) {
    for (const std::vector<int64_t>& dims : std::vector<std::vector<int64_t>>{{0}, {1}, {-1}, {0, 2}}) {
      if ((op == Red::ArgMax || op == Red::ArgMin) && dims.size() != 1) continue;
      SCOPED_TRACE(::testing::Message() << red_name(op) << " dims " << shape_str(dims));
      // The transpose happens inside the op call, so every dtype (not only f64) sees a strided view.
      OpCase c{red_name(op), {rand_input({6, 3, 4})},
               [=](const Inputs& in) { return run(op, in[0].transpose(0, 2), dims, false); }};
      c.reference = [=](const Inputs& in) { return ref_reduce(in[0].transpose(0, 2), dims, false, op); };
      check_op(c, device());
      OpCase d{red_name(op), {noncontiguous_input({4, 3, 5})},
               [=](const Inputs& in) { return run(op, in[0], dims, true); }};
      d.reference = [=](const Inputs& in) { return ref_reduce(in[0], dims, true, op); };
      check_op(d, device());
    }
  }
}

TEST_P(ReduceTest, VarCorrections) {
  EMBER_REQUIRE_KERNEL(reduce_stub);
  for (int64_t corr : {0, 1, 2}) {
    OpCase c{"var", {rand_input({5, 7})}, [=](const Inputs& in) { return var(in[0], {1}, corr, false); }};
    c.reference = [=](const Inputs& in) { return ref_reduce(in[0], {1}, false, Red::Var, corr); };
    check_op(c, device());
  }
  // One element with correction 1: 0 / 0 = NaN (PyTorch gives NaN too).
  const Tensor one = ones({1}, TensorOptions(DType::f32, device()));
  EXPECT_TRUE(std::isnan(var(one).item_double()));
}

TEST_P(ReduceTest, LargeReductionStaysAccurate) {
  EMBER_REQUIRE_KERNEL(reduce_stub);
  // 20000 values all near 1: a naive f32 running sum drifts by ~1e-3 relative; the result must not.
  OpCase c{"sum", {rand_input({20000}, 0.9, 1.1)}, [](const Inputs& in) { return sum(in[0]); }};
  c.reference = [](const Inputs& in) { return ref_reduce(in[0], {}, false, Red::Sum); };
  check_op(c, device());
  OpCase m{"mean", {rand_input({4, 5000})}, [](const Inputs& in) { return mean(in[0], {1}); }};
  m.reference = [](const Inputs& in) { return ref_reduce(in[0], {1}, false, Red::Mean); };
  check_op(m, device());
}

TEST_P(ReduceTest, ZeroDimInput) {
  EMBER_REQUIRE_KERNEL(reduce_stub);
  const Tensor x = full({}, 2.5, TensorOptions(DType::f32, device()));
  for (const Tensor& r : {sum(x), sum(x, {0}), sum(x, {-1}, true), mean(x), amax(x), amin(x)}) {
    EXPECT_EQ(r.dim(), 0);
    EXPECT_EQ(r.item_double(), 2.5);
  }
  EXPECT_EQ(argmax(x).item<int64_t>(), 0);
  EXPECT_EQ(argmin(x, 0).dim(), 0);
  EXPECT_TRUE(std::isnan(var(x).item_double()));  // one element, correction 1
}

TEST_P(ReduceTest, EmptyReductions) {
  EMBER_REQUIRE_KERNEL(reduce_stub);
  const TensorOptions f32(DType::f32, device());
  EXPECT_EQ(sum(empty({0}, f32)).item_double(), 0.0);
  EXPECT_TRUE(std::isnan(mean(empty({0}, f32)).item_double()));
  const Tensor s = sum(empty({0, 3}, f32), {0});
  EXPECT_EQ(s.sizes(), Shape({3}));
  EXPECT_EQ(s.to_vector<double>(), std::vector<double>(3, 0.0));
  EXPECT_EQ(sum(empty({2, 0}, f32), {1}, true).sizes(), Shape({2, 1}));
  // An empty outer reduced dim with a contiguous inner one (no storage to read), and its mean.
  EXPECT_EQ(sum(empty({0, 3, 4}, f32), {0, 2}).to_vector<double>(), std::vector<double>(3, 0.0));
  EXPECT_EQ(sum(empty({3, 0, 4}, f32), {1}).to_vector<double>(), std::vector<double>(12, 0.0));
  EXPECT_EQ(sum(empty({0, 3}, f32), {1}).sizes(), Shape({0}));     // empty output, non-empty reduction
  EXPECT_EQ(amax(empty({0, 3}, f32), {1}).sizes(), Shape({0}));
  EXPECT_THROW(amax(empty({0, 3}, f32), {0}), ValueError);
  EXPECT_THROW(amin(empty({0}, f32)), ValueError);
  EXPECT_THROW(var(empty({2, 0}, f32), {1}), ValueError);
  EXPECT_THROW(argmax(empty({0}, f32)), ValueError);
  EXPECT_THROW(argmin(empty({3, 0}, f32), 1), ValueError);
}

TEST_P(ReduceTest, SumsDownStridedColumnsMatchReference) {
  // Outputs side by side in the input and the reduced dim strided (a bias gradient's sum over the batch): the CPU
  // kernel adds whole rows, in blocks of outputs that wrap over the kept dims.
  EMBER_REQUIRE_KERNEL(reduce_stub);
  for (Red op : {Red::Sum, Red::Mean}) {
    for (const auto& shape_dims : std::vector<std::pair<Shape, std::vector<int64_t>>>{
             {{70, 600}, {0}}, {{5, 7, 90}, {0}}, {{4, 300, 3}, {1}}, {{3, 6, 2, 130}, {0, 2}}}) {
      const Shape& shape = shape_dims.first;
      const std::vector<int64_t> dims = shape_dims.second;  // captured by the lambdas below
      SCOPED_TRACE(::testing::Message() << red_name(op) << " x " << shape_str(shape) << " dims " << shape_str(dims));
      OpCase c{red_name(op), {rand_input(shape)}, [=](const Inputs& in) { return run(op, in[0], dims, false); }};
      c.reference = [=](const Inputs& in) { return ref_reduce(in[0], dims, false, op); };
      check_op(c, device());
    }
  }
  std::vector<int32_t> v;
  for (int32_t i = 0; i < 3 * 300; ++i) v.push_back(i % 17 - 8);
  const Tensor xi = from_vector<int32_t>(v, {3, 300}).to(device());
  const std::vector<int64_t> got = sum(xi, {0}).to_vector<int64_t>();
  for (int64_t j = 0; j < 300; ++j) EXPECT_EQ(got[j], v[j] + v[300 + j] + v[600 + j]) << j;
}

TEST_P(ReduceTest, IntegerAndBoolSumsGiveI64) {
  EMBER_REQUIRE_KERNEL(reduce_stub);
  const Tensor xi = from_vector<int32_t>({1, -2, 3, 4, 5, -6}, {2, 3}).to(device());
  const Tensor si = sum(xi, {1});
  EXPECT_EQ(si.dtype(), DType::i64);
  EXPECT_EQ(si.to_vector<int64_t>(), (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(sum(xi).item<int64_t>(), 5);
  const Tensor big = full({3}, int64_t{3000000000}, TensorOptions(DType::i64, device()));
  EXPECT_EQ(sum(big).item<int64_t>(), 9000000000);
  const Tensor xb = from_vector<bool>({true, false, true, true}, {4}).to(device());
  EXPECT_EQ(sum(xb).dtype(), DType::i64);
  EXPECT_EQ(sum(xb).item<int64_t>(), 3);
  const Tensor mx = amax(xi, {0});
  EXPECT_EQ(mx.dtype(), DType::i32);
  EXPECT_EQ(mx.to_vector<int64_t>(), (std::vector<int64_t>{4, 5, 3}));
  EXPECT_EQ(amin(xi).item<int32_t>(), -6);
  EXPECT_EQ(argmax(xi, 1).to_vector<int64_t>(), (std::vector<int64_t>{2, 1}));
  const Tensor xu = from_vector<uint8_t>({200, 100, 250}, {3}).to(device());
  EXPECT_EQ(sum(xu).item<int64_t>(), 550);  // no u8 wrap-around
}

TEST_P(ReduceTest, ArgReductionsMatchReference) {
  EMBER_REQUIRE_KERNEL(reduce_stub);
  for (Red op : {Red::ArgMax, Red::ArgMin}) {
    for (int64_t dim : {0, 1, 2, -1, -3}) {
      for (bool keepdim : {false, true}) {
        OpCase c{red_name(op), {rand_input({3, 4, 5})},
                 [=](const Inputs& in) { return run(op, in[0], {dim}, keepdim); }};
        c.reference = [=](const Inputs& in) { return ref_reduce(in[0], {dim}, keepdim, op); };
        c.tolerance = [](DType) { return Tolerance{0.0, 0.0}; };
        check_op(c, device());
      }
    }
    // dim nullopt: over the flattened tensor.
    OpCase f{red_name(op), {rand_input({3, 4, 5})}, [=](const Inputs& in) {
               return op == Red::ArgMax ? argmax(in[0]) : argmin(in[0]);
             }};
    f.reference = [=](const Inputs& in) { return ref_reduce(in[0].reshape({-1}), {0}, false, op); };
    f.tolerance = [](DType) { return Tolerance{0.0, 0.0}; };
    check_op(f, device());
  }
}

TEST_P(ReduceTest, ArgReductionTiesAndNaN) {
  EMBER_REQUIRE_KERNEL(reduce_stub);
  const double nan = std::numeric_limits<double>::quiet_NaN();
  for (DType dt : {DType::f32, DType::f64, DType::f16, DType::bf16}) {
    SCOPED_TRACE(dtype_name(dt));
    // Ties resolve to the first index.
    const Tensor t = from_vector<double>({1, 3, 3, 1, 0, 2, -1, -1, 3}, {3, 3}).to(device(), dt);
    EXPECT_EQ(argmax(t, 1).to_vector<int64_t>(), (std::vector<int64_t>{1, 2, 2}));
    EXPECT_EQ(argmin(t, 1).to_vector<int64_t>(), (std::vector<int64_t>{0, 1, 0}));
    EXPECT_EQ(argmax(t, 0).to_vector<int64_t>(), (std::vector<int64_t>{0, 0, 0}));
    EXPECT_EQ(argmin(t, 0).to_vector<int64_t>(), (std::vector<int64_t>{2, 2, 1}));
    EXPECT_EQ(argmax(t).item<int64_t>(), 1);
    EXPECT_EQ(argmin(t).item<int64_t>(), 6);
    // NaN counts as the maximum (and the minimum): the first NaN wins.
    const Tensor n = from_vector<double>({1, nan, 5, nan, 7, 2}, {2, 3}).to(device(), dt);
    EXPECT_EQ(argmax(n, 1).to_vector<int64_t>(), (std::vector<int64_t>{1, 0}));
    EXPECT_EQ(argmin(n, 1).to_vector<int64_t>(), (std::vector<int64_t>{1, 0}));
    EXPECT_EQ(argmax(n).item<int64_t>(), 1);
    EXPECT_TRUE(std::isnan(amax(n, {1}).to_vector<double>()[0]));
    EXPECT_TRUE(std::isnan(amin(n).item_double()));
    EXPECT_EQ(amax(n, {0}).to_vector<double>()[2], 5.0);
    // keepdim over the flattened tensor gives every dim size 1.
    EXPECT_EQ(argmax(t, std::nullopt, true).sizes(), Shape({1, 1}));
  }
}

EMBER_INSTANTIATE_DEVICE_TESTS(ReduceTest);

TEST(ReduceErrors, BadDims) {
  const Tensor x = zeros({2, 3, 4});
  EXPECT_THROW(sum(x, {3}), IndexError);
  EXPECT_THROW(sum(x, {-4}), IndexError);
  EXPECT_THROW(mean(x, {0, 0}), IndexError);
  EXPECT_THROW(amax(x, {1, -2}), IndexError);  // the same dim twice
  EXPECT_THROW(var(x, {2, -1}), IndexError);
  EXPECT_THROW(argmax(x, 3), IndexError);
  EXPECT_THROW(argmin(x, -4), IndexError);
  EXPECT_THROW(sum(zeros({}), {1}), IndexError);
}

TEST(ReduceErrors, MeanAndVarNeedFloating) {
  const Tensor xi = zeros({2, 3}, DType::i32);
  EXPECT_THROW(mean(xi), DTypeError);
  EXPECT_THROW(var(xi, {0}), DTypeError);
  EXPECT_THROW(mean(zeros({2}, DType::b8)), DTypeError);
  EXPECT_NO_THROW(sum(xi));
}

TEST(ReduceErrors, MessageNamesOpAndShape) {
  try {
    amax(zeros({0, 3}), {0});
    FAIL() << "expected ValueError";
  } catch (const ValueError& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("amax"), std::string::npos) << msg;
    EXPECT_NE(msg.find("[0, 3]"), std::string::npos) << msg;
  }
}

TEST(ReduceMeta, ShapesOnlyOnMeta) {
  const Tensor x = empty({4, 5, 6}, TensorOptions(DType::f16, Device::meta()));
  EXPECT_EQ(sum(x, {1}).sizes(), Shape({4, 6}));
  EXPECT_EQ(var(x, {0, 2}, 1, true).sizes(), Shape({1, 5, 1}));
  EXPECT_EQ(argmax(x, -1).dtype(), DType::i64);
}

}  // namespace
}  // namespace ember::testing

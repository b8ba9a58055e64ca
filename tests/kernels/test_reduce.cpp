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

const std::vector<Red> kAllReductions = {Red::Sum, Red::Mean, Red::Max, Red::Min, Red::Var, Red::ArgMax, Red::ArgMin};

bool is_arg(Red op) { return op == Red::ArgMax || op == Red::ArgMin; }

TEST_P(ReduceTest, EveryKernelShapeMatchesReference) {
  // The CUDA kernel takes a warp or a block per output, or lays consecutive outputs along a warp (columns, and tiny
  // reductions), and may split a reduction over several blocks: each case below takes a different path (Note
  // [Reduction shapes] in cuda/reduce.cu). In bf16 and f16 the rounded inputs tie often, so argmax/argmin also
  // check the first-index rule across lanes.
  EMBER_REQUIRE_KERNEL(reduce_stub);
  const std::vector<std::pair<Shape, std::vector<int64_t>>> cases = {
      {{64, 100}, {1}},    {{8, 5000}, {1}},      {{5000, 8}, {0}},      {{1000, 5}, {1}},
      {{300, 2, 50}, {0}}, {{40, 33, 7}, {0, 2}}, {{2, 3, 700}, {0, 2}}, {{3, 6, 2, 130}, {1, 3}}};
  for (const auto& shape_dims : cases) {
    const Shape shape = shape_dims.first;
    const std::vector<int64_t> dims = shape_dims.second;
    for (Red op : kAllReductions) {
      if (is_arg(op) && dims.size() != 1) continue;
      SCOPED_TRACE(::testing::Message() << red_name(op) << " x " << shape_str(shape) << " dims " << shape_str(dims));
      OpCase c{red_name(op), {rand_input(shape)}, [=](const Inputs& in) { return run(op, in[0], dims, false); }};
      c.reference = [=](const Inputs& in) { return ref_reduce(in[0], dims, false, op); };
      if (is_arg(op)) c.tolerance = [](DType) { return Tolerance{0.0, 0.0}; };
      check_op(c, device());
    }
  }
}

TEST_P(ReduceTest, BroadcastInputs) {
  // Expanded views (stride 0) along a kept or a reduced dim; argmax/argmin over a broadcast dim see only ties.
  EMBER_REQUIRE_KERNEL(reduce_stub);
  const Shape full_shape{300, 50};
  for (const Shape& base : std::vector<Shape>{{1, 50}, {300, 1}}) {
    for (const std::vector<int64_t>& dims : std::vector<std::vector<int64_t>>{{0}, {1}, {0, 1}}) {
      for (Red op : kAllReductions) {
        if (is_arg(op) && dims.size() != 1) continue;
        SCOPED_TRACE(::testing::Message()
                     << red_name(op) << " base " << shape_str(base) << " dims " << shape_str(dims));
        OpCase c{red_name(op), {rand_input(base)}, [=](const Inputs& in) {
                   return run(op, in[0].expand(full_shape), dims, false);
                 }};
        c.reference = [=](const Inputs& in) { return ref_reduce(in[0].expand(full_shape), dims, false, op); };
        if (is_arg(op)) c.tolerance = [](DType) { return Tolerance{0.0, 0.0}; };
        check_op(c, device());
      }
    }
  }
}

TEST_P(ReduceTest, LargeReductionsSplitOverBlocks) {
  // 3M elements to one output, and a bias-gradient-like [4096, 300] sum over dim 0: on CUDA both split the
  // reduction over blocks and merge the partial results in a second pass (except the whole-tensor sum and mean,
  // which take CUB: Note [Whole-tensor sums through CUB]). Values in [0.5, 1.5] keep sums far from
  // zero; bf16/f16 rounding makes many ties for argmax/argmin.
  EMBER_REQUIRE_KERNEL(reduce_stub);
  const Tensor big = rand_input({3000000}, 0.5, 1.5);
  for (Red op : {Red::Sum, Red::Mean, Red::Var, Red::Max, Red::ArgMax, Red::ArgMin}) {
    SCOPED_TRACE(::testing::Message() << red_name(op) << " over 3M elements");
    OpCase c{red_name(op), {big}, [=](const Inputs& in) { return run(op, in[0], {0}, false); }};
    c.reference = [=](const Inputs& in) { return ref_reduce(in[0], {0}, false, op); };
    if (op == Red::Sum) c.dtypes = {DType::f32};  // 3e6 overflows f16
    if (is_arg(op)) c.tolerance = [](DType) { return Tolerance{0.0, 0.0}; };
    check_op(c, device());
  }
  const Tensor cols = rand_input({4096, 300}, 0.5, 1.5);
  for (Red op : {Red::Sum, Red::Mean, Red::Var, Red::Min, Red::ArgMax}) {
    SCOPED_TRACE(::testing::Message() << red_name(op) << " over dim 0 of [4096, 300]");
    OpCase c{red_name(op), {cols}, [=](const Inputs& in) { return run(op, in[0], {0}, false); }};
    c.reference = [=](const Inputs& in) { return ref_reduce(in[0], {0}, false, op); };
    if (is_arg(op)) c.tolerance = [](DType) { return Tolerance{0.0, 0.0}; };
    check_op(c, device());
  }
}

TEST_P(ReduceTest, PackedSumsMatchReference) {
  // Sums and means over leading dims (a bias gradient) and trailing dims (row sums) of contiguous tensors large
  // enough that, on an H100, CUDA takes the 16-byte packed kernels (Note [Packed sums] in cuda/reduce.cu): column sums
  // over row groups added in a second pass, column sums stored directly (fewer than 128 rows), dims of size 1 between
  // the reduced ones, a warp per row; and a view one element off 16-byte alignment, which takes the generic kernel.
  EMBER_REQUIRE_KERNEL(reduce_stub);
  struct Case {
    Shape shape;
    std::vector<int64_t> dims;
    std::vector<DType> dtypes;
  };
  const std::vector<DType> all = {DType::f32, DType::f16, DType::bf16};
  // [8192, 768] bf16: 3 column blocks, so on 132 SMs 88 row groups, past kPackMaxGroups.
  for (const Case& k : std::vector<Case>{{{4096, 1536}, {0}, all},
                                         {{8192, 768}, {0}, {DType::bf16}},
                                         {{2, 2048, 1, 768}, {0, 1}, {DType::f32}},
                                         {{100, 33792}, {0}, {DType::f32}},
                                         {{4224, 256}, {1}, all},
                                         {{2112, 1, 2, 256}, {2, 3}, {DType::bf16}}}) {
    for (Red op : {Red::Sum, Red::Mean}) {
      const std::vector<int64_t> dims = k.dims;
      SCOPED_TRACE(::testing::Message() << red_name(op) << " x " << shape_str(k.shape) << " dims " << shape_str(dims));
      OpCase c{red_name(op), {rand_input(k.shape)}, [=](const Inputs& in) { return run(op, in[0], dims, false); }};
      c.reference = [=](const Inputs& in) { return ref_reduce(in[0], dims, false, op); };
      c.dtypes = k.dtypes;
      check_op(c, device());
    }
  }
  const int64_t rows = 4096, cols = 768;
  OpCase c{"sum", {rand_input({rows * cols + 1})}, [=](const Inputs& in) {
             return sum(in[0].narrow(0, 1, rows * cols).reshape({rows, cols}), {0});
           }};
  c.reference = [=](const Inputs& in) {
    return ref_reduce(in[0].narrow(0, 1, rows * cols).reshape({rows, cols}), {0}, false, Red::Sum);
  };
  c.dtypes = {DType::f32};
  check_op(c, device());
}

TEST_P(ReduceTest, WholeTensorSumsOfLargeViews) {
  // Sums and means of every element of 200000-element views (Note [Whole-tensor sums through CUB] in
  // ember/kernels/cuda/reduce.cu): a contiguous view at a storage offset (CUDA: the CUB path) and a transposed one
  // (the split kernels), over all dims and over an explicit list of them.
  EMBER_REQUIRE_KERNEL(reduce_stub);
  const Tensor big = rand_input({3, 100000}, 0.5, 1.5);
  for (Red op : {Red::Sum, Red::Mean}) {
    SCOPED_TRACE(red_name(op));
    OpCase tail{red_name(op), {big}, [=](const Inputs& in) { return run(op, in[0].narrow(0, 1, 2), {}, false); }};
    tail.reference = [=](const Inputs& in) { return ref_reduce(in[0].narrow(0, 1, 2), {}, false, op); };
    OpCase both{red_name(op), {big}, [=](const Inputs& in) { return run(op, in[0].narrow(0, 1, 2), {0, 1}, true); }};
    both.reference = [=](const Inputs& in) { return ref_reduce(in[0].narrow(0, 1, 2), {0, 1}, true, op); };
    OpCase t{red_name(op), {big}, [=](const Inputs& in) { return run(op, in[0].t(), {}, false); }};
    t.reference = [=](const Inputs& in) { return ref_reduce(in[0].t(), {}, false, op); };
    // One element in: a base address no vector load is aligned to.
    auto shifted = [](const Tensor& x) { return x.view({-1}).narrow(0, 1, 200000); };
    OpCase odd{red_name(op), {big}, [=](const Inputs& in) { return run(op, shifted(in[0]), {}, false); }};
    odd.reference = [=](const Inputs& in) { return ref_reduce(shifted(in[0]), {}, false, op); };
    for (OpCase* c : {&tail, &both, &t, &odd}) {
      if (op == Red::Sum) c->dtypes = {DType::f32, DType::f64};  // 3e5 overflows f16
      check_op(*c, device());
    }
  }
}

TEST_P(ReduceTest, LargeIntegerSumsAreExact) {
  EMBER_REQUIRE_KERNEL(reduce_stub);
  const int64_t rows = 3000, cols = 1000;
  std::vector<int32_t> v(static_cast<size_t>(rows * cols));
  std::vector<bool> b(v.size());
  int64_t total = 0, count = 0;
  std::vector<int64_t> col_sums(static_cast<size_t>(cols), 0);
  for (int64_t i = 0; i < rows * cols; ++i) {
    const int32_t x = static_cast<int32_t>(i % 201) - 100 + (i % 7 == 0 ? 100000 : 0);
    v[static_cast<size_t>(i)] = x;
    total += x;
    col_sums[static_cast<size_t>(i % cols)] += x;
    b[static_cast<size_t>(i)] = i % 3 == 0;
    count += i % 3 == 0 ? 1 : 0;
  }
  const Tensor xi = from_vector<int32_t>(v, {rows * cols}).to(device());
  EXPECT_EQ(sum(xi).item<int64_t>(), total);
  EXPECT_EQ(sum(xi.view({rows, cols}), {0}).to_vector<int64_t>(), col_sums);
  EXPECT_EQ(amax(xi).item<int32_t>(), 100100);
  EXPECT_EQ(amin(xi).item<int32_t>(), -100);
  const Tensor xb = from_vector<bool>(b, {rows * cols}).to(device());
  EXPECT_EQ(sum(xb).item<int64_t>(), count);
}

TEST_P(ReduceTest, LargeArgReductionTiesAndNaN) {
  // Ties and NaNs far apart in a long reduction (different blocks and splits on CUDA): the first index still wins.
  EMBER_REQUIRE_KERNEL(reduce_stub);
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const int64_t n = 3000000;
  for (DType dt : {DType::f32, DType::f64, DType::f16, DType::bf16}) {
    SCOPED_TRACE(dtype_name(dt));
    std::vector<double> v(static_cast<size_t>(n), 0.0);
    const Tensor zeros_t = from_vector<double>(v, {n}).to(device(), dt);
    EXPECT_EQ(argmax(zeros_t).item<int64_t>(), 0);
    EXPECT_EQ(argmin(zeros_t).item<int64_t>(), 0);
    v[1234567] = 2.0;
    v[2345678] = 2.0;
    v[17] = -3.0;
    v[2900001] = -3.0;
    const Tensor ties = from_vector<double>(v, {n}).to(device(), dt);
    EXPECT_EQ(argmax(ties).item<int64_t>(), 1234567);
    EXPECT_EQ(argmin(ties).item<int64_t>(), 17);
    EXPECT_EQ(amax(ties).item_double(), 2.0);
    EXPECT_EQ(amin(ties).item_double(), -3.0);
    v[2000001] = nan;
    v[2500000] = nan;
    const Tensor nans = from_vector<double>(v, {n}).to(device(), dt);
    EXPECT_EQ(argmax(nans).item<int64_t>(), 2000001);
    EXPECT_EQ(argmin(nans).item<int64_t>(), 2000001);
    EXPECT_TRUE(std::isnan(amax(nans).item_double()));
    EXPECT_TRUE(std::isnan(amin(nans).item_double()));
    // Down the columns of [3000, 40]: rows 2000 and 2500 hold the maximum 1; column 5 has NaNs at rows 2100, 2200.
    const int64_t rows = 3000, cols = 40;
    std::vector<double> w(static_cast<size_t>(rows * cols), 0.0);
    for (int64_t j = 0; j < cols; ++j) {
      w[static_cast<size_t>(2000 * cols + j)] = 1.0;
      w[static_cast<size_t>(2500 * cols + j)] = 1.0;
    }
    w[static_cast<size_t>(2100 * cols + 5)] = nan;
    w[static_cast<size_t>(2200 * cols + 5)] = nan;
    const Tensor y = from_vector<double>(w, {rows, cols}).to(device(), dt);
    const std::vector<int64_t> am = argmax(y, 0).to_vector<int64_t>();
    const std::vector<int64_t> ai = argmin(y, 0).to_vector<int64_t>();
    const std::vector<double> mx = amax(y, {0}).to_vector<double>();
    for (int64_t j = 0; j < cols; ++j) {
      EXPECT_EQ(am[static_cast<size_t>(j)], j == 5 ? 2100 : 2000) << j;
      EXPECT_EQ(ai[static_cast<size_t>(j)], j == 5 ? 2100 : 0) << j;
      if (j == 5)
        EXPECT_TRUE(std::isnan(mx[static_cast<size_t>(j)]));
      else
        EXPECT_EQ(mx[static_cast<size_t>(j)], 1.0) << j;
    }
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

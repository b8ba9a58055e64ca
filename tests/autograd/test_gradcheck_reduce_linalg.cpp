// Gradient checks of the reductions (sum, mean, amax, amin, var) and linear algebra (matmul, bmm, linear) against
// float64 finite differences, over dims/keepdim combinations, non-contiguous and broadcast inputs, every matmul
// shape case, and hand-computed gradients where finite differences are invalid (amax/amin ties).
#include <string>
#include <vector>

#include "tests/harness/grad_check.h"

namespace ember::testing {
namespace {

using Dims = std::vector<int64_t>;

std::string dims_name(const Dims& dims, bool keepdim) {
  std::string s = "dims [";
  for (size_t i = 0; i < dims.size(); ++i) s += (i ? "," : "") + std::to_string(dims[i]);
  return s + "]" + (keepdim ? " keepdim" : "");
}

// Dims combinations for a 3-d input: all, single, negative, several, several with negatives.
const std::vector<Dims> kDims3 = {{}, {0}, {1}, {-1}, {0, 2}, {-3, -1}, {2, 0, 1}};

class ReduceGrad : public DeviceTest {};

TEST_P(ReduceGrad, SumAndMean) {
  EMBER_REQUIRE_KERNEL(reduce_stub);
  EMBER_REQUIRE_KERNEL(binary_stub);
  using F = Tensor (*)(const Tensor&, const Dims&, bool);
  const std::pair<const char*, F> ops_list[] = {
      {"sum", [](const Tensor& x, const Dims& d, bool k) { return sum(x, d, k); }},
      {"mean", [](const Tensor& x, const Dims& d, bool k) { return mean(x, d, k); }},
  };
  for (const auto& [name, f] : ops_list) {
    for (const Dims& dims : kDims3) {
      for (bool keepdim : {false, true}) {
        const std::string label = std::string(name) + " " + dims_name(dims, keepdim);
        GradCase c{label, {noncontiguous_input({3, 4, 5})},
                   [f = f, dims, keepdim](const Inputs& in) { return f(in[0], dims, keepdim); }};
        c.dtypes = {DType::f32, DType::bf16};
        check_grad(c, device());
      }
    }
    // A square input: a gradient broadcast along the wrong dim (not re-inserted at the reduced one) would pass a
    // shape check here but put row sums in columns.
    for (const Dims& dims : {Dims{1}, Dims{-1}, Dims{0}}) {
      GradCase c{std::string(name) + " square " + dims_name(dims, false), {rand_input({4, 4})},
                 [f = f, dims](const Inputs& in) { return f(in[0], dims, false); }};
      check_grad(c, device());
    }
    GradCase s{std::string(name) + " 0-d", {rand_input({})}, [f = f](const Inputs& in) { return f(in[0], {}, false); }};
    check_grad(s, device());
    GradCase s0{std::string(name) + " 0-d dim 0", {rand_input({})},
                [f = f](const Inputs& in) { return f(in[0], {0}, true); }};
    check_grad(s0, device());
    GradCase b{std::string(name) + " broadcast input", {rand_input({3, 1}).expand({3, 4})},
               [f = f](const Inputs& in) { return f(in[0], {0}, false); }};
      check_grad(b, device());
  }
}

TEST_P(ReduceGrad, Var) {
  EMBER_REQUIRE_KERNEL(reduce_stub);
  EMBER_REQUIRE_KERNEL(binary_stub);
  for (const Dims& dims : kDims3) {
    for (bool keepdim : {false, true}) {
      for (int64_t correction : {0, 1, 2}) {
        const std::string label = "var " + dims_name(dims, keepdim) + " correction " + std::to_string(correction);
        GradCase c{label, {noncontiguous_input({3, 4, 5})},
                   [dims, keepdim, correction](const Inputs& in) { return var(in[0], dims, correction, keepdim); }};
        c.dtypes = {DType::f32, DType::bf16};
        check_grad(c, device());
      }
    }
  }
  GradCase sq{"var square dim 1", {rand_input({4, 4})}, [](const Inputs& in) { return var(in[0], {1}); }};
  check_grad(sq, device());
}

// Random values have no ties (almost surely), so finite differences are valid there.
TEST_P(ReduceGrad, AmaxAminRandom) {
  EMBER_REQUIRE_KERNEL(reduce_stub);
  EMBER_REQUIRE_KERNEL(binary_stub);
  EMBER_REQUIRE_KERNEL(where_stub);
  using F = Tensor (*)(const Tensor&, const Dims&, bool);
  const std::pair<const char*, F> ops_list[] = {
      {"amax", [](const Tensor& x, const Dims& d, bool k) { return amax(x, d, k); }},
      {"amin", [](const Tensor& x, const Dims& d, bool k) { return amin(x, d, k); }},
  };
  for (const auto& [name, f] : ops_list) {
    for (const Dims& dims : kDims3) {
      for (bool keepdim : {false, true}) {
        GradCase c{std::string(name) + " " + dims_name(dims, keepdim), {noncontiguous_input({3, 4, 5})},
                   [f = f, dims, keepdim](const Inputs& in) { return f(in[0], dims, keepdim); }};
        check_grad(c, device());
      }
    }
    GradCase sq{std::string(name) + " square dim 1", {rand_input({4, 4})},
                [f = f](const Inputs& in) { return f(in[0], {1}, false); }};
    check_grad(sq, device());
    GradCase s{std::string(name) + " 0-d", {rand_input({})}, [f = f](const Inputs& in) { return f(in[0], {}, false); }};
    check_grad(s, device());
  }
}

// d<g, amax(x)>/dx at planted ties, against gradients worked out by hand: each group's gradient is split evenly
// among the elements equal to its extremum.
void expect_tie_gradient(Device device, DType dt, const Tensor& x64, const std::function<Tensor(const Tensor&)>& f,
                         const Tensor& g64, const Tensor& expected, const std::string& label) {
  SCOPED_TRACE(label + " in " + dtype_name(dt));
  Tensor x = convert_keep_strides(x64, dt, device).detach();
  x.requires_grad_();
  Tensor out = f(x);
  ASSERT_EQ(out.sizes(), g64.sizes());
  out.backward(g64.to(device, dt));
  ASSERT_TRUE(x.grad().defined());
  EXPECT_EQ(x.grad().dtype(), dt);
  EXPECT_TRUE(allclose(x.grad(), expected, default_tolerance(dt)));
}

TEST_P(ReduceGrad, AmaxAminTies) {
  EMBER_REQUIRE_KERNEL(reduce_stub);
  EMBER_REQUIRE_KERNEL(binary_stub);
  EMBER_REQUIRE_KERNEL(where_stub);
  // x [3, 4]:
  //   1 3 3 0
  //   2 2 2 2
  //  -1 5 0 0
  const Tensor x = from_vector<double>({1, 3, 3, 0, 2, 2, 2, 2, -1, 5, 0, 0}, {3, 4});
  for (DType dt : {DType::f64, DType::f32, DType::bf16}) {
    // amax over dim 1: row maxima 3 (x2), 2 (x4), 5 (x1).
    expect_tie_gradient(device(), dt, x, [](const Tensor& t) { return amax(t, {1}); },
                        from_vector<double>({2, 8, 6}, {3}),
                        from_vector<double>({0, 1, 1, 0, 2, 2, 2, 2, 0, 6, 0, 0}, {3, 4}), "amax dim 1");
    // amin over dim -1, keepdim: row minima 0 (x1), 2 (x4), -1 (x1).
    expect_tie_gradient(device(), dt, x, [](const Tensor& t) { return amin(t, {-1}, true); },
                        from_vector<double>({3, 4, 7}, {3, 1}),
                        from_vector<double>({0, 0, 0, 3, 1, 1, 1, 1, 7, 0, 0, 0}, {3, 4}), "amin dim -1 keepdim");
    // amin over dim 0: column minima -1 (x1), 2 (x1), 0 (x1), 0 (x2).
    expect_tie_gradient(device(), dt, x, [](const Tensor& t) { return amin(t, {0}); },
                        from_vector<double>({1, 2, 3, 4}, {4}),
                        from_vector<double>({0, 0, 0, 2, 0, 2, 0, 0, 1, 0, 3, 2}, {3, 4}), "amin dim 0");
    // amin over all dims: -1 once; amax over all dims: 5 once.
    expect_tie_gradient(device(), dt, x, [](const Tensor& t) { return amin(t); }, from_vector<double>({4}, {}),
                        from_vector<double>({0, 0, 0, 0, 0, 0, 0, 0, 4, 0, 0, 0}, {3, 4}), "amin all");
  }
  // Every element tied; several dims; a non-contiguous (transposed) input.
  const Tensor flat = full({2, 3, 2}, 1.5, DType::f64);
  expect_tie_gradient(device(), DType::f32, flat, [](const Tensor& t) { return amax(t, {0, -1}); },
                      from_vector<double>({4, 8, 12}, {3}),
                      from_vector<double>({1, 1, 2, 2, 3, 3, 1, 1, 2, 2, 3, 3}, {2, 3, 2}), "amax all tied");
  expect_tie_gradient(device(), DType::f32, flat, [](const Tensor& t) { return amax(t); },
                      from_vector<double>({6}, {}), full({2, 3, 2}, 0.5, DType::f64), "amax all dims all tied");
  // x^T [4, 3]: columns of x become rows; amax over dim 0 of x^T = row maxima of x.
  expect_tie_gradient(device(), DType::f32, x.t(), [](const Tensor& t) { return amax(t, {0}); },
                      from_vector<double>({2, 8, 6}, {3}),
                      from_vector<double>({0, 2, 0, 1, 2, 6, 1, 2, 0, 0, 2, 0}, {4, 3}), "amax transposed");
}

class LinalgGrad : public DeviceTest {};

TEST_P(LinalgGrad, MatmulShapes) {
  EMBER_REQUIRE_KERNEL(bmm_stub);
  EMBER_REQUIRE_KERNEL(reduce_stub);
  const std::vector<std::pair<Shape, Shape>> shapes = {
      {{4}, {4}},                   // dot
      {{4}, {4, 3}},                // vector @ matrix
      {{3, 4}, {4}},                // matrix @ vector
      {{3, 4}, {4, 5}},             // matrix @ matrix
      {{2, 3, 4}, {4}},             // batched @ vector
      {{4}, {2, 4, 3}},             // vector @ batched
      {{2, 3, 4}, {4, 5}},          // batched @ matrix
      {{3, 4}, {2, 4, 5}},          // matrix @ batched
      {{2, 3, 4}, {2, 4, 5}},       // batched @ batched
      {{2, 1, 3, 4}, {5, 4, 2}},    // broadcast batch dims
      {{5, 3, 4}, {2, 1, 4, 2}},    // broadcast batch dims, the other way round
      {{2, 2, 3, 4}, {4}},          // 4-d @ vector
  };
  for (const auto& [sa, sb] : shapes) {
    const std::string label = "matmul " + shape_str(sa) + " @ " + shape_str(sb);
    GradCase c{label, {rand_input(sa), rand_input(sb)}, [](const Inputs& in) { return matmul(in[0], in[1]); }};
    c.dtypes = {DType::f32, DType::bf16};
    check_grad(c, device());
    GradCase nc{label + " noncontiguous", {noncontiguous_input(sa), noncontiguous_input(sb)},
                [](const Inputs& in) { return matmul(in[0], in[1]); }};
    check_grad(nc, device());
    // One operand at a time (the other is saved only when needed).
    for (size_t w : {0, 1}) {
      GradCase one{label + " wrt " + std::to_string(w), {rand_input(sa), rand_input(sb)},
                   [](const Inputs& in) { return matmul(in[0], in[1]); }};
      one.wrt = {w};
      check_grad(one, device());
    }
  }
  // Stride-0 (expanded) operands.
  GradCase e{"matmul expanded operands", {rand_input({1, 3, 4}).expand({2, 3, 4}), rand_input({4, 1}).expand({4, 5})},
             [](const Inputs& in) { return matmul(in[0], in[1]); }};
  check_grad(e, device());
}

TEST_P(LinalgGrad, Bmm) {
  EMBER_REQUIRE_KERNEL(bmm_stub);
  GradCase c{"bmm", {rand_input({2, 3, 4}), rand_input({2, 4, 5})}, [](const Inputs& in) { return bmm(in[0], in[1]); }};
  c.dtypes = {DType::f32, DType::bf16};
  check_grad(c, device());
  GradCase nc{"bmm noncontiguous", {noncontiguous_input({3, 2, 4}), noncontiguous_input({3, 4, 1})},
              [](const Inputs& in) { return bmm(in[0], in[1]); }};
  check_grad(nc, device());
  GradCase b{"bmm broadcast batch operand", {rand_input({1, 3, 4}).expand({2, 3, 4}), rand_input({2, 4, 5})},
             [](const Inputs& in) { return bmm(in[0], in[1]); }};
  check_grad(b, device());
}

TEST_P(LinalgGrad, Linear) {
  EMBER_REQUIRE_KERNEL(bmm_stub);
  EMBER_REQUIRE_KERNEL(reduce_stub);
  EMBER_REQUIRE_KERNEL(binary_stub);
  const std::vector<Shape> x_shapes = {{3, 4}, {2, 3, 4}, {4}, {2, 2, 1, 4}};
  for (const Shape& xs : x_shapes) {
    const std::string label = "linear x " + shape_str(xs);
    GradCase c{label, {rand_input(xs), rand_input({5, 4}), rand_input({5})},
               [](const Inputs& in) { return linear(in[0], in[1], in[2]); }};
    c.dtypes = {DType::f32, DType::bf16};
    check_grad(c, device());
    GradCase nb{label + " no bias", {noncontiguous_input(xs), noncontiguous_input({5, 4})},
                [](const Inputs& in) { return linear(in[0], in[1]); }};
    check_grad(nb, device());
    for (size_t w : {0, 1, 2}) {
      GradCase one{label + " wrt " + std::to_string(w), {noncontiguous_input(xs), rand_input({5, 4}), rand_input({5})},
                   [](const Inputs& in) { return linear(in[0], in[1], in[2]); }};
      one.wrt = {w};
      check_grad(one, device());
    }
  }
}

// A chain through several of these ops: gradients flow through reduction -> matmul -> linear.
TEST_P(LinalgGrad, Composite) {
  EMBER_REQUIRE_KERNEL(bmm_stub);
  EMBER_REQUIRE_KERNEL(reduce_stub);
  EMBER_REQUIRE_KERNEL(binary_stub);
  EMBER_REQUIRE_KERNEL(where_stub);
  GradCase c{"var(linear(x) @ m) + amax",
             {noncontiguous_input({2, 3, 4}), rand_input({5, 4}), rand_input({5}), rand_input({5, 2})},
             [](const Inputs& in) {
               const Tensor h = matmul(linear(in[0], in[1], in[2]), in[3]);  // [2, 3, 2]
               return var(h, {1}) + amax(h, {1}) * mean(h, {0, 1, 2});  // [2, 2]
             }};
  c.dtypes = {DType::f32, DType::bf16};
  check_grad(c, device());
}

// .grad of an f32 leaf stays f32 and adds up across backward() calls; each pass's gradient is worked out by hand.
TEST_P(LinalgGrad, GradientsAccumulateInLeafDtype) {
  EMBER_REQUIRE_KERNEL(bmm_stub);
  EMBER_REQUIRE_KERNEL(reduce_stub);
  EMBER_REQUIRE_KERNEL(binary_stub);
  for (DType dt : {DType::f32, DType::bf16}) {
    SCOPED_TRACE(dtype_name(dt));
    // x [2, 3], w [4, 3], b [4]; loss = sum(linear(x, w, b)) + mean(x) * 6.
    // d/dx = column sums of w (each row of x) + 1; d/dw = column sums of x (each row of w); d/db = 2 rows -> 2.
    Tensor x = from_vector<double>({1, 2, 3, 4, 5, 6}, {2, 3}).to(device(), dt);
    Tensor w = from_vector<double>({1, 0, -1, 2, 1, 0, 0, 0, 1, -1, 2, 1}, {4, 3}).to(device(), dt);
    Tensor b = zeros({4}, {dt, device()});
    x.requires_grad_();
    w.requires_grad_();
    b.requires_grad_();
    const Tolerance tol = dt == DType::f32 ? Tolerance{1e-6, 1e-6} : default_tolerance(dt);  // bf16: 1/6 rounds
    for (int pass = 1; pass <= 2; ++pass) {
      Tensor loss = sum(linear(x, w, b)) + mean(x) * 6.0;
      loss.backward();
      ASSERT_EQ(x.grad().dtype(), dt);
      ASSERT_EQ(w.grad().dtype(), dt);
      ASSERT_EQ(b.grad().dtype(), dt);
      const double p = pass;
      // column sums of w: 1+2+0-1 = 2, 0+1+0+2 = 3, -1+0+1+1 = 1
      EXPECT_TRUE(allclose(x.grad(), from_vector<double>({3 * p, 4 * p, 2 * p, 3 * p, 4 * p, 2 * p}, {2, 3}), tol));
      // column sums of x: 5, 7, 9
      std::vector<double> gw;
      for (int r = 0; r < 4; ++r)
        for (double v : {5.0, 7.0, 9.0}) gw.push_back(v * p);
      EXPECT_TRUE(allclose(w.grad(), from_vector<double>(gw, {4, 3}), tol));
      EXPECT_TRUE(allclose(b.grad(), full({4}, 2 * p, DType::f64), tol));
    }
  }
}

EMBER_INSTANTIATE_DEVICE_TESTS(ReduceGrad);
EMBER_INSTANTIATE_DEVICE_TESTS(LinalgGrad);

}  // namespace
}  // namespace ember::testing

// Tests of the elementwise ops: every unary, binary, comparison and where op against naive float64 references on
// random, broadcast, non-contiguous, 0-d and empty shapes; integer (exact pow, wrapping overflow), float-in-float and
// promotion (0-d tensors by category, scalars in the compute type) cases against hand-computed values; NaN
// propagation; every error path (shape, dtype, device, missing clamp bounds, the binary kernel's operand contract).
#include <cmath>
#include <functional>
#include <limits>
#include <random>
#include <string>

#include "tests/harness/op_harness.h"

namespace ember::testing {
namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr double kInf = std::numeric_limits<double>::infinity();

// ---- independent float64 reference ----------------------------------------------------------------------------

// Right-aligned broadcasting of two shapes, written out independently of the library.
Shape ref_broadcast(const Shape& a, const Shape& b) {
  const size_t n = std::max(a.size(), b.size());
  Shape out(n, 1);
  for (size_t i = 0; i < n; ++i) {
    const int64_t da = i < n - a.size() ? 1 : a[i - (n - a.size())];
    const int64_t db = i < n - b.size() ? 1 : b[i - (n - b.size())];
    EXPECT_TRUE(da == db || da == 1 || db == 1) << "test bug: shapes do not broadcast";
    out[i] = da == 1 ? db : da;
  }
  return out;
}

// Row-major flat index into an input of shape `in` for flat element `flat` of the broadcast shape `out`.
int64_t ref_source_index(const Shape& in, const Shape& out, int64_t flat) {
  int64_t src = 0, stride = 1, rem = flat;
  const int64_t lead = static_cast<int64_t>(out.size() - in.size());
  for (int64_t d = static_cast<int64_t>(out.size()) - 1; d >= 0; --d) {
    const int64_t i = rem % out[d];
    rem /= out[d];
    const int64_t k = d - lead;
    if (k < 0) continue;
    if (in[k] != 1) src += i * stride;
    stride *= in[k];
  }
  return src;
}

// out[i] = f(args of every input at i), all inputs broadcast together; values read as f64 in row-major order.
Tensor ref_map(const Inputs& in, const std::function<double(const double*)>& f) {
  Shape out;
  std::vector<std::vector<double>> vals;
  for (const Tensor& t : in) {
    out = ref_broadcast(out, t.sizes());
    vals.push_back(t.to_vector<double>());
  }
  std::vector<double> r(static_cast<size_t>(numel_of(out)));
  std::vector<double> args(in.size());
  for (int64_t i = 0; i < static_cast<int64_t>(r.size()); ++i) {
    for (size_t k = 0; k < in.size(); ++k) args[k] = vals[k][ref_source_index(in[k].sizes(), out, i)];
    r[i] = f(args.data());
  }
  return from_vector(r, out);
}

using Fn1 = std::function<double(double)>;
using Fn2 = std::function<double(double, double)>;
OpFn ref_unary(Fn1 f) {
  return [f](const Inputs& in) { return ref_map(in, [&](const double* x) { return f(x[0]); }); };
}
OpFn ref_binary(Fn2 f) {
  return [f](const Inputs& in) { return ref_map(in, [&](const double* x) { return f(x[0], x[1]); }); };
}

double ref_gelu_erf(double x) { return 0.5 * x * (1.0 + std::erf(x / std::sqrt(2.0))); }
double ref_gelu_tanh(double x) {
  const double k = std::sqrt(2.0 / 3.14159265358979323846);
  return 0.5 * x * (1.0 + std::tanh(k * (x + 0.044715 * x * x * x)));
}
double ref_sigmoid(double x) { return 1.0 / (1.0 + std::exp(-x)); }

// ---- inputs ------------------------------------------------------------------------------------------------------

// Two shapes that broadcast: a random full shape (rank 0..4, dims 1..5), size-1 dims on either side, leading dims
// dropped from one of them.
std::pair<Shape, Shape> random_broadcast_pair(std::mt19937_64& rng) {
  std::uniform_int_distribution<int> rank(0, 4), dim(1, 5), coin(0, 2);
  Shape full(static_cast<size_t>(rank(rng)));
  for (int64_t& d : full) d = dim(rng);
  Shape a = full, b = full;
  for (size_t i = 0; i < full.size(); ++i) {
    const int c = coin(rng);
    if (c == 0) a[i] = 1;
    if (c == 1) b[i] = 1;
  }
  std::uniform_int_distribution<size_t> drop(0, b.size());
  b.erase(b.begin(), b.begin() + static_cast<std::ptrdiff_t>(drop(rng)));
  if (coin(rng) == 0) std::swap(a, b);
  return {a, b};
}

Shape random_shape(std::mt19937_64& rng) { return random_broadcast_pair(rng).first; }

// f64 values in {-2, -1, 0, 1}: exact in every float dtype, with many ties for the comparisons.
Tensor discrete_input(const Shape& shape) {
  std::vector<double> v = rand_input(shape, 0.0, 4.0).to_vector<double>();
  for (double& x : v) x = std::floor(x) - 2.0;
  return from_vector(v, shape);
}

// Hand-value tensor on a device.
Tensor hand(const std::vector<double>& v, DType dt, Device dev, Shape shape = {}) {
  if (shape.empty() && v.size() != 1) shape = {static_cast<int64_t>(v.size())};
  return from_vector(v, shape).to(dt).to(dev);
}

// ---- fixture -----------------------------------------------------------------------------------------------------

class ElementwiseTest : public DeviceTest {};

struct BinarySpec {
  const char* name;
  std::function<Tensor(const Tensor&, const Tensor&)> fn;
  Fn2 ref;
  double lo_a, hi_a, lo_b, hi_b;  // input ranges (positive bases for pow, divisors away from 0)
};

std::vector<BinarySpec> binary_specs() {
  return {
      {"add", [](const Tensor& a, const Tensor& b) { return add(a, b); }, [](double x, double y) { return x + y; },
       -1, 1, -1, 1},
      {"sub", [](const Tensor& a, const Tensor& b) { return sub(a, b); }, [](double x, double y) { return x - y; },
       -1, 1, -1, 1},
      {"mul", [](const Tensor& a, const Tensor& b) { return mul(a, b); }, [](double x, double y) { return x * y; },
       -1, 1, -1, 1},
      {"div", [](const Tensor& a, const Tensor& b) { return div(a, b); }, [](double x, double y) { return x / y; },
       -1, 1, 0.5, 2},
      {"pow", [](const Tensor& a, const Tensor& b) { return pow(a, b); },
       [](double x, double y) { return std::pow(x, y); }, 0.1, 2, -1.5, 1.5},
      {"maximum", [](const Tensor& a, const Tensor& b) { return maximum(a, b); },
       [](double x, double y) { return x > y ? x : y; }, -1, 1, -1, 1},
      {"minimum", [](const Tensor& a, const Tensor& b) { return minimum(a, b); },
       [](double x, double y) { return x < y ? x : y; }, -1, 1, -1, 1},
      {"operator+", [](const Tensor& a, const Tensor& b) { return a + b; }, [](double x, double y) { return x + y; },
       -1, 1, -1, 1},
      {"operator-", [](const Tensor& a, const Tensor& b) { return a - b; }, [](double x, double y) { return x - y; },
       -1, 1, -1, 1},
      {"operator*", [](const Tensor& a, const Tensor& b) { return a * b; }, [](double x, double y) { return x * y; },
       -1, 1, -1, 1},
      {"operator/", [](const Tensor& a, const Tensor& b) { return a / b; }, [](double x, double y) { return x / y; },
       -1, 1, 0.5, 2},
  };
}

using View = std::function<Tensor(const Tensor&)>;
Tensor same(const Tensor& t) { return t; }

// The views are applied inside the op (and the reference), so every dtype run sees non-contiguous operands; the
// harness itself hands non-f64 runs contiguous copies.
void check_binary(const BinarySpec& s, Tensor a, Tensor b, Device dev, View va = same, View vb = same) {
  SCOPED_TRACE(std::string(s.name) + " " + shape_str(va(a).sizes()) + " with " + shape_str(vb(b).sizes()));
  OpCase c{s.name, {a, b}, [f = s.fn, va, vb](const Inputs& in) { return f(va(in[0]), vb(in[1])); }};
  c.reference = [r = ref_binary(s.ref), va, vb](const Inputs& in) { return r({va(in[0]), vb(in[1])}); };
  check_op(c, dev);
}

TEST_P(ElementwiseTest, BinaryMatchesReferenceOnRandomAndSpecialShapes) {
  EMBER_REQUIRE_KERNEL(binary_stub);
  std::mt19937_64 rng(next_seed());
  const std::vector<std::pair<Shape, Shape>> fixed = {
      {{4, 1, 5}, {3, 1}}, {{2, 3}, {}}, {{}, {}}, {{0, 3}, {1, 3}}, {{3, 0}, {}}, {{2, 1}, {1, 0}}, {{7}, {7}}};
  for (const BinarySpec& s : binary_specs()) {
    std::vector<std::pair<Shape, Shape>> shapes = fixed;
    for (int k = 0; k < 4; ++k) shapes.push_back(random_broadcast_pair(rng));
    for (const auto& [sa, sb] : shapes)
      check_binary(s, rand_input(sa, s.lo_a, s.hi_a), rand_input(sb, s.lo_b, s.hi_b), device());
  }
}

TEST_P(ElementwiseTest, BinaryMatchesReferenceOnNonContiguousInputs) {
  EMBER_REQUIRE_KERNEL(binary_stub);
  for (const BinarySpec& s : binary_specs()) {
    // permuted strided view with a transposed one broadcast against it
    check_binary(s, noncontiguous_input({3, 4, 5}, s.lo_a, s.hi_a), rand_input({5, 4}, s.lo_b, s.hi_b).t(), device());
    // step slice with a non-contiguous column
    check_binary(s, rand_input({6, 8}, s.lo_a, s.hi_a).slice(1, 1, 8, 3), noncontiguous_input({6, 1}, s.lo_b, s.hi_b),
                 device());
    // explicitly expanded (stride 0) operand and a transposed one of the same shape
    check_binary(s, rand_input({4, 1}, s.lo_a, s.hi_a).expand({4, 6}), rand_input({6, 4}, s.lo_b, s.hi_b).t(),
                 device());
    // the same geometry made inside the op, so the f32/f16/bf16 runs see the strides too
    check_binary(
        s, rand_input({4, 1}, s.lo_a, s.hi_a), rand_input({6, 4}, s.lo_b, s.hi_b), device(),
        [](const Tensor& t) { return t.expand({4, 6}); }, [](const Tensor& t) { return t.t(); });
    check_binary(
        s, rand_input({2, 5, 6}, s.lo_a, s.hi_a), rand_input({6, 10}, s.lo_b, s.hi_b), device(),
        [](const Tensor& t) { return t.permute({2, 0, 1}); },
        [](const Tensor& t) { return t.slice(1, 1, 10, 2).unsqueeze(1); });
  }
}

TEST_P(ElementwiseTest, ComparisonsMatchReferenceAndReturnBool) {
  EMBER_REQUIRE_KERNEL(binary_stub);
  struct Cmp {
    const char* name;
    std::function<Tensor(const Tensor&, const Tensor&)> fn;
    std::function<bool(double, double)> ref;
  };
  const std::vector<Cmp> cmps = {
      {"eq", [](const Tensor& a, const Tensor& b) { return eq(a, b); }, [](double x, double y) { return x == y; }},
      {"ne", [](const Tensor& a, const Tensor& b) { return ne(a, b); }, [](double x, double y) { return x != y; }},
      {"lt", [](const Tensor& a, const Tensor& b) { return lt(a, b); }, [](double x, double y) { return x < y; }},
      {"le", [](const Tensor& a, const Tensor& b) { return le(a, b); }, [](double x, double y) { return x <= y; }},
      {"gt", [](const Tensor& a, const Tensor& b) { return gt(a, b); }, [](double x, double y) { return x > y; }},
      {"ge", [](const Tensor& a, const Tensor& b) { return ge(a, b); }, [](double x, double y) { return x >= y; }},
  };
  std::mt19937_64 rng(next_seed());
  for (const Cmp& cmp : cmps) {
    std::vector<std::pair<Tensor, Tensor>> cases = {
        {discrete_input({4, 1, 5}), discrete_input({3, 1})},
        {discrete_input({2, 3}), discrete_input({})},
        {discrete_input({0, 3}), discrete_input({3})},
        {discrete_input({5, 4}).t(), discrete_input({4, 5}).slice(0, 0, 4, 2).unsqueeze(1)},
    };
    for (int k = 0; k < 3; ++k) {
      const auto [sa, sb] = random_broadcast_pair(rng);
      cases.push_back({discrete_input(sa), discrete_input(sb)});
    }
    for (const auto& [a, b] : cases) {
      SCOPED_TRACE(std::string(cmp.name) + " " + shape_str(a.sizes()) + " with " + shape_str(b.sizes()));
      OpCase c{cmp.name, {a, b}, [f = cmp.fn](const Inputs& in) {
                 Tensor out = f(in[0], in[1]);
                 EXPECT_EQ(out.dtype(), DType::b8);
                 return out;
               }};
      c.reference = ref_binary([r = cmp.ref](double x, double y) { return r(x, y) ? 1.0 : 0.0; });
      check_op(c, device());
    }
  }
}

// Comparisons with a number (Note [Scalar operands]): bool, against the float64 reference, on every dtype the harness
// runs; 0.5 and 1 are exact in every floating dtype, and an integer tensor against 0.5 compares in f32.
TEST_P(ElementwiseTest, ScalarComparisonsMatchReferenceAndReturnBool) {
  EMBER_REQUIRE_KERNEL(binary_stub);
  struct Cmp {
    const char* name;
    std::function<Tensor(const Tensor&)> fn;
    std::function<bool(double)> ref;
  };
  const std::vector<Cmp> cmps = {
      {"eq 1", [](const Tensor& a) { return eq(a, 1); }, [](double x) { return x == 1.0; }},
      {"ne 1", [](const Tensor& a) { return ne(a, 1); }, [](double x) { return x != 1.0; }},
      {"lt 0.5", [](const Tensor& a) { return lt(a, 0.5); }, [](double x) { return x < 0.5; }},
      {"le 1", [](const Tensor& a) { return le(a, 1); }, [](double x) { return x <= 1.0; }},
      {"gt 0.5", [](const Tensor& a) { return gt(a, 0.5); }, [](double x) { return x > 0.5; }},
      {"ge -0.5", [](const Tensor& a) { return ge(a, -0.5); }, [](double x) { return x >= -0.5; }},
  };
  for (const Cmp& cmp : cmps) {
    for (const Tensor& x : {discrete_input({}), discrete_input({3, 5}), discrete_input({5, 4}).t(), discrete_input({0})}) {
      SCOPED_TRACE(std::string(cmp.name) + " on " + shape_str(x.sizes()));
      OpCase c{cmp.name, {x}, [f = cmp.fn](const Inputs& in) {
                 Tensor out = f(in[0]);
                 EXPECT_EQ(out.dtype(), DType::b8);
                 return out;
               }};
      c.reference = ref_unary([r = cmp.ref](double v) { return r(v) ? 1.0 : 0.0; });
      check_op(c, device());
    }
  }
  const Tensor ints = from_vector<int64_t>({-1, 0, 1, 2}, {4}).to(device());
  EXPECT_EQ(gt(ints, 0.5).to_vector<bool>(), (std::vector<bool>{false, false, true, true}));
  EXPECT_EQ(eq(ints, 2).to_vector<bool>(), (std::vector<bool>{false, false, false, true}));
  // An integer outside the tensor's range compares in i64 instead of wrapping in the tensor's dtype.
  const Tensor bytes = from_vector<int64_t>({0, 5, 200}, {3}).to(device(), DType::u8);
  EXPECT_EQ(gt(bytes, -1).to_vector<bool>(), (std::vector<bool>{true, true, true}));
  EXPECT_EQ(lt(bytes, 300).to_vector<bool>(), (std::vector<bool>{true, true, true}));
  EXPECT_EQ(eq(bytes, 256 + 5).to_vector<bool>(), (std::vector<bool>{false, false, false}));
  const Tensor words = from_vector<int64_t>({1, 2, 3}, {3}).to(device(), DType::i32);
  EXPECT_EQ(eq(words, int64_t{4294967297}).to_vector<bool>(), (std::vector<bool>{false, false, false}));
  EXPECT_EQ(ne(words, int64_t{-4294967296}).to_vector<bool>(), (std::vector<bool>{true, true, true}));
}

struct UnarySpec {
  const char* name;
  std::function<Tensor(const Tensor&)> fn;
  Fn1 ref;
  double lo, hi;  // input range (positive for log, sqrt, rsqrt, fractional powers)
};

std::vector<UnarySpec> unary_specs() {
  return {
      {"neg", [](const Tensor& x) { return neg(x); }, [](double x) { return -x; }, -1, 1},
      {"operator-", [](const Tensor& x) { return -x; }, [](double x) { return -x; }, -1, 1},
      {"exp", [](const Tensor& x) { return exp(x); }, [](double x) { return std::exp(x); }, -2, 2},
      {"log", [](const Tensor& x) { return log(x); }, [](double x) { return std::log(x); }, 0.1, 2},
      {"sqrt", [](const Tensor& x) { return sqrt(x); }, [](double x) { return std::sqrt(x); }, 0.1, 2},
      {"rsqrt", [](const Tensor& x) { return rsqrt(x); }, [](double x) { return 1.0 / std::sqrt(x); }, 0.1, 2},
      {"tanh", [](const Tensor& x) { return tanh(x); }, [](double x) { return std::tanh(x); }, -3, 3},
      {"sigmoid", [](const Tensor& x) { return sigmoid(x); }, ref_sigmoid, -4, 4},
      {"relu", [](const Tensor& x) { return relu(x); }, [](double x) { return x > 0 ? x : 0.0; }, -1, 1},
      {"gelu", [](const Tensor& x) { return gelu(x); }, ref_gelu_erf, -3, 3},
      {"gelu_tanh", [](const Tensor& x) { return gelu(x, GeluApprox::Tanh); }, ref_gelu_tanh, -3, 3},
      {"silu", [](const Tensor& x) { return silu(x); }, [](double x) { return x * ref_sigmoid(x); }, -4, 4},
      {"abs", [](const Tensor& x) { return abs(x); }, [](double x) { return std::fabs(x); }, -1, 1},
      {"pow_2.5", [](const Tensor& x) { return pow(x, 2.5); }, [](double x) { return std::pow(x, 2.5); }, 0.1, 2},
      {"pow_-0.5", [](const Tensor& x) { return pow(x, -0.5); }, [](double x) { return std::pow(x, -0.5); }, 0.1, 2},
      {"pow_3", [](const Tensor& x) { return pow(x, 3.0); }, [](double x) { return x * x * x; }, -1.5, 1.5},
      {"clamp_min", [](const Tensor& x) { return clamp(x, -0.3, std::nullopt); },
       [](double x) { return x < -0.3 ? -0.3 : x; }, -1, 1},
      {"clamp_max", [](const Tensor& x) { return clamp(x, std::nullopt, 0.4); },
       [](double x) { return x > 0.4 ? 0.4 : x; }, -1, 1},
      {"clamp_both", [](const Tensor& x) { return clamp(x, -0.5, 0.25); },
       [](double x) { return std::min(std::max(x, -0.5), 0.25); }, -1, 1},
      // min > max: PyTorch's min(max(x, lo), hi) gives hi everywhere
      {"clamp_crossed", [](const Tensor& x) { return clamp(x, 0.5, -0.5); }, [](double) { return -0.5; }, -1, 1},
  };
}

TEST_P(ElementwiseTest, UnaryMatchesReference) {
  EMBER_REQUIRE_KERNEL(unary_stub);
  std::mt19937_64 rng(next_seed());
  for (const UnarySpec& s : unary_specs()) {
    std::vector<Tensor> inputs = {
        rand_input({}, s.lo, s.hi),
        rand_input({0, 4}, s.lo, s.hi),
        rand_input({257}, s.lo, s.hi),
        noncontiguous_input({3, 4, 5}, s.lo, s.hi),
        rand_input({4, 1}, s.lo, s.hi).expand({4, 6}),
        rand_input({6, 9}, s.lo, s.hi).slice(1, 2, 9, 2),
    };
    for (int k = 0; k < 3; ++k) inputs.push_back(rand_input(random_shape(rng), s.lo, s.hi));
    for (const Tensor& x : inputs) {
      SCOPED_TRACE(std::string(s.name) + " on " + shape_str(x.sizes()));
      OpCase c{s.name, {x}, [f = s.fn](const Inputs& in) { return f(in[0]); }};
      c.reference = ref_unary(s.ref);
      check_op(c, device());
    }
    // non-contiguous for every dtype: a transposed step slice made inside the op
    const View view = [](const Tensor& t) { return t.slice(0, 1, 7, 2).t(); };
    OpCase c{s.name, {rand_input({7, 5}, s.lo, s.hi)}, [f = s.fn, view](const Inputs& in) { return f(view(in[0])); }};
    c.reference = [r = ref_unary(s.ref), view](const Inputs& in) { return r({view(in[0])}); };
    check_op(c, device());
  }
}

// The CUDA kernels' dense path (Note [Dense elementwise path] in ember/kernels/cuda/elementwise.cu): lengths around
// the 16-byte pack (1 to 17 elements and one long odd length: whole packs plus a tail for every dtype), a repeated
// (broadcast scalar) operand beside a dense one, and a contiguous view at an element offset (not 16-byte aligned),
// which takes the strided kernels. On the CPU the same cases run through its own paths.
TEST_P(ElementwiseTest, DensePathPacksTailsAndUnalignedViews) {
  EMBER_REQUIRE_KERNEL(binary_stub);
  const BinarySpec add_spec = binary_specs()[0], mul_spec = binary_specs()[2];
  const View offset = [](const Tensor& t) { return t.slice(0, 1, t.size(0)); };
  for (int64_t n : {1, 2, 3, 5, 7, 8, 9, 15, 16, 17, 4099}) {
    check_binary(add_spec, rand_input({n}), rand_input({n}), device());
    check_binary(mul_spec, rand_input({n}), rand_input({}), device());  // repeated b
    check_binary(mul_spec, rand_input({1}).expand({n}), rand_input({n}), device());
    check_binary(add_spec, rand_input({n + 1}), rand_input({n + 1}), device(), offset, offset);
    for (const UnarySpec& s : {unary_specs()[0], unary_specs()[1]}) {
      SCOPED_TRACE(std::string(s.name) + " on " + std::to_string(n));
      OpCase c{s.name, {rand_input({n + 1}, s.lo, s.hi)}, [f = s.fn](const Inputs& in) { return f(in[0]); }};
      c.reference = ref_unary(s.ref);
      check_op(c, device());
      OpCase u{s.name, {rand_input({n + 1}, s.lo, s.hi)}, [f = s.fn, offset](const Inputs& in) {
                 return f(offset(in[0]));
               }};
      u.reference = [r = ref_unary(s.ref), offset](const Inputs& in) { return r({offset(in[0])}); };
      check_op(u, device());
    }
  }
}

TEST_P(ElementwiseTest, ScalarOperandsMatchReference) {
  EMBER_REQUIRE_KERNEL(binary_stub);
  struct ScalarSpec {
    const char* name;
    std::function<Tensor(const Tensor&)> fn;
    Fn1 ref;
  };
  const std::vector<ScalarSpec> specs = {
      {"add", [](const Tensor& x) { return add(x, 1.5); }, [](double x) { return x + 1.5; }},
      {"sub", [](const Tensor& x) { return sub(x, 2); }, [](double x) { return x - 2.0; }},
      {"mul", [](const Tensor& x) { return mul(x, -3); }, [](double x) { return -3.0 * x; }},
      {"div", [](const Tensor& x) { return div(x, 4.0); }, [](double x) { return x / 4.0; }},
      {"operator+", [](const Tensor& x) { return x + 0.75; }, [](double x) { return x + 0.75; }},
      {"operator-", [](const Tensor& x) { return x - 1; }, [](double x) { return x - 1.0; }},
      {"operator*", [](const Tensor& x) { return x * 0.5; }, [](double x) { return x * 0.5; }},
      {"operator/", [](const Tensor& x) { return x / 8; }, [](double x) { return x / 8.0; }},
  };
  for (const ScalarSpec& s : specs) {
    for (const Tensor& x : {rand_input({}), rand_input({3, 5}), noncontiguous_input({2, 3, 4}), rand_input({0})}) {
      SCOPED_TRACE(std::string(s.name) + " on " + shape_str(x.sizes()));
      OpCase c{s.name, {x}, [f = s.fn](const Inputs& in) { return f(in[0]); }};
      c.reference = ref_unary(s.ref);
      check_op(c, device());
    }
  }
}

TEST_P(ElementwiseTest, AddInPlaceMatchesReference) {
  EMBER_REQUIRE_KERNEL(binary_stub);
  // a += b for f32, f16, bf16 destinations, a broadcast f32 operand (cast to the destination's dtype), against f64.
  for (DType dt : {DType::f32, DType::f16, DType::bf16}) {
    SCOPED_TRACE(dtype_name(dt));
    const Tensor a0 = rand_input({5, 6}), b0 = rand_input({1, 6});
    Tensor a = a0.to(dt).to(device());
    const Tensor b = b0.to(device());
    const void* data = a.raw_data();
    const int64_t version = a.version();
    ops::add_(a, b);
    EXPECT_EQ(a.raw_data(), data) << "in place";
    EXPECT_GT(a.version(), version);
    const std::vector<double> va = a0.to(dt).to_vector<double>(), vb = b0.to_vector<double>();
    std::vector<double> want(va.size());
    for (size_t i = 0; i < va.size(); ++i) want[i] = va[i] + vb[i % 6];
    const double tol = dt == DType::f32 ? 1e-6 : dt == DType::f16 ? 2e-3 : 1.6e-2;
    EXPECT_TRUE(allclose(a.to(DType::f64).to(Device::cpu()), from_vector(want, {5, 6}), Tolerance{tol, tol}));
  }
  Tensor wide = rand_input({4, 6}).to(device());
  EXPECT_THROW(ops::add_(rand_input({1, 6}).to(device()), wide), ShapeError);
  EXPECT_THROW(ops::add_(wide.t(), rand_input({6, 4}).to(device())), ValueError);
  EXPECT_THROW(ops::add_(zeros({3}, {DType::i64, device()}), rand_input({3}).to(device())), DTypeError);
}

TEST_P(ElementwiseTest, WhereMatchesReference) {
  EMBER_REQUIRE_KERNEL(where_stub);
  const auto mask = [](const Shape& shape) {
    std::vector<double> v = rand_input(shape).to_vector<double>();
    std::vector<bool> m(v.size());
    for (size_t i = 0; i < v.size(); ++i) m[i] = v[i] > 0.0;
    return from_vector(m, shape);
  };
  struct W {
    Tensor cond, a, b;
  };
  const std::vector<W> cases = {
      {mask({4, 1, 5}), rand_input({3, 1}), rand_input({})},
      {mask({}), rand_input({2, 3}), rand_input({2, 3})},
      {mask({3, 4}), rand_input({3, 4}), rand_input({4})},
      {mask({5, 3}).t(), noncontiguous_input({3, 5}), rand_input({5, 3}).t()},
      {mask({0, 2}), rand_input({1, 2}), rand_input({2})},
      {mask({}), rand_input({}), rand_input({})},
  };
  for (const W& w : cases) {
    SCOPED_TRACE("where " + shape_str(w.cond.sizes()) + ", " + shape_str(w.a.sizes()) + ", " +
                 shape_str(w.b.sizes()));
    OpCase c{"where", {w.cond, w.a, w.b}, [](const Inputs& in) { return where(in[0], in[1], in[2]); }};
    c.keep_dtype_inputs = {0};
    c.reference = [](const Inputs& in) {
      return ref_map(in, [](const double* x) { return x[0] != 0.0 ? x[1] : x[2]; });
    };
    check_op(c, device());
  }
  // value operands made non-contiguous inside the op, so every dtype run sees the strides
  const auto views = [](const Inputs& in) { return Inputs{in[0], in[1].t(), in[2].slice(1, 0, 10, 2)}; };
  OpCase c{"where", {mask({3, 1}), rand_input({5, 3}), rand_input({3, 10})}, [views](const Inputs& in) {
             const Inputs v = views(in);
             return where(v[0], v[1], v[2]);
           }};
  c.keep_dtype_inputs = {0};
  c.reference = [views](const Inputs& in) {
    return ref_map(views(in), [](const double* x) { return x[0] != 0.0 ? x[1] : x[2]; });
  };
  check_op(c, device());
}

TEST_P(ElementwiseTest, NaNPropagatesThroughReluClampMaximumMinimum) {
  EMBER_REQUIRE_KERNEL(unary_stub);
  EMBER_REQUIRE_KERNEL(binary_stub);
  for (DType dt : {DType::f32, DType::f64, DType::f16, DType::bf16}) {
    SCOPED_TRACE(dtype_name(dt));
    const Tensor x = hand({kNaN, -1.0, 2.0, kNaN}, dt, device());
    const Tensor y = hand({1.0, kNaN, 0.0, -kInf}, dt, device());
    const Tolerance exact{0.0, 0.0};
    EXPECT_TRUE(allclose(relu(x), from_vector<double>({kNaN, 0.0, 2.0, kNaN}, {4}), exact));
    EXPECT_TRUE(allclose(clamp(x, -0.5, 0.5), from_vector<double>({kNaN, -0.5, 0.5, kNaN}, {4}), exact));
    EXPECT_TRUE(allclose(clamp(x, std::nullopt, 1.0), from_vector<double>({kNaN, -1.0, 1.0, kNaN}, {4}), exact));
    EXPECT_TRUE(allclose(maximum(x, y), from_vector<double>({kNaN, kNaN, 2.0, kNaN}, {4}), exact));
    EXPECT_TRUE(allclose(minimum(y, x), from_vector<double>({kNaN, kNaN, 0.0, kNaN}, {4}), exact));
    // comparisons with NaN are false, except ne
    EXPECT_EQ(eq(x, x).to_vector<double>(), (std::vector<double>{0, 1, 1, 0}));
    EXPECT_EQ(ne(x, x).to_vector<double>(), (std::vector<double>{1, 0, 0, 1}));
  }
}

TEST_P(ElementwiseTest, IntegerOpsMatchHandValues) {
  EMBER_REQUIRE_KERNEL(binary_stub);
  EMBER_REQUIRE_KERNEL(unary_stub);
  using V = std::vector<double>;
  for (DType dt : {DType::i32, DType::i64}) {
    SCOPED_TRACE(dtype_name(dt));
    const Tensor a = hand({5, -3, 7, 0}, dt, device());
    const Tensor b = hand({2, 4, -7, 0}, dt, device());
    const auto check = [&](const Tensor& out, DType want, const V& expected, const char* what) {
      SCOPED_TRACE(what);
      EXPECT_EQ(out.dtype(), want);
      EXPECT_EQ(out.device(), device());
      EXPECT_EQ(out.to_vector<double>(), expected);
    };
    check(add(a, b), dt, {7, 1, 0, 0}, "add");
    check(sub(a, b), dt, {3, -7, 14, 0}, "sub");
    check(mul(a, b), dt, {10, -12, -49, 0}, "mul");
    check(maximum(a, b), dt, {5, 4, 7, 0}, "maximum");
    check(minimum(a, b), dt, {2, -3, -7, 0}, "minimum");
    check(eq(a, b), DType::b8, {0, 0, 0, 1}, "eq");
    check(ne(a, b), DType::b8, {1, 1, 1, 0}, "ne");
    check(lt(a, b), DType::b8, {0, 1, 0, 0}, "lt");
    check(le(a, b), DType::b8, {0, 1, 0, 1}, "le");
    check(gt(a, b), DType::b8, {1, 0, 1, 0}, "gt");
    check(ge(a, b), DType::b8, {1, 0, 1, 1}, "ge");
    check(neg(a), dt, {-5, 3, -7, 0}, "neg");
    check(abs(a), dt, {5, 3, 7, 0}, "abs");
    check(relu(a), dt, {5, 0, 7, 0}, "relu");
    check(clamp(a, -1.0, 6.0), dt, {5, -1, 6, 0}, "clamp both");
    check(clamp(a, std::nullopt, 2.0), dt, {2, -3, 2, 0}, "clamp max");
    check(clamp(a, 1e30, std::nullopt), dt, {dt == DType::i32 ? 2147483647.0 : 9223372036854775807.0,
                                              dt == DType::i32 ? 2147483647.0 : 9223372036854775807.0,
                                              dt == DType::i32 ? 2147483647.0 : 9223372036854775807.0,
                                              dt == DType::i32 ? 2147483647.0 : 9223372036854775807.0},
          "clamp saturated bound");
    check(pow(hand({2, 3, 5}, dt, device()), hand({10, 3, 0}, dt, device())), dt, {1024, 27, 1}, "pow");
    check(add(a, 3), dt, {8, 0, 10, 3}, "add scalar");
    check(a * 2, dt, {10, -6, 14, 0}, "mul scalar");
    // broadcasting [2, 1] with [3]
    check(add(hand({10, 20}, dt, device(), {2, 1}), hand({1, 2, 3}, dt, device())), dt, {11, 12, 13, 21, 22, 23},
          "broadcast add");
  }
  // i64 arithmetic stays exact beyond 2^53 (no round trip through double)
  const Tensor big = from_vector<int64_t>({(int64_t{1} << 53) + 1, -(int64_t{1} << 60)}, {2}).to(device());
  const Tensor one = from_vector<int64_t>({1, 3}, {2}).to(device());
  EXPECT_EQ(add(big, one).to_vector<int64_t>(),
            (std::vector<int64_t>{(int64_t{1} << 53) + 2, -(int64_t{1} << 60) + 3}));
  EXPECT_EQ(maximum(big, one).to_vector<int64_t>(), (std::vector<int64_t>{(int64_t{1} << 53) + 1, 3}));
  // u8 wraps like PyTorch's uint8
  const Tensor u = from_vector<uint8_t>({250, 3}, {2}).to(device());
  const Tensor v = from_vector<uint8_t>({10, 5}, {2}).to(device());
  EXPECT_EQ(add(u, v).to_vector<double>(), (V{4, 8}));
  EXPECT_EQ(sub(v, u).to_vector<double>(), (V{16, 2}));
  EXPECT_EQ(u.dtype(), DType::u8);
  // bool: comparisons, logical add (or) / mul (and), maximum / minimum
  const Tensor p = from_vector<bool>({true, true, false, false}, {4}).to(device());
  const Tensor q = from_vector<bool>({true, false, true, false}, {4}).to(device());
  EXPECT_EQ(eq(p, q).to_vector<double>(), (V{1, 0, 0, 1}));
  EXPECT_EQ(gt(p, q).to_vector<double>(), (V{0, 1, 0, 0}));
  EXPECT_EQ(add(p, q).to_vector<double>(), (V{1, 1, 1, 0}));
  EXPECT_EQ(mul(p, q).to_vector<double>(), (V{1, 0, 0, 0}));
  EXPECT_EQ(maximum(p, q).dtype(), DType::b8);
  EXPECT_EQ(minimum(p, q).to_vector<double>(), (V{1, 0, 0, 0}));
}

TEST_P(ElementwiseTest, DTypePromotionMatchesHandValues) {
  EMBER_REQUIRE_KERNEL(binary_stub);
  EMBER_REQUIRE_KERNEL(unary_stub);
  EMBER_REQUIRE_KERNEL(where_stub);
  const Device dev = device();
  const auto check = [](const Tensor& out, DType want, const std::vector<double>& expected, Tolerance tol,
                        const char* what) {
    SCOPED_TRACE(what);
    EXPECT_EQ(out.dtype(), want);
    EXPECT_TRUE(allclose(out, from_vector(expected, out.sizes()), tol));
  };
  const Tolerance exact{0.0, 0.0}, f32tol{1e-6, 0.0};
  check(add(hand({1.5, 0.25}, DType::f16, dev), hand({0.1, 2.0}, DType::f32, dev)), DType::f32,
        {1.5 + double(0.1f), 2.25}, f32tol, "f16 + f32 -> f32");
  check(add(hand({3, -2}, DType::i64, dev), hand({0.5, 1.25}, DType::f16, dev)), DType::f16, {3.5, -0.75}, exact,
        "i64 + f16 -> f16");
  check(div(hand({7, -3, 1}, DType::i32, dev), hand({2, 4, 3}, DType::i32, dev)), DType::f32, {3.5, -0.75, 1.0 / 3},
        f32tol, "i32 / i32 -> f32");
  check(hand({2, -3}, DType::i32, dev) * 2.5, DType::f32, {5, -7.5}, exact, "i32 * 2.5 -> f32");
  check(hand({2, -3}, DType::i64, dev) / 2, DType::f32, {1, -1.5}, exact, "i64 / 2 -> f32");
  check(hand({2, -3}, DType::i32, dev) + 1.5, DType::f32, {3.5, -1.5}, exact, "i32 + 1.5 -> f32");
  check(hand({2, -3}, DType::i64, dev) * 2, DType::i64, {4, -6}, exact, "i64 * 2 -> i64");
  check(hand({1.5, -2}, DType::f16, dev) * 2.5, DType::f16, {3.75, -5}, exact, "f16 * 2.5 -> f16");
  check(add(from_vector<bool>({true, false}, {2}).to(dev), 1), DType::i64, {2, 1}, exact, "bool + 1 -> i64");
  check(add(hand({1.5}, DType::f16, dev), hand({0.25}, DType::bf16, dev)), DType::f32, {1.75}, exact,
        "f16 + bf16 -> f32");
  check(maximum(hand({1, 5}, DType::i32, dev), hand({2.5, 2.5}, DType::f64, dev)), DType::f64, {2.5, 5}, exact,
        "maximum(i32, f64) -> f64");
  check(lt(hand({1, 2}, DType::i32, dev), hand({1.5, 1.5}, DType::f32, dev)), DType::b8, {1, 0}, exact,
        "lt(i32, f32) -> bool");
  check(where(from_vector<bool>({true, false}, {2}).to(dev), hand({4, 4}, DType::i32, dev),
              hand({0.5, 0.5}, DType::f32, dev)),
        DType::f32, {4, 0.5}, exact, "where(i32, f32) -> f32");
  check(clamp(hand({-1, 2}, DType::i32, dev), 0.5, std::nullopt), DType::f32, {0.5, 2}, exact,
        "clamp(i32, 0.5) -> f32");
  check(cast(hand({1.25, -2.75}, DType::f32, dev), DType::i32), DType::i32, {1, -2}, exact, "cast f32 -> i32");
  check(cast(hand({3, -4}, DType::i64, dev), DType::f16), DType::f16, {3, -4}, exact, "cast i64 -> f16");
}

TEST_P(ElementwiseTest, IntegerPowIsExactAndWraps) {
  EMBER_REQUIRE_KERNEL(binary_stub);
  const Device dev = device();
  // 10^10 mod 2^32 = 1410065408 (PyTorch wraps the same way); through double pow it was out of i32's range.
  EXPECT_EQ(pow(from_vector<int32_t>({10, 2, 3, -2}, {4}).to(dev), from_vector<int32_t>({10, 31, 20, 31}, {4}).to(dev))
                .to_vector<int64_t>(),
            (std::vector<int64_t>{1410065408, -2147483648, 3486784401 - 4294967296, -2147483648}));
  // i64 results above 2^53 are exact: 3^39 = 4052555153018976267 (double pow gives 4052555153018976256).
  const Tensor b64 = from_vector<int64_t>({3, -3, 7, 2}, {4}).to(dev);
  const Tensor e64 = from_vector<int64_t>({39, 39, 22, 64}, {4}).to(dev);
  EXPECT_EQ(pow(b64, e64).to_vector<int64_t>(),
            (std::vector<int64_t>{4052555153018976267, -4052555153018976267, 3909821048582988049, 0}));
  // Negative exponents (Note [Integer pow]): 1 for base 1, +-1 for base -1 by parity, 0 for every other base.
  const Tensor base = from_vector<int32_t>({1, -1, -1, 2, -5, 0, 3}, {7}).to(dev);
  const Tensor expo = from_vector<int32_t>({-7, -3, -4, -1, -2, -1, 0}, {7}).to(dev);
  EXPECT_EQ(pow(base, expo).to_vector<int64_t>(), (std::vector<int64_t>{1, -1, 1, 0, 0, 0, 1}));
  // u8 wraps modulo 256; a broadcast 0-d exponent.
  const Tensor u8 = from_vector<uint8_t>({2, 3, 255}, {3}).to(dev);
  EXPECT_EQ(pow(u8, scalar_tensor(9, {DType::u8, dev})).to_vector<int64_t>(),
            (std::vector<int64_t>{0, 227, 255}));  // 512 % 256, 19683 % 256, 255^9 = -1^9 mod 256
}

TEST_P(ElementwiseTest, SignedIntegerOverflowWraps) {
  EMBER_REQUIRE_KERNEL(binary_stub);
  EMBER_REQUIRE_KERNEL(unary_stub);
  const Device dev = device();
  constexpr int32_t kMax32 = std::numeric_limits<int32_t>::max(), kMin32 = std::numeric_limits<int32_t>::min();
  const Tensor a = from_vector<int32_t>({kMax32, kMin32, 65536, kMax32}, {4}).to(dev);
  const Tensor b = from_vector<int32_t>({1, 1, 65536, 2}, {4}).to(dev);
  EXPECT_EQ(add(a, b).to_vector<int32_t>(), (std::vector<int32_t>{kMin32, kMin32 + 1, 131072, kMin32 + 1}));
  EXPECT_EQ(sub(a, b).to_vector<int32_t>(), (std::vector<int32_t>{kMax32 - 1, kMax32, 0, kMax32 - 2}));
  EXPECT_EQ(mul(a, b).to_vector<int32_t>(), (std::vector<int32_t>{kMax32, kMin32, 0, -2}));
  EXPECT_EQ(neg(a).to_vector<int32_t>(), (std::vector<int32_t>{-kMax32, kMin32, -65536, -kMax32}));
  EXPECT_EQ(abs(a).to_vector<int32_t>(), (std::vector<int32_t>{kMax32, kMin32, 65536, kMax32}));
  EXPECT_EQ((a + 1).to_vector<int32_t>(), (std::vector<int32_t>{kMin32, kMin32 + 1, 65537, kMin32}));
  constexpr int64_t kMax64 = std::numeric_limits<int64_t>::max(), kMin64 = std::numeric_limits<int64_t>::min();
  const Tensor c = from_vector<int64_t>({kMax64, kMin64, int64_t{1} << 32}, {3}).to(dev);
  const Tensor d = from_vector<int64_t>({1, -1, int64_t{1} << 32}, {3}).to(dev);
  EXPECT_EQ(add(c, d).to_vector<int64_t>(), (std::vector<int64_t>{kMin64, kMax64, int64_t{1} << 33}));
  EXPECT_EQ(mul(c, d).to_vector<int64_t>(), (std::vector<int64_t>{kMax64, kMin64, 0}));
  EXPECT_EQ(neg(c).to_vector<int64_t>(), (std::vector<int64_t>{-kMax64, kMin64, -(int64_t{1} << 32)}));
  // clamp bounds beyond the dtype saturate (once, in the front end), for u8 too
  const Tensor u = from_vector<uint8_t>({0, 7, 255}, {3}).to(dev);
  EXPECT_EQ(clamp(u, -10.0, 300.0).to_vector<int32_t>(), (std::vector<int32_t>{0, 7, 255}));
  EXPECT_EQ(clamp(u, 300.0, std::nullopt).to_vector<int32_t>(), (std::vector<int32_t>{255, 255, 255}));
  EXPECT_EQ(clamp(c, -1e30, 1e30).to_vector<int64_t>(), c.to_vector<int64_t>());
}

TEST_P(ElementwiseTest, FloatOpsComputeInTheirOwnType) {
  EMBER_REQUIRE_KERNEL(unary_stub);
  EMBER_REQUIRE_KERNEL(binary_stub);
  const Device dev = device();
  // f32 math runs in float on every device: exp(89) overflows float, so sigmoid(-89) is exactly 0 and silu(-89) is
  // -0 (computed in double they would be 2.2e-39 and -2e-37, representable in f32). In f64 they are not 0.
  const Tensor x = from_vector<float>({-89.0f, -100.0f}, {2}).to(dev);
  EXPECT_EQ(sigmoid(x).to_vector<float>(), (std::vector<float>{0.0f, 0.0f}));
  EXPECT_EQ(silu(x).to_vector<float>(), (std::vector<float>{0.0f, 0.0f}));
  EXPECT_EQ(exp(from_vector<float>({89.0f}, {1}).to(dev)).to_vector<float>()[0], kInf);
  const double s64 = sigmoid(from_vector<double>({-89.0}, {1}).to(dev)).to_vector<double>()[0];
  EXPECT_NEAR(s64 / std::exp(-89.0), 1.0, 1e-12);
  // pow on f32 gives float results at both ends of float's range.
  EXPECT_EQ(pow(from_vector<float>({2.0f}, {1}).to(dev), 128.0).to_vector<float>()[0], kInf);
  EXPECT_EQ(pow(from_vector<float>({2.0f}, {1}).to(dev), from_vector<float>({-149.0f}, {1}).to(dev))
                .to_vector<double>()[0],
            std::ldexp(1.0, -149));
}

TEST_P(ElementwiseTest, ZeroDimTensorsPromoteByCategory) {
  EMBER_REQUIRE_KERNEL(binary_stub);
  EMBER_REQUIRE_KERNEL(where_stub);
  const Device dev = device();
  const auto check = [](const Tensor& out, DType want, const std::vector<double>& expected, const char* what) {
    SCOPED_TRACE(what);
    EXPECT_EQ(out.dtype(), want);
    EXPECT_EQ(out.to_vector<double>(), expected);
  };
  check(add(zeros({3}, {DType::f16, dev}), scalar_tensor(1.0, {DType::f32, dev})), DType::f16, {1, 1, 1},
        "f16[3] + f32 0-d -> f16");
  check(add(scalar_tensor(1.0, {DType::f64, dev}), full({2}, 0.5, {DType::bf16, dev})), DType::bf16, {1.5, 1.5},
        "f64 0-d + bf16[2] -> bf16");
  check(add(full({3}, 2, {DType::i32, dev}), scalar_tensor(5, {DType::i64, dev})), DType::i32, {7, 7, 7},
        "i32[3] + i64 0-d -> i32");
  check(add(full({3}, 2, {DType::i32, dev}), scalar_tensor(0.5, {DType::f32, dev})), DType::f32, {2.5, 2.5, 2.5},
        "i32[3] + f32 0-d -> f32");
  check(mul(full({2}, 3, {DType::u8, dev}), scalar_tensor(0.5, {DType::f16, dev})), DType::f16, {1.5, 1.5},
        "u8[2] * f16 0-d -> f16");
  check(add(from_vector<bool>({true, false}, {2}).to(dev), scalar_tensor(3, {DType::i64, dev})), DType::i64, {4, 3},
        "bool[2] + i64 0-d -> i64");
  check(add(from_vector<bool>({true, false}, {2}).to(dev), scalar_tensor(true, {DType::b8, dev})), DType::b8, {1, 1},
        "bool[2] + bool 0-d -> bool");
  check(add(scalar_tensor(1.5, {DType::f16, dev}), scalar_tensor(0.25, {DType::f32, dev})), DType::f32, {1.75},
        "two 0-d tensors promote normally");
  check(add(full({1}, 1.5, {DType::f16, dev}), full({1}, 0.25, {DType::f32, dev})), DType::f32, {1.75},
        "two 1-d tensors promote normally");
  check(maximum(full({2}, 1, {DType::i64, dev}), scalar_tensor(4, {DType::i32, dev})), DType::i64, {4, 4},
        "maximum(i64[2], i32 0-d) -> i64");
  // The 0-d operand is cast to the result dtype first: f16(0.1) == f16(0.1), although 0.1f > f16(0.1).
  check(lt(full({1}, 0.1, {DType::f16, dev}), scalar_tensor(0.1, {DType::f32, dev})), DType::b8, {0},
        "lt(f16[1], f32 0-d) compares in f16");
  check(where(from_vector<bool>({true, false}, {2}).to(dev), full({2}, 0.5, {DType::f16, dev}),
              scalar_tensor(2.0, {DType::f64, dev})),
        DType::f16, {0.5, 2}, "where(f16[2], f64 0-d) -> f16");
}

TEST_P(ElementwiseTest, ScalarOperandsKeepTheirValueInTheComputeType) {
  EMBER_REQUIRE_KERNEL(binary_stub);
  const Device dev = device();
  // 100000 is inf in f16 and 1e-8 is 0 in f16: rounded to the tensor's dtype first they gave 0.
  const Tensor q = full({1}, 60000, {DType::f16, dev}) / 100000.0;
  EXPECT_EQ(q.dtype(), DType::f16);
  EXPECT_NEAR(q.to_vector<double>()[0], 0.6, 0.6 * 1e-3);
  const Tensor m = full({1}, 1000, {DType::f16, dev}) * 1e-8;
  EXPECT_EQ(m.dtype(), DType::f16);
  EXPECT_NEAR(m.to_vector<double>()[0], 1e-5, 1e-5 * 1e-2);
  const Tensor s = full({2}, 1, {DType::f16, dev}) - 65520.0;  // 1 - 65520 = -65519 -> f16 -65504
  EXPECT_EQ(s.to_vector<double>(), (std::vector<double>{-65504, -65504}));
  // Integer tensors: a floating scalar gives f32, an integer scalar keeps the dtype exactly (i64 beyond 2^53).
  EXPECT_EQ((full({1}, 7, {DType::i32, dev}) / 2).to_vector<double>(), (std::vector<double>{3.5}));
  EXPECT_EQ((full({1}, 7, {DType::i32, dev}) * 0.5).dtype(), DType::f32);
  EXPECT_EQ((full({1}, 1, {DType::i64, dev}) + ((int64_t{1} << 53) + 1)).to_vector<int64_t>(),
            (std::vector<int64_t>{(int64_t{1} << 53) + 2}));
  // A scalar operand on a non-contiguous tensor.
  const Tensor t = full({3, 2}, 60000, {DType::f16, dev}).t();
  const std::vector<double> r = div(t, 100000.0).to_vector<double>();
  ASSERT_EQ(r.size(), 6u);
  for (double v : r) EXPECT_NEAR(v, 0.6, 0.6 * 1e-3);
}

TEST_P(ElementwiseTest, OutputIsFreshAndContiguous) {
  EMBER_REQUIRE_KERNEL(binary_stub);
  const Tensor a = rand_input({4, 6}).t().to(device());
  const Tensor out = add(a, a);
  EXPECT_TRUE(out.is_contiguous());
  EXPECT_EQ(out.sizes(), (Shape{6, 4}));
  EXPECT_NE(out.raw_data(), a.raw_data());
  EXPECT_TRUE(allclose(out, ref_binary([](double x, double y) { return x + y; })({a.cpu(), a.cpu()}), {1e-6, 1e-6}));
}

EMBER_INSTANTIATE_DEVICE_TESTS(ElementwiseTest);

// ---- user-facing behaviour ---------------------------------------------------------------------------------------

TEST(ElementwiseUser, OperatorsOnSmallTensors) {
  const Tensor a = ember::tensor({1, 2, 3});
  const Tensor b = ember::tensor({10, 20, 30});
  using V = std::vector<float>;
  EXPECT_EQ((a + b).to_vector<float>(), (V{11, 22, 33}));
  EXPECT_EQ((b - a).to_vector<float>(), (V{9, 18, 27}));
  EXPECT_EQ((a * b).to_vector<float>(), (V{10, 40, 90}));
  EXPECT_EQ((b / a).to_vector<float>(), (V{10, 10, 10}));
  EXPECT_EQ((-a).to_vector<float>(), (V{-1, -2, -3}));
  EXPECT_EQ((a + 1).to_vector<float>(), (V{2, 3, 4}));
  EXPECT_EQ((a * 2.0).to_vector<float>(), (V{2, 4, 6}));
  EXPECT_EQ(((b - 1) / 3).to_vector<float>(), (V{3, 19.0f / 3.0f, 29.0f / 3.0f}));
  EXPECT_EQ(relu(a - 2).to_vector<float>(), (V{0, 0, 1}));
  EXPECT_EQ((a + b).dtype(), DType::f32);
  EXPECT_EQ(gt(b, ember::tensor({15})).to_vector<float>(), (V{0, 1, 1}));
}

TEST(ElementwiseUser, MetaTensorsGiveShapeAndDTypeWithoutData) {
  const Tensor a = empty({2, 1, 3}, {DType::f16, Device::meta()});
  const Tensor b = empty({4, 1}, {DType::f32, Device::meta()});
  const Tensor c = add(a, b);
  EXPECT_EQ(c.sizes(), (Shape{2, 4, 3}));
  EXPECT_EQ(c.dtype(), DType::f32);
  EXPECT_TRUE(c.device().is_meta());
  EXPECT_EQ(exp(a).sizes(), a.sizes());
  EXPECT_EQ(mul(a, 2.5).dtype(), DType::f16);
  EXPECT_EQ(lt(a, b).dtype(), DType::b8);
  EXPECT_EQ(where(empty({4, 1}, {DType::b8, Device::meta()}), a, b).sizes(), (Shape{2, 4, 3}));
}

// ---- error paths -------------------------------------------------------------------------------------------------

template <class E, class F>
void expect_error(F&& f, const std::string& needle) {
  try {
    f();
    ADD_FAILURE() << "expected an exception mentioning '" << needle << "'";
  } catch (const E& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  } catch (const std::exception& e) {
    ADD_FAILURE() << "wrong exception type: " << e.what();
  }
}

TEST(ElementwiseErrors, NonBroadcastableShapesThrowShapeError) {
  const Tensor a = zeros({2, 3}), b = zeros({4});
  for (const BinarySpec& s : binary_specs()) {
    SCOPED_TRACE(s.name);
    expect_error<ShapeError>([&] { s.fn(a, b); }, "[2, 3]");
  }
  expect_error<ShapeError>([&] { add(a, b); }, "add");
  expect_error<ShapeError>([&] { eq(a, b); }, "eq");
  expect_error<ShapeError>([&] { ge(zeros({3, 2}), zeros({2, 3})); }, "ge");
  expect_error<ShapeError>([&] { where(zeros({2, 3}, {DType::b8}), a, b); }, "where");
  expect_error<ShapeError>([&] { where(zeros({5}, {DType::b8}), a, a); }, "where");
}

TEST(ElementwiseErrors, FloatingOnlyOpsRejectIntegerInputs) {
  const Tensor i = zeros({3}, {DType::i64});
  expect_error<DTypeError>([&] { exp(i); }, "exp");
  expect_error<DTypeError>([&] { log(i); }, "log");
  expect_error<DTypeError>([&] { sqrt(i); }, "sqrt");
  expect_error<DTypeError>([&] { rsqrt(i); }, "rsqrt");
  expect_error<DTypeError>([&] { tanh(i); }, "tanh");
  expect_error<DTypeError>([&] { sigmoid(i); }, "sigmoid");
  expect_error<DTypeError>([&] { gelu(i); }, "gelu");
  expect_error<DTypeError>([&] { gelu(i, GeluApprox::Tanh); }, "gelu");
  expect_error<DTypeError>([&] { silu(i); }, "silu");
  expect_error<DTypeError>([&] { pow(i, 2.0); }, "pow");
  expect_error<DTypeError>([&] { exp(zeros({3}, {DType::i32})); }, "i32");
}

TEST(ElementwiseErrors, BoolInputsRejectedWhereUnsupported) {
  const Tensor b = zeros({3}, {DType::b8});
  expect_error<DTypeError>([&] { neg(b); }, "neg");
  expect_error<DTypeError>([&] { abs(b); }, "abs");
  expect_error<DTypeError>([&] { relu(b); }, "relu");
  expect_error<DTypeError>([&] { clamp(b, 0.0, 1.0); }, "clamp");
  expect_error<DTypeError>([&] { sub(b, b); }, "sub");
  expect_error<DTypeError>([&] { exp(b); }, "exp");
}

TEST(ElementwiseErrors, WhereNeedsBoolCondition) {
  const Tensor a = zeros({3});
  expect_error<DTypeError>([&] { where(zeros({3}), a, a); }, "where");
  expect_error<DTypeError>([&] { where(zeros({3}, {DType::i64}), a, a); }, "i64");
  expect_error<DTypeError>([&] { where(zeros({3}, {DType::u8}), a, a); }, "bool");
}

TEST(ElementwiseErrors, DeviceMismatchThrowsDeviceError) {
  const Tensor cpu = zeros({3});
  const Tensor meta = empty({3}, {DType::f32, Device::meta()});
  for (const BinarySpec& s : binary_specs()) {
    SCOPED_TRACE(s.name);
    expect_error<DeviceError>([&] { s.fn(meta, cpu); }, "meta");
    expect_error<DeviceError>([&] { s.fn(cpu, meta); }, "cpu");
  }
  expect_error<DeviceError>([&] { lt(cpu, meta); }, "lt");
  expect_error<DeviceError>([&] { where(zeros({3}, {DType::b8}), meta, cpu); }, "where");
  expect_error<DeviceError>([&] { where(empty({3}, {DType::b8, Device::meta()}), cpu, cpu); }, "where");
}

TEST(ElementwiseErrors, BinaryKernelRejectsOperandsOutsideItsContract) {
  // Arithmetic operands must have the output's dtype or (a scalar operand) its compute dtype; comparisons one dtype.
  const auto kernel = binary_stub.get(DeviceType::CPU);
  const Tensor i32 = zeros({2}, DType::i32), f16 = zeros({2}, DType::f16), f32 = zeros({2}, DType::f32);
  const Tensor f64 = zeros({2}, DType::f64);
  expect_error<DTypeError>([&] { kernel(BinaryOp::Add, i32, f64, empty({2}, DType::i32)); }, "add");
  expect_error<DTypeError>([&] { kernel(BinaryOp::Mul, f64, f16, empty({2}, DType::f16)); }, "f64");
  expect_error<DTypeError>([&] { kernel(BinaryOp::Lt, f16, f32, empty({2}, DType::b8)); }, "lt");
  // An f16 output with an f32 (compute dtype) operand is accepted and computed in float: 1 + 2^-11 + 2^-11 in f16.
  Tensor out = empty({2}, DType::f16);
  kernel(BinaryOp::Add, full({2}, 1.0, DType::f16), scalar_tensor(std::ldexp(1.0, -11), DType::f32).expand({2}), out);
  EXPECT_EQ(out.to_vector<double>(), (std::vector<double>{1.0, 1.0}));  // 1 + 2^-11 ties to even
  kernel(BinaryOp::Add, full({2}, 1.0, DType::f16), scalar_tensor(0.00073, DType::f32).expand({2}), out);
  EXPECT_EQ(out.to_vector<double>(), (std::vector<double>{1.0 + std::ldexp(1.0, -10), 1.0 + std::ldexp(1.0, -10)}));
}

TEST(ElementwiseErrors, ClampWithoutBoundsAndUndefinedInputsThrowValueError) {
  expect_error<ValueError>([&] { clamp(zeros({3}), std::nullopt, std::nullopt); }, "clamp");
  expect_error<ValueError>([&] { add(Tensor(), zeros({3})); }, "add");
  expect_error<ValueError>([&] { mul(zeros({3}), Tensor()); }, "mul");
  expect_error<ValueError>([&] { exp(Tensor()); }, "exp");
  expect_error<ValueError>([&] { div(Tensor(), 2.0); }, "div");
}

}  // namespace
}  // namespace ember::testing

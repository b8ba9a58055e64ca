// Tests of conv2d, max_pool2d (values and flat indices) and avg_pool2d against naive float64 loops written here
// (a direct 7-loop convolution, window loops for pooling) and hand-computed cases, over strides, padding, dilation,
// groups (incl. depthwise), 1x1 and non-square kernels, non-contiguous inputs, empty batches and every error path.
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "tests/harness/op_harness.h"
#include "tests/kernels/conv_pool_test_util.h"

namespace ember::testing {
namespace {

// Direct convolution: out[n, o, y, z] = b[o] + sum_{c, i, j} x[n, g*cg + c, y*s - p + i*d, z*s - p + j*d] * w[o, c, i, j].
Tensor conv_ref(const Tensor& x, const Tensor& w, const Tensor& b, const Conv2dParams& p) {
  const std::vector<double> xv = x.to_vector<double>(), wv = w.to_vector<double>();
  const Shape os = conv_out_shape(x.sizes(), w.sizes(), p);
  const int64_t plane = os[2] * os[3];
  std::vector<double> out(flat(numel_of(os)), 0.0);
  if (b.defined()) {  // the bias is each sum's first term
    const std::vector<double> bv = b.to_vector<double>();
    for (size_t e = 0; e < out.size(); ++e) out[e] = bv[flat((static_cast<int64_t>(e) / plane) % os[1])];
  }
  for_each_conv_term(x.sizes(), w.sizes(), p, [&](size_t o, size_t xi, size_t wi) { out[o] += xv[xi] * wv[wi]; });
  return from_vector(out, os);
}


Tolerance conv_tolerance(DType dt) {
  Tolerance t = default_tolerance(dt);
  if (dt == DType::f32) t.atol = 1e-5;  // sums of up to ~50 products accumulated in f32
  return t;
}

struct ConvConfig {
  std::string name;
  Shape x, w;
  Conv2dParams p;
  bool bias;
};

std::vector<ConvConfig> conv_configs() {
  return {
      {"basic", {2, 3, 7, 6}, {4, 3, 3, 3}, conv_params(1, 1, 0, 0, 1, 1, 1), true},
      {"stride2", {2, 3, 9, 8}, {5, 3, 3, 3}, conv_params(2, 2, 0, 0, 1, 1, 1), false},
      {"padding1", {1, 2, 5, 5}, {3, 2, 3, 3}, conv_params(1, 1, 1, 1, 1, 1, 1), true},
      {"stride2_padding1", {2, 2, 8, 7}, {3, 2, 3, 3}, conv_params(2, 2, 1, 1, 1, 1, 1), true},
      {"dilation2", {2, 2, 9, 10}, {2, 2, 3, 3}, conv_params(1, 1, 2, 1, 2, 2, 1), true},
      {"groups2", {2, 4, 6, 6}, {6, 2, 3, 3}, conv_params(1, 1, 0, 0, 1, 1, 2), true},
      {"depthwise", {2, 3, 6, 5}, {3, 1, 3, 3}, conv_params(1, 1, 1, 1, 1, 1, 3), true},
      {"depthwise_multiplier2", {1, 2, 5, 5}, {4, 1, 3, 3}, conv_params(2, 1, 1, 0, 1, 1, 2), false},
      {"kernel1x1", {3, 5, 4, 4}, {7, 5, 1, 1}, conv_params(1, 1, 0, 0, 1, 1, 1), true},
      {"kernel1x1_stride2", {1, 4, 5, 6}, {3, 4, 1, 1}, conv_params(2, 2, 0, 0, 1, 1, 1), false},
      {"non_square", {2, 3, 8, 11}, {4, 3, 2, 5}, conv_params(1, 2, 1, 2, 2, 1, 1), true},
      {"kernel_equals_input", {2, 2, 3, 4}, {3, 2, 3, 4}, conv_params(1, 1, 0, 0, 1, 1, 1), true},
  };
}

class Conv2dTest : public DeviceTest {};

TEST_P(Conv2dTest, HandComputedTinyConv) {
  EMBER_REQUIRE_KERNEL(conv2d_stub);
  const Tensor x = from_vector<double>({1, 2, 3, 4, 5, 6, 7, 8, 9}, {1, 1, 3, 3}).to(device());
  const Tensor w = ones({1, 1, 2, 2}, {DType::f64, device()});
  Tensor out = conv2d(x, w);
  ASSERT_EQ(out.sizes(), (Shape{1, 1, 2, 2}));
  EXPECT_EQ(out.to_vector<double>(), (std::vector<double>{12, 16, 24, 28}));
  out = conv2d(x, w, from_vector<double>({0.5}, {1}).to(device()));
  EXPECT_EQ(out.to_vector<double>(), (std::vector<double>{12.5, 16.5, 24.5, 28.5}));
  // stride 2, padding 1: windows start at -1 and 1 in each direction.
  out = conv2d(x.to(DType::f32), w.to(DType::f32), Tensor(), conv_params(2, 2, 1, 1, 1, 1, 1));
  ASSERT_EQ(out.sizes(), (Shape{1, 1, 2, 2}));
  EXPECT_EQ(out.to_vector<double>(), (std::vector<double>{1, 5, 11, 28}));
  // dilation 2 with a 2x2 kernel reads the four corners.
  out = conv2d(x, w, Tensor(), conv_params(1, 1, 0, 0, 2, 2, 1));
  ASSERT_EQ(out.sizes(), (Shape{1, 1, 1, 1}));
  EXPECT_EQ(out.to_vector<double>(), (std::vector<double>{1 + 3 + 7 + 9}));
}

TEST_P(Conv2dTest, MatchesDirectConvolution) {
  EMBER_REQUIRE_KERNEL(conv2d_stub);
  for (const ConvConfig& cfg : conv_configs()) {
    SCOPED_TRACE("config " + cfg.name);
    const Conv2dParams p = cfg.p;
    Inputs in{rand_input(cfg.x), rand_input(cfg.w), cfg.bias ? rand_input({cfg.w[0]}) : Tensor()};
    OpCase c{"conv2d", in, [p](const Inputs& t) { return conv2d(t[0], t[1], t[2], p); }};
    c.reference = [p](const Inputs& t) { return conv_ref(t[0], t[1], t[2], p); };
    c.tolerance = conv_tolerance;
    check_op(c, device());
  }
}

TEST_P(Conv2dTest, NonContiguousInputs) {
  EMBER_REQUIRE_KERNEL(conv2d_stub);
  const Conv2dParams p = conv_params(2, 1, 1, 1, 1, 2, 2);
  // x is stored [N, C, W, H] and used transposed; weight stored [O, KH, KW, C/g] and permuted; bias is a slice.
  OpCase c{"conv2d", {rand_input({2, 4, 7, 6}), rand_input({6, 3, 2, 2}), rand_input({12})},
           [p](const Inputs& t) {
             return conv2d(t[0].transpose(2, 3), t[1].permute({0, 3, 1, 2}), t[2].slice(0, 0, 12, 2), p);
           }};
  c.reference = [p](const Inputs& t) {
    return conv_ref(t[0].transpose(2, 3), t[1].permute({0, 3, 1, 2}), t[2].slice(0, 0, 12, 2), p);
  };
  c.tolerance = conv_tolerance;
  check_op(c, device());
  // Strided views straight from the harness (kept non-contiguous in the f64 run).
  OpCase d{"conv2d", {noncontiguous_input({2, 3, 6, 5}), noncontiguous_input({4, 3, 3, 2})},
           [](const Inputs& t) { return conv2d(t[0], t[1], Tensor(), conv_params(1, 1, 1, 0, 1, 1, 1)); }};
  d.reference = [](const Inputs& t) { return conv_ref(t[0], t[1], Tensor(), conv_params(1, 1, 1, 0, 1, 1, 1)); };
  d.tolerance = conv_tolerance;
  check_op(d, device());
}

TEST_P(Conv2dTest, EmptyBatch) {
  EMBER_REQUIRE_KERNEL(conv2d_stub);
  const Tensor out = conv2d(zeros({0, 3, 5, 5}, {DType::f32, device()}), zeros({2, 3, 3, 3}, {DType::f32, device()}));
  EXPECT_EQ(out.sizes(), (Shape{0, 2, 3, 3}));
}

EMBER_INSTANTIATE_DEVICE_TESTS(Conv2dTest);

TEST(Conv2dErrors, ShapesDTypesParamsDevices) {
  const Tensor x = zeros({1, 4, 5, 5});
  const Tensor w = zeros({2, 4, 3, 3});
  // ranks
  EXPECT_THROW(conv2d(zeros({4, 5, 5}), w), ShapeError);
  EXPECT_THROW(conv2d(x, zeros({2, 4, 3})), ShapeError);
  // channels vs weight x groups
  EXPECT_THROW(conv2d(zeros({1, 3, 5, 5}), w), ShapeError);
  EXPECT_THROW(conv2d(x, zeros({2, 4, 3, 3}), Tensor(), conv_params(1, 1, 0, 0, 1, 1, 2)), ShapeError);
  // out channels not divisible by groups
  EXPECT_THROW(conv2d(x, zeros({3, 2, 3, 3}), Tensor(), conv_params(1, 1, 0, 0, 1, 1, 2)), ShapeError);
  // non-positive output size (kernel too big; dilation too big)
  EXPECT_THROW(conv2d(zeros({1, 4, 2, 2}), w), ShapeError);
  EXPECT_THROW(conv2d(x, w, Tensor(), conv_params(1, 1, 0, 0, 3, 1, 1)), ShapeError);
  // bias shape
  EXPECT_THROW(conv2d(x, w, zeros({3})), ShapeError);
  EXPECT_THROW(conv2d(x, w, zeros({2, 1})), ShapeError);
  // dtypes
  EXPECT_THROW(conv2d(x, zeros({2, 4, 3, 3}, {DType::f64})), DTypeError);
  EXPECT_THROW(conv2d(x, w, zeros({2}, {DType::f16})), DTypeError);
  EXPECT_THROW(conv2d(zeros({1, 4, 5, 5}, {DType::i32}), zeros({2, 4, 3, 3}, {DType::i32})), DTypeError);
  // parameters
  EXPECT_THROW(conv2d(x, w, Tensor(), conv_params(0, 1, 0, 0, 1, 1, 1)), ValueError);
  EXPECT_THROW(conv2d(x, w, Tensor(), conv_params(1, 1, -1, 0, 1, 1, 1)), ValueError);
  EXPECT_THROW(conv2d(x, w, Tensor(), conv_params(1, 1, 0, 0, 0, 1, 1)), ValueError);
  EXPECT_THROW(conv2d(x, w, Tensor(), conv_params(1, 1, 0, 0, 1, 1, 0)), ValueError);
  // devices
  EXPECT_THROW(conv2d(x, zeros({2, 4, 3, 3}, {DType::f32, Device::meta()})), DeviceError);
  EXPECT_THROW(conv2d(x, w, zeros({2}, {DType::f32, Device::meta()})), DeviceError);
  // the message names the op and the shapes
  try {
    conv2d(zeros({1, 3, 5, 5}), w);
  } catch (const ShapeError& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("conv2d"), std::string::npos) << msg;
    EXPECT_NE(msg.find("[1, 3, 5, 5]"), std::string::npos) << msg;
  }
}

TEST(Conv2dErrors, MetaTensorsGiveShapesOnly) {
  const Tensor out = conv2d(empty({8, 3, 32, 32}, {DType::f32, Device::meta()}),
                            empty({16, 3, 5, 5}, {DType::f32, Device::meta()}), Tensor(),
                            conv_params(2, 2, 2, 2, 1, 1, 1));
  EXPECT_EQ(out.sizes(), (Shape{8, 16, 16, 16}));
  EXPECT_TRUE(out.device().is_meta());
}

// ---- pooling --------------------------------------------------------------------------------------------------

// Naive max pool: padded positions are -inf (never chosen); ties keep the first in row-major window order; NaN wins.
void max_pool_ref(const Tensor& x, const Pool2dParams& p, Tensor* out, Tensor* idx) {
  const std::vector<double> xv = x.to_vector<double>();
  const int64_t N = x.size(0), C = x.size(1), H = x.size(2), W = x.size(3);
  const int64_t OH = (H + 2 * p.padding[0] - p.kernel[0]) / p.stride[0] + 1;
  const int64_t OW = (W + 2 * p.padding[1] - p.kernel[1]) / p.stride[1] + 1;
  std::vector<double> ov;
  std::vector<int64_t> iv;
  for (int64_t nc = 0; nc < N * C; ++nc)
    for (int64_t y = 0; y < OH; ++y)
      for (int64_t z = 0; z < OW; ++z) {
        double best = -std::numeric_limits<double>::infinity();
        int64_t bi = -1;
        for (int64_t i = 0; i < p.kernel[0]; ++i)
          for (int64_t j = 0; j < p.kernel[1]; ++j) {
            const int64_t iy = y * p.stride[0] - p.padding[0] + i, ix = z * p.stride[1] - p.padding[1] + j;
            if (iy < 0 || iy >= H || ix < 0 || ix >= W) continue;
            const double v = xv[static_cast<size_t>((nc * H + iy) * W + ix)];
            if (bi < 0 || v > best || std::isnan(v)) {
              best = v;
              bi = iy * W + ix;
            }
          }
        ov.push_back(best);
        iv.push_back(bi);
      }
  if (out) *out = from_vector(ov, {N, C, OH, OW});
  if (idx) *idx = from_vector(iv, {N, C, OH, OW});
}

Tensor avg_pool_ref(const Tensor& x, const Pool2dParams& p) {
  const std::vector<double> xv = x.to_vector<double>();
  const int64_t N = x.size(0), C = x.size(1), H = x.size(2), W = x.size(3);
  const int64_t OH = (H + 2 * p.padding[0] - p.kernel[0]) / p.stride[0] + 1;
  const int64_t OW = (W + 2 * p.padding[1] - p.kernel[1]) / p.stride[1] + 1;
  std::vector<double> ov;
  for (int64_t nc = 0; nc < N * C; ++nc)
    for (int64_t y = 0; y < OH; ++y)
      for (int64_t z = 0; z < OW; ++z) {
        double s = 0.0;
        int64_t valid = 0;
        for (int64_t i = 0; i < p.kernel[0]; ++i)
          for (int64_t j = 0; j < p.kernel[1]; ++j) {
            const int64_t iy = y * p.stride[0] - p.padding[0] + i, ix = z * p.stride[1] - p.padding[1] + j;
            if (iy < 0 || iy >= H || ix < 0 || ix >= W) continue;
            s += xv[static_cast<size_t>((nc * H + iy) * W + ix)];
            ++valid;
          }
        // Without ceil mode every window lies inside the padded input, so count_include_pad divides by kh*kw.
        ov.push_back(s / static_cast<double>(p.count_include_pad ? p.kernel[0] * p.kernel[1] : valid));
      }
  return from_vector(ov, {N, C, OH, OW});
}

std::vector<std::pair<Shape, Pool2dParams>> pool_configs() {
  return {
      {{2, 3, 8, 8}, pool_params(2, 2, 2, 2, 0, 0)},
      {{2, 2, 7, 5}, pool_params(2, 2, 2, 2, 0, 0)},   // odd sizes: last row/column dropped
      {{1, 3, 7, 7}, pool_params(3, 3, 2, 2, 1, 1)},
      {{2, 2, 6, 5}, pool_params(3, 3, 1, 1, 1, 1)},
      {{1, 2, 6, 9}, pool_params(2, 3, 1, 2, 1, 1)},   // non-square kernel and stride
      {{1, 1, 5, 6}, pool_params(4, 2, 3, 1, 2, 0)},
      {{2, 2, 4, 4}, pool_params(1, 1, 1, 1, 0, 0)},
  };
}

class MaxPool2dTest : public DeviceTest {};

TEST_P(MaxPool2dTest, HandCheckedValuesAndIndices) {
  EMBER_REQUIRE_KERNEL(max_pool2d_stub);
  const Tensor x = from_vector<double>({1, 5, 2, 0,  //
                                        3, 4, 8, 7,  //
                                        9, 6, 1, 1,  //
                                        0, 2, 3, 10},
                                       {1, 1, 4, 4})
                       .to(device());
  const MaxPoolResult r = max_pool2d_with_indices(x, pool_params(2, 2, 2, 2, 0, 0));
  ASSERT_EQ(r.out.sizes(), (Shape{1, 1, 2, 2}));
  EXPECT_EQ(r.indices.dtype(), DType::i64);
  EXPECT_EQ(r.out.to_vector<double>(), (std::vector<double>{5, 8, 9, 10}));
  EXPECT_EQ(r.indices.to_vector<int64_t>(), (std::vector<int64_t>{1, 6, 8, 15}));
  EXPECT_EQ(max_pool2d(x, pool_params(2, 2, 2, 2, 0, 0)).to_vector<double>(), (std::vector<double>{5, 8, 9, 10}));
}

TEST_P(MaxPool2dTest, PaddingIsMinusInfinity) {
  EMBER_REQUIRE_KERNEL(max_pool2d_stub);
  // All values negative: a zero padding would win; -inf padding never does.
  const Tensor x = from_vector<double>({-1, -2, -3, -4, -5, -6, -7, -8, -9}, {1, 1, 3, 3}).to(device());
  const MaxPoolResult r = max_pool2d_with_indices(x, pool_params(2, 2, 1, 1, 1, 1));
  ASSERT_EQ(r.out.sizes(), (Shape{1, 1, 4, 4}));
  EXPECT_EQ(r.out.to_vector<double>(),
            (std::vector<double>{-1, -1, -2, -3, -1, -1, -2, -3, -4, -4, -5, -6, -7, -7, -8, -9}));
  EXPECT_EQ(r.indices.to_vector<int64_t>(),
            (std::vector<int64_t>{0, 0, 1, 2, 0, 0, 1, 2, 3, 3, 4, 5, 6, 6, 7, 8}));
}

TEST_P(MaxPool2dTest, NaNPropagates) {
  EMBER_REQUIRE_KERNEL(max_pool2d_stub);
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const Tensor x = from_vector<double>({1, nan, 3, 4}, {1, 1, 2, 2}).to(device()).to(DType::f32);
  const MaxPoolResult r = max_pool2d_with_indices(x, pool_params(2, 2, 2, 2, 0, 0));
  EXPECT_TRUE(std::isnan(r.out.item<double>()));
  EXPECT_EQ(r.indices.item<int64_t>(), 1);
}

TEST_P(MaxPool2dTest, NaNsAndTiesEverywhereMatchTheReference) {
  EMBER_REQUIRE_KERNEL(max_pool2d_stub);
  // Values from {0, 1, NaN}: every window has ties and NaNs in all positions, so the first-maximum and last-NaN
  // rules decide the indices (the 2x2 / stride-2 path selects without branches; the general path too).
  const double nan = std::numeric_limits<double>::quiet_NaN();
  std::vector<double> v;
  for (int64_t i = 0; i < 2 * 3 * 8 * 10; ++i) v.push_back(i % 7 == 3 || i % 11 == 5 ? nan : double((i * 5) % 3 / 2));
  const Tensor x = from_vector(v, {2, 3, 8, 10});
  for (const Pool2dParams& p : {pool_params(2, 2, 2, 2, 0, 0), pool_params(3, 3, 1, 1, 1, 1)}) {
    Tensor want_out, want_idx;
    max_pool_ref(x, p, &want_out, &want_idx);
    for (DType dt : {DType::f32, DType::f64, DType::bf16}) {
      SCOPED_TRACE(dtype_name(dt));
      const MaxPoolResult r = max_pool2d_with_indices(x.to(dt).to(device()), p);
      EXPECT_TRUE(allclose(r.out, want_out, {0, 0}));
      EXPECT_EQ(r.indices.to(Device::cpu()).to_vector<int64_t>(), want_idx.to_vector<int64_t>());
    }
  }
}

TEST_P(MaxPool2dTest, MatchesReference) {
  EMBER_REQUIRE_KERNEL(max_pool2d_stub);
  for (const auto& [shape, p] : pool_configs()) {
    SCOPED_TRACE("x " + shape_str(shape) + " kernel " + std::to_string(p.kernel[0]) + "x" +
                 std::to_string(p.kernel[1]) + " stride " + std::to_string(p.stride[0]) + "x" +
                 std::to_string(p.stride[1]) + " padding " + std::to_string(p.padding[0]) + "x" +
                 std::to_string(p.padding[1]));
    const Pool2dParams pp = p;
    OpCase c{"max_pool2d", {rand_input(shape)}, [pp](const Inputs& t) { return max_pool2d(t[0], pp); }};
    c.reference = [pp](const Inputs& t) {
      Tensor out;
      max_pool_ref(t[0], pp, &out, nullptr);
      return out;
    };
    check_op(c, device());
    // Indices: exact, for every dtype (the reference sees the same rounded values, so ties resolve alike).
    OpCase ci{"max_pool2d indices", {rand_input(shape)},
              [pp](const Inputs& t) { return max_pool2d_with_indices(t[0], pp).indices; }};
    ci.reference = [pp](const Inputs& t) {
      Tensor idx;
      max_pool_ref(t[0], pp, nullptr, &idx);
      return idx;
    };
    ci.tolerance = [](DType) { return Tolerance{0.0, 0.0}; };
    check_op(ci, device());
  }
}

TEST_P(MaxPool2dTest, NonContiguousInput) {
  EMBER_REQUIRE_KERNEL(max_pool2d_stub);
  const Pool2dParams p = pool_params(3, 2, 2, 1, 1, 1);
  OpCase c{"max_pool2d", {rand_input({2, 3, 9, 7})},
           [p](const Inputs& t) { return max_pool2d_with_indices(t[0].transpose(2, 3), p).out; }};
  c.reference = [p](const Inputs& t) {
    Tensor out;
    max_pool_ref(t[0].transpose(2, 3), p, &out, nullptr);
    return out;
  };
  check_op(c, device());
  OpCase ci{"max_pool2d indices", {noncontiguous_input({2, 3, 6, 8})},
            [p](const Inputs& t) { return max_pool2d_with_indices(t[0], p).indices; }};
  ci.reference = [p](const Inputs& t) {
    Tensor idx;
    max_pool_ref(t[0], p, nullptr, &idx);
    return idx;
  };
  ci.tolerance = [](DType) { return Tolerance{0.0, 0.0}; };
  check_op(ci, device());
}

EMBER_INSTANTIATE_DEVICE_TESTS(MaxPool2dTest);

class AvgPool2dTest : public DeviceTest {};

TEST_P(AvgPool2dTest, HandCheckedCountIncludePad) {
  EMBER_REQUIRE_KERNEL(avg_pool2d_stub);
  const Tensor x = from_vector<double>({1, 2, 3, 4}, {1, 1, 2, 2}).to(device());
  const Tensor with_pad = avg_pool2d(x, pool_params(2, 2, 1, 1, 1, 1, true));
  ASSERT_EQ(with_pad.sizes(), (Shape{1, 1, 3, 3}));
  EXPECT_EQ(with_pad.to_vector<double>(),
            (std::vector<double>{0.25, 0.75, 0.5, 1.0, 2.5, 1.5, 0.75, 1.75, 1.0}));
  const Tensor without = avg_pool2d(x, pool_params(2, 2, 1, 1, 1, 1, false));
  EXPECT_EQ(without.to_vector<double>(), (std::vector<double>{1, 1.5, 2, 2, 2.5, 3, 3, 3.5, 4}));
  const Tensor plain = avg_pool2d(x, pool_params(2, 2, 2, 2, 0, 0));
  EXPECT_EQ(plain.to_vector<double>(), (std::vector<double>{2.5}));
}

TEST_P(AvgPool2dTest, MatchesReference) {
  EMBER_REQUIRE_KERNEL(avg_pool2d_stub);
  for (bool include_pad : {true, false}) {
    for (auto [shape, p] : pool_configs()) {
      p.count_include_pad = include_pad;
      SCOPED_TRACE("x " + shape_str(shape) + " kernel " + std::to_string(p.kernel[0]) + "x" +
                   std::to_string(p.kernel[1]) + " padding " + std::to_string(p.padding[0]) + "x" +
                   std::to_string(p.padding[1]) + " count_include_pad " + std::to_string(include_pad));
      const Pool2dParams pp = p;
      OpCase c{"avg_pool2d", {rand_input(shape)}, [pp](const Inputs& t) { return avg_pool2d(t[0], pp); }};
      c.reference = [pp](const Inputs& t) { return avg_pool_ref(t[0], pp); };
      check_op(c, device());
    }
  }
}

TEST_P(AvgPool2dTest, NonContiguousInput) {
  EMBER_REQUIRE_KERNEL(avg_pool2d_stub);
  const Pool2dParams p = pool_params(3, 3, 2, 2, 1, 1, false);
  OpCase c{"avg_pool2d", {noncontiguous_input({2, 3, 7, 6})}, [p](const Inputs& t) { return avg_pool2d(t[0], p); }};
  c.reference = [p](const Inputs& t) { return avg_pool_ref(t[0], p); };
  check_op(c, device());
  OpCase d{"avg_pool2d", {rand_input({2, 3, 6, 7})},
           [p](const Inputs& t) { return avg_pool2d(t[0].transpose(2, 3), p); }};
  d.reference = [p](const Inputs& t) { return avg_pool_ref(t[0].transpose(2, 3), p); };
  check_op(d, device());
}

EMBER_INSTANTIATE_DEVICE_TESTS(AvgPool2dTest);

TEST(Pool2dErrors, ShapesDTypesParams) {
  const Tensor x = zeros({1, 2, 6, 6});
  for (int kind = 0; kind < 2; ++kind) {
    auto pool = [kind](const Tensor& t, const Pool2dParams& p) {
      return kind == 0 ? max_pool2d_with_indices(t, p).out : avg_pool2d(t, p);
    };
    SCOPED_TRACE(kind == 0 ? "max_pool2d" : "avg_pool2d");
    EXPECT_THROW(pool(zeros({2, 6, 6}), pool_params(2, 2, 2, 2, 0, 0)), ShapeError);
    EXPECT_THROW(pool(zeros({1, 1, 2, 6, 6}), pool_params(2, 2, 2, 2, 0, 0)), ShapeError);
    EXPECT_THROW(pool(zeros({1, 2, 2, 6}), pool_params(3, 3, 1, 1, 0, 0)), ShapeError);  // output height 0
    EXPECT_THROW(pool(x, pool_params(3, 3, 1, 1, 2, 0)), ValueError);  // padding more than half the kernel
    EXPECT_THROW(pool(x, pool_params(2, 2, 1, 1, 0, 2)), ValueError);
    EXPECT_THROW(pool(x, pool_params(2, 2, 1, 1, -1, 0)), ValueError);
    EXPECT_THROW(pool(x, pool_params(0, 2, 1, 1, 0, 0)), ValueError);
    EXPECT_THROW(pool(x, pool_params(2, 2, 0, 1, 0, 0)), ValueError);
    EXPECT_THROW(pool(zeros({1, 2, 6, 6}, {DType::i64}), pool_params(2, 2, 2, 2, 0, 0)), DTypeError);
  }
  EXPECT_THROW(max_pool2d(zeros({2, 6, 6}), pool_params(2, 2, 2, 2, 0, 0)), ShapeError);
  EXPECT_THROW(max_pool2d(zeros({1, 2, 6, 6}, {DType::i32}), pool_params(2, 2, 2, 2, 0, 0)), DTypeError);
  const Tensor meta = empty({4, 3, 9, 9}, {DType::f32, Device::meta()});
  const MaxPoolResult r = max_pool2d_with_indices(meta, pool_params(3, 3, 2, 2, 1, 1));
  EXPECT_EQ(r.out.sizes(), (Shape{4, 3, 5, 5}));
  EXPECT_EQ(r.indices.sizes(), (Shape{4, 3, 5, 5}));
  EXPECT_EQ(avg_pool2d(meta, pool_params(2, 2, 2, 2, 0, 0)).sizes(), (Shape{4, 3, 4, 4}));
}

}  // namespace
}  // namespace ember::testing

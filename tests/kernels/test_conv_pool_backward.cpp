// Tests of conv2d_backward_input / _weight, max_pool2d_backward and avg_pool2d_backward against naive float64
// loops written here (the transposed 7-loop convolution, window scatter loops) and against central finite
// differences of the forward ops in float64, over stride, padding, dilation, groups, overlapping pooling windows,
// count_include_pad, non-contiguous inputs, hand-computed cases and every error path.
#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include "tests/harness/op_harness.h"
#include "tests/kernels/conv_pool_test_util.h"

namespace ember::testing {
namespace {


size_t at(int64_t i) { return static_cast<size_t>(i); }

// ---- convolution ------------------------------------------------------------------------------------------------

// Sums of up to a few hundred products accumulated in f32 (grad_w sums over images and output positions).
Tolerance conv_backward_tolerance(DType dt) {
  Tolerance t = default_tolerance(dt);
  if (dt == DType::f32) t.atol = 2e-5;
  return t;
}

struct ConvConfig {
  std::string name;
  Shape x, w;
  Conv2dParams p;
};

std::vector<ConvConfig> conv_configs() {
  return {
      {"stride2_padding1_dilation2_groups2", {2, 4, 9, 8}, {6, 2, 3, 3}, conv_params(2, 2, 1, 1, 2, 2, 2)},
      {"basic", {2, 3, 6, 5}, {4, 3, 3, 3}, conv_params(1, 1, 0, 0, 1, 1, 1)},
      {"depthwise_padding1", {2, 3, 6, 5}, {3, 1, 3, 3}, conv_params(1, 1, 1, 1, 1, 1, 3)},
      {"one_image_multiplier2", {1, 2, 5, 5}, {4, 1, 3, 3}, conv_params(2, 1, 1, 0, 1, 1, 2)},
      {"non_square", {2, 3, 8, 11}, {4, 3, 2, 5}, conv_params(1, 2, 1, 2, 2, 1, 1)},
      {"kernel1x1_stride2_skips_inputs", {2, 4, 5, 6}, {3, 4, 1, 1}, conv_params(2, 2, 0, 0, 1, 1, 1)},
      {"stride3_larger_than_kernel", {1, 2, 10, 9}, {2, 2, 2, 2}, conv_params(3, 3, 1, 0, 1, 1, 1)},
  };
}

class Conv2dBackwardTest : public DeviceTest {};

TEST_P(Conv2dBackwardTest, MatchesDirectLoops) {
  EMBER_REQUIRE_KERNEL(conv2d_backward_stub);
  for (const ConvConfig& cfg : conv_configs()) {
    SCOPED_TRACE("config " + cfg.name);
    const Conv2dParams p = cfg.p;
    const Shape xs = cfg.x, ws = cfg.w, os = conv_out_shape(xs, ws, p);
    OpCase ci{"conv2d_backward_input", {rand_input(os), rand_input(ws)},
              [xs, p](const Inputs& t) { return ops::conv2d_backward_input(t[0], t[1], xs, p); }};
    ci.reference = [xs, p](const Inputs& t) { return conv_grad_x_ref(t[0], t[1], xs, p); };
    ci.tolerance = conv_backward_tolerance;
    check_op(ci, device());
    OpCase cw{"conv2d_backward_weight", {rand_input(os), rand_input(xs)},
              [ws, p](const Inputs& t) { return ops::conv2d_backward_weight(t[0], t[1], ws, p); }};
    cw.reference = [ws, p](const Inputs& t) { return conv_grad_w_ref(t[0], t[1], ws, p); };
    cw.tolerance = conv_backward_tolerance;
    check_op(cw, device());
  }
}

TEST_P(Conv2dBackwardTest, NonContiguousInputs) {
  EMBER_REQUIRE_KERNEL(conv2d_backward_stub);
  const Conv2dParams p = conv_params(2, 2, 1, 1, 2, 2, 2);
  const Shape xs{2, 4, 9, 8}, ws{6, 2, 3, 3}, os = conv_out_shape(xs, ws, p);
  // grad_out strided on every dim; weight stored [O, KH, KW, C/g] and permuted; x stored [N, C, W, H], transposed.
  OpCase ci{"conv2d_backward_input", {noncontiguous_input(os), rand_input({6, 3, 3, 2})},
            [xs, p](const Inputs& t) {
              return ops::conv2d_backward_input(t[0], t[1].permute({0, 3, 1, 2}), xs, p);
            }};
  ci.reference = [xs, p](const Inputs& t) { return conv_grad_x_ref(t[0], t[1].permute({0, 3, 1, 2}), xs, p); };
  ci.tolerance = conv_backward_tolerance;
  check_op(ci, device());
  OpCase cw{"conv2d_backward_weight", {noncontiguous_input(os), rand_input({2, 4, 8, 9})},
            [ws, p](const Inputs& t) { return ops::conv2d_backward_weight(t[0], t[1].transpose(2, 3), ws, p); }};
  cw.reference = [ws, p](const Inputs& t) { return conv_grad_w_ref(t[0], t[1].transpose(2, 3), ws, p); };
  cw.tolerance = conv_backward_tolerance;
  check_op(cw, device());
  // grad_out whose rows are evenly strided but whose channels are not adjacent (a channel slice).
  OpCase cs{"conv2d_backward_weight", {rand_input({os[0], 2 * os[1], os[2], os[3]}), noncontiguous_input(xs)},
            [ws, p](const Inputs& t) { return ops::conv2d_backward_weight(t[0].slice(1, 0, 12, 2), t[1], ws, p); }};
  cs.reference = [ws, p](const Inputs& t) { return conv_grad_w_ref(t[0].slice(1, 0, 12, 2), t[1], ws, p); };
  cs.tolerance = conv_backward_tolerance;
  check_op(cs, device());
}

TEST_P(Conv2dBackwardTest, HandComputedTiny) {
  EMBER_REQUIRE_KERNEL(conv2d_backward_stub);
  // x 3x3, all-ones 2x2 kernel, grad_out 2x2 = [1 2; 3 4]: each input element collects the grads of the windows
  // covering it, and each weight element the sum of the x elements it met weighted by grad_out.
  const Tensor go = from_vector<double>({1, 2, 3, 4}, {1, 1, 2, 2}).to(device());
  const Tensor w = ones({1, 1, 2, 2}, {DType::f64, device()});
  EXPECT_EQ(ops::conv2d_backward_input(go, w, {1, 1, 3, 3}).to_vector<double>(),
            (std::vector<double>{1, 3, 2, 4, 10, 6, 3, 7, 4}));
  const Tensor x = from_vector<double>({1, 2, 3, 4, 5, 6, 7, 8, 9}, {1, 1, 3, 3}).to(device());
  // gw[i, j] = sum_{y,z} go[y, z] * x[y + i, z + j]
  EXPECT_EQ(ops::conv2d_backward_weight(go, x, {1, 1, 2, 2}).to_vector<double>(),
            (std::vector<double>{37, 47, 67, 77}));
}

// L(x, w) = sum(conv2d(x, w) * G) is linear in each argument, so its central differences are exact up to rounding:
// dL/dx and dL/dw from the backward ops must match them to ~1e-9.
TEST_P(Conv2dBackwardTest, MatchesFiniteDifferencesOfForward) {
  EMBER_REQUIRE_KERNEL(conv2d_backward_stub);
  EMBER_REQUIRE_KERNEL(conv2d_stub);
  const double h = 1e-6;
  const Conv2dParams p = conv_params(2, 2, 1, 1, 2, 2, 2);
  const Shape xs{2, 2, 5, 6}, ws{4, 1, 3, 2}, os = conv_out_shape(xs, ws, p);
  const std::vector<double> xv = rand_input(xs).to_vector<double>(), wv = rand_input(ws).to_vector<double>();
  const std::vector<double> gv = rand_input(os).to_vector<double>();
  auto loss = [&](const std::vector<double>& xx, const std::vector<double>& ww) {
    const std::vector<double> out =
        ops::conv2d(from_vector(xx, xs).to(device()), from_vector(ww, ws).to(device()), Tensor(), p)
            .to_vector<double>();
    double s = 0.0;
    for (size_t i = 0; i < out.size(); ++i) s += out[i] * gv[i];
    return s;
  };
  std::vector<double> fd_x(xv.size()), fd_w(wv.size());
  for (size_t k = 0; k < xv.size(); ++k) {
    std::vector<double> xp = xv, xm = xv;
    xp[k] += h;
    xm[k] -= h;
    fd_x[k] = (loss(xp, wv) - loss(xm, wv)) / (2 * h);
  }
  for (size_t k = 0; k < wv.size(); ++k) {
    std::vector<double> wp = wv, wm = wv;
    wp[k] += h;
    wm[k] -= h;
    fd_w[k] = (loss(xv, wp) - loss(xv, wm)) / (2 * h);
  }
  const Tensor g = from_vector(gv, os).to(device());
  EXPECT_TRUE(allclose(ops::conv2d_backward_input(g, from_vector(wv, ws).to(device()), xs, p), from_vector(fd_x, xs),
                       Tolerance{1e-6, 1e-6}));
  EXPECT_TRUE(allclose(ops::conv2d_backward_weight(g, from_vector(xv, xs).to(device()), ws, p),
                       from_vector(fd_w, ws), Tolerance{1e-6, 1e-6}));
}

TEST_P(Conv2dBackwardTest, EmptyBatchGivesZeroWeightGrad) {
  EMBER_REQUIRE_KERNEL(conv2d_backward_stub);
  const Tensor go = zeros({0, 2, 3, 3}, {DType::f32, device()});
  const Tensor gw = ops::conv2d_backward_weight(go, zeros({0, 3, 5, 5}, {DType::f32, device()}), {2, 3, 3, 3});
  EXPECT_EQ(gw.sizes(), (Shape{2, 3, 3, 3}));
  EXPECT_EQ(gw.to_vector<double>(), std::vector<double>(54, 0.0));
  const Tensor gx = ops::conv2d_backward_input(go, zeros({2, 3, 3, 3}, {DType::f32, device()}), {0, 3, 5, 5});
  EXPECT_EQ(gx.sizes(), (Shape{0, 3, 5, 5}));
}

EMBER_INSTANTIATE_DEVICE_TESTS(Conv2dBackwardTest);

TEST(Conv2dBackwardErrors, ShapesDTypesParamsDevices) {
  const Shape xs{1, 4, 5, 5}, ws{2, 4, 3, 3};
  const Tensor go = zeros({1, 2, 3, 3}), w = zeros(ws), x = zeros(xs);
  // grad_out not of the forward output's shape
  EXPECT_THROW(ops::conv2d_backward_input(zeros({1, 2, 3, 4}), w, xs), ShapeError);
  EXPECT_THROW(ops::conv2d_backward_weight(zeros({1, 3, 3, 3}), x, ws), ShapeError);
  EXPECT_THROW(ops::conv2d_backward_input(zeros({2, 3, 3}), w, xs), ShapeError);
  // ranks, channels and groups
  EXPECT_THROW(ops::conv2d_backward_input(go, w, {4, 5, 5}), ShapeError);
  EXPECT_THROW(ops::conv2d_backward_input(go, zeros({2, 4, 3}), xs), ShapeError);
  EXPECT_THROW(ops::conv2d_backward_weight(go, zeros({4, 5, 5}), ws), ShapeError);
  EXPECT_THROW(ops::conv2d_backward_weight(go, x, {2, 4, 3}), ShapeError);
  EXPECT_THROW(ops::conv2d_backward_input(go, zeros({2, 3, 3, 3}), xs), ShapeError);
  EXPECT_THROW(ops::conv2d_backward_input(go, zeros({2, 2, 3, 3}), xs, conv_params(1, 1, 0, 0, 1, 1, 3)),
               ShapeError);
  EXPECT_THROW(ops::conv2d_backward_input(zeros({1, 2, 1, 1}), w, {1, 4, 2, 2}), ShapeError);  // input too small
  // dtypes
  EXPECT_THROW(ops::conv2d_backward_input(go, zeros(ws, {DType::f64}), xs), DTypeError);
  EXPECT_THROW(ops::conv2d_backward_weight(go.to(DType::f16), x, ws), DTypeError);
  EXPECT_THROW(ops::conv2d_backward_input(zeros({1, 2, 3, 3}, {DType::i32}), zeros(ws, {DType::i32}), xs), DTypeError);
  // parameters
  EXPECT_THROW(ops::conv2d_backward_input(go, w, xs, conv_params(0, 1, 0, 0, 1, 1, 1)), ValueError);
  EXPECT_THROW(ops::conv2d_backward_weight(go, x, ws, conv_params(1, 1, -1, 0, 1, 1, 1)), ValueError);
  EXPECT_THROW(ops::conv2d_backward_weight(go, x, ws, conv_params(1, 1, 0, 0, 1, 0, 1)), ValueError);
  EXPECT_THROW(ops::conv2d_backward_input(go, w, xs, conv_params(1, 1, 0, 0, 1, 1, 0)), ValueError);
  // devices, undefined tensors
  EXPECT_THROW(ops::conv2d_backward_input(go, zeros(ws, {DType::f32, Device::meta()}), xs), DeviceError);
  EXPECT_THROW(ops::conv2d_backward_weight(go, zeros(xs, {DType::f32, Device::meta()}), ws), DeviceError);
  EXPECT_THROW(ops::conv2d_backward_input(Tensor(), w, xs), ValueError);
  try {
    ops::conv2d_backward_weight(zeros({1, 2, 3, 4}), x, ws);
    ADD_FAILURE() << "no error";
  } catch (const ShapeError& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("conv2d_backward_weight"), std::string::npos) << msg;
    EXPECT_NE(msg.find("[1, 2, 3, 4]"), std::string::npos) << msg;
  }
  // meta tensors: shapes only
  const Tensor mg = empty({8, 16, 16, 16}, {DType::f16, Device::meta()});
  const Tensor gx = ops::conv2d_backward_input(mg, empty({16, 3, 5, 5}, {DType::f16, Device::meta()}),
                                               {8, 3, 32, 32}, conv_params(2, 2, 2, 2, 1, 1, 1));
  EXPECT_EQ(gx.sizes(), (Shape{8, 3, 32, 32}));
  EXPECT_TRUE(gx.device().is_meta());
  const Tensor gw = ops::conv2d_backward_weight(mg, empty({8, 3, 32, 32}, {DType::f16, Device::meta()}),
                                                {16, 3, 5, 5}, conv_params(2, 2, 2, 2, 1, 1, 1));
  EXPECT_EQ(gw.sizes(), (Shape{16, 3, 5, 5}));
}

// Note [Kernel workspace] (conv_pool.cpp): the backward's column matrices and f32 accumulators come from the host
// allocator, so the peak during the call covers them, and all of it is returned when the call ends.
TEST(Conv2dBackwardWorkspace, ComesFromTheHostAllocatorAndIsReturned) {
  const Conv2dParams p = conv_params(1, 1, 1, 1, 1, 1, 2);
  const Shape xs{2, 6, 10, 9}, ws{4, 3, 3, 3}, os = conv_out_shape(xs, ws, p);
  const int64_t col_bytes = ws[1] * ws[2] * ws[3] * os[2] * os[3] * 4;  // one (image, group) column matrix, f32
  for (DType dt : {DType::f32, DType::bf16}) {
    SCOPED_TRACE(dtype_name(dt));
    const Tensor go = rand_input(os).to(dt), w = rand_input(ws).to(dt), x = rand_input(xs).to(dt);
    memory::Allocator& alloc = allocator_for(Device::cpu());
    for (int which = 0; which < 2; ++which) {
      alloc.reset_peak_stats();
      const int64_t before = alloc.stats().requested_bytes;
      {
        const Tensor g =
            which == 0 ? ops::conv2d_backward_input(go, w, xs, p) : ops::conv2d_backward_weight(go, x, ws, p);
        EXPECT_GE(alloc.stats().peak_requested_bytes - before, g.nbytes() + col_bytes);
        EXPECT_EQ(alloc.stats().requested_bytes - before, g.nbytes()) << "workspace still live after the call";
      }
      EXPECT_EQ(alloc.stats().requested_bytes, before);
    }
  }
}

// ---- pooling ----------------------------------------------------------------------------------------------------

Shape pool_out_shape(const Shape& x, const Pool2dParams& p) {
  return {x[0], x[1], (x[2] + 2 * p.padding[0] - p.kernel[0]) / p.stride[0] + 1,
          (x[3] + 2 * p.padding[1] - p.kernel[1]) / p.stride[1] + 1};
}

// grad_in[n, c, idx] += grad_out[n, c, y, z] with idx = indices[n, c, y, z] (flat within the plane).
Tensor max_pool_backward_ref(const Tensor& gout, const Tensor& indices, const Shape& xs) {
  const std::vector<double> gv = gout.to_vector<double>();
  const std::vector<int64_t> iv = indices.to_vector<int64_t>();
  const int64_t planes = xs[0] * xs[1], hw = xs[2] * xs[3], per = gout.size(2) * gout.size(3);
  std::vector<double> gi(at(planes * hw), 0.0);
  for (int64_t pl = 0; pl < planes; ++pl)
    for (int64_t k = 0; k < per; ++k) gi[at(pl * hw + iv[at(pl * per + k)])] += gv[at(pl * per + k)];
  return from_vector(gi, xs);
}

// Each window's gradient spread evenly over its in-bounds inputs: divided by the number of window positions inside
// the zero-padded input (count_include_pad) or inside the input itself.
Tensor avg_pool_backward_ref(const Tensor& gout, const Shape& xs, const Pool2dParams& p) {
  const std::vector<double> gv = gout.to_vector<double>();
  const int64_t H = xs[2], W = xs[3], OH = gout.size(2), OW = gout.size(3);
  std::vector<double> gi(at(numel_of(xs)), 0.0);
  for (int64_t pl = 0; pl < xs[0] * xs[1]; ++pl)
    for (int64_t y = 0; y < OH; ++y)
      for (int64_t z = 0; z < OW; ++z) {
        int64_t padded = 0, inside = 0;
        for (int64_t i = 0; i < p.kernel[0]; ++i)
          for (int64_t j = 0; j < p.kernel[1]; ++j) {
            const int64_t iy = y * p.stride[0] - p.padding[0] + i, ix = z * p.stride[1] - p.padding[1] + j;
            padded += iy >= -p.padding[0] && iy < H + p.padding[0] && ix >= -p.padding[1] && ix < W + p.padding[1];
            inside += iy >= 0 && iy < H && ix >= 0 && ix < W;
          }
        const double divisor = static_cast<double>(p.count_include_pad ? padded : inside);
        const double share = gv[at((pl * OH + y) * OW + z)] / divisor;
        for (int64_t i = 0; i < p.kernel[0]; ++i)
          for (int64_t j = 0; j < p.kernel[1]; ++j) {
            const int64_t iy = y * p.stride[0] - p.padding[0] + i, ix = z * p.stride[1] - p.padding[1] + j;
            if (iy >= 0 && iy < H && ix >= 0 && ix < W) gi[at((pl * H + iy) * W + ix)] += share;
          }
      }
  return from_vector(gi, xs);
}

std::vector<std::pair<Shape, Pool2dParams>> pool_configs() {
  return {
      {{2, 3, 8, 8}, pool_params(2, 2, 2, 2, 0, 0)},
      {{1, 3, 7, 7}, pool_params(3, 3, 2, 2, 1, 1)},  // overlapping windows, padding
      {{2, 2, 9, 6}, pool_params(3, 3, 2, 2, 0, 0)},  // overlapping windows, odd sizes
      {{2, 2, 6, 5}, pool_params(3, 3, 1, 1, 1, 1)},
      {{1, 2, 6, 9}, pool_params(2, 3, 1, 2, 1, 1)},  // non-square kernel and stride
      {{1, 1, 5, 6}, pool_params(4, 2, 3, 1, 2, 0)},
      {{2, 2, 7, 5}, pool_params(1, 1, 2, 2, 0, 0)},  // stride > kernel: some inputs get no gradient
  };
}

std::string pool_str(const Shape& s, const Pool2dParams& p) {
  return "x " + shape_str(s) + " kernel " + std::to_string(p.kernel[0]) + "x" + std::to_string(p.kernel[1]) +
         " stride " + std::to_string(p.stride[0]) + "x" + std::to_string(p.stride[1]) + " padding " +
         std::to_string(p.padding[0]) + "x" + std::to_string(p.padding[1]) + " count_include_pad " +
         std::to_string(p.count_include_pad);
}

class MaxPool2dBackwardTest : public DeviceTest {};

TEST_P(MaxPool2dBackwardTest, MatchesScatterOfForwardIndices) {
  EMBER_REQUIRE_KERNEL(max_pool2d_backward_stub);
  for (const auto& [xs, p] : pool_configs()) {
    SCOPED_TRACE(pool_str(xs, p));
    const Shape shape = xs;
    const Tensor indices = ops::max_pool2d_with_indices(rand_input(xs), p).indices;
    OpCase c{"max_pool2d_backward", {rand_input(pool_out_shape(xs, p)), indices},
             [shape](const Inputs& t) { return ops::max_pool2d_backward(t[0], t[1], shape); }};
    c.reference = [shape](const Inputs& t) { return max_pool_backward_ref(t[0], t[1], shape); };
    c.keep_dtype_inputs = {1};
    check_op(c, device());
  }
}

TEST_P(MaxPool2dBackwardTest, RepeatedIndicesAccumulateNonContiguous) {
  EMBER_REQUIRE_KERNEL(max_pool2d_backward_stub);
  // Random indices into a 3x4 plane from a 5x6 grad_out: every input element is hit several times. grad_out is
  // strided on every dim and the indices are a transposed view.
  const Shape xs{2, 3, 3, 4};
  OpCase c{"max_pool2d_backward", {noncontiguous_input({2, 3, 5, 6}), rand_indices({2, 3, 6, 5}, 12)},
           [xs](const Inputs& t) { return ops::max_pool2d_backward(t[0], t[1].transpose(2, 3), xs); }};
  c.reference = [xs](const Inputs& t) { return max_pool_backward_ref(t[0], t[1].transpose(2, 3), xs); };
  c.keep_dtype_inputs = {1};
  check_op(c, device());
}

TEST_P(MaxPool2dBackwardTest, HandCheckedOverlappingWindows) {
  EMBER_REQUIRE_KERNEL(max_pool2d_backward_stub);
  EMBER_REQUIRE_KERNEL(max_pool2d_stub);
  for (DType dt : {DType::f64, DType::f32, DType::f16, DType::bf16}) {
    SCOPED_TRACE(dtype_name(dt));
    // The centre is the maximum of all four 2x2 windows (stride 1): it collects 1 + 2 + 3 + 4.
    const Tensor x = from_vector<double>({1, 2, 3, 4, 9, 5, 6, 7, 8}, {1, 1, 3, 3}).to(device()).to(dt);
    const MaxPoolResult r = ops::max_pool2d_with_indices(x, pool_params(2, 2, 1, 1, 0, 0));
    const Tensor go = from_vector<double>({1, 2, 3, 4}, {1, 1, 2, 2}).to(device()).to(dt);
    const Tensor gi = ops::max_pool2d_backward(go, r.indices, x.sizes());
    EXPECT_EQ(gi.dtype(), dt);
    EXPECT_EQ(gi.to_vector<double>(), (std::vector<double>{0, 0, 0, 0, 10, 0, 0, 0, 0}));
  }
}

// The 2x2 / stride-2 pool writes each plane cell by cell (Note [Max-pool backward by cells]), or, where the cells
// cover the plane exactly, in one loop over the plane (Note [Max-pool backward by planes]): odd sizes leave a row and a
// column no cell covers (they get 0); a plane whose indices leave their cells (here two outputs share an input) is
// scattered instead; a -0 gradient lands as +0, as the scatter-add into zeros gives it.
TEST_P(MaxPool2dBackwardTest, CellWritesAgreeWithTheScatterAdd) {
  EMBER_REQUIRE_KERNEL(max_pool2d_backward_stub);
  EMBER_REQUIRE_KERNEL(max_pool2d_stub);
  for (const Shape& xs : {Shape{2, 3, 7, 9}, Shape{2, 3, 6, 8}}) {
    SCOPED_TRACE(shape_str(xs));
    const Pool2dParams p = pool_params(2, 2, 2, 2, 0, 0);
    const Shape os{2, 3, xs[2] / 2, xs[3] / 2};
    std::vector<int64_t> iv = ops::max_pool2d_with_indices(rand_input(xs), p).indices.to_vector<int64_t>();
    const int64_t per = os[2] * os[3];          // outputs per plane
    iv[at(4 * per + 5)] = iv[at(4 * per + 6)];  // plane 4: outputs 5 and 6 share an input
    std::vector<double> gv = rand_input(os).to_vector<double>();
    gv[0] = -0.0;
    const Tensor indices = from_vector(iv, os).to(device());
    for (DType dt : {DType::f64, DType::f32, DType::f16, DType::bf16}) {
      SCOPED_TRACE(dtype_name(dt));
      const Tensor go = from_vector(gv, os).to(device()).to(dt);
      const Tensor gi = ops::max_pool2d_backward(go, indices, xs);
      const std::vector<double> got = gi.to_vector<double>(),
                                want = max_pool_backward_ref(go, indices, xs).to(dt).to_vector<double>();
      ASSERT_EQ(got.size(), want.size());
      for (size_t k = 0; k < got.size(); ++k) EXPECT_EQ(got[k], want[k]) << "element " << k;  // one rounding each
      if (device().is_cpu()) EXPECT_FALSE(std::signbit(got[at(iv[0])])) << "-0 gradient";
    }
  }
}

// L(x) = sum(max_pool2d(x) * G) with distinct, well-separated values: the argmax does not move under +-h, so the
// central differences equal the gradient up to rounding.
TEST_P(MaxPool2dBackwardTest, MatchesFiniteDifferencesOfForward) {
  EMBER_REQUIRE_KERNEL(max_pool2d_backward_stub);
  EMBER_REQUIRE_KERNEL(max_pool2d_stub);
  const double h = 1e-6;
  const Shape xs{1, 2, 5, 6};
  const Pool2dParams p = pool_params(3, 3, 2, 2, 1, 1);
  std::vector<double> xv(at(numel_of(xs)));
  for (size_t i = 0; i < xv.size(); ++i) xv[i] = std::sin(1.7 * static_cast<double>(i) + 0.3) * 10.0;  // distinct
  const std::vector<double> gv = rand_input(pool_out_shape(xs, p)).to_vector<double>();
  auto loss = [&](const std::vector<double>& xx) {
    const std::vector<double> out = ops::max_pool2d(from_vector(xx, xs).to(device()), p).to_vector<double>();
    double s = 0.0;
    for (size_t i = 0; i < out.size(); ++i) s += out[i] * gv[i];
    return s;
  };
  std::vector<double> fd(xv.size());
  for (size_t k = 0; k < xv.size(); ++k) {
    std::vector<double> xp = xv, xm = xv;
    xp[k] += h;
    xm[k] -= h;
    fd[k] = (loss(xp) - loss(xm)) / (2 * h);
  }
  const Tensor x = from_vector(xv, xs).to(device());
  const Tensor gi =
      ops::max_pool2d_backward(from_vector(gv, pool_out_shape(xs, p)).to(device()),
                               ops::max_pool2d_with_indices(x, p).indices, xs);
  EXPECT_TRUE(allclose(gi, from_vector(fd, xs), Tolerance{1e-6, 1e-6}));
}

// An index outside the input plane is an IndexError naming the first bad output in row-major order, on every device
// and for every floating dtype.
TEST_P(MaxPool2dBackwardTest, OutOfRangeIndexIsIndexError) {
  EMBER_REQUIRE_KERNEL(max_pool2d_backward_stub);
  const Shape xs{1, 2, 6, 6};
  std::vector<int64_t> iv(18, 0);
  iv[9 + 2 * 3 + 1] = 36;  // output (0, 1, 2, 1): one past the 36-element plane
  iv[17] = -1;             // a later bad index
  const Tensor idx = from_vector(iv, {1, 2, 3, 3}).to(device());
  for (DType dt : {DType::f32, DType::f64, DType::f16, DType::bf16}) {
    SCOPED_TRACE(dtype_name(dt));
    const Tensor go = ones({1, 2, 3, 3}, {dt, device()});
    const std::string msg = error_message<IndexError>([&] { ops::max_pool2d_backward(go, idx, xs); });
    EXPECT_NE(msg.find("index 36 at output (0, 1, 2, 1)"), std::string::npos) << msg;
    EXPECT_NE(msg.find("36 elements"), std::string::npos) << msg;
  }
  EXPECT_THROW(ops::max_pool2d_backward(ones({1, 2, 3, 3}, {DType::f32, device()}),
                                        full({1, 2, 3, 3}, -1, {DType::i64, device()}), xs),
               IndexError);
}

EMBER_INSTANTIATE_DEVICE_TESTS(MaxPool2dBackwardTest);

class AvgPool2dBackwardTest : public DeviceTest {};

TEST_P(AvgPool2dBackwardTest, MatchesReference) {
  EMBER_REQUIRE_KERNEL(avg_pool2d_backward_stub);
  for (bool include_pad : {true, false}) {
    for (auto [xs, p] : pool_configs()) {
      p.count_include_pad = include_pad;
      SCOPED_TRACE(pool_str(xs, p));
      const Shape shape = xs;
      const Pool2dParams pp = p;
      OpCase c{"avg_pool2d_backward", {rand_input(pool_out_shape(xs, p))},
               [shape, pp](const Inputs& t) { return ops::avg_pool2d_backward(t[0], shape, pp); }};
      c.reference = [shape, pp](const Inputs& t) { return avg_pool_backward_ref(t[0], shape, pp); };
      check_op(c, device());
    }
  }
}

TEST_P(AvgPool2dBackwardTest, NonContiguousGrad) {
  EMBER_REQUIRE_KERNEL(avg_pool2d_backward_stub);
  for (bool include_pad : {true, false}) {
    const Pool2dParams p = pool_params(3, 3, 2, 2, 1, 1, include_pad);
    const Shape xs{2, 3, 7, 6};
    OpCase c{"avg_pool2d_backward", {noncontiguous_input(pool_out_shape(xs, p))},
             [xs, p](const Inputs& t) { return ops::avg_pool2d_backward(t[0], xs, p); }};
    c.reference = [xs, p](const Inputs& t) { return avg_pool_backward_ref(t[0], xs, p); };
    check_op(c, device());
  }
}

TEST_P(AvgPool2dBackwardTest, HandCheckedDivisors) {
  EMBER_REQUIRE_KERNEL(avg_pool2d_backward_stub);
  // x 2x2, kernel 2, stride 1, padding 1: nine windows, each input element lies in four of them. Counting the
  // padding, every window divides by 4 (each element gets 4 * 1/4 = 1); without it, the corner windows hold one
  // element, the edge windows two and the centre four (each element gets 1 + 1/2 + 1/2 + 1/4 = 2.25).
  const Tensor go = ones({1, 1, 3, 3}, {DType::f32, device()});
  EXPECT_EQ(ops::avg_pool2d_backward(go, {1, 1, 2, 2}, pool_params(2, 2, 1, 1, 1, 1, true)).to_vector<double>(),
            (std::vector<double>{1, 1, 1, 1}));
  EXPECT_EQ(ops::avg_pool2d_backward(go, {1, 1, 2, 2}, pool_params(2, 2, 1, 1, 1, 1, false)).to_vector<double>(),
            (std::vector<double>{2.25, 2.25, 2.25, 2.25}));
}

// avg_pool2d is linear: central differences of L(x) = sum(avg_pool2d(x) * G) are exact up to rounding.
TEST_P(AvgPool2dBackwardTest, MatchesFiniteDifferencesOfForward) {
  EMBER_REQUIRE_KERNEL(avg_pool2d_backward_stub);
  EMBER_REQUIRE_KERNEL(avg_pool2d_stub);
  const double h = 1e-6;
  for (const auto& [xs, p0] : std::vector<std::pair<Shape, Pool2dParams>>{
           {{1, 2, 5, 6}, pool_params(3, 3, 2, 2, 1, 1)}, {{2, 1, 6, 5}, pool_params(2, 3, 1, 2, 1, 1)}}) {
    for (bool include_pad : {true, false}) {
      Pool2dParams p = p0;
      p.count_include_pad = include_pad;
      SCOPED_TRACE(pool_str(xs, p));
      const Shape os = pool_out_shape(xs, p);
      const std::vector<double> xv = rand_input(xs).to_vector<double>(), gv = rand_input(os).to_vector<double>();
      auto loss = [&, &xs = xs](const std::vector<double>& xx) {  // a structured binding, captured by name
        const std::vector<double> out = ops::avg_pool2d(from_vector(xx, xs).to(device()), p).to_vector<double>();
        double s = 0.0;
        for (size_t i = 0; i < out.size(); ++i) s += out[i] * gv[i];
        return s;
      };
      std::vector<double> fd(xv.size());
      for (size_t k = 0; k < xv.size(); ++k) {
        std::vector<double> xp = xv, xm = xv;
        xp[k] += h;
        xm[k] -= h;
        fd[k] = (loss(xp) - loss(xm)) / (2 * h);
      }
      const Tensor gi = ops::avg_pool2d_backward(from_vector(gv, os).to(device()), xs, p);
      EXPECT_TRUE(allclose(gi, from_vector(fd, xs), Tolerance{1e-6, 1e-6}));
    }
  }
}

EMBER_INSTANTIATE_DEVICE_TESTS(AvgPool2dBackwardTest);

TEST(Pool2dBackwardErrors, ShapesDTypesParamsIndices) {
  const Shape xs{1, 2, 6, 6};
  const Pool2dParams p = pool_params(2, 2, 2, 2, 0, 0);
  const Tensor go = zeros({1, 2, 3, 3});
  const Tensor idx = zeros({1, 2, 3, 3}, {DType::i64});
  // max: index dtype and shape, input shape, grad dtype, devices
  EXPECT_THROW(ops::max_pool2d_backward(go, zeros({1, 2, 3, 3}, {DType::i32}), xs), DTypeError);
  EXPECT_THROW(ops::max_pool2d_backward(go, zeros({1, 2, 3, 2}, {DType::i64}), xs), ShapeError);
  EXPECT_THROW(ops::max_pool2d_backward(go, idx, {1, 3, 6, 6}), ShapeError);
  EXPECT_THROW(ops::max_pool2d_backward(go, idx, {2, 6, 6}), ShapeError);
  EXPECT_THROW(ops::max_pool2d_backward(zeros({2, 3, 3}), zeros({2, 3, 3}, {DType::i64}), xs), ShapeError);
  EXPECT_THROW(ops::max_pool2d_backward(zeros({1, 2, 3, 3}, {DType::i64}), idx, xs), DTypeError);
  EXPECT_THROW(ops::max_pool2d_backward(go, zeros({1, 2, 3, 3}, {DType::i64, Device::meta()}), xs), DeviceError);
  // max: indices outside the plane
  EXPECT_THROW(ops::max_pool2d_backward(go, full({1, 2, 3, 3}, 36, {DType::i64}), xs), IndexError);
  EXPECT_THROW(ops::max_pool2d_backward(go, full({1, 2, 3, 3}, -1, {DType::i64}), xs), IndexError);
  // avg: grad_out not of the forward output's shape, bad params, dtype
  EXPECT_THROW(ops::avg_pool2d_backward(zeros({1, 2, 3, 4}), xs, p), ShapeError);
  EXPECT_THROW(ops::avg_pool2d_backward(zeros({1, 3, 3, 3}), xs, p), ShapeError);
  EXPECT_THROW(ops::avg_pool2d_backward(go, {2, 6, 6}, p), ShapeError);
  EXPECT_THROW(ops::avg_pool2d_backward(go, {1, 2, 1, 1}, pool_params(2, 2, 2, 2, 0, 0)), ShapeError);
  EXPECT_THROW(ops::avg_pool2d_backward(go, xs, pool_params(3, 3, 2, 2, 2, 0)), ValueError);
  EXPECT_THROW(ops::avg_pool2d_backward(go, xs, pool_params(0, 2, 2, 2, 0, 0)), ValueError);
  EXPECT_THROW(ops::avg_pool2d_backward(go, xs, pool_params(2, 2, 0, 2, 0, 0)), ValueError);
  EXPECT_THROW(ops::avg_pool2d_backward(zeros({1, 2, 3, 3}, {DType::i32}), xs, p), DTypeError);
  try {
    ops::avg_pool2d_backward(zeros({1, 2, 3, 4}), xs, p);
    ADD_FAILURE() << "no error";
  } catch (const ShapeError& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("avg_pool2d_backward"), std::string::npos) << msg;
    EXPECT_NE(msg.find("[1, 2, 3, 4]"), std::string::npos) << msg;
  }
  // meta tensors: shapes only
  const Tensor mg = empty({4, 3, 5, 5}, {DType::f32, Device::meta()});
  EXPECT_EQ(ops::max_pool2d_backward(mg, empty({4, 3, 5, 5}, {DType::i64, Device::meta()}), {4, 3, 9, 9}).sizes(),
            (Shape{4, 3, 9, 9}));
  EXPECT_EQ(ops::avg_pool2d_backward(mg, {4, 3, 9, 9}, pool_params(3, 3, 2, 2, 1, 1)).sizes(), (Shape{4, 3, 9, 9}));
}

}  // namespace
}  // namespace ember::testing

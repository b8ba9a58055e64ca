// The fused layer-norm backward (Note [Fused layer-norm backward] in ember/kernels/ops_norm.cpp) against naive
// float64 loops written here: every dtype (f16/bf16 with f16/bf16 or f32 affine parameters), short, long and many
// rows (the CUDA kernel's warp, block and grouped column paths), no weight, strided and broadcast gradients, each
// subset of the three gradients, empty shapes, the errors, that the autograd node's backward allocates nothing but
// its results, and that the CPU kernel's results do not depend on the thread count. Device-parameterised: cuda
// instances skip without a GPU.
#include <cmath>
#include <vector>

#include "ember/kernels/ops.h"
#include "ember/memory/cpu_allocator.h"
#include "tests/harness/op_harness.h"
#include "tests/kernels/layer_norm_test_util.h"

namespace ember::testing {
namespace {

class LayerNormBackwardTest : public DeviceTest {};

using RefGrads = LayerNormRefGrads;

// Which of the three gradients an OpCase returns.
enum class Which { X, Weight, Bias };

// An OpCase for one gradient of layer norm over the last dim of in[0] (x), with in[1] the weight (or none when
// `with_weight` is false) and in[2] the output's gradient; `grad_of` shapes the gradient from in[2] (a transposed or
// expanded view, say).
OpCase backward_case(const Shape& shape, Which which, bool with_weight, std::function<Tensor(const Tensor&)> grad_of) {
  const int64_t cols = shape.back();
  const char* name = which == Which::X ? "layer_norm_backward x" : which == Which::Weight ? "... weight" : "... bias";
  auto pick = [which](const RefGrads& r) {
    return which == Which::X ? r.gx : which == Which::Weight ? r.gw : r.gb;
  };
  OpCase c{name,
           {rand_input(shape, -2.0, 2.0), rand_input({cols}, 0.5, 1.5), rand_input(shape)},
           [=](const Inputs& in) {
             const Tensor w = with_weight ? in[1] : Tensor();
             const LayerNormResult f = ops::layer_norm_with_stats(in[0], {cols}, w, Tensor());
             const LayerNormGrads g = ops::layer_norm_backward(grad_of(in[2]), in[0], w, f.mean, f.rstd, 1,
                                                               which == Which::X, which == Which::Weight,
                                                               which == Which::Bias);
             return which == Which::X ? g.x : which == Which::Weight ? g.weight : g.bias;
           }};
  c.reference = [=](const Inputs& in) {
    const RefGrads r = ref_layer_norm_backward(grad_of(in[2]), in[0], with_weight ? in[1] : Tensor(), cols, 1e-5);
    return from_vector(pick(r), which == Which::X ? shape : Shape{cols});
  };
  c.dtypes = {DType::f32, DType::f64, DType::f16, DType::bf16};
  // grad_x is a difference of O(1) terms: compared with an absolute floor of the dtype's precision.
  c.tolerance = [](DType dt) {
    Tolerance t = default_tolerance(dt);
    if (dt == DType::f32) t.atol = 1e-5;
    return t;
  };
  return c;
}

TEST_P(LayerNormBackwardTest, MatchesReferenceForEveryShapePath) {
  EMBER_REQUIRE_KERNEL(layer_norm_backward_stub);
  auto same = [](const Tensor& g) { return g; };
  // [1, 1]: grad_x is 0; 8 and 1000 columns: the warp path on CUDA; 1500 and 4100: the block path; 700 and 2100
  // rows: grouped column sums.
  for (const Shape& shape : std::vector<Shape>{{1, 1}, {4, 6, 8}, {3, 1000}, {2, 1500}, {1, 4100}, {700, 24},
                                               {2100, 5}}) {
    for (Which which : {Which::X, Which::Weight, Which::Bias}) {
      SCOPED_TRACE(shape_str(shape));
      check_op(backward_case(shape, which, true, same), device());
    }
  }
  check_op(backward_case({5, 33}, Which::X, false, same), device());
}

TEST_P(LayerNormBackwardTest, StridedAndBroadcastGradients) {
  EMBER_REQUIRE_KERNEL(layer_norm_backward_stub);
  // A transposed gradient (no unit stride) and a broadcast one (stride 0: the gradient of a sum).
  auto transposed = [](const Tensor& g) { return g.transpose(0, 1).contiguous().transpose(0, 1); };
  auto broadcast = [](const Tensor& g) { return g.select(0, 0).unsqueeze(0).expand(g.sizes()); };
  for (Which which : {Which::X, Which::Weight, Which::Bias}) {
    check_op(backward_case({9, 40}, which, true, transposed), device());
    check_op(backward_case({9, 40}, which, true, broadcast), device());
  }
}

// f16/bf16 x with f32 weight, gradient and affine gradients (Note [Mixed layer norm]): grad_x comes in x's dtype.
TEST_P(LayerNormBackwardTest, MixedPrecisionInput) {
  EMBER_REQUIRE_KERNEL(layer_norm_backward_stub);
  for (DType dt : {DType::f16, DType::bf16}) {
    const Tensor x = rand_input({6, 300}, -2.0, 2.0).to(dt), w = rand_input({300}, 0.5, 1.5);
    const Tensor g = rand_input({6, 300});
    const Tensor xd = x.to(device()), wd = w.to(DType::f32).to(device()), gd = g.to(DType::f32).to(device());
    const LayerNormResult f = ops::layer_norm_with_stats(xd, {300}, wd, Tensor());
    const LayerNormGrads r = ops::layer_norm_backward(gd, xd, wd, f.mean, f.rstd, 1, true, true, true);
    EXPECT_EQ(r.x.dtype(), dt);
    EXPECT_EQ(r.weight.dtype(), DType::f32);
    EXPECT_EQ(r.bias.dtype(), DType::f32);
    // Reference from the rounded x and the f32-rounded w and g, in f64.
    const RefGrads want = ref_layer_norm_backward(g.to(DType::f32), x, w.to(DType::f32), 300, 1e-5);
    EXPECT_TRUE(allclose(r.x, from_vector(want.gx, {6, 300}), default_tolerance(dt))) << dtype_name(dt);
    EXPECT_TRUE(allclose(r.weight, from_vector(want.gw, {300}), {1e-5, 1e-5})) << dtype_name(dt);
    EXPECT_TRUE(allclose(r.bias, from_vector(want.gb, {300}), {1e-5, 1e-5})) << dtype_name(dt);
  }
}

// Each subset of the gradients: only those asked for are defined, and each equals the one computed with all three.
TEST_P(LayerNormBackwardTest, EachSubsetOfGradients) {
  EMBER_REQUIRE_KERNEL(layer_norm_backward_stub);
  const Tensor x = rand_input({7, 3, 20}).to(DType::f32).to(device());
  const Tensor w = rand_input({3, 20}, 0.5, 1.5).to(DType::f32).to(device());
  const Tensor g = rand_input({7, 3, 20}).to(DType::f32).to(device());
  const LayerNormResult f = ops::layer_norm_with_stats(x, {3, 20}, w, Tensor());
  const LayerNormGrads all = ops::layer_norm_backward(g, x, w, f.mean, f.rstd, 2, true, true, true);
  EXPECT_EQ(all.x.sizes(), x.sizes());
  EXPECT_EQ(all.weight.sizes(), w.sizes());
  EXPECT_EQ(all.bias.sizes(), w.sizes());
  for (int mask = 0; mask < 8; ++mask) {
    const bool nx = mask & 1, nw = mask & 2, nb = mask & 4;
    // Without grad_x and grad_weight, x and the statistics are not needed (the autograd node does not keep them).
    const bool xhat = nx || nw;
    const LayerNormGrads r = ops::layer_norm_backward(g, xhat ? x : Tensor(), nx ? w : Tensor(),
                                                      xhat ? f.mean : Tensor(), xhat ? f.rstd : Tensor(), 2, nx, nw, nb);
    EXPECT_EQ(r.x.defined(), nx);
    EXPECT_EQ(r.weight.defined(), nw);
    EXPECT_EQ(r.bias.defined(), nb);
    if (nx) EXPECT_TRUE(allclose(r.x, all.x, {0.0, 0.0})) << mask;
    if (nw) EXPECT_TRUE(allclose(r.weight, all.weight, {0.0, 0.0})) << mask;
    if (nb) EXPECT_TRUE(allclose(r.bias, all.bias, {0.0, 0.0})) << mask;
  }
}

TEST_P(LayerNormBackwardTest, EmptyShapes) {
  EMBER_REQUIRE_KERNEL(layer_norm_backward_stub);
  // No rows: the affine gradients are sums over nothing, 0.
  const Tensor x = zeros({0, 5}, {DType::f32, device()}), w = ones({5}, {DType::f32, device()});
  const LayerNormResult f = ops::layer_norm_with_stats(x, {5}, w, Tensor());
  const LayerNormGrads r = ops::layer_norm_backward(x, x, w, f.mean, f.rstd, 1, true, true, true);
  EXPECT_EQ(r.x.sizes(), (Shape{0, 5}));
  EXPECT_TRUE(allclose(r.weight, zeros({5}, {DType::f64, Device::cpu()}), {0.0, 0.0}));
  EXPECT_TRUE(allclose(r.bias, zeros({5}, {DType::f64, Device::cpu()}), {0.0, 0.0}));
  // No columns: empty results.
  const Tensor e = zeros({3, 0}, {DType::f32, device()});
  const LayerNormResult fe = ops::layer_norm_with_stats(e, {0}, Tensor(), Tensor());
  const LayerNormGrads re = ops::layer_norm_backward(e, e, Tensor(), fe.mean, fe.rstd, 1, true, true, true);
  EXPECT_EQ(re.x.sizes(), (Shape{3, 0}));
  EXPECT_EQ(re.bias.sizes(), (Shape{0}));
}

TEST_P(LayerNormBackwardTest, Errors) {
  EMBER_REQUIRE_KERNEL(layer_norm_backward_stub);
  const Tensor x = rand_input({4, 6}).to(DType::f32).to(device()), w = ones({6}, {DType::f32, device()});
  const LayerNormResult f = ops::layer_norm_with_stats(x, {6}, w, Tensor());
  const Tensor g = ones({4, 6}, {DType::f32, device()});
  EXPECT_NE(error_message<ValueError>([&] {
              (void)ops::layer_norm_backward(g, Tensor(), w, f.mean, f.rstd, 1, true, false, false);
            }).find("need x, mean and rstd"),
            std::string::npos);
  (void)error_message<ShapeError>(
      [&] { (void)ops::layer_norm_backward(ones({4, 7}, {DType::f32, device()}), x, w, f.mean, f.rstd, 1, true,
                                           true, true); });
  (void)error_message<ShapeError>(
      [&] { (void)ops::layer_norm_backward(g, x, ones({5}, {DType::f32, device()}), f.mean, f.rstd, 1, true, false,
                                           false); });
  (void)error_message<DTypeError>([&] {
    (void)ops::layer_norm_backward(g.to(DType::f64), x, w.to(DType::f64), f.mean, f.rstd, 1, true, true, true);
  });
  (void)error_message<ShapeError>(
      [&] { (void)ops::layer_norm_backward(g, x, w, f.mean.slice(0, 0, 2), f.rstd, 1, true, true, true); });
  (void)error_message<ShapeError>([&] { (void)ops::layer_norm_backward(g, x, w, f.mean, f.rstd, 3, true, true, true); });
  (void)error_message<DTypeError>([&] {
    const Tensor i = zeros({4, 6}, {DType::i32, device()});
    (void)ops::layer_norm_backward(i, Tensor(), Tensor(), Tensor(), Tensor(), 1, false, false, true);
  });
}

EMBER_INSTANTIATE_DEVICE_TESTS(LayerNormBackwardTest);

// Backward through the autograd node allocates its three results and nothing else: no [rows, cols] temporary.
TEST(LayerNormBackwardMemory, AllocatesOnlyItsResults) {
  memory::CachingAllocator& alloc = memory::cpu_allocator();
  const int64_t rows = 512, cols = 1024;
  const Tensor x = rand_input({rows, cols}).to(DType::f32).requires_grad_(true);
  const Tensor w = ones({cols}).requires_grad_(true), b = zeros({cols}).requires_grad_(true);
  const Tensor y = layer_norm(x, {cols}, w, b);
  const Tensor g = rand_input({rows, cols}).to(DType::f32);
  alloc.reset_peak_stats();
  const int64_t before = alloc.stats().allocated_bytes;
  y.backward(g);
  const int64_t peak = alloc.stats().peak_allocated_bytes - before;
  const int64_t results = (rows * cols + 2 * cols) * 4;
  EXPECT_LE(peak, results + (64 << 10)) << "backward peak above the results: " << peak - results << " bytes";
  EXPECT_TRUE(x.grad().defined() && w.grad().defined() && b.grad().defined());
}

}  // namespace
}  // namespace ember::testing

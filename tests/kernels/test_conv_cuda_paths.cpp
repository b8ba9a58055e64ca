// Tests of the two CUDA convolution paths (ember/kernels/cuda/conv.h): cuDNN, where built in, and im2col + GEMM, at
// the default column budget and at one image per batch. Each path's conv2d, conv2d_backward_input and
// conv2d_backward_weight are checked against direct float64 loops written here over stride, padding, dilation, groups
// (incl. depthwise), bias / no bias, non-contiguous and broadcast operands and f32/f64/f16/bf16. The cuda instance
// skips without a GPU; the cpu instance, and every test in a build without CUDA, skip.
#include <functional>
#include <string>
#include <vector>

#include "tests/harness/op_harness.h"
#include "tests/kernels/conv_pool_test_util.h"

#if defined(EMBER_WITH_CUDA)
#include "ember/kernels/cuda/conv.h"
#endif

namespace ember::testing {
namespace {

class ConvCudaPathsTest : public DeviceTest {};

#if defined(EMBER_WITH_CUDA)

using ::ember::cuda::ConvStrategy;

size_t at(int64_t i) { return static_cast<size_t>(i); }

Tensor forward_ref(const Tensor& x, const Tensor& w, const Tensor& b, const Conv2dParams& p) {
  const Shape os = conv_out_shape(x.sizes(), w.sizes(), p);
  const std::vector<double> xv = x.to_vector<double>(), wv = w.to_vector<double>();
  std::vector<double> out(at(numel_of(os)), 0.0);
  if (b.defined()) {
    const std::vector<double> bv = b.to_vector<double>();
    const int64_t plane = os[2] * os[3];
    for (size_t e = 0; e < out.size(); ++e) out[e] = bv[at((static_cast<int64_t>(e) / plane) % os[1])];
  }
  for_each_conv_term(x.sizes(), w.sizes(), p, [&](size_t oi, size_t xi, size_t wi) { out[oi] += xv[xi] * wv[wi]; });
  return from_vector(out, os);
}

// Sums of up to a few hundred products accumulated in f32.
Tolerance conv_tolerance(DType dt) {
  Tolerance t = default_tolerance(dt);
  if (dt == DType::f32) t.atol = 2e-5;
  return t;
}

struct Config {
  std::string name;
  Shape x, w;
  Conv2dParams p;
  bool bias;
};

std::vector<Config> configs() {
  return {
      {"basic_bias", {2, 3, 7, 6}, {4, 3, 3, 3}, conv_params(1, 1, 0, 0, 1, 1, 1), true},
      {"stride2", {2, 3, 9, 8}, {5, 3, 3, 3}, conv_params(2, 2, 0, 0, 1, 1, 1), false},
      {"stride2_padding1_dilation2_groups2", {2, 4, 9, 8}, {6, 2, 3, 3}, conv_params(2, 2, 1, 1, 2, 2, 2), true},
      {"dilation2", {2, 2, 9, 10}, {2, 2, 3, 3}, conv_params(1, 1, 2, 1, 2, 2, 1), false},
      {"groups2", {3, 4, 6, 6}, {6, 2, 3, 3}, conv_params(1, 1, 0, 0, 1, 1, 2), true},
      {"depthwise", {2, 3, 6, 5}, {3, 1, 3, 3}, conv_params(1, 1, 1, 1, 1, 1, 3), true},
      {"depthwise_multiplier2", {1, 2, 5, 5}, {4, 1, 3, 3}, conv_params(2, 1, 1, 0, 1, 1, 2), false},
      {"kernel1x1_stride2", {2, 4, 5, 6}, {3, 4, 1, 1}, conv_params(2, 2, 0, 0, 1, 1, 1), true},
      {"non_square", {2, 3, 8, 11}, {4, 3, 2, 5}, conv_params(1, 2, 1, 2, 2, 1, 1), true},
      {"stride3_larger_than_kernel", {1, 2, 10, 9}, {2, 2, 2, 2}, conv_params(3, 3, 1, 0, 1, 1, 1), false},
      {"one_output_row", {2, 2, 3, 7}, {3, 2, 3, 2}, conv_params(1, 2, 0, 1, 1, 1, 1), true},
  };
}

// A path to test: the strategy and the im2col column budget (1 byte: one image per batch).
struct ConvPath {
  ConvStrategy strategy;
  int64_t chunk_bytes;
  std::string name() const {
    return std::string(::ember::cuda::conv_strategy_name(strategy)) +
           (chunk_bytes == 1 ? " (one image per batch)" : "");
  }
};

std::vector<ConvPath> paths() {
  const int64_t default_bytes = ::ember::cuda::im2col_chunk_bytes();
  std::vector<ConvPath> v{{ConvStrategy::Im2col, default_bytes}, {ConvStrategy::Im2col, 1}};
  if (::ember::cuda::conv_cudnn_built_in()) v.push_back({ConvStrategy::Cudnn, default_bytes});
  return v;
}

// Selects a path for a scope and restores the previous settings.
class ScopedConvPath {
 public:
  explicit ScopedConvPath(const ConvPath& path)
      : strategy_(::ember::cuda::conv_strategy()), bytes_(::ember::cuda::set_im2col_chunk_bytes(path.chunk_bytes)) {
    ::ember::cuda::set_conv_strategy(path.strategy);
  }
  ~ScopedConvPath() {
    ::ember::cuda::set_conv_strategy(strategy_);
    ::ember::cuda::set_im2col_chunk_bytes(bytes_);
  }
  ScopedConvPath(const ScopedConvPath&) = delete;
  ScopedConvPath& operator=(const ScopedConvPath&) = delete;

 private:
  ConvStrategy strategy_;
  int64_t bytes_;
};

// f16/bf16 at the default budget; one image per batch rounds the weight gradient once per image in those dtypes (the
// documented cost of a tiny budget), so that run checks f32 (and f64).
std::vector<DType> dtypes_for(const ConvPath& path) {
  if (path.chunk_bytes == 1) return {DType::f32};
  return {DType::f32, DType::f16, DType::bf16};
}

#define EMBER_REQUIRE_CUDA_PATHS()                                                           \
  do {                                                                                       \
    if (!device().is_cuda()) GTEST_SKIP() << "the convolution paths tested here are CUDA's"; \
    EMBER_REQUIRE_KERNEL(conv2d_stub);                                                       \
    EMBER_REQUIRE_KERNEL(conv2d_backward_stub);                                              \
  } while (0)

TEST_P(ConvCudaPathsTest, ForwardMatchesDirectLoops) {
  EMBER_REQUIRE_CUDA_PATHS();
  for (const ConvPath& path : paths()) {
    SCOPED_TRACE("path " + path.name());
    const ScopedConvPath scope(path);
    for (const Config& cfg : configs()) {
      SCOPED_TRACE("config " + cfg.name);
      const Conv2dParams p = cfg.p;
      OpCase c{"conv2d",
               {rand_input(cfg.x), rand_input(cfg.w), cfg.bias ? rand_input({cfg.w[0]}) : Tensor()},
               [p](const Inputs& t) { return conv2d(t[0], t[1], t[2], p); }};
      c.reference = [p](const Inputs& t) { return forward_ref(t[0], t[1], t[2], p); };
      c.tolerance = conv_tolerance;
      c.dtypes = dtypes_for(path);
      check_op(c, device());
    }
    // x stored [N, C, W, H] and transposed, weight stored [O, KH, KW, C/g] and permuted, bias a strided slice.
    const Conv2dParams p = conv_params(2, 1, 1, 1, 1, 2, 2);
    OpCase c{"conv2d", {rand_input({2, 4, 7, 6}), rand_input({6, 3, 2, 2}), rand_input({12})}, [p](const Inputs& t) {
               return conv2d(t[0].transpose(2, 3), t[1].permute({0, 3, 1, 2}), t[2].slice(0, 0, 12, 2), p);
             }};
    c.reference = [p](const Inputs& t) {
      return forward_ref(t[0].transpose(2, 3), t[1].permute({0, 3, 1, 2}), t[2].slice(0, 0, 12, 2), p);
    };
    c.tolerance = conv_tolerance;
    c.dtypes = dtypes_for(path);
    check_op(c, device());
  }
}

TEST_P(ConvCudaPathsTest, InputGradMatchesDirectLoops) {
  EMBER_REQUIRE_CUDA_PATHS();
  for (const ConvPath& path : paths()) {
    SCOPED_TRACE("path " + path.name());
    const ScopedConvPath scope(path);
    for (const Config& cfg : configs()) {
      SCOPED_TRACE("config " + cfg.name);
      const Conv2dParams p = cfg.p;
      const Shape xs = cfg.x, ws = cfg.w;
      OpCase c{"conv2d_backward_input",
               {rand_input(conv_out_shape(xs, ws, p)), rand_input(ws)},
               [xs, p](const Inputs& t) { return ops::conv2d_backward_input(t[0], t[1], xs, p); }};
      c.reference = [xs, p](const Inputs& t) { return conv_grad_x_ref(t[0], t[1], xs, p); };
      c.tolerance = conv_tolerance;
      c.dtypes = dtypes_for(path);
      check_op(c, device());
    }
    // grad_out strided on every dim, then broadcast (stride 0 over images and rows); weight permuted.
    const Conv2dParams p = conv_params(2, 2, 1, 1, 2, 2, 2);
    const Shape xs{2, 4, 9, 8}, ws{6, 2, 3, 3}, os = conv_out_shape(xs, ws, p);
    OpCase c{"conv2d_backward_input", {noncontiguous_input(os), rand_input({6, 3, 3, 2})}, [xs, p](const Inputs& t) {
               return ops::conv2d_backward_input(t[0], t[1].permute({0, 3, 1, 2}), xs, p);
             }};
    c.reference = [xs, p](const Inputs& t) { return conv_grad_x_ref(t[0], t[1].permute({0, 3, 1, 2}), xs, p); };
    c.tolerance = conv_tolerance;
    c.dtypes = dtypes_for(path);
    check_op(c, device());
    OpCase b{"conv2d_backward_input", {rand_input({1, os[1], 1, os[3]}), rand_input(ws)}, [xs, p, os](const Inputs& t) {
               return ops::conv2d_backward_input(t[0].expand(os), t[1], xs, p);
             }};
    b.reference = [xs, p, os](const Inputs& t) { return conv_grad_x_ref(t[0].expand(os), t[1], xs, p); };
    b.tolerance = conv_tolerance;
    b.dtypes = dtypes_for(path);
    check_op(b, device());
  }
}

TEST_P(ConvCudaPathsTest, WeightGradMatchesDirectLoops) {
  EMBER_REQUIRE_CUDA_PATHS();
  for (const ConvPath& path : paths()) {
    SCOPED_TRACE("path " + path.name());
    const ScopedConvPath scope(path);
    for (const Config& cfg : configs()) {
      SCOPED_TRACE("config " + cfg.name);
      const Conv2dParams p = cfg.p;
      const Shape xs = cfg.x, ws = cfg.w;
      OpCase c{"conv2d_backward_weight",
               {rand_input(conv_out_shape(xs, ws, p)), rand_input(xs)},
               [ws, p](const Inputs& t) { return ops::conv2d_backward_weight(t[0], t[1], ws, p); }};
      c.reference = [ws, p](const Inputs& t) { return conv_grad_w_ref(t[0], t[1], ws, p); };
      c.tolerance = conv_tolerance;
      c.dtypes = dtypes_for(path);
      check_op(c, device());
    }
    // grad_out strided on every dim, x transposed; then grad_out broadcast over images and rows.
    const Conv2dParams p = conv_params(2, 2, 1, 1, 2, 2, 2);
    const Shape xs{2, 4, 9, 8}, ws{6, 2, 3, 3}, os = conv_out_shape(xs, ws, p);
    OpCase c{"conv2d_backward_weight", {noncontiguous_input(os), rand_input({2, 4, 8, 9})}, [ws, p](const Inputs& t) {
               return ops::conv2d_backward_weight(t[0], t[1].transpose(2, 3), ws, p);
             }};
    c.reference = [ws, p](const Inputs& t) { return conv_grad_w_ref(t[0], t[1].transpose(2, 3), ws, p); };
    c.tolerance = conv_tolerance;
    c.dtypes = dtypes_for(path);
    check_op(c, device());
    OpCase b{"conv2d_backward_weight",
             {rand_input({1, os[1], 1, os[3]}), rand_input(xs)},
             [ws, p, os](const Inputs& t) { return ops::conv2d_backward_weight(t[0].expand(os), t[1], ws, p); }};
    b.reference = [ws, p, os](const Inputs& t) { return conv_grad_w_ref(t[0].expand(os), t[1], ws, p); };
    b.tolerance = conv_tolerance;
    b.dtypes = dtypes_for(path);
    check_op(b, device());
  }
}

// No input channels: every output is the bias (or 0), written although there is no product to compute.
TEST_P(ConvCudaPathsTest, NoInputChannelsGiveTheBias) {
  EMBER_REQUIRE_CUDA_PATHS();
  for (const ConvPath& path : paths()) {
    SCOPED_TRACE("path " + path.name());
    const ScopedConvPath scope(path);
    const Tensor x = zeros({2, 0, 5, 5}, {DType::f32, device()});
    const Tensor w = zeros({3, 0, 3, 3}, {DType::f32, device()});
    const Tensor b = from_vector<double>({0.5, -1, 2}, {3}).to(device()).to(DType::f32);
    std::vector<double> want;
    for (int64_t n = 0; n < 2; ++n)
      for (double v : {0.5, -1.0, 2.0}) want.insert(want.end(), 9, v);
    EXPECT_EQ(conv2d(x, w, b).to_vector<double>(), want);
    EXPECT_EQ(conv2d(x, w).to_vector<double>(), std::vector<double>(54, 0.0));
  }
}

// Host-only: the settings' names, errors and round trips (no GPU needed).
TEST(ConvCudaPathSettings, NamesErrorsAndRoundTrips) {
  EXPECT_STREQ(::ember::cuda::conv_strategy_name(ConvStrategy::Cudnn), "cudnn");
  EXPECT_STREQ(::ember::cuda::conv_strategy_name(ConvStrategy::Im2col), "im2col");
  const ConvPath im2col{ConvStrategy::Im2col, 4096};
  {
    const ScopedConvPath scope(im2col);
    EXPECT_EQ(::ember::cuda::conv_strategy(), ConvStrategy::Im2col);
    EXPECT_EQ(::ember::cuda::im2col_chunk_bytes(), 4096);
    if (::ember::cuda::conv_cudnn_built_in()) {
      ::ember::cuda::set_conv_strategy(ConvStrategy::Cudnn);
      EXPECT_EQ(::ember::cuda::conv_strategy(), ConvStrategy::Cudnn);
    } else {
      EXPECT_THROW(::ember::cuda::set_conv_strategy(ConvStrategy::Cudnn), ConfigError);
    }
  }
  EXPECT_THROW(::ember::cuda::set_im2col_chunk_bytes(0), ValueError);
  EXPECT_THROW(::ember::cuda::set_im2col_chunk_bytes(-5), ValueError);
}

#else

TEST_P(ConvCudaPathsTest, SkippedWithoutCuda) { GTEST_SKIP() << "ember was built without CUDA"; }

#endif

EMBER_INSTANTIATE_DEVICE_TESTS(ConvCudaPathsTest);

}  // namespace
}  // namespace ember::testing

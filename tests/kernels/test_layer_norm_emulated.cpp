// The CUDA layer norm warp kernels (ember/kernels/cuda/layer_norm_kernels.cuh) run on the CPU under the SIMT emulator
// (tests/harness/simt_emulator.h), against float64 loops: mean, rstd, out and, for the fused residual add, sum, for
// f32 and bf16 rows of 64 to 1024 columns, with and without weight, bias and residual (of x's dtype, or bf16/f16 into
// an f32 x, as GPT-2's residual stream under autocast); the packed kernel (16-byte rows) and the scalar one on the
// same inputs. Outputs are NaN-poisoned first. The same kernels on a GPU are checked
// by LayerNormTest and AddLayerNormTest.
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "tests/harness/simt_emulator.h"
// The emulator's definitions of the CUDA names come first.
#include "ember/kernels/cuda/layer_norm_kernels.cuh"
#include "tests/harness/op_harness.h"

namespace ember::testing {
namespace {

namespace kc = ::ember::kernels::cuda;

template <class T>
std::vector<T> random_row_major(size_t n, uint32_t seed) {
  std::vector<T> v(n);
  uint32_t state = seed;
  for (T& x : v) {
    state = state * 1664525u + 1013904223u;
    x = T(4.0f * static_cast<float>(state >> 8) / static_cast<float>(1u << 24) - 1.5f);
  }
  return v;
}

template <class T>
double max_normalised(const std::vector<T>& got, const std::vector<double>& want) {
  double diff = 0.0, ref = 0.0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double g = static_cast<double>(static_cast<op_math_t<T>>(got[i]));
    diff = std::isfinite(g) ? std::max(diff, std::abs(g - want[i])) : std::numeric_limits<double>::infinity();
    ref = std::max(ref, std::abs(want[i]));
  }
  return ref > 0 ? diff / ref : diff;
}

template <class T, class R = T>
void check_layer_norm(int64_t rows, int64_t cols, bool affine, bool residual, bool packed) {
  using A = op_math_t<T>;
  SCOPED_TRACE(::testing::Message() << dtype_name(dtype_of<T>::value) << " [" << rows << ", " << cols << "]"
                                    << (affine ? " affine" : "")
                                    << (residual ? std::string(" residual ") + dtype_name(dtype_of<R>::value) : "")
                                    << (packed ? " packed" : " scalar"));
  const size_t n = static_cast<size_t>(rows * cols);
  const std::vector<T> x = random_row_major<T>(n, 5u + static_cast<uint32_t>(cols));
  const std::vector<R> res = random_row_major<R>(n, 9u + static_cast<uint32_t>(cols));
  const std::vector<T> w = random_row_major<T>(static_cast<size_t>(cols), 13u);
  const std::vector<T> b = random_row_major<T>(static_cast<size_t>(cols), 17u);
  const T poison = T(std::numeric_limits<float>::quiet_NaN());
  std::vector<T> out(n, poison), sum(n, poison);
  std::vector<A> mean(static_cast<size_t>(rows), std::numeric_limits<A>::quiet_NaN()), rstd = mean;

  kc::LayerNormArgs a{};
  a.x = x.data();
  a.rows = rows;
  a.cols = cols;
  a.row_stride = cols;
  a.col_stride = 1;
  a.weight = affine ? w.data() : nullptr;
  a.bias = affine ? b.data() : nullptr;
  a.eps = 1e-5;
  a.out = out.data();
  a.mean = mean.data();
  a.rstd = rstd.data();
  if (residual) {
    a.residual = res.data();
    a.res_row_stride = cols;
    a.res_col_stride = 1;
    a.res_dtype = dtype_of<R>::value;
    a.sum = sum.data();
  }
  ASSERT_TRUE(kc::layer_norm_pack_applies<T>(a)) << "contiguous aligned rows of whole packs";
  constexpr int64_t per_block = kc::kWarpThreads / kc::kWarpSize;
  const auto blocks = static_cast<unsigned>((rows + per_block - 1) / per_block);
  if (packed)
    simt::launch(blocks, kc::kWarpThreads, [&] { kc::layer_norm_warp_pack_kernel<T, R>(a); });
  else
    simt::launch(blocks, kc::kWarpThreads, [&] { kc::layer_norm_warp_kernel<T>(a); });

  // float64 reference on the same (rounded) values; the residual form normalises the rounded x + residual.
  std::vector<double> want_out(n), want_sum(n), want_mean(static_cast<size_t>(rows)), want_rstd(want_mean.size());
  for (int64_t r = 0; r < rows; ++r) {
    std::vector<double> v(static_cast<size_t>(cols));
    for (int64_t c = 0; c < cols; ++c) {
      const size_t i = static_cast<size_t>(r * cols + c);
      v[static_cast<size_t>(c)] =
          residual ? static_cast<double>(static_cast<A>(T(static_cast<A>(x[i]) + static_cast<A>(res[i]))))
                   : static_cast<double>(static_cast<A>(x[i]));
      want_sum[i] = v[static_cast<size_t>(c)];
    }
    double mu = 0, var = 0;
    for (double e : v) mu += e;
    mu /= static_cast<double>(cols);
    for (double e : v) var += (e - mu) * (e - mu);
    const double inv = 1.0 / std::sqrt(var / static_cast<double>(cols) + 1e-5);
    want_mean[static_cast<size_t>(r)] = mu;
    want_rstd[static_cast<size_t>(r)] = inv;
    for (int64_t c = 0; c < cols; ++c) {
      double o = (v[static_cast<size_t>(c)] - mu) * inv;
      if (affine)
        o = o * static_cast<double>(static_cast<A>(w[static_cast<size_t>(c)])) +
            static_cast<double>(static_cast<A>(b[static_cast<size_t>(c)]));
      want_out[static_cast<size_t>(r * cols + c)] = o;
    }
  }
  const double tol = std::is_same_v<T, float> ? 1e-5 : 1e-2;
  EXPECT_LE(max_normalised(out, want_out), tol) << "out";
  EXPECT_LE(max_normalised(mean, want_mean), 1e-5) << "mean";
  EXPECT_LE(max_normalised(rstd, want_rstd), 1e-5) << "rstd";
  if (residual) EXPECT_LE(max_normalised(sum, want_sum), 0.0) << "sum (one rounding, as the reference)";
}

TEST(LayerNormEmulatedTest, PackedAndScalarWarpKernelsMatchFloat64) {
#if defined(__SANITIZE_THREAD__)
  GTEST_SKIP() << "the emulator's fibers switch stacks, which ThreadSanitizer is not told about";
#endif
  for (bool packed : {true, false})
    for (bool residual : {false, true})
      for (bool affine : {true, false}) {
        check_layer_norm<float>(5, 1024, affine, residual, packed);
        check_layer_norm<float>(3, 68, affine, residual, packed);
        check_layer_norm<BFloat16>(6, 768, affine, residual, packed);
        check_layer_norm<BFloat16>(2, 64, affine, residual, packed);
        if (residual) {
          check_layer_norm<float, BFloat16>(5, 768, affine, true, packed);
          check_layer_norm<float, Half>(3, 68, affine, true, packed);
        }
      }
}

TEST(LayerNormEmulatedTest, PackedResidualNeedsItsAlignment) {
  // A 16-bit residual of an f32 x is read in 8-byte packs: a residual 2 bytes off that takes the scalar kernel, and so
  // does one of another 16-bit dtype than f16/bf16's pairing with f32 (a bf16 x's residual must be bf16).
  std::vector<float> x(64), out(64), sum(64), mean(1), rstd(1);
  std::vector<BFloat16> res(65);
  kc::LayerNormArgs a{};
  a.x = x.data();
  a.rows = 1;
  a.cols = 64;
  a.row_stride = 64;
  a.col_stride = 1;
  a.out = out.data();
  a.mean = mean.data();
  a.rstd = rstd.data();
  a.residual = res.data();
  a.res_row_stride = 64;
  a.res_col_stride = 1;
  a.res_dtype = DType::bf16;
  a.sum = sum.data();
  EXPECT_TRUE(kc::layer_norm_pack_applies<float>(a));
  a.residual = res.data() + 1;
  EXPECT_FALSE(kc::layer_norm_pack_applies<float>(a));
  a.residual = res.data();
  a.res_dtype = DType::f64;
  EXPECT_FALSE(kc::layer_norm_pack_applies<float>(a));
  a.res_dtype = DType::f16;
  EXPECT_FALSE(kc::layer_norm_pack_applies<BFloat16>(a));
}

}  // namespace
}  // namespace ember::testing

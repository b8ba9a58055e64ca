// The packed backward kernel of the fused bias + GELU (ember/kernels/cuda/bias_gelu_kernels.cuh) run on the CPU under
// the SIMT emulator (tests/harness/simt_emulator.h) against float64: grad_x = gelu'(x + bias) * g and the column sums
// of grad_x, written whole (one row group) or as per-group partial sums, for f32 and bf16, erf and tanh GELU. Outputs
// are NaN-poisoned first. BiasGeluBackwardTest checks the launcher's choice of kernel on a GPU.
#include <cmath>
#include <limits>
#include <vector>

#include "tests/harness/simt_emulator.h"
// The emulator's definitions of the CUDA names come first.
#include "ember/kernels/cuda/bias_gelu_kernels.cuh"
#include "tests/harness/op_harness.h"
#include "tests/kernels/emulated_buffers.h"

namespace ember::testing {
namespace {

namespace bg = ::ember::kernels::cuda::bias_gelu;

template <class T>
T from_double(double v) {
  return T(static_cast<float>(v));
}

// Runs the kernel on [rows, cols] with `groups` row groups and checks grad_x and the (summed) column sums.
template <class T>
void check_packed_backward(int64_t rows, int64_t cols, int64_t groups, bool tanh_approx, uint32_t seed) {
  SCOPED_TRACE(::testing::Message() << (std::is_same_v<T, float> ? "f32" : "bf16") << " rows " << rows << " cols "
                                    << cols << " groups " << groups << (tanh_approx ? " tanh" : " erf"));
  using A = op_math_t<T>;
  constexpr int V = ::ember::cuda::Pack<T>::kSize;
  ASSERT_EQ(cols % V, 0);
  // 16-byte aligned operands (the launcher's condition), drawn from [-2, 2); grad_x NaN-poisoned.
  const int64_t n = rows * cols;
  AlignedBuffer<T> g_buf(n), x_buf(n), b_buf(cols), gx_buf(n, from_double<T>(std::numeric_limits<double>::quiet_NaN()));
  fill_uniform(g_buf, n, seed, -2.0, 2.0);
  fill_uniform(x_buf, n, seed + 101u, -2.0, 2.0);
  fill_uniform(b_buf, cols, seed + 202u, -2.0, 2.0);
  T* g = g_buf.data;
  T* x = x_buf.data;
  T* bias = b_buf.data;
  T* gx = gx_buf.data;
  std::vector<A> partial(static_cast<size_t>(groups * cols), std::numeric_limits<A>::quiet_NaN());
  std::vector<T> sums(static_cast<size_t>(cols), from_double<T>(std::numeric_limits<double>::quiet_NaN()));
  const int64_t rows_per_group = (rows + groups - 1) / groups;
  const simt::Dim3 grid{static_cast<unsigned>((cols / V + 31) / 32), static_cast<unsigned>(groups), 1};
  void* out_sums = groups == 1 ? static_cast<void*>(sums.data()) : static_cast<void*>(partial.data());
  simt::launch(grid, 32 * bg::kRowThreads, [&] {
    bg::bias_gelu_backward_pack_kernel<T>(g, x, bias, rows, cols, rows_per_group, tanh_approx, gx, out_sums,
                                          groups == 1);
  });
  if (groups > 1)
    for (int64_t j = 0; j < cols; ++j) {
      A s = 0;
      for (int64_t k = 0; k < groups; ++k) s += partial[static_cast<size_t>(k * cols + j)];
      sums[static_cast<size_t>(j)] = T(s);
    }

  double gx_err = 0.0, gx_ref = 0.0, sum_err = 0.0, sum_ref = 0.0;
  std::vector<double> col_sum(static_cast<size_t>(cols), 0.0);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t j = 0; j < cols; ++j) {
      const int64_t i = r * cols + j;
      const double v = static_cast<double>(static_cast<float>(x[i])) + static_cast<double>(static_cast<float>(bias[j]));
      const double want =
          kernels::unary_backward_fn<double>(tanh_approx ? UnaryOp::GeluTanh : UnaryOp::GeluErf,
                                             static_cast<double>(static_cast<float>(g[i])), v, 0.0, 0.0);
      const double got = static_cast<float>(gx[i]);
      gx_err = std::isfinite(got) ? std::max(gx_err, std::abs(got - want)) : INFINITY;
      gx_ref = std::max(gx_ref, std::abs(want));
      col_sum[static_cast<size_t>(j)] += want;
    }
  for (int64_t j = 0; j < cols; ++j) {
    const double got = static_cast<float>(sums[static_cast<size_t>(j)]);
    sum_err = std::isfinite(got) ? std::max(sum_err, std::abs(got - col_sum[static_cast<size_t>(j)])) : INFINITY;
    sum_ref = std::max(sum_ref, std::abs(col_sum[static_cast<size_t>(j)]));
  }
  // f32: the sum of the input's rounding and f32 arithmetic; bf16: one rounding of the output (normalised error).
  const double tol = std::is_same_v<T, float> ? 1e-5 : 1e-2;
  EXPECT_LE(gx_err / gx_ref, tol);
  EXPECT_LE(sum_err / sum_ref, tol);
}

TEST(BiasGeluEmulatedTest, PackedBackwardMatchesFloat64) {
#if defined(__SANITIZE_THREAD__)
  GTEST_SKIP() << "the emulator's fibers switch stacks, which ThreadSanitizer is not told about";
#endif
  check_packed_backward<float>(70, 136, 1, false, 1u);     // 34 packs: a second, partial block of columns
  check_packed_backward<float>(300, 8, 3, true, 2u);       // three row groups, the last partial: partial sums
  check_packed_backward<BFloat16>(45, 264, 1, false, 3u);  // 33 packs of 8
  check_packed_backward<BFloat16>(40, 16, 2, true, 4u);
}

}  // namespace
}  // namespace ember::testing

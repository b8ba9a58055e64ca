// The packed layer-norm backward kernels (ember/kernels/cuda/layer_norm_backward_kernels.cuh, Note [Packed layer-norm
// backward] in layer_norm_backward.cu) run on the CPU under the SIMT emulator (tests/harness/simt_emulator.h) against
// float64: grad_x = rstd * (d - mean(d) - xhat * mean(d * xhat)) (+ grad_add) with d = g * weight, and the affine
// gradients sum(g * xhat) and sum(g) down the columns, stored whole or as per-group partial sums that
// reduce_pack::sum_groups_kernel adds; f32 and bf16, rows of 36 to 1024 columns, with and without weight and
// grad_add. Outputs are NaN-poisoned first. LayerNormBackwardTest checks the launcher on a GPU.
#include <cmath>
#include <limits>
#include <vector>

#include "tests/harness/simt_emulator.h"
// The emulator's definitions of the CUDA names come first.
#include "ember/kernels/cuda/layer_norm_backward_kernels.cuh"
#include "tests/harness/op_harness.h"
#include "tests/kernels/emulated_buffers.h"

namespace ember::testing {
namespace {

namespace lb = ::ember::kernels::cuda::layer_norm_backward;
namespace rp = ::ember::kernels::cuda::reduce_pack;

template <class T>
void check_backward(int64_t rows, int64_t cols, bool weight, bool add, int64_t groups, bool wgrad, bool bgrad) {
  SCOPED_TRACE(::testing::Message() << (std::is_same_v<T, float> ? "f32" : "bf16") << " [" << rows << ", " << cols
                                    << "]" << (weight ? " weight" : "") << (add ? " grad_add" : "") << " groups "
                                    << groups << (wgrad ? " grad_weight" : "") << (bgrad ? " grad_bias" : ""));
  using A = op_math_t<T>;
  constexpr int V = ::ember::cuda::Pack<T>::kSize;
  ASSERT_EQ(cols % V, 0);
  const int64_t n = rows * cols;
  const T poison = T(std::numeric_limits<float>::quiet_NaN());
  AlignedBuffer<T> g(n), x(n), w(cols), ga(n), gx(n, poison);
  fill_uniform(g, n, 3u + static_cast<uint32_t>(cols), -1.0, 1.0);
  fill_uniform(x, n, 5u + static_cast<uint32_t>(rows), -1.5, 2.5);
  fill_uniform(w, cols, 7u, 0.5, 1.5);
  fill_uniform(ga, n, 11u, -1.0, 1.0);
  std::vector<A> mean(static_cast<size_t>(rows)), rstd(static_cast<size_t>(rows));
  for (int64_t r = 0; r < rows; ++r) {
    double s = 0.0, ss = 0.0;
    for (int64_t j = 0; j < cols; ++j) s += x.at(r * cols + j);
    const double mu = s / static_cast<double>(cols);
    for (int64_t j = 0; j < cols; ++j) ss += (x.at(r * cols + j) - mu) * (x.at(r * cols + j) - mu);
    mean[static_cast<size_t>(r)] = static_cast<A>(mu);
    rstd[static_cast<size_t>(r)] = static_cast<A>(1.0 / std::sqrt(ss / static_cast<double>(cols) + 1e-5));
  }
  lb::Args a{};
  a.rows = rows;
  a.cols = cols;
  a.g = g.data;
  a.g_rs = cols;
  a.g_cs = 1;
  a.x = x.data;
  a.x_rs = cols;
  a.x_cs = 1;
  a.weight = weight ? w.data : nullptr;
  a.mean = mean.data();
  a.rstd = rstd.data();
  a.grad_add = add ? ga.data : nullptr;
  a.add_rs = cols;
  a.add_cs = 1;
  a.grad_x = gx.data;
  const unsigned row_blocks = static_cast<unsigned>((rows + 3) / 4);
  simt::launch(simt::Dim3{row_blocks, 1, 1}, lb::kPackRowThreads, [&] { lb::grad_x_warp_pack_kernel<T>(a); });

  AlignedBuffer<T> gw(cols, poison), gb(cols, poison);
  std::vector<A> pw(static_cast<size_t>(groups * cols), std::numeric_limits<A>::quiet_NaN()), pb = pw;
  const int64_t rows_per_group = (rows + groups - 1) / groups;
  const bool final = groups == 1;
  void* wsum = wgrad ? (final ? static_cast<void*>(gw.data) : static_cast<void*>(pw.data())) : nullptr;
  void* bsum = bgrad ? (final ? static_cast<void*>(gb.data) : static_cast<void*>(pb.data())) : nullptr;
  const simt::Dim3 grid{static_cast<unsigned>((cols / V + 31) / 32), static_cast<unsigned>(groups), 1};
  lb::Args affine = a;  // grad_bias alone reads g only: x and the statistics are null, as the launcher passes them
  if (!wgrad) affine.x = affine.mean = affine.rstd = nullptr;
  simt::launch(grid, rp::kPackColumns * rp::kRowThreads,
               [&] { lb::affine_partial_pack_kernel<T>(affine, rows_per_group, wsum, bsum, final); });
  if (!final) {
    if (wgrad)
      simt::launch(simt::Dim3{1, 1, 1}, 64,
                   [&] { rp::sum_groups_kernel<A, T>(pw.data(), groups, cols, rows, false, gw.data); });
    if (bgrad)
      simt::launch(simt::Dim3{1, 1, 1}, 64,
                   [&] { rp::sum_groups_kernel<A, T>(pb.data(), groups, cols, rows, false, gb.data); });
  }

  std::vector<double> want_x(static_cast<size_t>(n)), got_x(static_cast<size_t>(n));
  std::vector<double> want_w(static_cast<size_t>(cols), 0.0), want_b(static_cast<size_t>(cols), 0.0);
  std::vector<double> got_w(static_cast<size_t>(cols)), got_b(static_cast<size_t>(cols));
  for (int64_t r = 0; r < rows; ++r) {
    const double mu = mean[static_cast<size_t>(r)], k = rstd[static_cast<size_t>(r)];
    double sa = 0.0, sb = 0.0;
    for (int64_t j = 0; j < cols; ++j) {
      const double d = g.at(r * cols + j) * (weight ? w.at(j) : 1.0), xh = (x.at(r * cols + j) - mu) * k;
      sa += d;
      sb += d * xh;
      want_w[static_cast<size_t>(j)] += g.at(r * cols + j) * xh;
      want_b[static_cast<size_t>(j)] += g.at(r * cols + j);
    }
    for (int64_t j = 0; j < cols; ++j) {
      const int64_t i = r * cols + j;
      const double d = g.at(i) * (weight ? w.at(j) : 1.0), xh = (x.at(i) - mu) * k;
      want_x[static_cast<size_t>(i)] =
          k * (d - sa / static_cast<double>(cols) - xh * sb / static_cast<double>(cols)) + (add ? ga.at(i) : 0.0);
      got_x[static_cast<size_t>(i)] = gx.at(i);
    }
  }
  for (int64_t j = 0; j < cols; ++j) {
    got_w[static_cast<size_t>(j)] = gw.at(j);
    got_b[static_cast<size_t>(j)] = gb.at(j);
  }
  // f32: float arithmetic over a row of at most 1024 terms; bf16: the outputs' rounding (2^-9).
  const double tol = std::is_same_v<T, float> ? 2e-5 : 1e-2;
  EXPECT_LE(normalised_error(got_x, want_x), tol);
  if (wgrad) {
    EXPECT_LE(normalised_error(got_w, want_w), tol);
  }
  if (bgrad) {
    EXPECT_LE(normalised_error(got_b, want_b), tol);
  }
}

TEST(LayerNormBackwardEmulatedTest, PackedKernelsMatchFloat64) {
#if defined(__SANITIZE_THREAD__)
  GTEST_SKIP() << "the emulator's fibers switch stacks, which ThreadSanitizer is not told about";
#endif
  check_backward<float>(7, 768, true, true, 1, true, true);      // 6 packs a lane; a partial block of rows
  check_backward<float>(9, 1024, false, false, 3, true, true);   // 8 packs a lane; three groups, the last partial
  check_backward<float>(5, 36, true, false, 2, false, true);     // 9 packs: lanes 9-31 idle; grad_bias only
  check_backward<BFloat16>(6, 264, true, true, 1, true, false);  // 33 packs: a second column block; grad_weight only
  check_backward<BFloat16>(10, 1024, false, true, 4, true, true);
}

}  // namespace
}  // namespace ember::testing

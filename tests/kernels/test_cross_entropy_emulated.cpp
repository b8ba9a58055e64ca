// The CUDA fused softmax + cross-entropy kernels (ember/kernels/cuda/cross_entropy_kernels.cuh) run on the CPU under
// the SIMT emulator (tests/harness/simt_emulator.h), against float64 loops: loss, lse and the logits' gradient for f32
// and bf16 rows read as 16-byte packs and element by element, with label smoothing, an ignored row and a row whose
// target is its largest logit; and rows with -inf, NaN and +inf logits through the packed path. Outputs are
// NaN-poisoned first. The same kernels on a GPU are checked by
// CrossEntropyTest.
#include <cmath>
#include <limits>
#include <vector>

#include "tests/harness/simt_emulator.h"
// The emulator's definitions of the CUDA names come first.
#include "ember/kernels/cuda/cross_entropy_kernels.cuh"
#include "tests/harness/op_harness.h"

namespace ember::testing {
namespace {

namespace kc = ::ember::kernels::cuda;

template <class T>
void check_cross_entropy(int64_t rows, int64_t cols, double smoothing, bool packed) {
  using A = kc::acc_t<T>;
  SCOPED_TRACE(::testing::Message() << (std::is_same_v<T, float> ? "f32" : "bf16") << " [" << rows << ", " << cols
                                    << "] smoothing " << smoothing << (packed ? " packed" : " scalar"));
  constexpr int64_t kIgnore = -100;
  std::vector<T> logits(static_cast<size_t>(rows * cols));
  uint32_t state = 3u + static_cast<uint32_t>(cols);
  for (T& x : logits) {
    state = state * 1664525u + 1013904223u;
    x = T(8.0f * static_cast<float>(state >> 8) / static_cast<float>(1u << 24) - 4.0f);
  }
  std::vector<int64_t> target(static_cast<size_t>(rows));
  for (int64_t r = 0; r < rows; ++r) target[static_cast<size_t>(r)] = (r * 7 + 3) % cols;
  target[1] = kIgnore;
  const float nan = std::numeric_limits<float>::quiet_NaN();
  std::vector<A> loss(static_cast<size_t>(rows), A(nan)), lse = loss, grad_loss(static_cast<size_t>(rows));
  for (int64_t r = 0; r < rows; ++r) grad_loss[static_cast<size_t>(r)] = A(0.5 + 0.25 * static_cast<double>(r));
  std::vector<T> grad(logits.size(), T(nan));

  const unsigned threads = kc::threads_for(cols);
  ASSERT_EQ(kc::cross_entropy_packed<T>(logits.data(), grad.data(), cols), packed);
  simt::launch(static_cast<unsigned>(rows), threads, [&] {
    kc::cross_entropy_kernel<T>(logits.data(), target.data(), cols, kIgnore, smoothing, loss.data(), lse.data(),
                                packed);
  });
  simt::launch(static_cast<unsigned>(rows), threads, [&] {
    kc::cross_entropy_backward_kernel<T>(grad_loss.data(), logits.data(), target.data(), lse.data(), cols, kIgnore,
                                         static_cast<A>(smoothing / static_cast<double>(cols)),
                                         static_cast<A>(1.0 - smoothing), grad.data(), packed);
  });

  double loss_err = 0, lse_err = 0, grad_err = 0, grad_ref = 0;
  for (int64_t r = 0; r < rows; ++r) {
    const size_t ri = static_cast<size_t>(r);
    std::vector<double> x(static_cast<size_t>(cols));
    double mx = -INFINITY, sum_x = 0;
    for (int64_t c = 0; c < cols; ++c) {
      x[static_cast<size_t>(c)] = static_cast<double>(static_cast<A>(logits[static_cast<size_t>(r * cols + c)]));
      mx = std::max(mx, x[static_cast<size_t>(c)]);
      sum_x += x[static_cast<size_t>(c)];
    }
    double s = 0;
    for (double v : x) s += std::exp(v - mx);
    const double l = mx + std::log(s);
    const bool ignored = target[ri] == kIgnore;
    const double want_loss = ignored
                                 ? 0.0
                                 : (1.0 - smoothing) * (l - x[static_cast<size_t>(target[ri])]) +
                                       smoothing / static_cast<double>(cols) * (static_cast<double>(cols) * l - sum_x);
    loss_err = std::max(loss_err, std::abs(static_cast<double>(loss[ri]) - want_loss) / std::max(1.0, want_loss));
    lse_err = std::max(lse_err, std::abs(static_cast<double>(lse[ri]) - l) / std::abs(l));
    for (int64_t c = 0; c < cols; ++c) {
      const double p = std::exp(x[static_cast<size_t>(c)] - l);
      const double g = static_cast<double>(grad_loss[ri]);
      const double want =
          ignored ? 0.0 : g * (p - smoothing / static_cast<double>(cols) - (c == target[ri] ? 1.0 - smoothing : 0.0));
      const double got = static_cast<double>(static_cast<A>(grad[static_cast<size_t>(r * cols + c)]));
      grad_err = std::isfinite(got) ? std::max(grad_err, std::abs(got - want)) : INFINITY;
      grad_ref = std::max(grad_ref, std::abs(want));
      if (!std::isfinite(got)) break;
    }
  }
  EXPECT_LE(loss_err, 1e-5) << "loss";
  EXPECT_LE(lse_err, 1e-5) << "lse (f32 sums)";
  const double grad_tol = std::is_same_v<T, float> ? 1e-5 : 1e-2;
  EXPECT_LE(grad_err / grad_ref, grad_tol) << "grad_logits";
}

TEST(CrossEntropyEmulatedTest, PackedAndScalarRowsMatchFloat64) {
#if defined(__SANITIZE_THREAD__)
  GTEST_SKIP() << "the emulator's fibers switch stacks, which ThreadSanitizer is not told about";
#endif
  for (double smoothing : {0.0, 0.1}) {
    check_cross_entropy<float>(4, 2000, smoothing, true);     // whole packs: 16-byte reads and writes
    check_cross_entropy<float>(4, 1001, smoothing, false);    // 1001 % 4 != 0: element by element
    check_cross_entropy<BFloat16>(3, 4096, smoothing, true);  // 512 packs of 8, two per thread
    check_cross_entropy<BFloat16>(3, 37, smoothing, false);   // one warp, a partial row
  }
}

// Note [Non-finite rows] through the packed path (Note [Cross-entropy packs]): rows wide enough that thread 0 adds two
// packs, so a thread's first pack can be all -inf (its max stays -inf) and its second finite. A masked row (some -inf)
// and a row whose first pack is masked give the f64 loss over the other logits and a zero gradient at the masked
// ones; a NaN, a +inf and a row of only -inf give a NaN loss and lse.
template <class T>
void check_non_finite_rows(int64_t cols) {
  using A = kc::acc_t<T>;
  SCOPED_TRACE(::testing::Message() << (std::is_same_v<T, float> ? "f32" : "bf16") << " cols " << cols);
  constexpr int64_t kRows = 5;
  const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  std::vector<T> logits(static_cast<size_t>(kRows * cols));
  for (int64_t i = 0; i < kRows * cols; ++i)
    logits[static_cast<size_t>(i)] = T(static_cast<float>((i * 37) % 101) / 25.0f - 2.0f);
  auto at = [&](int64_t r, int64_t c) -> T& { return logits[static_cast<size_t>(r * cols + c)]; };
  constexpr int V = ::ember::cuda::Pack<T>::kSize;
  for (int64_t c = 0; c < cols; c += 3) at(0, c) = T(-inf);  // masked logits
  for (int64_t c = 0; c < V; ++c) at(1, c) = T(-inf);        // thread 0's first pack all -inf
  at(2, cols - 1) = T(nan);
  at(3, cols / 2) = T(inf);
  for (int64_t c = 0; c < cols; ++c) at(4, c) = T(-inf);
  const std::vector<int64_t> target = {1, V, 0, 0, 0};
  std::vector<A> loss(kRows, A(nan)), lse = loss, grad_loss(kRows, A(1));
  std::vector<T> grad(logits.size(), T(nan));
  const unsigned threads = kc::threads_for(cols);
  ASSERT_TRUE(kc::cross_entropy_packed<T>(logits.data(), grad.data(), cols));
  ASSERT_GT(cols / V, static_cast<int64_t>(threads));  // thread 0 adds a second pack
  simt::launch(kRows, threads, [&] {
    kc::cross_entropy_kernel<T>(logits.data(), target.data(), cols, -100, 0.0, loss.data(), lse.data(), true);
  });
  simt::launch(kRows, threads, [&] {
    kc::cross_entropy_backward_kernel<T>(grad_loss.data(), logits.data(), target.data(), lse.data(), cols, -100, A(0),
                                         A(1), grad.data(), true);
  });
  for (int64_t r : {0, 1}) {
    double mx = -INFINITY, s = 0;
    for (int64_t c = 0; c < cols; ++c) mx = std::max(mx, static_cast<double>(static_cast<A>(at(r, c))));
    for (int64_t c = 0; c < cols; ++c) s += std::exp(static_cast<double>(static_cast<A>(at(r, c))) - mx);
    const double l = mx + std::log(s);
    const double want = l - static_cast<double>(static_cast<A>(at(r, target[static_cast<size_t>(r)])));
    EXPECT_NEAR(static_cast<double>(loss[static_cast<size_t>(r)]), want, 1e-5 * std::max(1.0, want)) << "row " << r;
    EXPECT_NEAR(static_cast<double>(lse[static_cast<size_t>(r)]), l, 1e-5 * std::abs(l)) << "row " << r;
    for (int64_t c = 0; c < cols; ++c) {
      const double x = static_cast<double>(static_cast<A>(at(r, c)));
      const double p = std::exp(x - l), want_g = c == target[static_cast<size_t>(r)] ? p - 1.0 : p;
      const double got = static_cast<double>(static_cast<A>(grad[static_cast<size_t>(r * cols + c)]));
      if (x == -INFINITY) {
        EXPECT_EQ(got, 0.0) << "row " << r << " column " << c;
      } else {
        const double tol = std::is_same_v<T, float> ? 1e-6 : 1e-2;
        EXPECT_NEAR(got, want_g, tol) << "row " << r << " column " << c;
      }
    }
  }
  for (int64_t r : {2, 3, 4}) {
    EXPECT_TRUE(std::isnan(static_cast<double>(loss[static_cast<size_t>(r)]))) << "row " << r;
    EXPECT_TRUE(std::isnan(static_cast<double>(lse[static_cast<size_t>(r)]))) << "row " << r;
  }
}

TEST(CrossEntropyEmulatedTest, NonFiniteRowsThroughPacks) {
#if defined(__SANITIZE_THREAD__)
  GTEST_SKIP() << "the emulator's fibers switch stacks, which ThreadSanitizer is not told about";
#endif
  check_non_finite_rows<float>(1040);     // 260 packs of 4 over 256 threads
  check_non_finite_rows<BFloat16>(2064);  // 258 packs of 8
}

}  // namespace
}  // namespace ember::testing

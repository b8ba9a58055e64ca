// The hand-written tensor-core GEMM's kernel (ember/kernels/cuda/tc_gemm_kernel.cuh), verified on an H100 by
// TensorCoreGemmTest, run on the CPU under the SIMT emulator (tests/harness/simt_emulator.h) against float64 products:
// this checks the emulator's model of mma.sync, ldmatrix (plain and .trans) and cp.async against a kernel whose
// hardware results are known good, which is what the emulated tests of other tensor-core kernels (the flash
// attention) rest on. Shapes take the 16-byte path (K, N multiples of 8), the element-wise path and partial tiles;
// outputs are poisoned (NaN) first.
#include <cmath>
#include <limits>
#include <vector>

#include "tests/harness/simt_emulator.h"
// The emulator's definitions of the CUDA names come first.
#include "ember/kernels/cuda/tc_gemm_kernel.cuh"
#include "tests/harness/op_harness.h"

namespace ember::testing {
namespace {

namespace tc = ::ember::cuda::tc;

struct Shape3 {
  int64_t batch, M, N, K;
};

template <class T>
void check_emulated_gemm(const Shape3& s, uint32_t seed) {
  SCOPED_TRACE(::testing::Message() << (std::is_same_v<T, Half> ? "f16" : "bf16") << " batch " << s.batch << " M "
                                    << s.M << " N " << s.N << " K " << s.K);
  auto fill = [&](size_t n) {
    std::vector<uint16_t> bits(n);
    std::vector<double> values(n);
    uint32_t state = seed;
    for (size_t i = 0; i < n; ++i) {
      state = state * 1664525u + 1013904223u;
      const float u = static_cast<float>(state >> 8) / static_cast<float>(1u << 24);
      bits[i] = T(2.0f * u - 1.0f).bits;
      values[i] = static_cast<float>(T::from_bits(bits[i]));
    }
    seed += 7919u;
    return std::make_pair(bits, values);
  };
  const auto [a_bits, a] = fill(static_cast<size_t>(s.batch * s.M * s.K));
  const auto [b_bits, b] = fill(static_cast<size_t>(s.batch * s.K * s.N));
  std::vector<double> expected(static_cast<size_t>(s.batch * s.M * s.N), 0.0);
  for (int64_t z = 0; z < s.batch; ++z)
    for (int64_t i = 0; i < s.M; ++i)
      for (int64_t k = 0; k < s.K; ++k) {
        const double x = a[static_cast<size_t>((z * s.M + i) * s.K + k)];
        for (int64_t j = 0; j < s.N; ++j)
          expected[static_cast<size_t>((z * s.M + i) * s.N + j)] += x * b[static_cast<size_t>((z * s.K + k) * s.N + j)];
      }
  std::vector<uint16_t> out(expected.size(), 0xffffu);  // NaN in f16 and bf16

  tc::TcGemmParams p{};
  p.a = a_bits.data();
  p.b = b_bits.data();
  p.out = out.data();
  p.M = s.M;
  p.N = s.N;
  p.K = s.K;
  auto aligned = [](const void* q, uintptr_t n) { return reinterpret_cast<uintptr_t>(q) % n == 0; };
  p.a_vec = s.K % 8 == 0 && aligned(p.a, 16);
  p.b_vec = s.N % 8 == 0 && aligned(p.b, 16);
  p.out_vec2 = s.N % 2 == 0 && aligned(p.out, 4);
  const simt::Dim3 grid{static_cast<unsigned>((s.N + tc::kBlockN - 1) / tc::kBlockN),
                        static_cast<unsigned>((s.M + tc::kBlockM - 1) / tc::kBlockM), static_cast<unsigned>(s.batch)};
  simt::launch(
      grid, tc::kThreads, [&] { tc::tc_gemm_kernel<T>(p); }, tc::kSmemBytes);

  double diff = 0.0, ref = 0.0;
  for (size_t i = 0; i < out.size(); ++i) {
    const double v = static_cast<float>(T::from_bits(out[i]));
    diff = std::isfinite(v) ? std::max(diff, std::abs(v - expected[i])) : std::numeric_limits<double>::infinity();
    ref = std::max(ref, std::abs(expected[i]));
  }
  EXPECT_LE(diff / ref, 1e-2);  // one rounding to 16 bits of an f32 sum (TensorCoreGemmTest's tolerance)
}

TEST(TensorCoreGemmEmulatedTest, MatchesFloat64Products) {
#if defined(__SANITIZE_THREAD__)
  GTEST_SKIP() << "the emulator's fibers switch stacks, which ThreadSanitizer is not told about";
#endif
  check_emulated_gemm<BFloat16>({1, 128, 128, 64}, 1u);  // one whole block, 16-byte loads, two k tiles
  check_emulated_gemm<Half>({2, 70, 136, 40}, 2u);       // partial tiles, two blocks along N, batch 2
  check_emulated_gemm<BFloat16>({1, 33, 50, 27}, 3u);    // element-wise loads (K, N not multiples of 8), odd N
}

}  // namespace
}  // namespace ember::testing

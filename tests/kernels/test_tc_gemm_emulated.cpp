// The hand-written tensor-core GEMM's kernel (ember/kernels/cuda/tc_gemm_kernel.cuh), verified on an H100 by
// TensorCoreGemmTest, run on the CPU under the SIMT emulator (tests/harness/simt_emulator.h) against float64 products:
// this checks the emulator's model of mma.sync, ldmatrix (plain and .trans) and cp.async against a kernel whose
// hardware results are known good, which is what the emulated tests of other tensor-core kernels (the flash
// attention) rest on. Shapes take the 16-byte path (K, N multiples of 8), the element-wise path and partial tiles;
// outputs are poisoned (NaN) first.
#include <vector>

#include "tests/harness/simt_emulator.h"
// The emulator's definitions of the CUDA names come first.
#include "ember/kernels/cuda/tc_gemm_kernel.cuh"
#include "tests/harness/op_harness.h"
#include "tests/kernels/gemm_emulated_reference.h"

namespace ember::testing {
namespace {

namespace tc = ::ember::cuda::tc;

template <class T>
void check_emulated_gemm(const GemmShape& s, uint32_t seed) {
  SCOPED_TRACE(::testing::Message() << (std::is_same_v<T, Half> ? "f16" : "bf16") << " batch " << s.batch << " M "
                                    << s.M << " N " << s.N << " K " << s.K);
  const auto [a_bits, a] = random_16bit<T>(static_cast<size_t>(s.batch * s.M * s.K), seed);
  const auto [b_bits, b] = random_16bit<T>(static_cast<size_t>(s.batch * s.K * s.N), seed);
  const std::vector<double> expected = gemm_reference(s, a, b);
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

  // One rounding to 16 bits of an f32 sum (TensorCoreGemmTest's tolerance).
  EXPECT_LE(normalised_error<T>(out, expected), 1e-2);
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

// The Hopper GEMM's kernel (ember/kernels/cuda/tc_gemm_sm90_kernel.cuh) run on the CPU under the SIMT emulator
// (tests/harness/simt_emulator.h) against float64 products. The emulator models the mbarrier phases, TMA boxes with
// the 128-byte swizzle and wgmma's descriptors from the PTX ISA's layouts (Note [Hopper GEMM]); these tests check the
// kernel's own logic (tiling, pipeline parities, tails, fragment layout) against the documented layouts, and
// TensorCoreGemmTest's Wgmma cases check both on a GPU (they passed on an H100 on the kernel's first run there).
// Outputs are poisoned (NaN) first.
#include <algorithm>
#include <vector>

#include "tests/harness/simt_emulator.h"
// The emulator's definitions of the CUDA names come first.
#include "ember/kernels/cuda/tc_gemm_sm90_kernel.cuh"
#include "tests/harness/op_harness.h"
#include "tests/kernels/gemm_emulated_reference.h"

namespace ember::testing {
namespace {

namespace sm90 = ::ember::cuda::sm90;

// The launcher's tensor maps (tc_gemm_sm90.cu): [batch, rows, cols] of 16-bit elements, 128-byte swizzled boxes.
simt::TensorMap map_of(const void* base, int64_t batch, int64_t rows, int64_t cols, uint32_t box_cols,
                       uint32_t box_rows) {
  simt::TensorMap m;
  m.base = base;
  m.dims[0] = static_cast<uint64_t>(cols);
  m.dims[1] = static_cast<uint64_t>(rows);
  m.dims[2] = static_cast<uint64_t>(batch);
  m.strides[1] = static_cast<uint64_t>(cols * 2);
  m.strides[2] = static_cast<uint64_t>(rows * cols * 2);
  m.box[0] = box_cols;
  m.box[1] = box_rows;
  m.box[2] = 1;
  m.elem_bytes = 2;
  m.swizzle_128b = true;
  return m;
}

// [batch, rows, cols] row-major -> [batch, cols, rows] (the transposed storage of each matrix).
std::vector<uint16_t> transposed(const std::vector<uint16_t>& v, int64_t batch, int64_t rows, int64_t cols) {
  std::vector<uint16_t> t(v.size());
  for (int64_t z = 0; z < batch; ++z)
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < cols; ++c)
        t[static_cast<size_t>((z * cols + c) * rows + r)] = v[static_cast<size_t>((z * rows + r) * cols + c)];
  return t;
}

// `units` persistent blocks (or clusters of kCluster blocks; the launcher's SM or cluster count) share the tiles.
// kAMajorM / kBMajorK store a as [batch, K, M] / b as [batch, N, K]; with `bias` a random bias row is added.
template <class T, int BN, int kCluster = 1, bool kAMajorM = false, bool kBMajorK = false>
void check_emulated_wgmma_gemm(const GemmShape& s, uint32_t seed, unsigned units = 132, bool bias = false) {
  SCOPED_TRACE(::testing::Message() << (std::is_same_v<T, Half> ? "f16" : "bf16") << " BN " << BN << " cluster "
                                    << kCluster << (kAMajorM ? " a [K, M]" : "") << (kBMajorK ? " b [N, K]" : "")
                                    << (bias ? " bias" : "") << " batch " << s.batch << " M " << s.M << " N " << s.N
                                    << " K " << s.K);
  ASSERT_TRUE(s.N % 8 == 0 && (kAMajorM ? s.M : s.K) % 8 == 0 && (kBMajorK ? s.K : s.N) % 8 == 0)
      << "the launcher's conditions";
  const auto [a_bits, a] = random_16bit<T>(static_cast<size_t>(s.batch * s.M * s.K), seed);
  const auto [b_bits, b] = random_16bit<T>(static_cast<size_t>(s.batch * s.K * s.N), seed);
  const auto [bias_bits, bias_values] = random_16bit<T>(static_cast<size_t>(s.N), seed);
  std::vector<double> expected = gemm_reference(s, a, b);
  if (bias)
    for (size_t i = 0; i < expected.size(); ++i) expected[i] += bias_values[i % static_cast<size_t>(s.N)];
  std::vector<uint16_t> out(expected.size(), 0xffffu);  // NaN in f16 and bf16

  const std::vector<uint16_t> a_store = kAMajorM ? transposed(a_bits, s.batch, s.M, s.K) : a_bits;
  const std::vector<uint16_t> b_store = kBMajorK ? transposed(b_bits, s.batch, s.K, s.N) : b_bits;
  const simt::TensorMap map_a = kAMajorM ? map_of(a_store.data(), s.batch, s.K, s.M, 64, 64)
                                         : map_of(a_store.data(), s.batch, s.M, s.K, sm90::kBlockK, sm90::kBlockM);
  const simt::TensorMap map_b = kBMajorK ? map_of(b_store.data(), s.batch, s.N, s.K, sm90::kBlockK, sm90::kBoxN)
                                         : map_of(b_store.data(), s.batch, s.K, s.N, sm90::kBoxN, sm90::kBlockK);
  sm90::WgmmaGemmParams p{};
  p.out = out.data();
  p.bias = bias ? bias_bits.data() : nullptr;
  p.M = s.M;
  p.N = s.N;
  p.K = s.K;
  p.m_tiles = (s.M + sm90::kBlockM * kCluster - 1) / (sm90::kBlockM * kCluster);
  p.n_tiles = (s.N + BN - 1) / BN;
  p.tiles = s.batch * p.m_tiles * p.n_tiles;
  p.out_vec2 = reinterpret_cast<uintptr_t>(out.data()) % 4 == 0;
  const simt::Dim3 grid{static_cast<unsigned>(std::min<int64_t>(p.tiles, units) * kCluster), 1, 1};
  simt::launch(
      grid, sm90::kThreads, [&] { sm90::wgmma_gemm_kernel<T, BN, kCluster, kAMajorM, kBMajorK>(map_a, map_b, p); },
      sm90::Tile<BN>::kSmemBytes, kCluster);

  // One rounding to 16 bits of an f32 sum (TensorCoreGemmTest's tolerance); a layout error is of order 1.
  EXPECT_LE(normalised_error<T>(out, expected), 1e-2);
}

TEST(WgmmaGemmEmulatedTest, OneTileMatchesFloat64Products) {
#if defined(__SANITIZE_THREAD__)
  GTEST_SKIP() << "the emulator's fibers switch stacks, which ThreadSanitizer is not told about";
#endif
  check_emulated_wgmma_gemm<BFloat16, 256>({1, 128, 256, 64}, 1u);  // one whole tile, one k tile
  check_emulated_wgmma_gemm<Half, 256>({1, 128, 256, 320}, 2u);     // 5 k tiles over 4 stages: the empty barriers wrap
  check_emulated_wgmma_gemm<Half, 128>({1, 128, 128, 448}, 3u);     // 7 k tiles over 6 stages
  check_emulated_wgmma_gemm<BFloat16, 64>({1, 128, 64, 576}, 4u);   // 9 k tiles over 8 stages
}

TEST(WgmmaGemmEmulatedTest, PartialTilesAndBatchesMatchFloat64Products) {
#if defined(__SANITIZE_THREAD__)
  GTEST_SKIP() << "the emulator's fibers switch stacks, which ThreadSanitizer is not told about";
#endif
  check_emulated_wgmma_gemm<Half, 256>({2, 72, 264, 40}, 5u);        // partial M, N and K tiles, batch 2
  check_emulated_wgmma_gemm<BFloat16, 256>({1, 300, 520, 136}, 6u);  // 3 x 3 tiles in one raster group
  check_emulated_wgmma_gemm<BFloat16, 128>({2, 136, 200, 72}, 7u);   // 2 x 2 tiles, batch 2
  check_emulated_wgmma_gemm<Half, 64>({1, 1100, 72, 24}, 8u);        // 9 M tiles: a second, partial raster group
}

// Fewer persistent blocks than tiles: each block runs several tiles, its pipeline's rounds running on across them.
TEST(WgmmaGemmEmulatedTest, PersistentBlocksCarryThePipelineAcrossTiles) {
#if defined(__SANITIZE_THREAD__)
  GTEST_SKIP() << "the emulator's fibers switch stacks, which ThreadSanitizer is not told about";
#endif
  check_emulated_wgmma_gemm<BFloat16, 256>({2, 200, 264, 136}, 9u, 3);  // 8 tiles on 3 blocks, 3 k tiles each
  check_emulated_wgmma_gemm<Half, 64>({1, 256, 200, 72}, 10u, 2);       // 8 tiles on 2 blocks, 2 k tiles each
  check_emulated_wgmma_gemm<Half, 128>({3, 130, 136, 8}, 11u, 1);       // 12 tiles of one k tile on one block
}

// Clusters of 2 blocks along M: each loads its A rows and half of B's boxes, multicast to both; a stage is reloaded
// only when the consumers of both blocks have released it.
TEST(WgmmaGemmEmulatedTest, ClustersShareBByMulticast) {
#if defined(__SANITIZE_THREAD__)
  GTEST_SKIP() << "the emulator's fibers switch stacks, which ThreadSanitizer is not told about";
#endif
  check_emulated_wgmma_gemm<BFloat16, 256, 2>({1, 256, 256, 320}, 12u);    // one cluster tile, 5 k tiles on 4 stages
  check_emulated_wgmma_gemm<Half, 256, 2>({2, 200, 264, 136}, 13u, 2);     // rank 1 past M in part; 4 tiles, 2 clusters
  check_emulated_wgmma_gemm<Half, 128, 2>({1, 130, 200, 456}, 14u, 1);     // 2 tiles on one cluster, 8 k tiles each
  check_emulated_wgmma_gemm<BFloat16, 128, 2>({3, 100, 136, 24}, 15u, 2);  // rank 1 wholly past M: zeros, no stores
}

// Transposed storage: a as [K, M] (a weight gradient's x^T) and b as [N, K] (a linear layer's weight), and the bias
// epilogue, alone and in clusters.
TEST(WgmmaGemmEmulatedTest, TransposedOperandsAndBiasMatchFloat64Products) {
#if defined(__SANITIZE_THREAD__)
  GTEST_SKIP() << "the emulator's fibers switch stacks, which ThreadSanitizer is not told about";
#endif
  check_emulated_wgmma_gemm<Half, 256, 1, false, true>({1, 200, 264, 136}, 16u, 132, true);  // x @ W^T + b
  check_emulated_wgmma_gemm<BFloat16, 128, 2, false, true>({2, 136, 128, 72}, 17u, 1, true);
  check_emulated_wgmma_gemm<BFloat16, 64, 1, true, false>({1, 136, 72, 200}, 18u);  // x^T @ g, partial K tiles
  check_emulated_wgmma_gemm<Half, 256, 2, true, false>({2, 264, 256, 64}, 19u, 2);
  check_emulated_wgmma_gemm<Half, 128, 1, false, false>({1, 72, 136, 40}, 20u, 132, true);  // bias, plain layout
}

}  // namespace
}  // namespace ember::testing

// Tests of the hand-written tensor-core GEMMs (ember::cuda::tensor_core_gemm: the mma.sync kernel of tc_gemm.cu and
// the Hopper wgmma + TMA kernel of tc_gemm_sm90.cu) against a float64 CPU product of the same f16/bf16-rounded
// operands: partial tiles, batches, the 16-byte cp.async load path and the element-wise one (unaligned shapes or
// pointers), the wgmma kernel's pipeline and tails, plus the argument checks. The cuda instance skips without a
// GPU; a build without CUDA compiles the suite to one skipped test.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "tests/harness/op_harness.h"

#if defined(EMBER_WITH_CUDA)
#include <cuda_runtime.h>

#include "ember/kernels/cuda/blas.h"
#include "ember/kernels/cuda/stream.h"
#include "ember/kernels/cuda/tc_gemm_sm90.h"
#endif

namespace ember::testing {
namespace {

class TensorCoreGemmTest : public DeviceTest {};

#if defined(EMBER_WITH_CUDA)

struct GemmShape {
  int64_t batch, M, N, K;
  std::string str() const { return detail::concat(batch, " x [", M, " x ", K, "] @ [", K, " x ", N, "]"); }
};

// out[b] = a[b] @ bm[b] in float64 for row-major [batch, M, K] and [batch, K, N] values.
std::vector<double> reference_bmm(const std::vector<double>& a, const std::vector<double>& b, const GemmShape& s) {
  std::vector<double> out(static_cast<size_t>(s.batch * s.M * s.N), 0.0);
  for (int64_t t = 0; t < s.batch; ++t) {
    const double* pa = a.data() + t * s.M * s.K;
    const double* pb = b.data() + t * s.K * s.N;
    double* po = out.data() + t * s.M * s.N;
    for (int64_t i = 0; i < s.M; ++i)
      for (int64_t k = 0; k < s.K; ++k) {
        const double x = pa[i * s.K + k];
        for (int64_t j = 0; j < s.N; ++j) po[i * s.N + j] += x * pb[k * s.N + j];
      }
  }
  return out;
}

// max |actual - expected| / max |expected|; infinite when an element of `actual` is not finite (an unwritten,
// NaN-poisoned output included) or when the sizes differ.
double normalised_error(const std::vector<double>& actual, const std::vector<double>& expected) {
  if (actual.size() != expected.size()) return INFINITY;
  double max_err = 0.0, max_ref = 0.0;
  for (size_t i = 0; i < actual.size(); ++i) {
    if (!std::isfinite(actual[i])) return INFINITY;
    max_err = std::max(max_err, std::abs(actual[i] - expected[i]));
    max_ref = std::max(max_ref, std::abs(expected[i]));
  }
  return max_ref > 0.0 ? max_err / max_ref : max_err;
}

constexpr double kMaxNormalisedError = 1e-2;

// The wgmma tests: skip without a GPU that runs the kernel, saying why, and leave the process's wgmma configuration
// as found. On a 9.x device with sm_90a code in the build the kernel must run: a register count other than its
// setmaxnreg split's, or a failed probe, fails the test rather than skipping it.
#define EMBER_SKIP_WITHOUT_WGMMA()                                                                   \
  do {                                                                                               \
    EMBER_SKIP_WITHOUT_CUDA();                                                                       \
    if (!cuda::wgmma_gemm_supported(device().index)) {                                               \
      const std::string why = cuda::wgmma_gemm_unsupported_reason(device().index);                   \
      if (why.find("registers") != std::string::npos || why.find("probe") != std::string::npos)      \
        FAIL() << "the wgmma kernel is off on a device that should run it: " << why;                 \
      GTEST_SKIP() << "the wgmma kernel does not run here: " << why;                                 \
    }                                                                                                \
  } while (0)
struct ResetWgmmaConfig {
  ~ResetWgmmaConfig() { cuda::set_wgmma_config({}); }
};

// Runs tensor_core_gemm on `s` for `dtype` and compares with the float64 product of the rounded operands. With
// `offset` each operand starts `offset` elements into its buffer: 1 (2 bytes: not 16-byte aligned) forces the
// element-wise load path and unpaired stores.
void check_gemm(DType dtype, const GemmShape& s, Device device, int64_t offset,
                cuda::TcGemmKernel kernel = cuda::TcGemmKernel::MmaSync) {
  SCOPED_TRACE(detail::concat(dtype_name(dtype), " ", s.str(),
                              offset ? detail::concat(" (operands at element ", offset, ")") : "",
                              kernel == cuda::TcGemmKernel::Wgmma ? " (wgmma)" : ""));
  const int64_t o = offset;
  const int64_t na = s.batch * s.M * s.K, nb = s.batch * s.K * s.N, no = s.batch * s.M * s.N;
  // Operands are rounded to the dtype first; the reference multiplies exactly those values.
  const Tensor a = rand_input({o + na}).to(dtype).to(device);
  const Tensor b = rand_input({o + nb}).to(dtype).to(device);
  const Tensor out = empty({o + no}, {dtype, device});
  const Tensor a_view = a.slice(0, o, o + na), b_view = b.slice(0, o, o + nb), out_view = out.slice(0, o, o + no);
  const std::vector<double> expected = reference_bmm(a_view.to_vector<double>(), b_view.to_vector<double>(), s);

  cuda::tensor_core_gemm(dtype, s.batch, s.M, s.N, s.K, a_view.raw_data(), b_view.raw_data(), out_view.raw_data(),
                         cuda::current_stream(device.index).get(), kernel);
  const double err = normalised_error(out_view.to_vector<double>(), expected);
  EXPECT_LE(err, kMaxNormalisedError);
}

TEST_P(TensorCoreGemmTest, MatchesFloat64Reference) {
  EMBER_SKIP_WITHOUT_CUDA();
  const std::vector<GemmShape> shapes = {
      {1, 1, 1, 1},           // a single element: everything but one lane is masked
      {1, 17, 33, 9},         // unaligned K and N: element-wise loads, partial tiles everywhere
      {1, 128, 128, 32},      // exactly one block tile and one K step
      {1, 256, 192, 320},     // several tiles along M and K, a partial tile along N
      {1, 1000, 1000, 1000},  // large, aligned (K, N multiples of 8), partial edge tiles
      {3, 129, 200, 72},      // batched, aligned, one row past a tile
      {3, 45, 31, 27},        // batched, unaligned
      {2, 70, 36, 40},        // K % 8 == 0 (A by cp.async), N % 8 != 0 (B element-wise), odd tile edges
      {2, 70, 40, 36},        // K % 8 != 0 (A element-wise), N % 8 == 0 (B by cp.async)
      {1, 64, 8, 2000},       // long K: many pipeline iterations, one narrow N tile
  };
  for (DType dtype : {DType::f16, DType::bf16}) {
    for (const GemmShape& s : shapes) check_gemm(dtype, s, device(), /*offset=*/0);
    // Aligned shapes at unaligned addresses take the element-wise loads and unpaired stores.
    check_gemm(dtype, {1, 128, 128, 32}, device(), /*offset=*/1);
    check_gemm(dtype, {2, 96, 72, 200}, device(), /*offset=*/1);
  }
}

// The Hopper kernel on shapes it takes (K, N multiples of 8, aligned operands) at each tile width, alone and in
// clusters of 2: one tile, partial tiles in M, N and K, batches, more k tiles than pipeline stages, several raster
// groups, more tiles than SMs. Auto takes it too, and falls
// back to mma.sync where it does not apply.
TEST_P(TensorCoreGemmTest, WgmmaMatchesFloat64Reference) {
  EMBER_SKIP_WITHOUT_WGMMA();
  const ResetWgmmaConfig reset;
  const std::vector<GemmShape> shapes = {
      {1, 128, 256, 64},      // exactly one 256-wide tile and one k tile
      {1, 1, 8, 8},           // one row, one 8-column group: TMA zero-fills the rest of the tile
      {3, 129, 200, 72},      // batched, one row past a tile, partial N and K tiles
      {1, 256, 512, 1024},    // 16 k tiles: several rounds of every stage count (4, 6, 8)
      {1, 1000, 1000, 1000},  // partial edge tiles, one raster group of 8 M tiles
      {1, 1100, 264, 64},     // 9 M tiles: a second, partial raster group
      {1, 64, 8, 2000},       // long K, one narrow N tile
      {8, 256, 1024, 64},     // 64 to 256 tiles: persistent blocks take several each (132 SMs)
  };
  for (DType dtype : {DType::f16, DType::bf16}) {
    for (const cuda::WgmmaConfig config :
         {cuda::WgmmaConfig{64, 1}, cuda::WgmmaConfig{128, 1}, cuda::WgmmaConfig{256, 1}, cuda::WgmmaConfig{128, 2},
          cuda::WgmmaConfig{256, 2}}) {
      cuda::set_wgmma_config(config);
      SCOPED_TRACE(detail::concat("tile width ", config.tile_width, ", cluster ", config.cluster));
      for (const GemmShape& s : shapes) check_gemm(dtype, s, device(), /*offset=*/0, cuda::TcGemmKernel::Wgmma);
    }
    cuda::set_wgmma_config({});
    check_gemm(dtype, {2, 96, 72, 200}, device(), /*offset=*/0, cuda::TcGemmKernel::Auto);
    check_gemm(dtype, {2, 96, 72, 200}, device(), /*offset=*/1, cuda::TcGemmKernel::Auto);  // falls back
    // 16-byte aligned but not 128-byte aligned operands (TMA's global address needs 16 bytes; a swizzled map is
    // documented in one place with 128).
    for (int64_t o : {8, 24, 40}) check_gemm(dtype, {1, 72, 24, 72}, device(), o, cuda::TcGemmKernel::Wgmma);
  }
  EXPECT_THROW(cuda::tensor_core_gemm(DType::f16, 1, 8, 12, 8, nullptr, nullptr, nullptr,
                                      cuda::current_stream(device().index).get(), cuda::TcGemmKernel::Wgmma),
               ValueError);  // null operands are checked first
  const Tensor a = rand_input({64 * 12}).to(DType::f16).to(device());
  const Tensor out = empty({64 * 12}, {DType::f16, device()});
  EXPECT_THROW(cuda::tensor_core_gemm(DType::f16, 1, 64, 12, 12, a.raw_data(), a.raw_data(), out.raw_data(),
                                      cuda::current_stream(device().index).get(), cuda::TcGemmKernel::Wgmma),
               ShapeError);  // K and N not multiples of 8
}

// Which operand element each output of one wgmma tile reads: with A a 0/1 selection (A[m][k] = 1 where k = m % 64)
// out[m][n] is B[m % 64][n], and B filled with its own row (then column) index names the element read; likewise for A
// with B a selection. Small integers are exact in f16. On a mismatch the first few sources are printed, which is
// what a wrong descriptor stride or swizzle looks like (Note [Hopper GEMM]).
TEST_P(TensorCoreGemmTest, WgmmaReadsTheDocumentedOperandLayouts) {
  EMBER_SKIP_WITHOUT_WGMMA();
  const ResetWgmmaConfig reset;
  constexpr int64_t M = 128, K = 64;
  for (int64_t N : {int64_t{64}, int64_t{256}}) {
    cuda::set_wgmma_config({static_cast<int>(N), 1});
    // out = a @ b for f16 operands given by value functions.
    auto product = [&](auto a_of, auto b_of) {
      std::vector<float> a(M * K), b(K * N);
      for (int64_t m = 0; m < M; ++m)
        for (int64_t k = 0; k < K; ++k) a[m * K + k] = a_of(m, k);
      for (int64_t k = 0; k < K; ++k)
        for (int64_t n = 0; n < N; ++n) b[k * N + n] = b_of(k, n);
      const Tensor ta = from_vector(a, {M, K}).to(DType::f16).to(device());
      const Tensor tb = from_vector(b, {K, N}).to(DType::f16).to(device());
      const Tensor out = empty({M, N}, {DType::f16, device()});
      cuda::tensor_core_gemm(DType::f16, 1, M, N, K, ta.raw_data(), tb.raw_data(), out.raw_data(),
                             cuda::current_stream(device().index).get(), cuda::TcGemmKernel::Wgmma);
      return out.to_vector<double>();
    };
    auto select = [](int64_t r, int64_t c) { return r % 64 == c ? 1.0f : 0.0f; };
    // B through A = selection: out[m][n] = B[m % 64][n].
    const auto b_row = product(select, [](int64_t k, int64_t) { return static_cast<float>(k); });
    const auto b_col = product(select, [](int64_t, int64_t n) { return static_cast<float>(n); });
    // A through B = selection (B[k][n] = 1 where k = n % 64): out[m][n] = A[m][n % 64].
    auto select_b = [](int64_t k, int64_t n) { return n % 64 == k ? 1.0f : 0.0f; };
    const auto a_row = product([](int64_t m, int64_t) { return static_cast<float>(m); }, select_b);
    const auto a_col = product([](int64_t, int64_t k) { return static_cast<float>(k); }, select_b);
    int64_t b_bad = 0, a_bad = 0;
    for (int64_t m = 0; m < M; ++m)
      for (int64_t n = 0; n < N; ++n) {
        const size_t i = static_cast<size_t>(m * N + n);
        if (b_row[i] != static_cast<double>(m % 64) || b_col[i] != static_cast<double>(n)) {
          if (b_bad++ < 8)
            ADD_FAILURE() << "N " << N << ": out(" << m << ", " << n << ") read B(" << b_row[i] << ", " << b_col[i]
                          << "), expected B(" << m % 64 << ", " << n << ")";
        }
        if (a_row[i] != static_cast<double>(m) || a_col[i] != static_cast<double>(n % 64)) {
          if (a_bad++ < 8)
            ADD_FAILURE() << "N " << N << ": out(" << m << ", " << n << ") read A(" << a_row[i] << ", " << a_col[i]
                          << "), expected A(" << m << ", " << n % 64 << ")";
        }
      }
    EXPECT_EQ(b_bad, 0) << "outputs whose B element is not the documented one, N " << N;
    EXPECT_EQ(a_bad, 0) << "outputs whose A element is not the documented one, N " << N;
  }
}

// gemm() under GemmStrategy::TensorCore with the layouts of a training step's products: x @ W^T + b (b stored [N, K],
// a bias), x^T @ g (a stored [K, M]) and a plain product with a bias, against float64. On Hopper the wgmma kernel takes
// them (tensor_core_gemm_takes); elsewhere cuBLASLt does, and the results must agree either way.
TEST_P(TensorCoreGemmTest, GemmStrategyTakesTransposedOperandsAndBias) {
  EMBER_SKIP_WITHOUT_CUDA();
  struct Reset {
    cuda::GemmStrategy saved = cuda::gemm_strategy();
    ~Reset() {
      cuda::set_gemm_strategy(saved);
      cuda::set_wgmma_config({});
    }
  } reset;
  cuda::set_gemm_strategy(cuda::GemmStrategy::TensorCore);
  const GemmShape s{2, 136, 264, 72};
  struct Case {
    bool a_t, b_t, bias;
  };
  // Each tile width and cluster size of the wgmma kernel (where it runs; elsewhere the same cuBLASLt call four times).
  for (const cuda::WgmmaConfig config :
       {cuda::WgmmaConfig{64, 1}, cuda::WgmmaConfig{256, 1}, cuda::WgmmaConfig{128, 2}, cuda::WgmmaConfig{256, 2}}) {
    cuda::set_wgmma_config(config);
    for (DType dtype : {DType::f16, DType::bf16}) {
      for (const Case c : {Case{false, true, true}, Case{true, false, false}, Case{false, false, true}}) {
        SCOPED_TRACE(detail::concat(dtype_name(dtype), c.a_t ? " a [K, M]" : "", c.b_t ? " b [N, K]" : "",
                                    c.bias ? " bias" : "", " (wgmma width ", config.tile_width, ", cluster ",
                                    config.cluster, ")"));
        // Stored operands; the reference reads them through the same strides.
        const Tensor a = rand_input({s.batch, c.a_t ? s.K : s.M, c.a_t ? s.M : s.K}).to(dtype).to(device());
        const Tensor b = rand_input({s.batch, c.b_t ? s.N : s.K, c.b_t ? s.K : s.N}).to(dtype).to(device());
        const Tensor bias = rand_input({s.N}).to(dtype).to(device());
        const Tensor out = empty({s.batch, s.M, s.N}, {dtype, device()});
        const cuda::MatrixRef ra{a.raw_data(), s.M * s.K, c.a_t ? 1 : s.K, c.a_t ? s.M : 1};
        const cuda::MatrixRef rb{b.raw_data(), s.K * s.N, c.b_t ? 1 : s.N, c.b_t ? s.K : 1};
        cuda::gemm(dtype, s.batch, s.M, s.N, s.K, ra, rb, out.raw_data(), s.M * s.N, s.N, 1.0, 0.0, device().index,
                   cuda::current_stream(device().index).get(), c.bias ? bias.raw_data() : nullptr);
        const std::vector<double> av = a.to_vector<double>(), bv = b.to_vector<double>(),
                                  biasv = bias.to_vector<double>();
        std::vector<double> a_rm(av.size()), b_rm(bv.size());  // row-major [batch, M, K] and [batch, K, N]
        for (int64_t z = 0; z < s.batch; ++z)
          for (int64_t i = 0; i < s.M; ++i)
            for (int64_t k = 0; k < s.K; ++k)
              a_rm[static_cast<size_t>((z * s.M + i) * s.K + k)] =
                  av[static_cast<size_t>(z * s.M * s.K + (c.a_t ? k * s.M + i : i * s.K + k))];
        for (int64_t z = 0; z < s.batch; ++z)
          for (int64_t k = 0; k < s.K; ++k)
            for (int64_t j = 0; j < s.N; ++j)
              b_rm[static_cast<size_t>((z * s.K + k) * s.N + j)] =
                  bv[static_cast<size_t>(z * s.K * s.N + (c.b_t ? j * s.K + k : k * s.N + j))];
        std::vector<double> expected = reference_bmm(a_rm, b_rm, s);
        if (c.bias)
          for (size_t i = 0; i < expected.size(); ++i) expected[i] += biasv[i % static_cast<size_t>(s.N)];
        EXPECT_LE(normalised_error(out.to_vector<double>(), expected), kMaxNormalisedError);
      }
    }
  }
}

TEST_P(TensorCoreGemmTest, EmptyKGivesZeros) {
  EMBER_SKIP_WITHOUT_CUDA();
  const Tensor out = empty({2, 5, 7}, {DType::bf16, device()});  // NaN-poisoned by the test allocator
  cuda::tensor_core_gemm(DType::bf16, 2, 5, 7, 0, nullptr, nullptr, out.raw_data(),
                         cuda::current_stream(device().index).get());
  const std::vector<double> got = out.to_vector<double>();
  EXPECT_TRUE(std::all_of(got.begin(), got.end(), [](double v) { return v == 0.0; }));
}

// Argument checks come before any CUDA call, so they run on machines without a GPU too.
TEST(TensorCoreGemmHost, RejectsUnsupportedDTypesAndNegativeSizes) {
  const std::string msg = error_message<DTypeError>(
      [] { cuda::tensor_core_gemm(DType::f32, 1, 2, 2, 2, nullptr, nullptr, nullptr, nullptr); });
  EXPECT_NE(msg.find("tensor_core_gemm"), std::string::npos) << msg;
  EXPECT_NE(msg.find("f32"), std::string::npos) << msg;
  EXPECT_THROW(cuda::tensor_core_gemm(DType::f16, 1, -1, 2, 2, nullptr, nullptr, nullptr, nullptr), ShapeError);
  // Nothing to compute: no launch, no pointer is touched.
  EXPECT_NO_THROW(cuda::tensor_core_gemm(DType::f16, 0, 4, 4, 4, nullptr, nullptr, nullptr, nullptr));
  EXPECT_NO_THROW(cuda::tensor_core_gemm(DType::bf16, 2, 4, 0, 4, nullptr, nullptr, nullptr, nullptr));
}

// The Hopper kernel's configuration by shape on an H100 (132 SMs, 66 clusters of 2; Note [Hopper GEMM], "Tile width"):
// the fewest waves of units times the bytes a block loads per k step, a tie to the smaller unit.
TEST(TensorCoreGemmHost, WgmmaConfigFillsTheSms) {
  auto pick = [](int64_t batch, int64_t M, int64_t N, int clusters = 66) {
    const cuda::WgmmaConfig c = cuda::wgmma_config_for(batch, M, N, 132, clusters);
    return std::make_pair(c.tile_width, c.cluster);
  };
  using P = std::pair<int, int>;
  EXPECT_EQ(pick(1, 1024, 1024), P(64, 1));      // 128 tiles of 64, one wave: ties 32 clusters x 128, fewer SMs busy
  EXPECT_EQ(pick(1, 2048, 2048), P(256, 2));     // 64 clusters, one wave, 128 + 128 bytes per k step
  EXPECT_EQ(pick(1, 4096, 4096), P(256, 2));     // 4 waves x 256 < 4 waves x 384 alone
  EXPECT_EQ(pick(1, 8192, 8192), P(256, 2));     // 16 waves x 256
  EXPECT_EQ(pick(12, 1024, 1024), P(256, 2));    // the batch fills the waves
  EXPECT_EQ(pick(1, 4096, 4096, 0), P(256, 1));  // no cluster fits: single blocks
  EXPECT_EQ(pick(1, 128, 64), P(64, 1));
  EXPECT_THROW(cuda::set_wgmma_config({96, 1}), ValueError);
  EXPECT_THROW(cuda::set_wgmma_config({128, 3}), ValueError);
  EXPECT_THROW(cuda::set_wgmma_config({64, 2}), ValueError);  // a cluster splits B's boxes; width 64 has one
  const ResetWgmmaConfig reset;
  cuda::set_wgmma_config({0, 1});  // clusters off: the width alone is chosen
  EXPECT_EQ(pick(1, 4096, 4096), P(256, 1));
  cuda::set_wgmma_config({128, 0});  // the width fixed: the cluster alone is chosen
  EXPECT_EQ(pick(1, 4096, 4096), P(128, 2));
}

#else

TEST_P(TensorCoreGemmTest, MatchesFloat64Reference) { GTEST_SKIP() << "ember was built without the CUDA backend"; }

#endif

INSTANTIATE_TEST_SUITE_P(cuda, TensorCoreGemmTest, ::testing::Values(Device::cuda(0)), device_param_name);

}  // namespace
}  // namespace ember::testing

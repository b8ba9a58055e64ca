// The flash attention kernels (ember/kernels/cuda/attention_flash_kernels.cuh) run on the CPU under the SIMT emulator
// (tests/harness/simt_emulator.h), against naive float64 loops: out, lse and the gradient of qkv for f16 and bf16 at
// head sizes 32 and 64, T on both sides of the 64-row tiles, causal and not, with every output poisoned (NaN) before
// the launches, so an element no block writes fails the comparison. These run in every build, GPU or not; the same
// kernels on a GPU are checked by AttentionCudaTest.FlashMatchesFloat64Reference. Also: the emulator's own
// primitives (mma against a matrix product, deadlock reporting, when cp.async lands).
#include <algorithm>
#include <cstring>
#include <limits>
#include <vector>

#include "tests/harness/simt_emulator.h"
// The emulator's definitions of the CUDA names come first.
#include "ember/kernels/cuda/attention_flash_kernels.cuh"
#include "tests/harness/op_harness.h"
#include "tests/kernels/attention_reference.h"

#if defined(__SANITIZE_THREAD__)
#define EMBER_SIMT_UNDER_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define EMBER_SIMT_UNDER_TSAN 1
#endif
#endif

namespace ember::testing {
namespace {

namespace flash = ::ember::cuda::flash;

void skip_under_tsan() {
#if defined(EMBER_SIMT_UNDER_TSAN)
  GTEST_SKIP() << "the emulator's fibers switch stacks, which ThreadSanitizer is not told about";
#endif
}

// ---- the emulator -------------------------------------------------------------------------------------------------

// One mma over fragments that the lanes build from A (16 x 16) and B (16 x 8) by the PTX layout, against the f64
// product: every lane's four outputs.
TEST(SimtEmulatorTest, MmaMatchesMatrixProduct) {
  skip_under_tsan();
  double A[16][16], B[16][8];
  for (int i = 0; i < 16; ++i)
    for (int k = 0; k < 16; ++k) A[i][k] = static_cast<float>(BFloat16(static_cast<float>((i * 7 + k * 3) % 11 - 5)));
  for (int k = 0; k < 16; ++k)
    for (int j = 0; j < 8; ++j) B[k][j] = static_cast<float>(BFloat16(0.25f * static_cast<float>((k * 5 + j) % 9 - 4)));
  std::vector<float> got(32 * 4, std::numeric_limits<float>::quiet_NaN());
  auto bits = [](double v) { return static_cast<uint32_t>(BFloat16(static_cast<float>(v)).bits); };
  simt::launch(1, 32, [&] {
    const int lane = simt::current().lane, g = lane / 4, t = lane % 4;
    const uint32_t a[4] = {bits(A[g][2 * t]) | bits(A[g][2 * t + 1]) << 16,
                           bits(A[g + 8][2 * t]) | bits(A[g + 8][2 * t + 1]) << 16,
                           bits(A[g][2 * t + 8]) | bits(A[g][2 * t + 9]) << 16,
                           bits(A[g + 8][2 * t + 8]) | bits(A[g + 8][2 * t + 9]) << 16};
    const uint32_t b0 = bits(B[2 * t][g]) | bits(B[2 * t + 1][g]) << 16;
    const uint32_t b1 = bits(B[2 * t + 8][g]) | bits(B[2 * t + 9][g]) << 16;
    float d[4] = {1.0f, 1.0f, 1.0f, 1.0f};
    ::ember::cuda::mma_16816<BFloat16>(d, a, b0, b1);
    for (int j = 0; j < 4; ++j) got[static_cast<size_t>(lane * 4 + j)] = d[j];
  });
  for (int lane = 0; lane < 32; ++lane)
    for (int j = 0; j < 4; ++j) {
      const int row = lane / 4 + 8 * (j / 2), col = 2 * (lane % 4) + j % 2;
      double want = 1.0;
      for (int k = 0; k < 16; ++k) want += A[row][k] * B[k][col];
      EXPECT_EQ(got[static_cast<size_t>(lane * 4 + j)], want) << "lane " << lane << " register " << j;
    }
}

TEST(SimtEmulatorTest, ShuffleAndBarrierOrder) {
  skip_under_tsan();
  std::vector<int> seen(64, -1);
  static int shared_value = 0;
  simt::launch(2, 64, [&] {
    const int tid = static_cast<int>(simt::current().thread_idx.x);
    if (tid == 0) shared_value = static_cast<int>(simt::current().block_idx.x) + 100;
    __syncthreads();  // every thread sees thread 0's store
    const int from = __shfl_xor_sync(0xffffffffu, tid, 5);
    if (simt::current().block_idx.x == 1) seen[static_cast<size_t>(tid)] = from * 1000 + shared_value;
  });
  for (int tid = 0; tid < 64; ++tid) EXPECT_EQ(seen[static_cast<size_t>(tid)], (tid ^ 5) * 1000 + 101) << tid;
}

TEST(SimtEmulatorTest, DivergentBarrierIsReportedNotHung) {
  skip_under_tsan();
  EXPECT_THROW(simt::launch(1, 64,
                            [] {
                              if (simt::current().thread_idx.x != 3) __syncthreads();
                              __syncthreads();
                            }),
               simt::SimtError);
  EXPECT_THROW(simt::launch(1, 48, [] {}), simt::SimtError);
}

// cp.async lands at the wait that covers its group, and not before: a read after the wait sees the bytes, a read
// before it (or of a group still pending) sees the poison, and a barrier carries the landed bytes to the other
// threads. The flash kernels' double-buffered key tiles rest on this model.
TEST(SimtEmulatorTest, CpAsyncLandsAtItsWait) {
  skip_under_tsan();
  alignas(16) static uint32_t src[2][32][4];
  for (int g = 0; g < 2; ++g)
    for (int t = 0; t < 32; ++t)
      for (int e = 0; e < 4; ++e) src[g][t][e] = static_cast<uint32_t>(1000 * g + 10 * t + e);
  std::vector<uint32_t> before(32), pending(32), landed(32), neighbour(32), zero_filled(32);
  simt::launch(1, 32, [&] {
    alignas(16) __shared__ uint32_t dst[2][32][4];
    const int t = static_cast<int>(simt::current().thread_idx.x);
    ::ember::cuda::cp_async_16(dst[0][t], src[0][t], 16);
    ::ember::cuda::cp_async_commit();
    ::ember::cuda::cp_async_16(dst[1][t], src[1][t], t % 2 == 0 ? 16 : 0);  // odd threads: zero-fill
    ::ember::cuda::cp_async_commit();
    before[t] = dst[0][t][1];
    ::ember::cuda::cp_async_wait<1>();  // the first group has landed, the second may not have
    landed[t] = dst[0][t][1];
    pending[t] = dst[1][t][1];
    ::ember::cuda::cp_async_wait<0>();
    __syncthreads();
    neighbour[t] = dst[0][(t + 1) % 32][2];
    zero_filled[t] = dst[1][t][3];
  });
  for (int t = 0; t < 32; ++t) {
    SCOPED_TRACE(t);
    EXPECT_EQ(before[t], 0xffffffffu);
    EXPECT_EQ(pending[t], 0xffffffffu);
    EXPECT_EQ(landed[t], static_cast<uint32_t>(10 * t + 1));
    EXPECT_EQ(neighbour[t], static_cast<uint32_t>(10 * ((t + 1) % 32) + 2));
    EXPECT_EQ(zero_filled[t], t % 2 == 0 ? static_cast<uint32_t>(1000 + 10 * t + 3) : 0u);
  }
}

// What the hardware leaves undefined is an error: a store into a cp.async destination, or to its source, before the
// wait that covers the copy, and a thread that exits with copies in flight.
TEST(SimtEmulatorTest, CpAsyncMisuseIsReported) {
  skip_under_tsan();
  alignas(16) static uint32_t src[32][4] = {};
  auto copy_then = [](auto&& between) {
    return [between] {
      alignas(16) __shared__ uint32_t dst[32][4];
      const int t = static_cast<int>(simt::current().thread_idx.x);
      ::ember::cuda::cp_async_16(dst[t], src[t], 16);
      ::ember::cuda::cp_async_commit();
      if (!between(dst[t], src[t])) return;  // exits with the copy in flight
      ::ember::cuda::cp_async_wait<0>();
    };
  };
  EXPECT_THROW(simt::launch(1, 32, copy_then([](uint32_t* d, uint32_t*) { return d[0] = 1, true; })), simt::SimtError);
  EXPECT_THROW(simt::launch(1, 32, copy_then([](uint32_t*, uint32_t* s) { return s[1] += 1, true; })), simt::SimtError);
  EXPECT_THROW(simt::launch(1, 32, copy_then([](uint32_t*, uint32_t*) { return false; })), simt::SimtError);
  EXPECT_NO_THROW(simt::launch(1, 32, copy_then([](uint32_t*, uint32_t*) { return true; })));
}

// ---- the flash kernels --------------------------------------------------------------------------------------------

constexpr uint16_t kPoison16 = 0xffffu;  // NaN in f16 and bf16

template <class T>
std::vector<double> decode(const std::vector<uint16_t>& bits) {
  std::vector<double> v(bits.size());
  for (size_t i = 0; i < bits.size(); ++i) v[i] = static_cast<float>(T::from_bits(bits[i]));
  return v;
}

template <class T>
std::vector<uint16_t> encode(const std::vector<double>& v) {
  std::vector<uint16_t> bits(v.size());
  for (size_t i = 0; i < v.size(); ++i) bits[i] = T(static_cast<float>(v[i])).bits;
  return bits;
}

// Values in [-amp, amp] rounded to T (the reference sees the rounded values).
template <class T>
std::vector<double> random_rounded(size_t n, double amp, uint32_t seed) {
  std::vector<double> v(n);
  uint32_t state = seed;
  for (double& x : v) {
    state = state * 1664525u + 1013904223u;
    const double u = static_cast<double>(state >> 8) / static_cast<double>(1u << 24);
    x = static_cast<float>(T(static_cast<float>((2.0 * u - 1.0) * amp)));
  }
  return v;
}

template <class T, int HD>
void check_flash(int64_t B, int64_t T_len, int64_t H, bool causal) {
  const int64_t C = H * HD;
  SCOPED_TRACE(::testing::Message() << (std::is_same_v<T, Half> ? "f16" : "bf16") << " hd " << HD << " B " << B << " T "
                                    << T_len << " H " << H << (causal ? " causal" : " full"));
  const std::vector<double> x = random_rounded<T>(static_cast<size_t>(B * T_len * 3 * C), 2.0, 7u + T_len);
  const std::vector<double> go = random_rounded<T>(static_cast<size_t>(B * T_len * C), 1.0, 11u + T_len);
  const Reference ref = naive_attention(x, go, B, T_len, C, H, causal);
  const std::vector<uint16_t> qkv = encode<T>(x), grad_out = encode<T>(go);

  std::vector<uint16_t> out(static_cast<size_t>(B * T_len * C), kPoison16);
  std::vector<uint16_t> grad(static_cast<size_t>(B * T_len * 3 * C), kPoison16);
  std::vector<float> lse(static_cast<size_t>(B * H * T_len), std::numeric_limits<float>::quiet_NaN());
  std::vector<float> delta(lse.size(), std::numeric_limits<float>::quiet_NaN());

  const ::ember::cuda::FlashShape shape{B, T_len, C, H};
  flash::FlashParams p = flash::make_params(shape, causal);
  p.qkv = qkv.data();
  p.grad_out = grad_out.data();
  p.lse = lse.data();
  p.delta = delta.data();
  const auto blocks = static_cast<unsigned>(flash::flash_blocks(p));
  p.out = out.data();
  simt::launch(blocks, flash::kThreads, [&] { flash::flash_forward_kernel<T, HD>(p); });
  // The backward with the forward's output (as autograd runs it) and without (delta from a recomputed o).
  for (bool with_out : {true, false}) {
    std::fill(grad.begin(), grad.end(), kPoison16);
    std::fill(delta.begin(), delta.end(), std::numeric_limits<float>::quiet_NaN());
    p.o = with_out ? out.data() : nullptr;
    p.out = grad.data();
    simt::launch(blocks, flash::kThreads, [&] { flash::flash_backward_dq_kernel<T, HD>(p); });
    simt::launch(blocks, flash::kThreads, [&] { flash::flash_backward_dkdv_kernel<T, HD>(p); });
    EXPECT_LE(normalised_error(decode<T>(grad), ref.grad), 1e-2)
        << "grad_qkv " << (with_out ? "with" : "without") << " out";
  }

  // p and ds are rounded to T as mma operands (Note [Flash attention]): the 16-bit tolerance of the CUDA op tests. The
  // scores stay in f32, so lse is held to f32's.
  EXPECT_LE(normalised_error(decode<T>(out), ref.out), 1e-2) << "out";
  EXPECT_LE(normalised_error(std::vector<double>(lse.begin(), lse.end()), ref.lse), 1e-5) << "lse";
}

// One tile: T below the 64-row tile, both dtypes and head sizes (the sanitizer suite runs these).
TEST(FlashAttentionEmulatedTest, OneTileMatchesFloat64Reference) {
  skip_under_tsan();
  for (bool causal : {true, false}) {
    check_flash<Half, 32>(1, 1, 1, causal);
    check_flash<BFloat16, 64>(2, 7, 2, causal);
  }
}

// Several tiles, T one past a tile and past two (label `long`: about 25 s under the sanitizers).
TEST(FlashAttentionEmulatedTest, SeveralTilesMatchFloat64Reference) {
  skip_under_tsan();
  for (bool causal : {true, false}) {
    check_flash<Half, 64>(1, 65, 1, causal);
    check_flash<BFloat16, 32>(1, 130, 2, causal);
  }
}

}  // namespace
}  // namespace ember::testing

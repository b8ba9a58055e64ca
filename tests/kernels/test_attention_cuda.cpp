// The fused attention over packed qkv on every device with the kernel, against naive float64 loops: out, the saved
// lse and the gradient of qkv for f16/bf16/f32/f64 on CUDA (f32/f64 on the CPU, its kernel's dtypes) at T = 1, 7, 64,
// 300, causal and not, 1 to 4 heads; and, on CUDA only, shapes that take the block-per-row path and more than one
// tile (Note [Attention tiles] in ember/kernels/cuda/attention.cu). Errors are normalised: max |actual - expected| /
// max |expected|. cuda instances skip without a GPU.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "tests/harness/op_harness.h"
#include "tests/kernels/attention_reference.h"

#if defined(EMBER_WITH_CUDA)
#include "ember/kernels/cuda/attention.h"
#endif

namespace ember::testing {
namespace {

class AttentionCudaTest : public DeviceTest {};

double normalised_error(const Tensor& actual, const std::vector<double>& expected) {
  return ::ember::testing::normalised_error(actual.to_vector<double>(), expected);
}

// f16/bf16: scores, weights and d scores are stored in 16 bits between the products (Note [Attention precision] in
// ember/kernels/cuda/attention.cu).
double tolerance_for(DType dt) {
  switch (dt) {
    case DType::f64:
      return 1e-10;
    case DType::f32:
      return 1e-4;
    default:
      return 1e-2;
  }
}

DType lse_dtype_for(DType dt) { return is_reduced_float(dt) ? DType::f32 : dt; }

struct Shape4 {
  int64_t B, T, C, H;
};

// Forward and backward of one shape in one dtype on `device`, against naive_attention on the rounded inputs.
void check_attention(Device device, DType dt, const Shape4& s, bool causal) {
  SCOPED_TRACE(::testing::Message() << dtype_name(dt) << " B " << s.B << " T " << s.T << " C " << s.C << " H " << s.H
                                    << (causal ? " causal" : " full"));
  const Tensor x = rand_input({s.B, s.T, 3 * s.C}).to(dt).to(DType::f64);  // rounded to dt once
  const Tensor g = rand_input({s.B, s.T, s.C}).to(dt).to(DType::f64);
  const Reference ref = naive_attention(x.to_vector<double>(), g.to_vector<double>(), s.B, s.T, s.C, s.H, causal);
  const Tensor qkv = x.to(device, dt);
  const AttentionResult r = ops::attention_qkv(qkv, s.H, causal);
  ASSERT_EQ(r.out.sizes(), Shape({s.B, s.T, s.C}));
  ASSERT_EQ(r.lse.sizes(), Shape({s.B, s.H, s.T}));
  ASSERT_EQ(r.lse.dtype(), lse_dtype_for(dt));
  const double tol = tolerance_for(dt);
  EXPECT_LE(normalised_error(r.out, ref.out), tol) << "out";
  EXPECT_LE(normalised_error(r.lse, ref.lse), tol) << "lse";
  // With the forward's output (as autograd calls it) and without (the kernel recomputes what it needs).
  for (bool with_out : {true, false}) {
    const Tensor grad =
        ops::attention_qkv_backward(g.to(device, dt), qkv, r.lse, s.H, causal, with_out ? r.out : Tensor());
    ASSERT_EQ(grad.sizes(), qkv.sizes());
    ASSERT_EQ(grad.dtype(), dt);
    EXPECT_LE(normalised_error(grad, ref.grad), tol) << "grad_qkv " << (with_out ? "with" : "without") << " out";
  }
}

TEST_P(AttentionCudaTest, MatchesFloat64Reference) {
  EMBER_REQUIRE_KERNEL(attention_stub);
  EMBER_REQUIRE_KERNEL(attention_backward_stub);
  // The CPU kernel computes in f32/f64 only; the CUDA one also takes f16/bf16.
  const std::vector<DType> dtypes = device().is_cuda()
                                        ? std::vector<DType>{DType::f16, DType::bf16, DType::f32, DType::f64}
                                        : std::vector<DType>{DType::f32, DType::f64};
  for (DType dt : dtypes)
    for (int64_t T : {1, 7, 64, 300})
      for (bool causal : {true, false})
        for (const auto& [H, C] : std::vector<std::pair<int64_t, int64_t>>{{1, 16}, {2, 16}, {3, 12}, {4, 16}})
          check_attention(device(), dt, {2, T, C, H}, causal);
}

// Rows longer than 1024 keys take a block each; with 128 MiB of f32 scratch per buffer, B = 10 at T = 2048 runs as
// tiles of 8 and 2 batch elements, and T = 6144 as two tiles of query rows whose dk and dv add up across the tiles.
// CUDA only: the CPU kernel holds [T, T] buffers per thread, which at these sizes is not a unit test.
TEST_P(AttentionCudaTest, LongRowsAndSeveralTiles) {
  EMBER_REQUIRE_KERNEL(attention_stub);
  EMBER_REQUIRE_KERNEL(attention_backward_stub);
  if (!device().is_cuda()) GTEST_SKIP() << "shapes for the CUDA kernel's tiles";
  check_attention(device(), DType::f32, {10, 2048, 4, 1}, false);
  check_attention(device(), DType::f32, {1, 6144, 4, 1}, true);
  check_attention(device(), DType::f32, {1, 6144, 4, 1}, false);
  check_attention(device(), DType::bf16, {2, 1500, 8, 2}, true);
}

#if defined(EMBER_WITH_CUDA)

using ::ember::cuda::AttentionStrategy;

// Sets the CUDA attention path for one test and restores the previous one.
class AttentionStrategyScope {
 public:
  explicit AttentionStrategyScope(AttentionStrategy s) : previous_(::ember::cuda::attention_strategy()) {
    ::ember::cuda::set_attention_strategy(s);
  }
  ~AttentionStrategyScope() { ::ember::cuda::set_attention_strategy(previous_); }

 private:
  AttentionStrategy previous_;
};

// The flash kernels (Note [Flash attention] in ember/kernels/cuda/attention_flash_kernels.cuh) on the GPU: f16/bf16
// at head sizes 32 and 64, T around the 64-row tiles (1, 7, 64, 65, 130, 300), causal and not, one to four heads,
// and a GPT-sized row of 1024 keys; each call must have run the flash path (flash_attention_calls).
TEST_P(AttentionCudaTest, FlashMatchesFloat64Reference) {
  if (!device().is_cuda()) GTEST_SKIP() << "the CUDA flash kernels";
  const AttentionStrategyScope flash(AttentionStrategy::Flash);
  for (DType dt : {DType::f16, DType::bf16})
    for (const auto& [H, C] : std::vector<std::pair<int64_t, int64_t>>{{1, 32}, {2, 128}, {4, 128}, {1, 64}})
      for (int64_t T : {1, 7, 64, 65, 130, 300})
        for (bool causal : {true, false}) {
          ASSERT_TRUE(::ember::cuda::flash_attention_supported(dt, C / H));
          const int64_t calls = ::ember::cuda::flash_attention_calls();
          check_attention(device(), dt, {2, T, C, H}, causal);
          EXPECT_EQ(::ember::cuda::flash_attention_calls(), calls + 3) << "forward and backwards on the flash path";
        }
  for (DType dt : {DType::f16, DType::bf16})
    for (bool causal : {true, false}) check_attention(device(), dt, {1, 1024, 128, 2}, causal);
}

// The flash backward has no atomics (Note [Flash attention]): two runs on the same inputs give the same bits, at a
// GPT-2 head shape with several waves of blocks.
TEST_P(AttentionCudaTest, FlashBackwardIsDeterministic) {
  if (!device().is_cuda()) GTEST_SKIP() << "the CUDA flash kernels";
  const AttentionStrategyScope flash(AttentionStrategy::Flash);
  const int64_t B = 2, T = 1024, C = 768, H = 12;
  const Tensor qkv = rand_input({B, T, 3 * C}).to(device(), DType::bf16);
  const Tensor go = rand_input({B, T, C}).to(device(), DType::bf16);
  const AttentionResult r = ops::attention_qkv(qkv, H, true);
  const Tensor first = ops::attention_qkv_backward(go, qkv, r.lse, H, true, r.out);
  const Tensor second = ops::attention_qkv_backward(go, qkv, r.lse, H, true, r.out);
  const Tensor a = first.to(Device::cpu()), b = second.to(Device::cpu());
  ASSERT_EQ(a.numel(), b.numel());
  EXPECT_EQ(std::memcmp(a.raw_data(), b.raw_data(), static_cast<size_t>(a.numel()) * 2), 0);
}

// A grad_out that is not 16-byte aligned (a view one element into its buffer) is copied and runs the flash backward,
// the forward's path, rather than the tiled one.
TEST_P(AttentionCudaTest, FlashBackwardCopiesAMisalignedGradOut) {
  if (!device().is_cuda()) GTEST_SKIP() << "the CUDA flash kernels";
  const AttentionStrategyScope flash(AttentionStrategy::Flash);
  const int64_t B = 2, T = 70, C = 128, H = 2;
  const Tensor x = rand_input({B, T, 3 * C}).to(DType::bf16).to(DType::f64);
  const Tensor g = rand_input({B * T * C + 1}).to(DType::bf16).to(DType::f64);
  const Tensor g_view = g.slice(0, 1, B * T * C + 1).view({B, T, C});
  const Reference ref = naive_attention(x.to_vector<double>(), g_view.to_vector<double>(), B, T, C, H, true);
  const Tensor qkv = x.to(device(), DType::bf16);
  const Tensor go = g.to(device(), DType::bf16).slice(0, 1, B * T * C + 1).view({B, T, C});
  ASSERT_NE(reinterpret_cast<uintptr_t>(go.raw_data()) % 16, 0u);
  const AttentionResult r = ops::attention_qkv(qkv, H, true);
  const int64_t calls = ::ember::cuda::flash_attention_calls();
  const Tensor grad = ops::attention_qkv_backward(go, qkv, r.lse, H, true, r.out);
  EXPECT_EQ(::ember::cuda::flash_attention_calls(), calls + 1);
  EXPECT_LE(normalised_error(grad, ref.grad), 1e-2);
}

// Under Flash, calls the flash kernels do not cover (f32, head size 4) run the tiled path and stay exact.
TEST_P(AttentionCudaTest, FlashFallsBackToTiledOutsideItsCover) {
  if (!device().is_cuda()) GTEST_SKIP() << "the CUDA attention paths";
  const AttentionStrategyScope flash(AttentionStrategy::Flash);
  const int64_t calls = ::ember::cuda::flash_attention_calls();
  check_attention(device(), DType::f32, {2, 65, 64, 2}, true);
  check_attention(device(), DType::bf16, {2, 65, 16, 4}, true);
  EXPECT_EQ(::ember::cuda::flash_attention_calls(), calls);
}

#endif  // EMBER_WITH_CUDA

EMBER_INSTANTIATE_DEVICE_TESTS(AttentionCudaTest);

}  // namespace
}  // namespace ember::testing

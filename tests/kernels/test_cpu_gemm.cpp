// The CPU Gemm (ember/kernels/cpu/gemm.h) that the convolution and matmul kernels run many times per call: c = a @ b
// and c += a @ b against a float64 reference; a product split over threads gives the same bits as a serial one,
// accumulating or not, with packed (strided) operands and when run inside a parallel chunk; run() takes no memory
// (all workspace is taken when the Gemm is made); the meta replay takes what the constructor takes.
#include <cstring>
#include <utility>
#include <vector>

#include "ember/core/meta_scope.h"
#include "ember/core/parallel.h"
#include "ember/kernels/cpu/gemm.h"
#include "ember/kernels/cpu/meta_workspace.h"
#include "ember/memory/cpu_allocator.h"
#include "tests/harness/op_harness.h"

namespace ember::testing {
namespace {

using kernels::cpu::Gemm;

struct Case {
  const char* what;
  int64_t M, K, N;
  bool transpose_a, strided_b;  // a stored [K, M] and viewed transposed; b every second element of a wider buffer
};

const std::vector<Case>& cases() {
  static const std::vector<Case> c = {
      {"row blocks", 301, 70, 97, false, false},
      {"column blocks, transposed left operand", 64, 288, 577, true, false},
      {"column blocks, packed right operand", 97, 50, 400, false, true},
      {"below Eigen's blocking threshold", 3, 4, 5, false, false},
  };
  return c;
}

// The operands of a case as tensors (views with the case's strides) in dtype T.
template <class T>
std::pair<Tensor, Tensor> operands(const Case& c) {
  const DType dt = dtype_of_v<T>;
  Tensor a = c.transpose_a ? rand_input({c.K, c.M}).to(dt).t() : rand_input({c.M, c.K}).to(dt);
  Tensor b = c.strided_b ? rand_input({c.K, 2 * c.N}).to(dt).slice(1, 0, 2 * c.N, 2) : rand_input({c.K, c.N}).to(dt);
  return {a, b};
}

// c0 (+)= a @ b through a Gemm made with `split`, on `threads` threads; returns the result.
template <class T>
Tensor run_gemm(const Tensor& a, const Tensor& b, const Tensor& c0, bool accumulate, bool split, int threads) {
  ScopedNumThreads tc(threads);
  Tensor c = c0.clone();
  Gemm<T> g(a.size(0), a.size(1), b.size(1), a.stride(0), a.stride(1), b.stride(0), b.stride(1), split);
  g.run(static_cast<const T*>(a.raw_data()), static_cast<const T*>(b.raw_data()), static_cast<T*>(c.raw_data()),
        c.stride(0), accumulate);
  return c;
}

bool same_bits(const Tensor& x, const Tensor& y) {
  return x.sizes() == y.sizes() && std::memcmp(x.raw_data(), y.raw_data(), static_cast<size_t>(x.nbytes())) == 0;
}

TEST(CpuGemm, MatchesFloat64ReferenceWithAndWithoutAccumulate) {
  for (const Case& c : cases()) {
    SCOPED_TRACE(c.what);
    const auto [a, b] = operands<float>(c);
    const Tensor c0 = rand_input({c.M, c.N}).to(DType::f32);
    const Tensor product = matmul(a.to(DType::f64), b.to(DType::f64));
    for (bool split : {false, true}) {
      EXPECT_TRUE(allclose(run_gemm<float>(a, b, c0, false, split, 2), product, {1e-5, 1e-5}));
      EXPECT_TRUE(allclose(run_gemm<float>(a, b, c0, true, split, 2), add(c0.to(DType::f64), product), {1e-5, 1e-5}));
    }
  }
}

TEST(CpuGemm, SplitGivesTheSameBitsAsSerial) {
  for (const Case& c : cases()) {
    SCOPED_TRACE(c.what);
    const auto [a, b] = operands<double>(c);
    const Tensor c0 = rand_input({c.M, c.N}).to(DType::f64);
    for (bool accumulate : {false, true}) {
      const Tensor serial = run_gemm<double>(a, b, c0, accumulate, false, 1);
      for (int threads : {2, 3})
        EXPECT_TRUE(same_bits(run_gemm<double>(a, b, c0, accumulate, true, threads), serial))
            << threads << " threads, accumulate " << accumulate;
    }
  }
}

TEST(CpuGemm, SplitGemmRunInsideAParallelChunkRunsItsBlocksInTurn) {
  const Case& c = cases()[1];
  const std::pair<Tensor, Tensor> ab = operands<float>(c);
  const Tensor &a = ab.first, &b = ab.second;  // not a structured binding: the lambda below captures them
  const Tensor c0 = zeros({c.M, c.N}, TensorOptions(DType::f32, Device::cpu()));
  const Tensor serial = run_gemm<float>(a, b, c0, false, false, 1);
  ScopedNumThreads tc(2);
  Tensor out = c0.clone();
  Gemm<float> g(c.M, c.K, c.N, a.stride(0), a.stride(1), b.stride(0), b.stride(1), /*split=*/true);
  parallel::parallel_for(2, 1, 1, [&](int64_t chunk, int64_t, int64_t) {
    if (chunk == 0)
      g.run(static_cast<const float*>(a.raw_data()), static_cast<const float*>(b.raw_data()),
            static_cast<float*>(out.raw_data()), c.N);
  });
  EXPECT_TRUE(same_bits(out, serial));
}

TEST(CpuGemm, RunTakesNoMemory) {
  for (const Case& c : cases()) {
    SCOPED_TRACE(c.what);
    const auto [a, b] = operands<float>(c);
    Tensor out = empty({c.M, c.N}, TensorOptions(DType::f32, Device::cpu()));
    ScopedNumThreads tc(2);
    for (bool split : {false, true}) {
      Gemm<float> g(c.M, c.K, c.N, a.stride(0), a.stride(1), b.stride(0), b.stride(1), split);
      const memory::AllocatorStats before = memory::cpu_allocator().stats();
      for (int rep = 0; rep < 2; ++rep)
        g.run(static_cast<const float*>(a.raw_data()), static_cast<const float*>(b.raw_data()),
              static_cast<float*>(out.raw_data()), c.N, rep == 1);
      const memory::AllocatorStats after = memory::cpu_allocator().stats();
      EXPECT_EQ(after.num_allocs, before.num_allocs) << "split " << split;
      EXPECT_EQ(after.allocated_bytes, before.allocated_bytes) << "split " << split;
    }
  }
}

TEST(CpuGemm, MetaReplayTakesWhatTheConstructorTakes) {
  for (int threads : {1, 2, 3}) {
    ScopedNumThreads tc(threads);
    for (const Case& c : cases()) {
      SCOPED_TRACE(c.what);
      const auto [a, b] = operands<float>(c);
      for (bool split : {false, true}) {
        memory::Allocator& cpu = memory::cpu_allocator();
        cpu.reset_peak_stats();
        const int64_t base = cpu.stats().allocated_bytes;
        { Gemm<float> g(c.M, c.K, c.N, a.stride(0), a.stride(1), b.stride(0), b.stride(1), split); }
        const int64_t cpu_peak = cpu.stats().peak_allocated_bytes - base;
        int64_t meta_peak = 0;
        {
          MetaAllocationScope scope;
          scope.allocator().reset_peak_stats();
          const int64_t meta_base = scope.allocator().stats().allocated_bytes;
          {
            kernels::cpu::MetaWorkspace ws;
            kernels::cpu::take_gemm_workspace(ws, DType::f32, c.M, c.K, c.N, a.stride(0), a.stride(1), b.stride(0),
                                              b.stride(1), split);
          }
          meta_peak = scope.allocator().stats().peak_allocated_bytes - meta_base;
        }
        EXPECT_EQ(meta_peak, cpu_peak) << threads << " threads, split " << split;
      }
    }
  }
}

}  // namespace
}  // namespace ember::testing

// Hand-written CUDA kernels against the ceilings they chase, on CUDA device 0: achieved GB/s of the memory-bound ops
// (elementwise, GELU, softmax, layer norm, cross-entropy, row and column sums, AdamW) next to a device-to-device copy
// measured in the same run, and TFLOP/s of the hand-written tensor-core GEMMs (mma.sync; wgmma + TMA on Hopper) next to
// cuBLASLt on the same operands.
// Bytes counted are the minimum an op must move (each input read once, each output written once), so "% of copy" is
// the share of the copy's bandwidth the kernel reaches. Exits 0 with a note when no GPU is visible.
// Usage: cuda_kernels [--quick]   (--quick: smaller sizes, for a smoke run)
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "ember/base/cuda_check.h"
#include "ember/ember.h"
#include "ember/kernels/cuda/blas.h"
#include "ember/kernels/cuda/device_info.h"
#include "ember/kernels/cuda/tc_gemm_sm90.h"
#include "ember/memory/cuda_device.h"

using namespace ember;

namespace {

// Median over 5 repetitions of the mean milliseconds per call of fn() (timed with events on the default stream,
// after a warm-up that fills the caching allocator).
double median_ms(int iterations, const std::function<void()>& fn) {
  for (int i = 0; i < 3; ++i) fn();
  cudaEvent_t start, stop;
  EMBER_CUDA_CHECK(cudaEventCreate(&start));
  EMBER_CUDA_CHECK(cudaEventCreate(&stop));
  std::vector<double> reps;
  for (int r = 0; r < 5; ++r) {
    EMBER_CUDA_CHECK(cudaEventRecord(start, nullptr));
    for (int i = 0; i < iterations; ++i) fn();
    EMBER_CUDA_CHECK(cudaEventRecord(stop, nullptr));
    EMBER_CUDA_CHECK(cudaEventSynchronize(stop));
    float ms = 0;
    EMBER_CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
    reps.push_back(static_cast<double>(ms) / iterations);
  }
  EMBER_CUDA_CHECK(cudaEventDestroy(start));
  EMBER_CUDA_CHECK(cudaEventDestroy(stop));
  std::sort(reps.begin(), reps.end());
  return reps[2];
}

struct Row {
  std::string op, shape;
  double bytes, ms;
};

void print_bandwidth(const std::vector<Row>& rows, double copy_gbs) {
  std::printf("| op | shape | bytes moved | ms | GB/s | %% of copy |\n|---|---|---:|---:|---:|---:|\n");
  for (const Row& r : rows) {
    const double gbs = r.bytes / (r.ms * 1e-3) / 1e9;
    std::printf("| %s | %s | %.1f MiB | %.4f | %.0f | %.0f%% |\n", r.op.c_str(), r.shape.c_str(), r.bytes / (1 << 20),
                r.ms, gbs, 100.0 * gbs / copy_gbs);
  }
}

// max |x - y| / max |y| over two tensors of one shape (compared in f64 on the CPU).
double normalised_error(const Tensor& x, const Tensor& y) {
  const Tensor a = x.to(Device::cpu(), DType::f64), b = y.to(Device::cpu(), DType::f64);
  const double* pa = a.data<double>();
  const double* pb = b.data<double>();
  double diff = 0, scale = 0;
  for (int64_t i = 0; i < a.numel(); ++i) {
    diff = std::max(diff, std::fabs(pa[i] - pb[i]));
    scale = std::max(scale, std::fabs(pb[i]));
  }
  return scale > 0 ? diff / scale : diff;
}

}  // namespace

int main(int argc, char** argv) {
  if (memory::cuda::device_count() == 0) {
    std::printf("cuda_kernels: no CUDA device visible; nothing to measure\n");
    return 0;
  }
  const bool quick = argc > 1 && std::strcmp(argv[1], "--quick") == 0;
  cudaDeviceProp prop{};
  EMBER_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
  std::printf("device 0: %s, %d SMs, %.1f GiB\n\n", prop.name, prop.multiProcessorCount,
              static_cast<double>(prop.totalGlobalMem) / (1 << 30));
  NoGradGuard no_grad;
  const Device dev = Device::cuda(0);
  const TensorOptions f32(DType::f32, dev);
  const int iters = quick ? 5 : 50;

  // ---- memory-bound kernels --------------------------------------------------------------------------------------
  const int64_t n = quick ? (int64_t{1} << 22) : (int64_t{1} << 26);  // 64 Mi elements: 256 MiB per f32 tensor
  const Tensor x = randn({n}, f32), y = randn({n}, f32);
  Tensor dst = empty({n}, f32);
  const double copy_ms = median_ms(iters, [&] {
    EMBER_CUDA_CHECK(
        cudaMemcpyAsync(dst.raw_data(), x.raw_data(), static_cast<size_t>(n) * 4, cudaMemcpyDeviceToDevice, nullptr));
  });
  const double copy_gbs = 2.0 * static_cast<double>(n) * 4 / (copy_ms * 1e-3) / 1e9;
  std::printf("device-to-device copy of %lld f32: %.4f ms, %.0f GB/s (read + write)\n\n", static_cast<long long>(n),
              copy_ms, copy_gbs);

  std::vector<Row> rows;
  const double nb = static_cast<double>(n);
  const std::string flat = "[" + std::to_string(n) + "]";
  rows.push_back({"add f32", flat, 3 * nb * 4, median_ms(iters, [&] { (void)add(x, y); })});
  rows.push_back({"gelu f32", flat, 2 * nb * 4, median_ms(iters, [&] { (void)gelu(x); })});
  {
    const Tensor h = x.to(DType::bf16);
    rows.push_back({"gelu bf16", flat, 2 * nb * 2, median_ms(iters, [&] { (void)gelu(h); })});
  }
  {
    const int64_t r = n / 1024;
    const Tensor m = x.reshape({r, 1024});
    const std::string shape = "[" + std::to_string(r) + ", 1024]";
    rows.push_back({"softmax f32", shape, 2 * nb * 4, median_ms(iters, [&] { (void)softmax(m, -1); })});
    rows.push_back({"sum(dim 1) f32", shape, nb * 4, median_ms(iters, [&] { (void)sum(m, {1}); })});
    // Column sums (a bias gradient's reduction over the rows; Note [Packed sums] in ember/kernels/cuda/reduce.cu).
    rows.push_back({"sum(dim 0) f32", shape, nb * 4, median_ms(iters, [&] { (void)sum(m, {0}); })});
    {
      const Tensor h = m.to(DType::bf16);
      rows.push_back({"sum(dim 0) bf16", shape, nb * 2, median_ms(iters, [&] { (void)sum(h, {0}); })});
      // GPT-2's attention projection bias gradient ([B * T, 3 * 768] at batch 4): a few microseconds per call, so
      // launch latency is a visible share of this row.
      const Tensor g = randn({4096, 2304}, f32).to(DType::bf16);
      rows.push_back(
          {"sum(dim 0) bf16", "[4096, 2304]", 4096.0 * 2304 * 2, median_ms(iters, [&] { (void)sum(g, {0}); })});
    }
    const Tensor w = ones({1024}, f32), b = zeros({1024}, f32);
    rows.push_back({"layer_norm f32", shape, 2 * nb * 4, median_ms(iters, [&] { (void)layer_norm(m, {1024}, w, b); })});
    // Layer norm backward: g and x read, grad_x written (the minimum); the kernels read g and x a second time for
    // the weight and bias gradients (Note [Packed layer-norm backward]), so this count tops out near 60% of copy.
    {
      const LayerNormResult f = ops::layer_norm_with_stats(m, {1024}, w, b);
      const Tensor g = y.reshape({r, 1024});
      rows.push_back({"layer_norm backward f32 (2 passes)", shape, 3 * nb * 4, median_ms(iters, [&] {
                        (void)ops::layer_norm_backward(g, m, w, f.mean, f.rstd, 1, true, true, true);
                      })});
    }
    // Residual add + layer norm: x and residual read, the sum and the normalised rows written.
    const Tensor res = y.reshape({r, 1024});
    rows.push_back({"add_layer_norm f32 (fused)", shape, 4 * nb * 4,
                    median_ms(iters, [&] { (void)ops::add_layer_norm_with_stats(m, res, {1024}, w, b); })});
    // Bias + GELU over [rows, 1024]: x read, out written (the bias is 4 KiB); backward reads g and x, writes grad_x.
    rows.push_back({"bias_gelu f32 (fused)", shape, 2 * nb * 4, median_ms(iters, [&] { (void)ops::bias_gelu(m, b); })});
    rows.push_back({"bias_gelu backward f32", shape, 3 * nb * 4,
                    median_ms(iters, [&] { (void)ops::bias_gelu_backward(res, m, b, GeluApprox::None, true, true); })});
  }
  {
    const int64_t vocab = 50304, tokens = quick ? 256 : 8192;  // GPT-2's padded vocabulary
    const Tensor logits = randn({tokens, vocab}, f32);
    const Tensor target = arange(tokens, TensorOptions(DType::i64, dev));
    const double bytes = static_cast<double>(tokens * vocab) * 4;  // the logits read once
    rows.push_back({"cross_entropy f32 (fused)", "[" + std::to_string(tokens) + ", 50304]", bytes,
                    median_ms(iters, [&] { (void)nn::functional::cross_entropy(logits, target); })});
  }
  {
    Tensor p = randn({n}, f32), g = randn({n}, f32), m = zeros({n}, f32), v = zeros({n}, f32);
    AdamParams ap;
    ap.decoupled = true;
    ap.weight_decay = 0.1;
    rows.push_back({"adamw f32", flat, 7 * nb * 4, median_ms(iters, [&] { ops::adam_step_(p, g, m, v, ap); })});
  }
  print_bandwidth(rows, copy_gbs);

  // ---- GEMM: hand-written tensor-core kernel against cuBLASLt -------------------------------------------------------
  // gemm() takes the strategy from EMBER_GEMM at first use; pin it so the cuBLASLt column is cuBLASLt whatever it says.
  cuda::set_gemm_strategy(cuda::GemmStrategy::CublasLt);
  // Both hand-written kernels: mma.sync (any sm_80+) and, where the build and device allow, wgmma + TMA (Hopper).
  const bool wgmma = cuda::wgmma_gemm_supported(dev.index);
  std::printf(
      "\n| GEMM (M = N = K) | dtype | cuBLASLt TFLOP/s | mma.sync TFLOP/s | ratio | wgmma TFLOP/s | ratio | "
      "normalised diff (mma.sync, wgmma) |\n");
  std::printf("|---:|---|---:|---:|---:|---:|---:|---|\n");
  const cudaStream_t stream = nullptr;
  std::vector<int64_t> sizes = quick ? std::vector<int64_t>{1024} : std::vector<int64_t>{1024, 2048, 4096, 8192};
  for (DType dt : {DType::f16, DType::bf16}) {
    for (int64_t s : sizes) {
      const Tensor a = randn({s, s}, f32).to(dt), b = randn({s, s}, f32).to(dt);
      Tensor c_lt = empty({s, s}, {dt, dev}), c_tc = empty({s, s}, {dt, dev}), c_wg = empty({s, s}, {dt, dev});
      // At least 5 calls and about 2^39 FLOP per timed loop (256 calls at 1024, 5 at 4096 and 8192), so the loop runs
      // for about a millisecond or more and the launch latency before its first kernel is a small share of it.
      const int gemm_iters = static_cast<int>(std::max<int64_t>(5, (int64_t{1} << 38) / (s * s * s)));
      const double lt_ms = median_ms(gemm_iters, [&] {
        cuda::gemm(dt, 1, s, s, s, {a.raw_data(), s * s, s, 1}, {b.raw_data(), s * s, s, 1}, c_lt.raw_data(), s * s, s,
                   1.0, 0.0, 0, stream);
      });
      const double tc_ms = median_ms(gemm_iters, [&] {
        cuda::tensor_core_gemm(dt, 1, s, s, s, a.raw_data(), b.raw_data(), c_tc.raw_data(), stream,
                               cuda::TcGemmKernel::MmaSync);
      });
      const double wg_ms = !wgmma ? 0.0 : median_ms(gemm_iters, [&] {
        cuda::tensor_core_gemm(dt, 1, s, s, s, a.raw_data(), b.raw_data(), c_wg.raw_data(), stream,
                               cuda::TcGemmKernel::Wgmma);
      });
      const double flop = 2.0 * static_cast<double>(s) * static_cast<double>(s) * static_cast<double>(s);
      const double lt = flop / (lt_ms * 1e-3) / 1e12, tc = flop / (tc_ms * 1e-3) / 1e12;
      if (wgmma) {
        const double wg = flop / (wg_ms * 1e-3) / 1e12;
        std::printf("| %lld | %s | %.1f | %.1f | %.0f%% | %.1f | %.0f%% | %.1e, %.1e |\n", static_cast<long long>(s),
                    dtype_name(dt), lt, tc, 100.0 * tc / lt, wg, 100.0 * wg / lt, normalised_error(c_tc, c_lt),
                    normalised_error(c_wg, c_lt));
      } else {
        std::printf("| %lld | %s | %.1f | %.1f | %.0f%% | — | — | %.1e, — |\n", static_cast<long long>(s),
                    dtype_name(dt), lt, tc, 100.0 * tc / lt, normalised_error(c_tc, c_lt));
      }
    }
  }
  if (!wgmma) return 0;

  // The wgmma kernel at each fixed tile width and cluster size, and what it picks by shape (Note [Hopper GEMM]).
  const cuda::WgmmaConfig configs[5] = {{64, 1}, {128, 1}, {256, 1}, {128, 2}, {256, 2}};
  std::printf(
      "\n| GEMM (M = N = K) | dtype | picked (width, cluster) | 64 | 128 | 256 | 128, cluster 2 | 256, cluster 2 |\n");
  std::printf("|---:|---|---|---:|---:|---:|---:|---:|\n");
  for (DType dt : {DType::f16, DType::bf16}) {
    for (int64_t s : sizes) {
      const Tensor a = randn({s, s}, f32).to(dt), b = randn({s, s}, f32).to(dt);
      Tensor c = empty({s, s}, {dt, dev});
      const int gemm_iters = static_cast<int>(std::max<int64_t>(5, (int64_t{1} << 38) / (s * s * s)));
      const double flop = 2.0 * static_cast<double>(s) * static_cast<double>(s) * static_cast<double>(s);
      double tflops[5];
      for (int i = 0; i < 5; ++i) {
        cuda::set_wgmma_config(configs[i]);
        const double ms = median_ms(gemm_iters, [&] {
          cuda::tensor_core_gemm(dt, 1, s, s, s, a.raw_data(), b.raw_data(), c.raw_data(), stream,
                                 cuda::TcGemmKernel::Wgmma);
        });
        tflops[i] = flop / (ms * 1e-3) / 1e12;
      }
      cuda::set_wgmma_config({});
      const int sms = cuda::device_properties(dev.index).sm_count;
      const cuda::WgmmaConfig picked = cuda::wgmma_config_for(1, s, s, sms, cuda::wgmma_max_clusters(dev.index));
      std::printf("| %lld | %s | %d, %d | %.1f | %.1f | %.1f | %.1f | %.1f |\n", static_cast<long long>(s),
                  dtype_name(dt), picked.tile_width, picked.cluster, tflops[0], tflops[1], tflops[2], tflops[3],
                  tflops[4]);
    }
  }
  return 0;
}

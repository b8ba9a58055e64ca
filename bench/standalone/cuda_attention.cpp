// The CUDA attention paths side by side on CUDA device 0 (ember/kernels/cuda/attention.h): the tiled path (per-head
// cuBLASLt products over score tiles) and flash attention, forward and backward (with the forward's output, as
// autograd calls it) of GPT-2 124M's attention at batch 4 and 16 (T 1024, 12 heads of 64), bf16 and f16. Prints per
// run the median time, TFLOP/s of the causal products the math needs (forward 2 and backward 5 products of
// T^2 / 2 x 64 per head and batch element, FlashAttention's convention, whatever a path recomputes), the scratch the
// path allocated above its inputs and outputs (peak allocated minus the level before the call and the call's
// outputs), and the largest difference of flash's outputs from the tiled path's, normalised by the largest tiled
// value. Exits 0 with a note when no GPU is visible.
// Usage: cuda_attention [--quick]   (--quick: batch 1, T 256, for a smoke run)
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <vector>

#include "bench/standalone/cuda_median_time.h"
#include "ember/base/cuda_check.h"
#include "ember/ember.h"
#include "ember/kernels/cuda/attention.h"
#include "ember/memory/cuda_device.h"

using namespace ember;
using cuda::AttentionStrategy;

namespace {

// Median over 5 repetitions of the mean milliseconds per call of fn(), after 2 warm-up calls.
double median_ms(int iterations, const std::function<void()>& fn) {
  for (int i = 0; i < 2; ++i) fn();
  return bench::median_us(iterations, fn) / 1000.0;
}

// max |a - b| / max |b|.
double normalised_difference(const Tensor& a, const Tensor& b) {
  const std::vector<double> x = a.to_vector<double>(), y = b.to_vector<double>();
  double diff = 0, ref = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    diff = std::max(diff, std::abs(x[i] - y[i]));
    ref = std::max(ref, std::abs(y[i]));
  }
  return ref > 0 ? diff / ref : diff;
}

struct Run {
  double fwd_ms = 0, bwd_ms = 0;
  int64_t fwd_scratch = 0, bwd_scratch = 0;
  Tensor out, grad;
  int64_t flash_calls = 0;
};

Run run(AttentionStrategy strategy, const Tensor& qkv, const Tensor& grad_out, int64_t H, int iterations) {
  cuda::set_attention_strategy(strategy);
  memory::Allocator& alloc = memory::cuda::allocator(0);
  Run r;
  const int64_t calls = cuda::flash_attention_calls();
  AttentionResult fwd = ops::attention_qkv(qkv, H, true);
  r.fwd_ms = median_ms(iterations, [&] { fwd = ops::attention_qkv(qkv, H, true); });
  r.bwd_ms =
      median_ms(iterations, [&] { r.grad = ops::attention_qkv_backward(grad_out, qkv, fwd.lse, H, true, fwd.out); });
  r.flash_calls = cuda::flash_attention_calls() - calls;
  // Scratch: the peak of one call above the level before it, less what the call returns.
  EMBER_CUDA_CHECK(cudaDeviceSynchronize());
  fwd = AttentionResult{};
  int64_t before = alloc.stats().allocated_bytes;
  alloc.reset_peak_stats();
  fwd = ops::attention_qkv(qkv, H, true);
  EMBER_CUDA_CHECK(cudaDeviceSynchronize());
  r.fwd_scratch = alloc.stats().peak_allocated_bytes - before - fwd.out.nbytes() - fwd.lse.nbytes();
  r.grad = Tensor();
  before = alloc.stats().allocated_bytes;
  alloc.reset_peak_stats();
  r.grad = ops::attention_qkv_backward(grad_out, qkv, fwd.lse, H, true, fwd.out);
  EMBER_CUDA_CHECK(cudaDeviceSynchronize());
  r.bwd_scratch = alloc.stats().peak_allocated_bytes - before - r.grad.nbytes();
  r.out = fwd.out;
  return r;
}

}  // namespace

int main(int argc, char** argv) {
  const bool quick = argc > 1 && std::strcmp(argv[1], "--quick") == 0;
  if (memory::cuda::device_count() == 0) {
    std::printf("cuda_attention: no CUDA device visible; nothing measured\n");
    return 0;
  }
  const int64_t T = quick ? 256 : 1024, H = 12, C = 768, hd = C / H;
  const std::vector<int64_t> batches = quick ? std::vector<int64_t>{1} : std::vector<int64_t>{4, 16};
  std::printf("## CUDA attention, tiled against flash (T %lld, %lld heads of %lld, causal)\n\n",
              static_cast<long long>(T), static_cast<long long>(H), static_cast<long long>(hd));
  std::printf(
      "| dtype | B | path | fwd ms | bwd ms | fwd TFLOP/s | bwd TFLOP/s | fwd scratch MiB | bwd scratch MiB |"
      " flash calls | out diff | grad diff |\n|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n");
  const AttentionStrategy previous = cuda::attention_strategy();
  for (DType dt : {DType::bf16, DType::f16})
    for (int64_t B : batches) {
      manual_seed(0);
      const Tensor qkv = randn({B, T, 3 * C}, TensorOptions(DType::f32, Device::cuda(0))).to(dt);
      const Tensor grad_out = randn({B, T, C}, TensorOptions(DType::f32, Device::cuda(0))).to(dt);
      // One causal product of T^2 / 2 x hd per head and batch element, in FLOPs.
      const double product = 2.0 * static_cast<double>(B * H) * static_cast<double>(T) * static_cast<double>(T) / 2.0 *
                             static_cast<double>(hd);
      const int iterations = quick ? 3 : 10;
      const Run tiled = run(AttentionStrategy::Tiled, qkv, grad_out, H, iterations);
      const Run flash = run(AttentionStrategy::Flash, qkv, grad_out, H, iterations);
      auto mib = [](int64_t b) { return static_cast<double>(b) / (1 << 20); };
      for (const auto* r : {&tiled, &flash}) {
        const bool is_flash = r == &flash;
        std::printf("| %s | %lld | %s | %.3f | %.3f | %.1f | %.1f | %.1f | %.1f | %lld | %s | %s |\n", dtype_name(dt),
                    static_cast<long long>(B), is_flash ? "flash" : "tiled", r->fwd_ms, r->bwd_ms,
                    2 * product / (r->fwd_ms * 1e9), 5 * product / (r->bwd_ms * 1e9), mib(r->fwd_scratch),
                    mib(r->bwd_scratch), static_cast<long long>(r->flash_calls),
                    is_flash ? std::to_string(normalised_difference(flash.out, tiled.out)).c_str() : "-",
                    is_flash ? std::to_string(normalised_difference(flash.grad, tiled.grad)).c_str() : "-");
      }
    }
  cuda::set_attention_strategy(previous);
  return 0;
}

// Google Benchmark suite for the compressed Linear forms (docs/compression.md) at MNIST fc1's shape, x [B, 9216] times
// W^T with W [128, 9216]: dense f32, CSR (i16 column indices) at 50% and 90% sparsity, int8 weights dequantized
// inside the kernel, int8 x int8 with a dynamic activation scale. Counters: the weight's stored bytes and FLOP/s of
// the dense product. CPU only (the compressed kernels have no CUDA implementation yet).
// Usage: bench_compress [--benchmark_filter=...]
#include <benchmark/benchmark.h>

#include "ember/ember.h"
#include "ember/kernels/ops_quant.h"
#include "ember/kernels/ops_sparse.h"

using namespace ember;

namespace {

constexpr int64_t kOut = 128, kIn = 9216;

// A [kOut, kIn] weight with `sparsity` of its entries exactly zero (the smallest magnitudes, as pruning leaves it).
Tensor pruned_weight(double sparsity) {
  manual_seed(0);
  Tensor w = randn({kOut, kIn});
  if (sparsity <= 0) return w;
  const Tensor mag = abs(w).reshape({-1});
  std::vector<float> v = mag.to_vector<float>();
  std::nth_element(v.begin(), v.begin() + static_cast<int64_t>(sparsity * v.size()), v.end());
  const double threshold = v[static_cast<size_t>(sparsity * v.size())];
  return mul(w, gt(abs(w), full({}, threshold)).to(DType::f32));
}

void set_counters(benchmark::State& state, int64_t batch, int64_t weight_bytes) {
  state.counters["weight_bytes"] = static_cast<double>(weight_bytes);
  state.counters["FLOP/s"] =
      benchmark::Counter(2.0 * batch * kIn * kOut * state.iterations(), benchmark::Counter::kIsRate);
}

void bm_dense(benchmark::State& state) {
  const int64_t batch = state.range(0);
  const Tensor x = randn({batch, kIn}), w = pruned_weight(0), b = zeros({kOut});
  for (auto _ : state) {
    Tensor y = nn::functional::linear(x, w, b);
    benchmark::DoNotOptimize(y.raw_data());
  }
  set_counters(state, batch, w.nbytes());
}

void bm_csr(benchmark::State& state, double sparsity) {
  const int64_t batch = state.range(0);
  const Tensor x = randn({batch, kIn}), b = zeros({kOut});
  const CsrMatrix w = ops::dense_to_csr(pruned_weight(sparsity));
  for (auto _ : state) {
    Tensor y = ops::csr_linear(x, w, b);
    benchmark::DoNotOptimize(y.raw_data());
  }
  set_counters(state, batch, w.nbytes());
}

void bm_int8(benchmark::State& state, bool dynamic) {
  const int64_t batch = state.range(0);
  const Tensor x = randn({batch, kIn}), b = zeros({kOut});
  const QuantizedPerChannel q = ops::quantize_per_channel_symmetric(pruned_weight(0));
  for (auto _ : state) {
    Tensor y = dynamic ? ops::int8_dynamic_linear(x, q.q, q.scale, b) : ops::int8_weight_linear(x, q.q, q.scale, b);
    benchmark::DoNotOptimize(y.raw_data());
  }
  set_counters(state, batch, q.q.nbytes() + q.scale.nbytes());
}

}  // namespace

BENCHMARK(bm_dense)->Arg(1)->Arg(64)->Arg(256)->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(bm_csr, sparsity_50, 0.5)->Arg(1)->Arg(64)->Arg(256)->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(bm_csr, sparsity_90, 0.9)->Arg(1)->Arg(64)->Arg(256)->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(bm_int8, weight_only, false)->Arg(1)->Arg(64)->Arg(256)->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(bm_int8, dynamic, true)->Arg(1)->Arg(64)->Arg(256)->Unit(benchmark::kMillisecond);

BENCHMARK_MAIN();

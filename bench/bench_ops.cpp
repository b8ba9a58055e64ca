// Google Benchmark suite for the op set on every available device: elementwise, reductions, matmul, softmax,
// layer norm, conv2d. Reports bytes/s or FLOP/s counters; results go to bench/RESULTS.md with machine and date.
// Usage: bench_ops [--benchmark_filter=...]   (CUDA cases register only when a GPU is visible)
#include <benchmark/benchmark.h>

#include "ember/ember.h"

using namespace ember;

namespace {

void sync(Device d) {
  if (d.is_cuda()) memory::cuda::synchronize(d.index);
}

void bm_add(benchmark::State& state, Device dev, DType dt) {
  const int64_t n = state.range(0);
  Tensor a = rand({n}, {dt, dev}), b = rand({n}, {dt, dev});
  for (auto _ : state) {
    Tensor c = add(a, b);
    benchmark::DoNotOptimize(c.raw_data());
    sync(dev);
  }
  state.SetBytesProcessed(state.iterations() * 3 * n * itemsize(dt));
}

void bm_sum_rows(benchmark::State& state, Device dev, DType dt) {
  const int64_t rows = state.range(0), cols = state.range(1);
  Tensor a = rand({rows, cols}, {dt, dev});
  for (auto _ : state) {
    Tensor s = sum(a, {-1});
    benchmark::DoNotOptimize(s.raw_data());
    sync(dev);
  }
  state.SetBytesProcessed(state.iterations() * rows * cols * itemsize(dt));
}

void bm_matmul(benchmark::State& state, Device dev, DType dt) {
  const int64_t n = state.range(0);
  Tensor a = rand({n, n}, {dt, dev}), b = rand({n, n}, {dt, dev});
  for (auto _ : state) {
    Tensor c = matmul(a, b);
    benchmark::DoNotOptimize(c.raw_data());
    sync(dev);
  }
  state.counters["FLOP/s"] = benchmark::Counter(2.0 * n * n * n * state.iterations(), benchmark::Counter::kIsRate);
}

void bm_softmax(benchmark::State& state, Device dev, DType dt) {
  const int64_t rows = state.range(0), cols = state.range(1);
  Tensor a = randn({rows, cols}, {dt, dev});
  for (auto _ : state) {
    Tensor s = softmax(a, -1);
    benchmark::DoNotOptimize(s.raw_data());
    sync(dev);
  }
  state.SetBytesProcessed(state.iterations() * 2 * rows * cols * itemsize(dt));
}

void bm_layer_norm(benchmark::State& state, Device dev, DType dt) {
  const int64_t rows = state.range(0), cols = state.range(1);
  Tensor x = randn({rows, cols}, {dt, dev}), w = ones({cols}, {dt, dev}), b = zeros({cols}, {dt, dev});
  for (auto _ : state) {
    Tensor y = layer_norm(x, {cols}, w, b);
    benchmark::DoNotOptimize(y.raw_data());
    sync(dev);
  }
  state.SetBytesProcessed(state.iterations() * 2 * rows * cols * itemsize(dt));
}

void bm_conv2d(benchmark::State& state, Device dev, DType dt) {
  // MNIST-CNN second layer: [64, 32, 26, 26] * [64, 32, 3, 3].
  Tensor x = randn({64, 32, 26, 26}, {dt, dev}), w = randn({64, 32, 3, 3}, {dt, dev});
  for (auto _ : state) {
    Tensor y = conv2d(x, w);
    benchmark::DoNotOptimize(y.raw_data());
    sync(dev);
  }
  const double flops = 2.0 * 64 * 64 * 24 * 24 * 32 * 9;
  state.counters["FLOP/s"] = benchmark::Counter(flops * state.iterations(), benchmark::Counter::kIsRate);
}

// Registers the cases whose kernels exist on `dev` (the CUDA backend grows op by op).
void register_all(Device dev) {
  const std::string d = dev.str();
  const DeviceType t = dev.type;
  for (DType dt : {DType::f32, DType::bf16}) {
    const std::string s = d + "/" + dtype_name(dt);
    if (binary_stub.has(t))
      benchmark::RegisterBenchmark(("add/" + s).c_str(), bm_add, dev, dt)->Arg(1 << 20)->Arg(1 << 24)->UseRealTime();
    if (reduce_stub.has(t))
      benchmark::RegisterBenchmark(("sum_rows/" + s).c_str(), bm_sum_rows, dev, dt)->Args({4096, 1024})->UseRealTime();
    if (softmax_stub.has(t))
      benchmark::RegisterBenchmark(("softmax/" + s).c_str(), bm_softmax, dev, dt)->Args({4096, 1024})->UseRealTime();
    if (layer_norm_stub.has(t))
      benchmark::RegisterBenchmark(("layer_norm/" + s).c_str(), bm_layer_norm, dev, dt)
          ->Args({4096, 1024})
          ->UseRealTime();
  }
  if (bmm_stub.has(t))
    benchmark::RegisterBenchmark(("matmul/" + d + "/f32").c_str(), bm_matmul, dev, DType::f32)
        ->Arg(256)->Arg(1024)->UseRealTime()->Unit(benchmark::kMillisecond);
  if (conv2d_stub.has(t))
    benchmark::RegisterBenchmark(("conv2d/" + d + "/f32").c_str(), bm_conv2d, dev, DType::f32)
        ->UseRealTime()->Unit(benchmark::kMillisecond);
}

}  // namespace

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  register_all(Device::cpu());
  for (int i = 0; i < memory::cuda::device_count(); ++i) register_all(Device::cuda(i));
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}

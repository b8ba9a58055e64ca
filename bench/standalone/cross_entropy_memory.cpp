// Fused softmax + cross-entropy against the composed form (log_softmax, then the target selection of nll_loss), side
// by side in one run: peak allocated bytes above the logits and wall time of forward + backward for GPT-sized rows
// (M tokens x a vocabulary), on the CPU and, when one is visible, on CUDA device 0. The composed form is what
// F::cross_entropy ran before the fused kernel existed; F::nll_loss(log_softmax(x)) still runs it.
// Usage: cross_entropy_memory [M=1024] [C=50304] [repeats=3]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <vector>

#include "ember/ember.h"
#include "ember/memory/cuda_device.h"

using namespace ember;
namespace F = nn::functional;

namespace {

struct Measured {
  double ms = 0;     // median over the repeats
  int64_t peak = 0;  // peak allocated above the level before the forward
  int64_t held = 0;  // allocated between forward and backward, above the level before the forward
};

Measured measure(memory::Allocator& alloc, Device dev, int repeats, const std::function<Tensor(const Tensor&)>& loss_of,
                 const Tensor& logits_in) {
  Measured m;
  std::vector<double> ms;
  for (int r = 0; r < repeats + 1; ++r) {  // the first run warms the caches and is not timed
    const Tensor x = logits_in.detach().requires_grad_(true);
    if (dev.is_cuda()) memory::cuda::synchronize(dev.index);
    const int64_t before = alloc.stats().allocated_bytes;
    alloc.reset_peak_stats();
    const auto t0 = std::chrono::steady_clock::now();
    Tensor loss = loss_of(x);
    const int64_t held = alloc.stats().allocated_bytes - before;
    loss.backward();
    (void)sum(x.grad()).item_double();  // waits for the device
    const auto t1 = std::chrono::steady_clock::now();
    if (r == 0) continue;
    m.held = held;
    m.peak = alloc.stats().peak_allocated_bytes - before;
    ms.push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
  }
  std::sort(ms.begin(), ms.end());
  m.ms = ms[ms.size() / 2];
  return m;
}

void run(Device dev, memory::Allocator& alloc, int64_t M, int64_t C, int repeats) {
  manual_seed(0);
  const Tensor logits = randn({M, C}, TensorOptions(DType::f32, dev));
  const Tensor target = (rand({M}, TensorOptions(DType::f32, dev)) * double(C)).to(DType::i64);
  const Measured fused = measure(
      alloc, dev, repeats, [&](const Tensor& x) { return F::cross_entropy(x, target); }, logits);
  const Measured composed = measure(
      alloc, dev, repeats, [&](const Tensor& x) { return F::nll_loss(log_softmax(x, 1), target); }, logits);
  auto mib = [](int64_t b) { return static_cast<double>(b) / (1 << 20); };
  const double mc = static_cast<double>(M * C) * 4 / (1 << 20);
  std::printf("| %s | [%lld, %lld] (%.0f MiB) | fused | %.1f | %.1f | %.2f |\n", dev.str().c_str(),
              static_cast<long long>(M), static_cast<long long>(C), mc, mib(fused.held), mib(fused.peak), fused.ms);
  std::printf("| %s | [%lld, %lld] (%.0f MiB) | composed | %.1f | %.1f | %.2f |\n", dev.str().c_str(),
              static_cast<long long>(M), static_cast<long long>(C), mc, mib(composed.held), mib(composed.peak),
              composed.ms);
}

}  // namespace

int main(int argc, char** argv) {
  const int64_t M = argc > 1 ? std::max(1ll, std::atoll(argv[1])) : 1024;
  const int64_t C = argc > 2 ? std::max(1ll, std::atoll(argv[2])) : 50304;
  const int repeats = argc > 3 ? std::max(1, std::atoi(argv[3])) : 3;
  std::printf("cross-entropy forward + backward, f32 logits, mean reduction; %d repeats, median\n\n", repeats);
  std::printf("| device | logits | path | MiB held for backward | peak MiB above logits | ms |\n");
  std::printf("|---|---|---|---:|---:|---:|\n");
  run(Device::cpu(), allocator_for(Device::cpu()), M, C, repeats);
  if (memory::cuda::device_count() > 0) run(Device::cuda(0), allocator_for(Device::cuda(0)), M, C, repeats);
  return 0;
}

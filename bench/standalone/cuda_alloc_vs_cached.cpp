// cudaMalloc + cudaFree against the caching allocator's cached allocate + deallocate, by size, on CUDA device 0:
// the plain device calls, ember's CachingAllocator with PyTorch's defaults (fixed segments) and with expandable
// segments. Prints a markdown table (median of repeated timed loops). Exits 0 with a note when no GPU is visible.
// Usage: cuda_alloc_vs_cached [iterations=200]
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <memory>
#include <vector>

#include "bench/standalone/cuda_median_time.h"
#include "ember/base/cuda_check.h"
#include "ember/memory/caching_allocator.h"
#include "ember/memory/cuda_backing.h"
#include "ember/memory/cuda_device.h"

using namespace ember::memory;

using ember::bench::median_us;

int main(int argc, char** argv) {
  if (cuda::device_count() == 0) {
    std::printf("cuda_alloc_vs_cached: no CUDA device visible; nothing to measure\n");
    return 0;
  }
  const int iterations = argc > 1 ? std::max(1, std::atoi(argv[1])) : 200;
  cudaDeviceProp prop{};
  EMBER_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
  std::printf("device 0: %s, %.1f GiB; %d iterations per timing, median of 5\n\n", prop.name,
              static_cast<double>(prop.totalGlobalMem) / (1 << 30), iterations);

  CachingAllocator fixed(make_cuda_backing(0), AllocatorConfig{}, "cuda:0 fixed segments");
  AllocatorConfig expandable_cfg;
  expandable_cfg.expandable_segments = true;
  CachingAllocator expandable(make_cuda_backing(0), expandable_cfg, "cuda:0 expandable segments");

  std::printf("| size | cudaMalloc + cudaFree | cached, fixed segments | cached, expandable segments |\n");
  std::printf("|---:|---:|---:|---:|\n");
  for (int64_t size : {int64_t{512}, int64_t{64} << 10, int64_t{1} << 20, int64_t{8} << 20, int64_t{64} << 20,
                       int64_t{512} << 20}) {
    const double raw = median_us(iterations, [&] {
      void* p = nullptr;
      EMBER_CUDA_CHECK(cudaMalloc(&p, static_cast<size_t>(size)));
      EMBER_CUDA_CHECK(cudaFree(p));
    });
    fixed.deallocate(fixed.allocate(size));  // the first call creates the segment; the timed ones are cached
    const double cached = median_us(iterations, [&] { fixed.deallocate(fixed.allocate(size)); });
    expandable.deallocate(expandable.allocate(size));
    const double grown = median_us(iterations, [&] { expandable.deallocate(expandable.allocate(size)); });
    std::printf("| %s | %.2f us | %.3f us | %.3f us |\n", format_bytes(size).c_str(), raw, cached, grown);
  }
  fixed.empty_cache();
  expandable.empty_cache();
  return 0;
}

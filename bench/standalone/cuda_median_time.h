// The timing loop the standalone CUDA benchmarks share: a host clock around `iterations` calls, the device drained
// before and after each loop, so every loop's work is finished when its clock stops.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <functional>
#include <vector>

#include "ember/base/cuda_check.h"

namespace ember::bench {

// Median over 5 repetitions of the mean time per call of fn(), in microseconds.
inline double median_us(int iterations, const std::function<void()>& fn) {
  std::vector<double> reps;
  for (int r = 0; r < 5; ++r) {
    EMBER_CUDA_CHECK(cudaDeviceSynchronize());
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < iterations; ++i) fn();
    EMBER_CUDA_CHECK(cudaDeviceSynchronize());
    const auto t1 = std::chrono::steady_clock::now();
    reps.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count() / iterations);
  }
  std::sort(reps.begin(), reps.end());
  return reps[2];
}

}  // namespace ember::bench

// All-reduce bandwidth of the NCCL process group (dist/) on CUDA f32 tensors, by size, beside a device-to-device
// copy of the same bytes in the same run. Prints a markdown table: time per call (median of 5 timed loops), algorithm
// bandwidth (bytes / time) and bus bandwidth (algbw * 2 (n - 1) / n, NCCL's convention: what each link carries; 0 at
// world size 1, where NCCL's all-reduce is a copy on one GPU). Exits 0 with a note when NCCL or a GPU is missing.
// Usage: cuda_nccl_allreduce [iterations=20]   (one process; or mpirun -np N with one GPU per rank where ember has MPI)
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <vector>

#include "bench/standalone/cuda_median_time.h"
#include "ember/base/cuda_check.h"
#include "ember/core/tensor.h"
#include "ember/dist/process_group.h"
#include "ember/memory/cuda_device.h"

using namespace ember;

using ember::bench::median_us;

int main(int argc, char** argv) {
  if (!dist::is_nccl_available() || memory::cuda::device_count() == 0) {
    std::printf("cuda_nccl_allreduce: %s; nothing to measure\n",
                dist::is_nccl_available() ? "no CUDA device visible" : "ember was built without NCCL");
    return 0;
  }
  const int iterations = argc > 1 ? std::max(1, std::atoi(argv[1])) : 20;
  if (dist::is_available()) dist::init();  // the MPI group bootstraps NCCL across processes
  const auto group = dist::new_nccl_group();
  const int n = group->size();
  const Device dev = group->device();
  cudaDeviceProp prop{};
  EMBER_CUDA_CHECK(cudaGetDeviceProperties(&prop, dev.index));
  if (group->rank() == 0) {
    std::printf("NCCL all-reduce (sum, f32) over %d rank(s), %s; %d calls per timing, median of 5\n\n", n, prop.name,
                iterations);
    std::printf("| bytes | all_reduce us | algbw GB/s | busbw GB/s | D2D copy us | copy GB/s (read + write) |\n");
    std::printf("|---:|---:|---:|---:|---:|---:|\n");
  }
  for (int64_t bytes : {int64_t{1} << 20, int64_t{16} << 20, int64_t{64} << 20, int64_t{256} << 20}) {
    const int64_t numel = bytes / 4;
    Tensor t = ones({numel}, TensorOptions(DType::f32, dev));
    Tensor src = ones({numel}, TensorOptions(DType::f32, dev)), dst = empty({numel}, TensorOptions(DType::f32, dev));
    group->all_reduce(t)->wait();  // warm-up: NCCL sets up its channels on the first call
    const double reduce_us = median_us(iterations, [&] { group->all_reduce(t)->wait(); });
    const double copy_us = median_us(iterations, [&] { dst.copy_(src); });
    const double algbw = static_cast<double>(bytes) / (reduce_us * 1e3);
    const double busbw = algbw * 2.0 * (n - 1) / n;
    if (group->rank() == 0)
      std::printf("| %lld | %.1f | %.1f | %.1f | %.1f | %.1f |\n", static_cast<long long>(bytes), reduce_us, algbw,
                  busbw, copy_us, 2.0 * static_cast<double>(bytes) / (copy_us * 1e3));
  }
  return 0;
}

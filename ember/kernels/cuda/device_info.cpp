// CUDA device query (see device_info.h): one cudaGetDeviceProperties per device, cached behind a mutex.
// Invariant: properties are read once per device; later calls return the cached copy, so queries never sync.
#include "ember/kernels/cuda/device_info.h"

#include <memory>
#include <mutex>
#include <vector>

#include "ember/base/cuda_check.h"
#include "ember/memory/cuda_device.h"

namespace ember::cuda {

const DeviceProperties& device_properties(int device) {
  const int n = memory::cuda::device_count();
  EMBER_CHECK(device >= 0 && device < n, DeviceError, "device_properties: cuda:", device, " is not available (", n,
              " CUDA device(s) visible)");
  static std::mutex mutex;
  static auto* cache = new std::vector<std::unique_ptr<DeviceProperties>>();  // never destroyed
  std::lock_guard<std::mutex> lock(mutex);
  if (cache->empty()) cache->resize(static_cast<size_t>(n));
  auto& slot = (*cache)[static_cast<size_t>(device)];
  if (!slot) {
    cudaDeviceProp p{};
    EMBER_CUDA_CHECK(cudaGetDeviceProperties(&p, device));
    auto d = std::make_unique<DeviceProperties>();
    d->index = device;
    d->name = p.name;
    d->major = p.major;
    d->minor = p.minor;
    d->sm_count = p.multiProcessorCount;
    d->total_memory = static_cast<int64_t>(p.totalGlobalMem);
    d->l2_cache_bytes = p.l2CacheSize;
    d->shared_memory_per_block_optin = static_cast<int64_t>(p.sharedMemPerBlockOptin);
    d->max_threads_per_block = p.maxThreadsPerBlock;
    d->max_threads_per_sm = p.maxThreadsPerMultiProcessor;
    d->warp_size = p.warpSize;
    d->memory_bus_width = p.memoryBusWidth;
    slot = std::move(d);
  }
  return *slot;
}

}  // namespace ember::cuda

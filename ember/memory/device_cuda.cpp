// CUDA device query, the per-device caching allocator (over CudaBacking) and host<->device copies (cuda_device.h).
// Compiled in every build; without EMBER_WITH_CUDA it reports no devices and refuses device work.
#include "ember/memory/cuda_device.h"

#include <memory>
#include <mutex>
#include <vector>

#include "ember/base/error.h"

#if defined(EMBER_WITH_CUDA)
#include "ember/base/cuda_check.h"
#include "ember/memory/cuda_scoped.h"
#include "ember/memory/caching_allocator.h"
#include "ember/memory/cuda_backing.h"
#endif

namespace ember::memory::cuda {

#if defined(EMBER_WITH_CUDA)

int device_count() {
  static const int count = [] {
    int n = 0;
    cudaError_t st = cudaGetDeviceCount(&n);
    if (st != cudaSuccess) {
      (void)cudaGetLastError();  // clear the sticky error: no driver / no device means "no GPU"
      return 0;
    }
    return n;
  }();
  return count;
}

namespace {


void check_device(int device) {
  EMBER_CHECK(device >= 0 && device < device_count(), DeviceError, "cuda:", device, " is not available (",
              device_count(), " CUDA device(s) visible)");
}

}  // namespace

// Each device's allocator is made on that device's first use, not all at once: making one creates the device's
// primary context (several hundred MiB of device memory), and a process that uses one GPU of several — a DDP rank —
// must not hold a context on every GPU of the node.
Allocator& allocator(int device) {
  check_device(device);
  static std::mutex mutex;
  static auto* allocators = new std::vector<std::unique_ptr<CachingAllocator>>(static_cast<size_t>(device_count()));
  std::lock_guard<std::mutex> lock(mutex);  // the vector is never destroyed; a failed make leaves its slot empty
  std::unique_ptr<CachingAllocator>& slot = (*allocators)[static_cast<size_t>(device)];
  if (!slot)
    slot = std::make_unique<CachingAllocator>(make_cuda_backing(device), alloc_config_from_env(),
                                              "cuda:" + std::to_string(device));
  return *slot;
}

void copy_bytes(void* dst, const void* src, int64_t nbytes, CopyKind kind, int device) {
  check_device(device);
  if (nbytes == 0) return;
  ScopedDevice scoped(device);
  cudaMemcpyKind k = kind == CopyKind::HostToDevice   ? cudaMemcpyHostToDevice
                     : kind == CopyKind::DeviceToHost ? cudaMemcpyDeviceToHost
                                                      : cudaMemcpyDeviceToDevice;
  EMBER_CUDA_CHECK(cudaMemcpy(dst, src, static_cast<size_t>(nbytes), k));
}

void synchronize(int device) {
  check_device(device);
  ScopedDevice scoped(device);
  EMBER_CUDA_CHECK(cudaDeviceSynchronize());
}

#else  // CPU-only build

int device_count() { return 0; }

namespace {
[[noreturn]] void no_cuda(const char* what) {
  EMBER_THROW(DeviceError, what, ": ember was built without CUDA (configure with EMBER_CUDA=ON on a machine with nvcc)");
}
}  // namespace

Allocator& allocator(int) { no_cuda("cuda allocator"); }
void copy_bytes(void*, const void*, int64_t, CopyKind, int) { no_cuda("cuda copy"); }
void synchronize(int) { no_cuda("cuda synchronize"); }

#endif

bool is_available() { return device_count() > 0; }

}  // namespace ember::memory::cuda

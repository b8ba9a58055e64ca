// CUDA device query, plain device allocator and host<->device copies (see cuda_device.h).
// Compiled in every build; without EMBER_WITH_CUDA it reports no devices and refuses device work.
#include "ember/memory/cuda_device.h"

#include <memory>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "ember/base/error.h"

#if defined(EMBER_WITH_CUDA)
#include "ember/base/cuda_check.h"
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

// Makes `device` current for the scope and restores the caller's device afterwards.
class ScopedDevice {
 public:
  explicit ScopedDevice(int device) {
    EMBER_CUDA_CHECK(cudaGetDevice(&previous_));
    if (previous_ != device) EMBER_CUDA_CHECK(cudaSetDevice(device));
  }
  ~ScopedDevice() { (void)cudaSetDevice(previous_); }
  ScopedDevice(const ScopedDevice&) = delete;
  ScopedDevice& operator=(const ScopedDevice&) = delete;

 private:
  int previous_ = 0;
};

class CudaMallocAllocator final : public Allocator {
 public:
  explicit CudaMallocAllocator(int device) : device_(device) {}

  void* allocate(int64_t nbytes) override {
    EMBER_CHECK(nbytes >= 0, ValueError, "cuda allocator: negative size ", nbytes);
    if (nbytes == 0) return nullptr;
    ScopedDevice scoped(device_);
    void* p = nullptr;
    cudaError_t st = cudaMalloc(&p, static_cast<size_t>(nbytes));
    std::lock_guard<std::mutex> lock(mutex_);
    if (st == cudaErrorMemoryAllocation) {
      (void)cudaGetLastError();
      ++stats_.num_ooms;
      size_t free_b = 0, total_b = 0;
      (void)cudaMemGetInfo(&free_b, &total_b);
      throw OutOfMemoryError(
          detail::concat("CUDA out of memory on cuda:", device_, ": tried to allocate ", format_bytes(nbytes), "; ",
                         format_bytes(static_cast<int64_t>(free_b)), " free of ",
                         format_bytes(static_cast<int64_t>(total_b)), ", ", format_bytes(stats_.allocated_bytes),
                         " allocated by ember"),
          nbytes, static_cast<int64_t>(total_b), stats_.allocated_bytes, stats_.reserved_bytes);
    }
    EMBER_CUDA_CHECK(st);
    try {
      live_.emplace(p, nbytes);
    } catch (...) {
      (void)cudaFree(p);
      throw;
    }
    if (poison_allocations()) EMBER_CUDA_CHECK(cudaMemset(p, kPoisonByte, static_cast<size_t>(nbytes)));
    stats_.allocated_bytes += nbytes;
    stats_.reserved_bytes += nbytes;
    if (stats_.allocated_bytes > stats_.peak_allocated_bytes) stats_.peak_allocated_bytes = stats_.allocated_bytes;
    ++stats_.num_allocs;
    return p;
  }

  void deallocate(void* ptr) override {
    if (ptr == nullptr) return;
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = live_.find(ptr);
    EMBER_CHECK(it != live_.end(), ValueError, "cuda allocator: pointer ", ptr, " was not allocated here");
    stats_.allocated_bytes -= it->second;
    stats_.reserved_bytes -= it->second;
    ++stats_.num_frees;
    live_.erase(it);
    EMBER_CUDA_CHECK(cudaFree(ptr));
  }

  AllocatorStats stats() const override {
    std::lock_guard<std::mutex> lock(mutex_);
    return stats_;
  }
  void reset_peak_stats() override {
    std::lock_guard<std::mutex> lock(mutex_);
    stats_.peak_allocated_bytes = stats_.allocated_bytes;
  }
  std::string name() const override { return detail::concat("cuda:", device_, " (cudaMalloc)"); }

 private:
  int device_;
  mutable std::mutex mutex_;
  std::unordered_map<void*, int64_t> live_;
  AllocatorStats stats_;
};

void check_device(int device) {
  EMBER_CHECK(device >= 0 && device < device_count(), DeviceError, "cuda:", device, " is not available (",
              device_count(), " CUDA device(s) visible)");
}

}  // namespace

Allocator& allocator(int device) {
  check_device(device);
  static std::mutex mutex;
  static auto* allocators = new std::vector<std::unique_ptr<CudaMallocAllocator>>();  // never destroyed
  std::lock_guard<std::mutex> lock(mutex);
  if (allocators->empty()) {
    for (int d = 0; d < device_count(); ++d) allocators->push_back(std::make_unique<CudaMallocAllocator>(d));
  }
  return *(*allocators)[device];
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

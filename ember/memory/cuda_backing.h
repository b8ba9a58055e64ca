// The CUDA backing of the caching allocator (backing.h): cudaMalloc/cudaFree segments, pooled cudaEvents for
// cross-stream reuse, and expandable segments through the driver's virtual-memory API (cuMemCreate/cuMemMap).
// Invariant: every call runs with the backing's device current and restores the caller's; every mapped page owns
// exactly one physical handle, released when the page is unmapped. No CUDA header is included here.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "ember/memory/backing.h"

namespace ember::memory {

// Only CUDA builds define these. Callers guard their use with `#if defined(EMBER_WITH_CUDA)` (the library exports
// that definition to everything that links it); a CPU-only build gets a compile error instead of a link error.
#if defined(EMBER_WITH_CUDA)

// Segments of one CUDA device. StreamId carries the bits of a cudaStream_t (0 = the legacy default stream).
// Expandable segments are offered when the driver exposes the virtual-memory API and the device supports it; the
// driver entry points are looked up at run time through the CUDA runtime, so linking never needs libcuda and a
// machine without a driver still loads the library (device_count() is then 0 and no backing is made).
class CudaBacking final : public Backing {
 public:
  explicit CudaBacking(int device);
  ~CudaBacking() override;
  CudaBacking(const CudaBacking&) = delete;
  CudaBacking& operator=(const CudaBacking&) = delete;

  std::string name() const override;
  void* malloc(int64_t nbytes) override;  // nullptr on cudaErrorMemoryAllocation (error cleared)
  void free(void* ptr, int64_t nbytes) override;
  int64_t capacity() const override;   // total device memory
  int64_t available() const override;  // free device memory right now (cudaMemGetInfo)

  EventId record_event(StreamId stream) override;
  bool event_completed(EventId event) override;
  void release_event(EventId event) override;
  void synchronize() override;  // cudaDeviceSynchronize on this device

  bool supports_expandable() const override;
  int64_t page_size() const override;  // the VMM granularity, at least 2 MiB
  void* reserve_range(int64_t nbytes) override;  // nullptr when the address space is exhausted
  bool map(void* addr, int64_t nbytes) override;  // false (nothing mapped) when cuMemCreate runs out of memory
  void unmap(void* addr, int64_t nbytes) override;
  void release_range(void* addr, int64_t nbytes) override;
  void fill(void* ptr, int64_t nbytes, unsigned char byte, StreamId stream) override;  // cudaMemsetAsync on stream

  int device() const { return device_; }
  int64_t mapped_pages() const;  // physical pages currently mapped in reserved ranges
  int64_t pooled_events() const;  // cudaEvents created so far (in use or waiting for reuse)

 private:
  struct State;
  int device_;
  std::unique_ptr<State> state_;
};

// Throws DeviceError when `device` is not a visible CUDA device.
std::unique_ptr<Backing> make_cuda_backing(int device);

// The device to make current while pinning host memory (cudaHostAlloc / cudaHostRegister create a context on the
// current device when it has none): the current device if its primary context is active, else the first device
// whose primary context is, else the current one. So a process that trains on cuda:3 pins under cuda:3's context
// instead of opening one on cuda:0 (several hundred MiB there), as PyTorch's pinned allocator does.
int pinning_device();

// Whether `device`'s primary context is active (cuDevicePrimaryCtxGetState); true when the driver cannot say. Since
// CUDA 12 cudaSetDevice creates the primary context, so device guards restore the caller's device only when this
// holds: a thread that never used cuda:0 must not get a context there from a guard's destructor.
bool primary_context_active(int device) noexcept;

#endif  // EMBER_WITH_CUDA

}  // namespace ember::memory

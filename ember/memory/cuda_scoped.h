// Small CUDA helpers shared by the memory layer's CUDA code (include only where EMBER_WITH_CUDA is defined):
// a scope guard for the current device and the StreamId <-> cudaStream_t mapping.
// Invariant: ScopedDevice restores the caller's device on every exit path (unless restoring would create a context:
// see its destructor) and never throws from its destructor.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "ember/base/cuda_check.h"
#include "ember/memory/allocator.h"
#include "ember/memory/cuda_backing.h"

namespace ember::memory::cuda {

// Makes `device` current for the scope and restores the caller's device afterwards.
class ScopedDevice {
 public:
  explicit ScopedDevice(int device) {
    EMBER_CUDA_CHECK(cudaGetDevice(&previous_));
    changed_ = previous_ != device;
    // Set even when current: since CUDA 12 cudaSetDevice also makes the device's primary context current on this
    // thread, which the driver calls of expandable segments (cuMem*) need on a thread with no runtime call yet.
    EMBER_CUDA_CHECK(cudaSetDevice(device));
  }
  // The caller's device is restored only if its primary context is active: cudaSetDevice would create one (a rank
  // on cuda:3 whose thread still reads device 0 would otherwise hold a context on cuda:0); the thread then stays on
  // `device`, as PyTorch's guards leave it.
  ~ScopedDevice() {
    if (changed_ && primary_context_active(previous_)) (void)cudaSetDevice(previous_);
  }
  ScopedDevice(const ScopedDevice&) = delete;
  ScopedDevice& operator=(const ScopedDevice&) = delete;

 private:
  int previous_ = 0;
  bool changed_ = false;
};

inline cudaStream_t to_stream(StreamId id) { return reinterpret_cast<cudaStream_t>(static_cast<uintptr_t>(id)); }

}  // namespace ember::memory::cuda

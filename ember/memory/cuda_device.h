// CUDA devices as the memory layer sees them: how many there are, a caching allocator per device, and
// byte copies between host and device. Safe to include and call in a CPU-only build (EMBER_WITH_CUDA undefined):
// device_count() is then 0 and the rest throws DeviceError.
#pragma once

#include <cstdint>

#include "ember/memory/allocator.h"

namespace ember::memory::cuda {

// Number of usable CUDA devices. 0 when the build has no CUDA, when no driver is installed
// (cudaErrorInsufficientDriver / cudaErrorNoDevice mean "no GPU", not a failure), or when none is visible.
int device_count();
bool is_available();

// The caching allocator of one device (over cudaMalloc / the VMM API), configured from EMBER_ALLOC_CONF at first use.
Allocator& allocator(int device);

enum class CopyKind { HostToDevice, DeviceToHost, DeviceToDevice };
// Synchronous byte copy (cudaMemcpy) on the legacy default stream; `device` is the CUDA device involved and the
// caller's current device is restored afterwards. Note [Copy ordering]: this is ordered with kernels because every
// kernel launches on the legacy default stream today (kernels/cuda/stream.h current_stream); when kernels move to
// other streams, copies must take that stream and synchronise it.
void copy_bytes(void* dst, const void* src, int64_t nbytes, CopyKind kind, int device);

void synchronize(int device);

}  // namespace ember::memory::cuda

// What a CUDA device is: name, compute capability, SM count, memory; for reports (demo, bench) and launch sizing.
// Safe to include in a CPU-only build: there device_properties() throws DeviceError (no CUDA compiled in).
// Invariant: properties are queried once per device and cached for the life of the process.
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>

#include "ember/base/error.h"

namespace ember::cuda {

struct DeviceProperties {
  int index = 0;
  std::string name;
  int major = 0, minor = 0;  // compute capability
  int sm_count = 0;
  int64_t total_memory = 0;  // bytes
  int64_t l2_cache_bytes = 0;
  int64_t shared_memory_per_block_optin = 0;  // bytes
  int max_threads_per_block = 0;
  int max_threads_per_sm = 0;
  int warp_size = 0;
  int memory_bus_width = 0;  // bits

  // "sm_90"
  std::string arch() const { return detail::concat("sm_", major, minor); }
  // "cuda:0 NVIDIA H100 80GB HBM3 (sm_90, 132 SMs, 79.1 GiB)"
  std::string summary() const {
    char mem[32];
    std::snprintf(mem, sizeof mem, "%.1f GiB", static_cast<double>(total_memory) / (1024.0 * 1024.0 * 1024.0));
    return detail::concat("cuda:", index, " ", name, " (", arch(), ", ", sm_count, " SMs, ", mem, ")");
  }
};

#if defined(EMBER_WITH_CUDA)
// Properties of CUDA device `device`; DeviceError when it does not exist, BackendError when the query fails.
const DeviceProperties& device_properties(int device);
#else
[[noreturn]] inline const DeviceProperties& device_properties(int device) {
  EMBER_THROW(DeviceError, "device_properties: cuda:", device, " is not available (ember was built without CUDA)");
}
#endif

}  // namespace ember::cuda

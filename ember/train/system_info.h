// What this ember is and where it runs, for `ember info` and bug reports: the version and build options (CUDA and
// its runtime, cuDNN, zlib, compiler), the host (cores, memory), every visible CUDA device (name, compute capability,
// memory free/total) and the allocator configuration EMBER_ALLOC_CONF gives.
// Invariant: system_info() never throws for a missing GPU or a malformed EMBER_ALLOC_CONF — those are reported in
// the result (an empty device list, the error text).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace ember::train {

struct BuildInfo {
  std::string version;       // "0.1.0"
  bool cuda = false;         // the CUDA backend is compiled in
  std::string cuda_runtime;  // "13.0" (the runtime library in use; empty without CUDA)
  std::string cuda_driver;   // the newest CUDA version the driver supports ("" without CUDA or driver)
  std::string cudnn;         // "9.10.2" ("" when built without cuDNN)
  // The libraries opened on first use (Note [Libraries opened on first use] in base/dynamic_library.h): "" when not
  // built in, "unavailable (<reason>)" when the library cannot be opened. system_info() opens them.
  std::string cublaslt;      // "13.1.0"
  std::string cusparse;      // "12.6.3"
  std::string nccl;          // "2.27.7"
  bool zlib = false;         // MNIST .gz files are read
  std::string compiler;      // "GCC 12.2.0"
  std::string build_type;    // "release" (NDEBUG) or "debug"
  std::string cpu_isa;       // the vector ISA the C++ code was compiled for: "avx512", "avx2" or "sse" (EMBER_CPU_ISA)
};

struct CpuInfo {
  int64_t cores = 0;                   // online processors
  int64_t memory_total_bytes = 0;      // physical memory
  int64_t memory_available_bytes = 0;  // free physical memory now
};

struct CudaDeviceInfo {
  int index = 0;
  std::string name;
  int major = 0, minor = 0;  // compute capability
  int sm_count = 0;
  int64_t memory_free_bytes = 0;   // cudaMemGetInfo, through the device allocator's backing
  int64_t memory_total_bytes = 0;
};

struct SystemInfo {
  BuildInfo build;
  CpuInfo cpu;
  std::vector<CudaDeviceInfo> cuda_devices;
  std::string cuda_error;           // why a device query failed ("" when none did)
  bool alloc_conf_set = false;      // EMBER_ALLOC_CONF is set
  std::string alloc_conf_env;       // its text
  std::string alloc_conf_effective; // the parsed configuration on ember's defaults (AllocatorConfig::str())
  std::string alloc_conf_error;     // the ConfigError of a malformed EMBER_ALLOC_CONF ("" otherwise)
  std::string cpu_allocator_conf;   // what the CPU allocator really runs: expandable segments only where its backing
                                    // supports them (a simulated device with a capacity), else fixed segments
  // Settings of the CPU allocator's configuration that do nothing there ("" when none): per_process_memory_fraction
  // and garbage_collection_threshold are fractions of a capacity, and host memory has none unless capacity:SIZE.
  std::string cpu_allocator_note;
  std::string to_json() const;      // one line; keys in docs/cli.md
  std::string to_string() const;    // a few readable lines
};

SystemInfo system_info();
std::string ember_version();  // the project's version (project(ember VERSION ...)), without querying anything

namespace detail {
// CUDA library versions as the libraries encode them (0 without CUDA / cuDNN / a driver); cuda_system_info.cpp.
int cuda_runtime_version();
int cuda_driver_version();
int64_t cudnn_version();
// Version texts as in BuildInfo (these open their library).
std::string cublaslt_version();
std::string cusparse_version();
}  // namespace detail

}  // namespace ember::train

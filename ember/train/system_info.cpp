// system_info (system_info.h): build options from the library's own compile definitions, the host from sysconf,
// CUDA devices through the memory layer and kernels/cuda/device_info.h.
// Invariant: CUDA headers are not included here (cuda_system_info.cpp holds the calls that need them).
#include "ember/train/system_info.h"

#include <unistd.h>

#include <cstdlib>
#include <nlohmann/json.hpp>
#include <sstream>

#include "ember/base/error.h"
#include "ember/data/mnist.h"
#include "ember/dist/nccl_process_group.h"
#include "ember/kernels/cuda/device_info.h"
#include "ember/memory/address_only.h"
#include "ember/memory/alloc_config.h"
#include "ember/memory/allocator.h"
#include "ember/memory/caching_allocator.h"
#include "ember/memory/cpu_allocator.h"
#include "ember/memory/cuda_device.h"

// The project's version: ember/CMakeLists.txt defines EMBER_VERSION from project(ember VERSION ...).
#ifndef EMBER_VERSION
#define EMBER_VERSION "unknown"
#endif

namespace ember::train {

#if !defined(EMBER_WITH_CUDA)
namespace detail {
int cuda_runtime_version() { return 0; }
int cuda_driver_version() { return 0; }
int64_t cudnn_version() { return 0; }
std::string cublaslt_version() { return ""; }
std::string cusparse_version() { return ""; }
}  // namespace detail
#endif

namespace {

// 13000 -> "13.0" (CUDA's encoding: 1000 * major + 10 * minor); "" for 0.
std::string cuda_version_text(int v) {
  if (v <= 0) return "";
  return std::to_string(v / 1000) + "." + std::to_string((v % 1000) / 10);
}

// cuDNN 9 encodes 10000 * major + 100 * minor + patch, earlier versions 1000 * major + 100 * minor + patch.
std::string cudnn_version_text(int64_t v) {
  if (v <= 0) return "";
  const int64_t major = v >= 90000 ? v / 10000 : v / 1000;
  const int64_t rest = v >= 90000 ? v % 10000 : v % 1000;
  return std::to_string(major) + "." + std::to_string(rest / 100) + "." + std::to_string(rest % 100);
}

std::string compiler_text() {
#if defined(__clang__)
  return std::string("Clang ") + __clang_version__;
#elif defined(__GNUC__)
  return std::string("GCC ") + __VERSION__;
#else
  return "unknown";
#endif
}

}  // namespace

std::string ember_version() { return EMBER_VERSION; }

SystemInfo system_info() {
  SystemInfo s;
  s.build.version = EMBER_VERSION;
#if defined(EMBER_WITH_CUDA)
  s.build.cuda = true;
#endif
  s.build.cuda_runtime = cuda_version_text(detail::cuda_runtime_version());
  s.build.cuda_driver = cuda_version_text(detail::cuda_driver_version());
  s.build.cudnn = cudnn_version_text(detail::cudnn_version());
  s.build.cublaslt = detail::cublaslt_version();
  s.build.cusparse = detail::cusparse_version();
  s.build.nccl = dist::detail::nccl_version();
  s.build.zlib = data::gzip_supported();
  s.build.compiler = compiler_text();
  // cmake/EmberCpuIsa.cmake's flags, as the compiler saw them.
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512DQ__) && defined(__AVX512VL__)
  s.build.cpu_isa = "avx512";
#elif defined(__AVX2__) && defined(__FMA__)
  s.build.cpu_isa = "avx2";
#else
  s.build.cpu_isa = "sse";
#endif
#if defined(NDEBUG)
  s.build.build_type = "release";
#else
  s.build.build_type = "debug";
#endif

  const long cores = sysconf(_SC_NPROCESSORS_ONLN), pages = sysconf(_SC_PHYS_PAGES),
             free_pages = sysconf(_SC_AVPHYS_PAGES), page = sysconf(_SC_PAGE_SIZE);
  s.cpu.cores = cores > 0 ? cores : 0;
  s.cpu.memory_total_bytes = pages > 0 && page > 0 ? static_cast<int64_t>(pages) * page : 0;
  s.cpu.memory_available_bytes = free_pages > 0 && page > 0 ? static_cast<int64_t>(free_pages) * page : 0;

  try {
    const int n = memory::cuda::device_count();
    for (int d = 0; d < n; ++d) {
      const cuda::DeviceProperties& p = cuda::device_properties(d);
      CudaDeviceInfo info;
      info.index = d;
      info.name = p.name;
      info.major = p.major;
      info.minor = p.minor;
      info.sm_count = p.sm_count;
      info.memory_total_bytes = p.total_memory;
      // Free memory now (cudaMemGetInfo) through the device allocator's backing; creating the allocator allocates
      // nothing.
      if (auto* caching = dynamic_cast<memory::CachingAllocator*>(&memory::cuda::allocator(d))) {
        info.memory_free_bytes = caching->backing().available();
        info.memory_total_bytes = caching->backing().capacity();
      }
      s.cuda_devices.push_back(info);
    }
  } catch (const std::exception& e) {
    s.cuda_error = e.what();
  }

  if (const char* env = std::getenv("EMBER_ALLOC_CONF")) {
    s.alloc_conf_set = true;
    s.alloc_conf_env = env;
  }
  try {
    s.alloc_conf_effective = memory::alloc_config_from_env().explicit_str();
    const memory::AllocatorConfig cpu = memory::effective_config(memory::cpu_allocator());
    s.cpu_allocator_conf = cpu.explicit_str();
    if (cpu.capacity == memory::kNoLimit && memory::cpu_allocator().backing().capacity() == memory::kNoLimit) {
      std::vector<std::string> inert;
      if (cpu.memory_fraction < 1.0) inert.push_back("per_process_memory_fraction");
      if (cpu.garbage_collection_threshold > 0.0) inert.push_back("garbage_collection_threshold");
      if (!inert.empty())
        s.cpu_allocator_note = (inert.size() == 2 ? inert[0] + " and " + inert[1] + " have" : inert[0] + " has") +
                               " no effect on the CPU allocator: host memory has no capacity to take a fraction of "
                               "(add capacity:SIZE)";
    }
  } catch (const Error& e) {
    s.alloc_conf_error = e.what();
  }
  return s;
}

std::string SystemInfo::to_json() const {
  using json = nlohmann::ordered_json;
  auto text_or_null = [](const std::string& t) { return t.empty() ? json() : json(t); };
  json j;
  j["version"] = build.version;
  j["build"] = {{"cuda", build.cuda},
                {"cuda_runtime", text_or_null(build.cuda_runtime)},
                {"cuda_driver", text_or_null(build.cuda_driver)},
                {"cudnn", text_or_null(build.cudnn)},
                {"cublaslt", text_or_null(build.cublaslt)},
                {"cusparse", text_or_null(build.cusparse)},
                {"nccl", text_or_null(build.nccl)},
                {"zlib", build.zlib},
                {"compiler", build.compiler},
                {"build_type", build.build_type},
                {"cpu_isa", build.cpu_isa}};
  j["cpu"] = {{"cores", cpu.cores},
              {"memory_total_bytes", cpu.memory_total_bytes},
              {"memory_available_bytes", cpu.memory_available_bytes}};
  json devices = json::array();
  for (const CudaDeviceInfo& d : cuda_devices)
    devices.push_back({{"index", d.index},
                       {"name", d.name},
                       {"compute_capability", std::to_string(d.major) + "." + std::to_string(d.minor)},
                       {"sm_count", d.sm_count},
                       {"memory_free_bytes", d.memory_free_bytes},
                       {"memory_total_bytes", d.memory_total_bytes}});
  j["cuda_devices"] = devices;
  j["cuda_error"] = text_or_null(cuda_error);
  j["alloc_conf"] = {{"env", alloc_conf_set ? json(alloc_conf_env) : json()},
                     {"effective", alloc_conf_error.empty() ? json(alloc_conf_effective) : json()},
                     {"error", text_or_null(alloc_conf_error)},
                     {"cpu_allocator", alloc_conf_error.empty() ? json(cpu_allocator_conf) : json()},
                     {"cpu_allocator_note", cpu_allocator_note.empty() ? json() : json(cpu_allocator_note)}};
  // EMBER_ALLOC_CONF (and the error quoting it) may hold any bytes: invalid UTF-8 becomes U+FFFD, never a throw.
  return j.dump(-1, ' ', false, json::error_handler_t::replace);
}

std::string SystemInfo::to_string() const {
  std::ostringstream os;
  os << "ember " << build.version << " (" << build.build_type << ", " << build.compiler << ", CPU ISA "
     << build.cpu_isa << ")\n";
  os << "build: CUDA " << (build.cuda ? "on" : "off");
  if (build.cuda) {
    os << " (runtime " << (build.cuda_runtime.empty() ? "unknown" : build.cuda_runtime) << ", driver "
       << (build.cuda_driver.empty() ? "none" : build.cuda_driver) << ")";
  }
  os << ", cuDNN " << (build.cudnn.empty() ? "off" : build.cudnn);
  if (build.cuda)
    os << ", cuBLASLt " << build.cublaslt << ", cuSPARSE " << (build.cusparse.empty() ? "off" : build.cusparse)
       << ", NCCL " << (build.nccl.empty() ? "off" : build.nccl);
  os << ", zlib " << (build.zlib ? "on" : "off") << "\n";
  os << "cpu: " << cpu.cores << " cores, " << memory::format_bytes(cpu.memory_total_bytes) << " memory ("
     << memory::format_bytes(cpu.memory_available_bytes) << " free)\n";
  if (cuda_devices.empty()) os << "cuda: no device" << (cuda_error.empty() ? "" : " (" + cuda_error + ")") << "\n";
  for (const CudaDeviceInfo& d : cuda_devices)
    os << "cuda:" << d.index << ": " << d.name << ", compute capability " << d.major << "." << d.minor << ", "
       << d.sm_count << " SMs, " << memory::format_bytes(d.memory_free_bytes) << " free of "
       << memory::format_bytes(d.memory_total_bytes) << "\n";
  os << "EMBER_ALLOC_CONF: " << (alloc_conf_set ? "'" + alloc_conf_env + "'" : std::string("(unset)"));
  if (alloc_conf_error.empty())
    os << " -> " << (alloc_conf_effective.empty() ? std::string("defaults") : alloc_conf_effective)
       << "; the CPU allocator runs "
       << (cpu_allocator_conf.empty() ? std::string("PyTorch's defaults (fixed segments)") : cpu_allocator_conf);
  else
    os << " -> error: " << alloc_conf_error;
  if (!cpu_allocator_note.empty()) os << "\n  note: " << cpu_allocator_note;
  return os.str();
}

}  // namespace ember::train

// The CPU tensor allocator: created lazily, replaced under a mutex, never destroyed (tensors may outlive static
// teardown). Invariant: callers hold the pointer only while no configure_cpu_allocator() can run concurrently
// with live tensors (it refuses to replace an allocator that holds live allocations).
#include "ember/memory/cpu_allocator.h"

#include <memory>
#include <mutex>

#include "ember/base/error.h"

namespace ember::memory {

namespace {
std::mutex g_mutex;
CachingAllocator* g_cpu = nullptr;

CachingAllocator* build(const AllocatorConfig& config) {
  std::unique_ptr<Backing> backing;
  if (config.capacity != kNoLimit) backing = make_simulated_backing(config.capacity, /*materialize=*/true);
  else backing = make_host_backing();
  return new CachingAllocator(std::move(backing), config, "cpu");
}
}  // namespace

CachingAllocator& cpu_allocator() {
  std::lock_guard<std::mutex> lock(g_mutex);
  if (g_cpu == nullptr) g_cpu = build(alloc_config_from_env());
  return *g_cpu;
}

void configure_cpu_allocator(const AllocatorConfig& config) {
  std::lock_guard<std::mutex> lock(g_mutex);
  if (g_cpu != nullptr) {
    const AllocatorStats s = g_cpu->stats();
    EMBER_CHECK(s.allocated_bytes == 0, ValueError, "configure_cpu_allocator: the CPU allocator still holds ",
                format_bytes(s.allocated_bytes), " in live allocations; free every CPU tensor first");
    g_cpu->empty_cache();
    // The old allocator is kept (not deleted): a caller may still hold a reference to it for statistics.
  }
  g_cpu = build(config);
}

}  // namespace ember::memory

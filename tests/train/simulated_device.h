// The CPU allocator rebuilt as a simulated device of a given capacity, for the tests of test_train_device (a process
// of its own: the allocator can be replaced only while it holds no live allocation).
#pragma once

#include <cstdint>

#include "ember/memory/alloc_config.h"
#include "ember/memory/cpu_allocator.h"

#if defined(__SANITIZE_ADDRESS__)
#define EMBER_TEST_LSAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define EMBER_TEST_LSAN 1
#endif
#endif
#if EMBER_TEST_LSAN
#include <sanitizer/lsan_interface.h>
#endif

namespace ember::testing {

// Rebuilds the process-wide CPU allocator as a device of `capacity` bytes (memory::kNoLimit: the unbounded host);
// nothing to do when it already is one. The memory layer keeps a replaced allocator alive on purpose (a caller may
// still hold it): LeakSanitizer is told so.
inline void use_device(int64_t capacity) {
  memory::CachingAllocator* old = &memory::cpu_allocator();
  if (old->config().capacity == capacity) return;
  memory::AllocatorConfig c = memory::alloc_config_from_env();
  c.capacity = capacity;
  memory::configure_cpu_allocator(c);
#if EMBER_TEST_LSAN
  __lsan_ignore_object(old);
#endif
}

}  // namespace ember::testing

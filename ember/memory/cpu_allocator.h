// The allocator behind CPU tensors: a CachingAllocator over host memory, configured from EMBER_ALLOC_CONF at first
// use. With a `capacity` setting the host becomes a simulated device of that size (real memory, fixed capacity), so
// OOMs, fragmentation and every allocator knob behave on CPU as on a GPU of that size (DESIGN.md §2).
// Invariant: the allocator is replaced only while it holds no live allocation.
#pragma once

#include "ember/memory/alloc_config.h"
#include "ember/memory/caching_allocator.h"

namespace ember::memory {

// The process-wide CPU allocator (created on first use from alloc_config_from_env(); ConfigError if malformed).
CachingAllocator& cpu_allocator();

// Rebuilds the CPU allocator with `config` (capacity < kNoLimit: a simulated device of that size; expandable
// segments then work too). Throws ValueError while the current one has live allocations.
void configure_cpu_allocator(const AllocatorConfig& config);

}  // namespace ember::memory

// Address-only caching allocators: the caching allocator's policy (any AllocatorConfig) over a SimulatedBacking that
// hands out addresses and no bytes. A dry run allocates through one (meta tensors under core's
// MetaAllocationScope) to predict the statistics of a real run — peak allocated, peak reserved, OOMs — without
// memory. Invariant: its addresses are never dereferenced (nothing backs them); its statistics mean what they mean
// for an allocator over real memory with the same policy and capacity.
#pragma once

#include <memory>
#include <string>

#include "ember/memory/alloc_config.h"
#include "ember/memory/caching_allocator.h"

namespace ember::memory {

// A CachingAllocator with `config` over SimulatedBacking(config.capacity, materialize = false): unbounded when the
// config sets no capacity, else a simulated device of that size (as configure_cpu_allocator builds for the host).
std::shared_ptr<CachingAllocator> make_address_only_allocator(const AllocatorConfig& config,
                                                              const std::string& name = "meta");

// The policy `allocator` really applies: its config, with expandable_segments only where its backing supports them
// (host memory does not, so the CPU allocator of ember_default_config() runs fixed segments).
AllocatorConfig effective_config(CachingAllocator& allocator);

}  // namespace ember::memory

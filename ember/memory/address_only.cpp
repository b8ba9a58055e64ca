// Address-only caching allocators (address_only.h).
// Invariant: the backing is never materialised, so the allocator never writes to the addresses it hands out (its
// poison fill is skipped for non-materialised backings).
#include "ember/memory/address_only.h"

#include "ember/memory/backing.h"

namespace ember::memory {

std::shared_ptr<CachingAllocator> make_address_only_allocator(const AllocatorConfig& config, const std::string& name) {
  return std::make_shared<CachingAllocator>(make_simulated_backing(config.capacity, /*materialize=*/false), config,
                                            name);
}

AllocatorConfig effective_config(CachingAllocator& allocator) {
  AllocatorConfig c = allocator.config();
  c.expandable_segments = c.expandable_segments && allocator.backing().supports_expandable();
  return c;
}

}  // namespace ember::memory

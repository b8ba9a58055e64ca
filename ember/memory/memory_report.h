// Memory attribution: the allocator's bytes by owner — module path × phase (forward, backward, optimizer, data,
// workspace, other) — now and at the allocator's peak, as a table (memory_report) and as JSON.
// Invariant: the report's totals equal the allocator's statistics exactly (current: allocated_bytes; at peak:
// peak_allocated_bytes), because every allocated byte carries exactly one tag.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "ember/memory/caching_allocator.h"
#include "ember/memory/tags.h"

namespace ember::memory {

// One owner's bytes (block bytes after rounding, as allocated_bytes counts them).
struct TagBytes {
  std::string module;  // dotted module path ("" when no module was running)
  std::string phase;   // parameters | forward | backward | optimizer | data | workspace | other
  int64_t current_bytes = 0;  // allocated now
  int64_t peak_bytes = 0;     // this owner's own high-water mark since the last reset_peak_stats
  int64_t at_peak_bytes = 0;  // allocated at the moment the allocator reached peak_allocated_bytes
  int64_t num_allocs = 0;     // allocations made under this tag since the allocator was created
};

struct MemoryAttribution {
  std::string allocator;          // the allocator's name
  std::vector<TagBytes> owners;   // every tag that holds or held bytes, largest at_peak first (tags naming the same
                                  // module and phase are merged; their peak_bytes is then the sum of their peaks)
  int64_t current_bytes = 0;      // == allocator.stats().allocated_bytes
  int64_t peak_bytes = 0;         // == allocator.stats().peak_allocated_bytes
  std::string to_json() const;    // one line: {"allocator":..., "current_bytes":..., "peak_bytes":..., "owners":[...]}
};

MemoryAttribution memory_attribution(const CachingAllocator& allocator);

// A readable report: current and at-peak bytes by module (rows, indented by path depth) and phase (columns), with
// totals that equal the allocator's statistics; printed next to memory_summary().
std::string memory_report(const CachingAllocator& allocator);
// The same for the CPU allocator (cpu_allocator()).
std::string memory_report();

}  // namespace ember::memory

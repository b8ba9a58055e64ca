// explain_oom: the message of an OutOfMemoryError, with replay-checked advice (see oom_report.h).
// Invariant: the replays run on address-only simulated devices, so explaining never allocates device memory.
#include "ember/memory/oom_report.h"

#include <algorithm>
#include <sstream>

#include "ember/base/error.h"
#include "ember/memory/caching_allocator.h"

namespace ember::memory {

namespace {
// Would the live allocations (in allocation order) plus the request fit under `config` on `capacity` bytes?
bool replay_fits(const std::vector<LiveAllocation>& live, int64_t request, StreamId stream,
                 const AllocatorConfig& config, int64_t capacity) {
  CachingAllocator probe(make_simulated_backing(capacity, false), config, "oom-replay");
  try {
    for (const LiveAllocation& a : live) probe.allocate(a.requested, a.stream);
    probe.allocate(request, stream);
    return true;
  } catch (const OutOfMemoryError&) {
    return false;
  }
}
}  // namespace

std::string explain_oom(const OomFacts& f) {
  std::ostringstream os;
  const int64_t cached = f.reserved - f.allocated;
  os << f.device << ": out of memory: tried to allocate " << format_bytes(f.requested);
  if (f.rounded != f.requested) os << " (" << format_bytes(f.rounded) << " after rounding)";
  os << ". Capacity " << (f.capacity == kNoLimit ? std::string("unbounded") : format_bytes(f.capacity));
  if (f.allowed != f.capacity) os << ", allowed " << format_bytes(f.allowed);
  os << "; " << format_bytes(f.allocated) << " allocated by live tensors, " << format_bytes(f.reserved)
     << " reserved by the allocator, of which " << format_bytes(cached) << " is reserved but unallocated in "
     << f.free_blocks << " free block(s), the largest " << format_bytes(f.largest_free) << ".";

  std::vector<LiveAllocation> live = f.live;
  std::sort(live.begin(), live.end(), [](const LiveAllocation& a, const LiveAllocation& b) { return a.id < b.id; });
  const int64_t replay_capacity = f.allowed != kNoLimit ? f.allowed : f.capacity;
  std::vector<std::string> helps;
  if (cached >= f.requested && replay_capacity != kNoLimit) {  // the bytes exist, but not in one piece
    if (f.config.max_split_size == kNoLimit) {
      AllocatorConfig c = f.config;
      c.max_split_size = 128 * kMiB;
      if (replay_fits(live, f.requested, f.stream, c, replay_capacity)) helps.push_back("max_split_size_mb:128");
    }
    if (!f.config.expandable_segments) {
      AllocatorConfig c = f.config;
      c.expandable_segments = true;
      if (replay_fits(live, f.requested, f.stream, c, replay_capacity)) helps.push_back("expandable_segments:True");
    }
  }
  if (!helps.empty()) {
    os << " The cache is fragmented: a replay of the " << live.size()
       << " live allocation(s) plus this request fits with EMBER_ALLOC_CONF=" << helps[0];
    if (helps.size() > 1) os << " (or " << helps[1] << ")";
    os << ".";
  } else {
    os << " Live tensors would need " << format_bytes(f.allocated + f.rounded)
       << " with this request; no allocator setting makes that fit: free tensors or need less memory — a smaller "
          "batch (with gradient accumulation), activation checkpointing, or mixed precision.";
  }
  return os.str();
}

}  // namespace ember::memory

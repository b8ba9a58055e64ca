// explain_oom: the message of an OutOfMemoryError, with replay-checked advice (see oom_report.h).
// Invariant: the replays run on address-only simulated devices, so explaining never allocates device memory.
#include "ember/memory/oom_report.h"

#include <algorithm>
#include <sstream>

#include "ember/base/error.h"
#include "ember/memory/caching_allocator.h"

namespace ember::memory {

namespace {

// The replay device has exactly the allowed memory, so the limits must not apply a second time.
AllocatorConfig unlimited(AllocatorConfig c) {
  c.memory_fraction = 1.0;
  c.capacity = kNoLimit;
  return c;
}

// Would the live allocations (in allocation order) plus the request fit under `config` on `capacity` bytes?
bool live_set_fits(const std::vector<LiveAllocation>& live, int64_t request, StreamId stream,
                   const AllocatorConfig& config, int64_t capacity) {
  CachingAllocator probe(make_simulated_backing(capacity, false), unlimited(config), "oom-replay");
  probe.set_oom_explanations(false);
  try {
    for (const LiveAllocation& a : live) probe.allocate(a.requested, a.stream);
    probe.allocate(request, stream);
    return true;
  } catch (const OutOfMemoryError&) {
    return false;
  }
}

// Would the whole recorded history followed by the request have served the request under `config`?
bool history_serves(const std::vector<TraceEvent>& history, int64_t request, StreamId stream,
                    const AllocatorConfig& config, int64_t capacity) {
  std::vector<TraceEvent> events = history;
  TraceEvent e;
  e.action = TraceAction::Alloc;
  e.id = ~uint64_t{0};
  e.size = request;
  e.stream = stream;
  events.push_back(e);
  const ReplayResult r = replay_trace(events, unlimited(config), capacity);
  return r.last_oom_index != static_cast<int64_t>(events.size()) - 1;
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
  if (f.device_available != kNoLimit && f.capacity != kNoLimit) {
    const int64_t elsewhere = f.capacity - f.reserved - f.device_available;
    os << " The device reports " << format_bytes(f.device_available) << " free";
    if (elsewhere > 0) os << "; " << format_bytes(elsewhere) << " is held outside this allocator (other processes or libraries)";
    os << ".";
  }

  std::vector<LiveAllocation> live = f.live;
  std::sort(live.begin(), live.end(), [](const LiveAllocation& a, const LiveAllocation& b) { return a.id < b.id; });
  // What this allocator could hold at most now: the allowed memory, less what others hold on the device (its free
  // memory plus what this allocator reserves).
  int64_t replay_capacity = f.allowed != kNoLimit ? f.allowed : f.capacity;
  if (replay_capacity != kNoLimit && f.device_available != kNoLimit)
    replay_capacity = std::min(replay_capacity, f.reserved + f.device_available);
  // No setting helps only when the live bytes and the request exceed that memory. Less cached than requested
  // is not enough to say so: the device may have the bytes unmapped, in pieces smaller than the segment this
  // request needs (a 4 MiB request gets a 20 MiB segment), which other settings use.
  if (replay_capacity == kNoLimit || f.allocated + f.rounded > replay_capacity) {
    os << " Live tensors would need " << format_bytes(f.allocated + f.rounded)
       << " with this request; no allocator setting makes that fit: free tensors or need less memory — a smaller "
          "batch (with gradient accumulation), activation checkpointing, or mixed precision.";
    return os.str();
  }
  // The bytes exist, but not in pieces this allocator can use (cache splits, segment sizes). Suggest a setting only
  // where a replay shows it would have served this.
  std::vector<std::pair<std::string, AllocatorConfig>> knobs;
  if (f.config.max_split_size == kNoLimit) {
    AllocatorConfig c = f.config;
    c.max_split_size = 128 * kMiB;
    // Spelled with fixed segments where the replay had them: EMBER_ALLOC_CONF reads over ember's defaults, which turn
    // expandable segments on.
    knobs.emplace_back(c.expandable_segments ? "max_split_size_mb:128" : "max_split_size_mb:128,expandable_segments:False",
                       c);
  }
  if (!f.config.expandable_segments) {
    AllocatorConfig c = f.config;
    c.expandable_segments = true;
    knobs.emplace_back("expandable_segments:True", c);
  }
  std::vector<std::string> helps;
  if (f.has_history) {
    for (const auto& [name, c] : knobs)
      if (history_serves(f.history, f.requested, f.stream, c, replay_capacity)) helps.push_back(name);
    if (!helps.empty()) {
      os << " The cache is fragmented: replaying this allocator's recorded history under EMBER_ALLOC_CONF="
         << helps[0];
      if (helps.size() > 1) os << " (or " << helps[1] << ")";
      os << " serves this request.";
    } else {
      os << " The cache is fragmented, and replaying this allocator's recorded history under "
         << (knobs.empty() ? std::string("other settings") : knobs[0].first)
         << (knobs.size() > 1 ? " or " + knobs[1].first : std::string())
         << " does not serve this request either: free tensors, or call empty_cache() between phases, or need less "
            "memory (smaller batch, activation checkpointing, mixed precision).";
    }
    return os.str();
  }
  const bool fits_now = live_set_fits(live, f.requested, f.stream, f.config, replay_capacity);
  for (const auto& [name, c] : knobs)
    if (!fits_now && live_set_fits(live, f.requested, f.stream, c, replay_capacity)) helps.push_back(name);
  if (!helps.empty()) {
    os << " The " << live.size() << " live allocation(s) plus this request fit in the allowed memory but not "
       << "under the current settings (segment sizes, splitting) even packed afresh, and do fit with "
       << "EMBER_ALLOC_CONF=" << helps[0];
    if (helps.size() > 1) os << " (or " << helps[1] << ")";
    os << ".";
  } else if (fits_now) {
    os << " The cache is fragmented by the order of earlier allocations: the " << live.size()
       << " live allocation(s) plus this request fit when packed afresh.";
    if (knobs.empty()) {
      os << " Both settings that reduce this (expandable_segments, max_split_size_mb) are already on: free "
            "tensors, call empty_cache() between phases, or need less memory.";
    } else {
      os << " " << (knobs.size() > 1 ? "Settings that reduce this are " : "A setting that reduces this is ")
         << knobs[0].first << (knobs.size() > 1 ? " and " + knobs[1].first : std::string())
         << "; turn on the allocator trace (enable_trace) from the start and this message will say whether "
         << (knobs.size() > 1 ? "either" : "it") << " would have served the request.";
    }
  } else {
    os << " The live allocations plus this request do not fit under any setting tried: free tensors or need less "
          "memory — a smaller batch (with gradient accumulation), activation checkpointing, or mixed precision.";
  }
  return os.str();
}

}  // namespace ember::memory

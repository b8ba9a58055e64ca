// Explaining an out-of-memory failure (issue: OOM ladder): the numbers that matter, and advice only where a replay
// shows it is true. Invariant: a knob is suggested only if replaying the live allocations plus the failed request
// under that knob, on a device of the same allowed size, succeeds; otherwise the honest alternatives are named.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "ember/memory/alloc_config.h"
#include "ember/memory/allocator.h"
#include "ember/memory/trace.h"

namespace ember::memory {

struct LiveAllocation {
  uint64_t id = 0;  // allocation order
  int64_t requested = 0;
  StreamId stream = 0;
};

struct OomFacts {
  std::string device;        // the backing's name
  int64_t requested = 0;     // bytes asked for
  int64_t rounded = 0;       // after the allocator's rounding
  StreamId stream = 0;
  int64_t capacity = kNoLimit;
  int64_t allowed = kNoLimit;
  int64_t allocated = 0;     // bytes in live allocations
  int64_t reserved = 0;      // bytes held from the device
  int64_t free_blocks = 0;   // cached free blocks
  int64_t largest_free = 0;  // largest cached free block
  int64_t device_available = kNoLimit;  // what the device itself reports free (kNoLimit: not known)
  AllocatorConfig config;
  std::vector<LiveAllocation> live;  // any order
  // The allocator's whole history (alloc/free events since it was empty), when its trace recorded all of it.
  bool has_history = false;
  std::vector<TraceEvent> history;
};

// The OutOfMemoryError message for these facts (runs the replays it needs).
std::string explain_oom(const OomFacts& facts);

}  // namespace ember::memory

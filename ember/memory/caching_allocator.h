// The pooled caching allocator (DESIGN.md §2 and its reference numbers): PyTorch-compatible size classes, best-fit
// reuse keyed on (stream, size, segment age, address), split and coalesce, max_split_size, power-of-two rounding, garbage
// collection, expandable segments, cross-stream frees, an OOM ladder with explained errors, statistics,
// fragmentation metrics and a trace — all over an injected Backing, so it behaves identically on CUDA, host
// memory and a simulated device of any capacity.
// Invariants (checked by check_invariants()): the blocks of a segment tile it exactly, in address order; no two
// adjacent blocks are both free; every free block is in exactly one pool; statistics equal a recount; the per-tag
// bytes sum to the allocated bytes (now and at the peak).
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <unordered_map>
#include <vector>

#include "ember/memory/alloc_config.h"
#include "ember/memory/allocator.h"
#include "ember/memory/backing.h"
#include "ember/memory/fault_injection.h"
#include "ember/memory/tag_stats.h"
#include "ember/memory/tags.h"
#include "ember/memory/trace.h"

namespace ember::memory {

// Size classes (DESIGN.md reference numbers).
inline constexpr int64_t kMinBlockSize = 512;          // every request is rounded to a multiple of this
inline constexpr int64_t kSmallSize = 1 * kMiB;        // requests <= this come from the small pool
inline constexpr int64_t kSmallBuffer = 2 * kMiB;      // small-pool segment size
inline constexpr int64_t kMinLargeAlloc = 10 * kMiB;   // requests below this get a kLargeBuffer segment
inline constexpr int64_t kLargeBuffer = 20 * kMiB;     // large-pool segment size for 1-10 MiB requests
inline constexpr int64_t kRoundLarge = 2 * kMiB;       // larger segments are rounded to this

struct StatCounter {
  int64_t current = 0, peak = 0, allocated = 0, freed = 0;
  void increase(int64_t n) {
    current += n;
    allocated += n;
    if (current > peak) peak = current;
  }
  void decrease(int64_t n) {
    current -= n;
    freed += n;
  }
  void reset_peak() { peak = current; }
};

enum StatPool : int { kAggregatePool = 0, kSmallPool = 1, kLargePool = 2, kNumStatPools = 3 };

struct DeviceStats {
  // Counts and bytes, each for the aggregate, small and large pools.
  StatCounter allocation[kNumStatPools];          // live allocations
  StatCounter segment[kNumStatPools];             // segments held from the backing
  StatCounter active[kNumStatPools];              // allocated blocks + freed blocks awaiting stream events
  StatCounter inactive_split[kNumStatPools];      // free blocks inside segments that are split
  StatCounter allocated_bytes[kNumStatPools];     // bytes in live allocations (after rounding)
  StatCounter reserved_bytes[kNumStatPools];      // bytes held from the backing
  StatCounter active_bytes[kNumStatPools];
  StatCounter inactive_split_bytes[kNumStatPools];
  StatCounter requested_bytes[kNumStatPools];     // bytes the callers asked for
  int64_t num_alloc_retries = 0;  // requests that needed the cache freed and the backing asked again
  int64_t num_ooms = 0;
  int64_t num_sync_all_streams = 0;
  int64_t num_device_alloc = 0;   // backing mallocs (and expandable-segment maps)
  int64_t num_device_free = 0;
  StatCounter oversize_allocations;  // allocations of blocks >= max_split_size
  StatCounter oversize_segments;
};

// The four named fragmentation metrics (docs/memory.md) plus the largest free block.
struct FragmentationMetrics {
  int64_t cache_slack = 0;            // reserved - allocated: cached, not in use
  int64_t inactive_split_bytes = 0;   // free bytes stranded inside split segments (mapped bytes only: <= cache_slack)
  int64_t rounding_waste = 0;         // allocated - requested: lost to size rounding
  double peak_fragmentation = 0.0;    // 1 - peak_active / peak_reserved since the last reset
  int64_t largest_free_block = 0;     // biggest single request the cache could serve without the backing (a free
                                      // block of an expandable segment counts only its mapped bytes)
};

struct BlockSnapshot {
  uint64_t addr = 0;
  int64_t size = 0;
  int64_t requested = 0;  // 0 for free blocks
  bool allocated = false;
  bool pending_events = false;  // freed by the user, waiting for other streams
  StreamId stream = 0;
  TagId tag = kUntagged;
  uint64_t id = 0;
};

struct SegmentSnapshot {
  uint64_t addr = 0;
  int64_t size = 0;    // bytes the blocks tile (for expandable segments: the extent grown so far)
  int64_t mapped = 0;  // bytes held from the device (== size for fixed segments; the mapped pages otherwise)
  StreamId stream = 0;
  bool small_pool = false;
  bool expandable = false;
  std::vector<BlockSnapshot> blocks;  // address order, tiling the segment
};

class CachingAllocator final : public Allocator {
 public:
  CachingAllocator(std::unique_ptr<Backing> backing, AllocatorConfig config = {}, std::string name = "caching");
  ~CachingAllocator() override;
  CachingAllocator(const CachingAllocator&) = delete;
  CachingAllocator& operator=(const CachingAllocator&) = delete;

  void* allocate(int64_t nbytes, StreamId stream = 0) override;
  void deallocate(void* ptr) override;
  void record_stream(void* ptr, StreamId stream) override;
  void retag(void* ptr, TagId tag) override;  // ValueError unless ptr is a live allocation
  void empty_cache() override;
  AllocatorStats stats() const override;
  void reset_peak_stats() override;
  std::string name() const override { return name_; }
  uint64_t open_peak_window() override;
  int64_t peak_window(uint64_t id) const override;
  void close_peak_window(uint64_t id) override;

  DeviceStats device_stats() const;
  // Bytes by owner tag (DESIGN.md §6): every tag that holds or held bytes. With `totals`, also the statistics taken
  // under the same lock, so sum(current) == totals->allocated_bytes and sum(at_peak) == totals->peak_allocated_bytes.
  std::vector<TagStat> tag_stats(AllocatorStats* totals = nullptr) const;
  FragmentationMetrics fragmentation() const;
  std::vector<SegmentSnapshot> snapshot() const;
  // A readable table of the statistics, the fragmentation metrics and the segments by pool (like PyTorch's
  // torch.cuda.memory_summary()).
  std::string memory_summary() const;

  // Applies to requests made from now on; cached blocks stay. Throws ConfigError if expandable_segments changes
  // while segments are held.
  void set_config(const AllocatorConfig& config);
  AllocatorConfig config() const;
  // Allowed memory: min(capacity setting, memory_fraction x backing capacity).
  int64_t allowed_memory() const;

  // Trace (off until enabled): keep the last `capacity` events.
  void enable_trace(size_t capacity);
  void disable_trace();
  std::vector<TraceEvent> trace() const;
  uint64_t trace_dropped() const;  // events the ring dropped (oldest first) since it was enabled
  void annotate(const std::string& note);

  // OutOfMemoryError messages explain the failure, replaying allocations to check advice (on by default). Replays
  // and probes turn it off: their OOMs are expected and need only the numbers.
  void set_oom_explanations(bool on);

  // Fault injection (tests): an armed plan makes its requests to allocate() fail as if the device had no room for
  // them (Note [Injected out of memory] in fault_injection.h). Requests are counted per allocator.
  FaultInjector& fault_injector();

  // Throws ember::Error describing the first violated invariant (see the file comment). For tests.
  void check_invariants() const;
  Backing& backing() { return *backing_; }

 private:
  struct Impl;
  std::unique_ptr<Backing> backing_;
  std::string name_;
  std::unique_ptr<Impl> impl_;
};

}  // namespace ember::memory

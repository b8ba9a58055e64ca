// The caching allocator's allocation paths: rounding, best fit from the pools, split, free and merge, stream events
// and the OOM ladder, plus the Allocator interface and configuration (see caching_allocator.h for the invariants).
// Note [Block lifecycle]: a block is free (in its pool), allocated (in active_), or pending (freed by the user but
// still used by other streams: allocated stays true until its events complete, then it is freed for real).
// Only free blocks are merged with their neighbours, so a pending block is never coalesced or reused.
#include "ember/memory/caching_allocator.h"

#include <algorithm>
#include <cstddef>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "ember/base/error.h"
#include "ember/memory/caching_allocator_impl.h"
#include "ember/memory/oom_report.h"

namespace ember::memory {

using namespace caching_detail;

// ---- the pool and the alloc/free paths (Note [Inline hot path]) -------------------------------------------------

inline int64_t CachingAllocator::Impl::round_size(int64_t size) const {
  if (size < kMinBlockSize) return kMinBlockSize;
  const int64_t div = config.divisions_for(size);
  if (div > 1 && size > kMinBlockSize * div) return roundup_power2_next_division(size, div);
  return round_up(size, kMinBlockSize);
}

inline Block* CachingAllocator::Impl::get_free_block(BlockPool& pool, int64_t size, StreamId stream) {
  auto it = pool.blocks.lower_bound(FitKey{stream, size});
  if (it == pool.blocks.end() || (*it)->stream != stream) return nullptr;
  Block* b = *it;
  // Oversize blocks (>= max_split_size) serve only large requests within kLargeBuffer of their size. Blocks of
  // expandable segments are exempt: their free tail pages go back to the device, so splitting them strands nothing.
  if (b->size >= config.max_split_size && !b->segment->expandable &&
      (size < config.max_split_size || b->size >= size + kLargeBuffer))
    return nullptr;
  pool.blocks.erase(it);
  return b;
}

inline bool CachingAllocator::Impl::should_split(const Block* b, int64_t size) const {
  const int64_t remaining = b->size - size;
  if (b->pool->is_small || b->segment->expandable) return remaining >= kMinBlockSize;
  return size < config.max_split_size && remaining > kSmallSize;
}

inline void CachingAllocator::Impl::process_events(bool wait) {
  if (events.empty()) return;
  if (wait) {
    backing.synchronize();
    ++stats.num_sync_all_streams;
  }
  // Handled entries leave `events` one at a time, so a backing that throws midway leaves only unhandled ones.
  size_t i = 0;
  while (i < events.size()) {
    const auto [ev, b] = events[i];
    if (!backing.event_completed(ev)) {
      ++i;
      continue;
    }
    events.erase(events.begin() + static_cast<std::ptrdiff_t>(i));
    backing.release_event(ev);
    if (--b->event_count == 0) free_block(b);
  }
}

// Returns a block to its pool, merging with free neighbours (Note [Block lifecycle]).
inline void CachingAllocator::Impl::free_block(Block* b) {
  const bool is_small = b->segment->is_small;
  for_pools(is_small, [&](int p) {
    stats.active[p].decrease(1);
    stats.active_bytes[p].decrease(b->size);
  });
  add_inactive(b->prev, -1);
  add_inactive(b->next, -1);
  b->allocated = false;
  b->requested = 0;
  b->stream_uses.clear();
  b->last_use = ++clock;
  b->tag = kUntagged;
  for (Block* n : {b->prev, b->next}) {
    if (n == nullptr || n->allocated) continue;
    n->pool->blocks.erase(n);
    if (n == b->prev) {
      b->ptr = n->ptr;
      b->prev = n->prev;
      if (b->prev) b->prev->next = b;
      else b->segment->head = b;
    } else {
      b->next = n->next;
      if (b->next) b->next->prev = b;
    }
    b->size += n->size;
    delete_block(n);
  }
  add_inactive(b->prev, +1);
  add_inactive(b->next, +1);
  add_inactive(b, +1);
  b->pool->blocks.insert(b);
}

inline void* CachingAllocator::Impl::allocate(int64_t nbytes, StreamId stream) {
  EMBER_CHECK(nbytes >= 0, ValueError, "allocate: negative size ", nbytes);
  if (nbytes == 0) return nullptr;
  if (nbytes > kMaxRequest) throw_oom(nbytes, nbytes, stream);
  const int64_t size = round_size(nbytes);
  BlockPool& pool = pool_for(size);
  // An injected fault: nothing in the cache fits and the device refuses (Note [Injected out of memory]).
  const bool refuse = faults.next();
  process_events(false);
  // A block of an expandable segment must have the pages under the request mapped (Note [Expandable segments]);
  // when the device has no room for them it goes back to its pool and the ladder continues.
  auto ready = [&](Block* blk) -> Block* {
    if (blk == nullptr || !blk->segment->expandable || map_pages(blk->segment, blk->ptr, size)) return blk;
    blk->pool->blocks.insert(blk);
    return nullptr;
  };
  auto from_pool = [&]() { return refuse ? nullptr : ready(get_free_block(pool, size, stream)); };
  auto obtain = [&]() -> Block* {
    if (refuse) return nullptr;
    return use_expandable() ? ready(expand_segment(size, pool.is_small, stream))
                            : alloc_segment(size, pool.is_small, stream);
  };
  Block* b = from_pool();
  if (b == nullptr) {
    garbage_collect();
    b = obtain();
    if (b == nullptr) {  // free oversize cached blocks, then retry
      release_cached(0, true);
      b = from_pool();
      if (b == nullptr) b = obtain();
    }
    if (b == nullptr) {  // synchronise, free every cached unsplit block and unmap free pages, retry
      ++stats.num_alloc_retries;
      process_events(true);
      b = from_pool();
      if (b == nullptr) {
        release_cached(0, false);
        b = from_pool();
        if (b == nullptr) b = obtain();
      }
    }
    if (b == nullptr) throw_oom(nbytes, size, stream);
  }
  add_inactive(b, -1);
  if (should_split(b, size)) {
    Block* rest = new_block();
    rest->ptr = b->ptr + size;
    rest->size = b->size - size;
    rest->stream = stream;
    rest->pool = b->pool;
    rest->segment = b->segment;
    rest->prev = b;
    rest->next = b->next;
    if (rest->next) rest->next->prev = rest;
    b->next = rest;
    b->size = size;
    rest->last_use = b->last_use;
    rest->pool->blocks.insert(rest);
    add_inactive(rest, +1);
  }
  b->allocated = true;
  b->requested = nbytes;
  b->id = next_id++;
  b->tag = current_tag();
  active.emplace(b->ptr, b);
  const bool is_small = b->segment->is_small;
  const int64_t old_peak = stats.allocated_bytes[kAggregatePool].peak;
  for_pools(is_small, [&](int p) {
    stats.allocation[p].increase(1);
    stats.allocated_bytes[p].increase(b->size);
    stats.active[p].increase(1);
    stats.active_bytes[p].increase(b->size);
    stats.requested_bytes[p].increase(nbytes);
  });
  tag_stats.on_alloc(b->tag, b->size, stats.allocated_bytes[kAggregatePool].peak > old_peak);
  if (b->size >= config.max_split_size) stats.oversize_allocations.increase(1);
  note_active_peak();
  for (auto& w : peak_windows) w.second = std::max(w.second, stats.allocated_bytes[kAggregatePool].current);
  record(TraceAction::Alloc, b->id, nbytes, b->size, b->ptr, stream, b->tag);
  if (poison_allocations()) {
    try {
      backing.fill(b->ptr, nbytes, kPoisonByte, stream);
    } catch (...) {  // the block goes back, so a failed fill loses nothing
      deallocate(b->ptr);
      throw;
    }
  }
  return b->ptr;
}

inline void CachingAllocator::Impl::deallocate(void* ptr) {
  if (ptr == nullptr) return;
  auto it = active.find(ptr);
  EMBER_CHECK(it != active.end(), ValueError, "deallocate: pointer ", ptr, " was not allocated by this allocator");
  Block* b = it->second;
  // Events first (Note [Event failure on free]).
  std::vector<EventId> recorded;
  try {
    for (StreamId s : b->stream_uses) recorded.push_back(backing.record_event(s));
  } catch (...) {
    for (EventId e : recorded) {
      try {
        backing.release_event(e);
      } catch (...) {  // the event is forgotten either way; the block must not be
      }
    }
    recorded.clear();
    backing.synchronize();  // throws (nothing changed) only when the device itself is lost
    ++stats.num_sync_all_streams;
    b->stream_uses.clear();  // every stream's work has completed: the block is free to reuse at once
  }
  active.erase(it);
  const bool is_small = b->segment->is_small;
  for_pools(is_small, [&](int p) {
    stats.allocation[p].decrease(1);
    stats.allocated_bytes[p].decrease(b->size);
    stats.requested_bytes[p].decrease(b->requested);
  });
  tag_stats.on_free(b->tag, b->size);  // a pending block leaves allocated_bytes (and its tag) here too
  if (b->size >= config.max_split_size) stats.oversize_allocations.decrease(1);
  record(TraceAction::Free, b->id, b->requested, b->size, b->ptr, b->stream, b->tag);
  if (!recorded.empty()) {  // reuse only after the other streams' work completes
    for (EventId e : recorded) events.emplace_back(e, b);
    b->event_count += static_cast<int>(recorded.size());
    b->stream_uses.clear();
    return;
  }
  free_block(b);
}

// Note [Event failure on free]
// A block used on other streams is reused only after events recorded on them complete. When recording one throws
// (a failing cudaEventRecord; SimulatedBacking's event_faults()), the events already recorded are released and the
// device is synchronised instead — all work queued on every stream has then completed — and the block is freed at
// once, without events. deallocate() thus completes and throws nothing: its callers are mostly destructors
// (StorageImpl), which swallow an exception, and a throw that left the block allocated would leak it for the life
// of the process. Only when synchronize() fails too (the device is lost) does the error propagate, with the block
// still allocated and the statistics unchanged.

// ---- OOM ---------------------------------------------------------------------------------------------------------

int64_t CachingAllocator::Impl::held_bytes(const Block* b) const {
  const Segment* seg = b->segment;
  if (seg == nullptr || !seg->expandable) return b->size;
  const int64_t page = backing.page_size();
  const int64_t lo = b->ptr - seg->base, hi = lo + b->size;
  int64_t bytes = 0;
  for (int64_t p = lo / page; p * page < hi && p < static_cast<int64_t>(seg->page_mapped.size()); ++p)
    if (seg->page_mapped[static_cast<size_t>(p)]) bytes += std::min(hi, (p + 1) * page) - std::max(lo, p * page);
  return bytes;
}

void CachingAllocator::Impl::throw_oom(int64_t requested, int64_t rounded, StreamId stream) {
  ++stats.num_ooms;
  record(TraceAction::Oom, 0, requested, rounded, nullptr, stream, current_tag());
  OomFacts f;
  f.device = backing.name();
  f.requested = requested;
  f.rounded = rounded;
  f.stream = stream;
  f.capacity = backing.capacity();
  f.allowed = allowed();
  f.allocated = stats.allocated_bytes[kAggregatePool].current;
  f.reserved = stats.reserved_bytes[kAggregatePool].current;
  for (BlockPool* pool : {&small_pool, &large_pool})
    for (Block* b : pool->blocks) {
      const int64_t held = held_bytes(b);  // an unmapped hole of an expandable segment holds nothing
      f.largest_free = std::max(f.largest_free, held);
      f.free_blocks += held > 0;
    }
  f.config = config;
  if (!explain_ooms) {
    throw OutOfMemoryError(detail::concat(f.device, ": out of memory: tried to allocate ", format_bytes(requested),
                                          " with ", format_bytes(f.allocated), " allocated and ",
                                          format_bytes(f.reserved), " reserved"),
                           requested, f.capacity == kNoLimit ? -1 : f.capacity, f.allocated, f.reserved);
  }
  try {
    f.device_available = backing.available();
  } catch (...) {  // the explanation must not replace the OutOfMemoryError
  }
  if (trace_from_start && trace.enabled() && trace.dropped() == 0) {
    f.has_history = true;
    f.history = trace.events();
  }
  f.live.reserve(active.size());
  for (const auto& [p, b] : active) f.live.push_back({b->id, b->requested, b->stream});
  throw OutOfMemoryError(explain_oom(f), requested, f.capacity == kNoLimit ? -1 : f.capacity, f.allocated,
                         f.reserved);
}

// ---- public API ------------------------------------------------------------------------------------------------

CachingAllocator::CachingAllocator(std::unique_ptr<Backing> backing, AllocatorConfig config, std::string name)
    : backing_(std::move(backing)), name_(std::move(name)) {
  EMBER_CHECK(backing_ != nullptr, ValueError, "CachingAllocator: no backing");
  impl_ = std::make_unique<Impl>(*backing_, std::move(config));
}

CachingAllocator::~CachingAllocator() {
  // Segments still holding live blocks are returned too: the process is tearing the allocator down.
  std::lock_guard<std::mutex> lock(impl_->mutex);
  // A destructor must not throw: a backing failing here (e.g. a CUDA runtime already shutting down) is ignored.
  for (auto& [ev, b] : impl_->events) {
    try {
      backing_->release_event(ev);
    } catch (...) {
    }
  }
  for (Segment* s : impl_->segments) {
    try {
      if (s->expandable) {
        const int64_t page = backing_->page_size();
        for (size_t q = 0; q < s->page_mapped.size(); ++q)
          if (s->page_mapped[q]) backing_->unmap(s->base + static_cast<int64_t>(q) * page, page);
        backing_->release_range(s->base, s->reserved_range);
      } else {
        backing_->free(s->base, s->size);
      }
    } catch (...) {
    }
  }
}

void* CachingAllocator::allocate(int64_t nbytes, StreamId stream) {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  return impl_->allocate(nbytes, stream);
}

void CachingAllocator::deallocate(void* ptr) {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  impl_->deallocate(ptr);
}

void CachingAllocator::record_stream(void* ptr, StreamId stream) {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  auto it = impl_->active.find(ptr);
  EMBER_CHECK(it != impl_->active.end(), ValueError, "record_stream: pointer ", ptr,
              " is not a live allocation of ", name_);
  Block* b = it->second;
  if (stream == b->stream) return;
  if (std::find(b->stream_uses.begin(), b->stream_uses.end(), stream) == b->stream_uses.end())
    b->stream_uses.push_back(stream);
}

void CachingAllocator::retag(void* ptr, TagId tag) {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  auto it = impl_->active.find(ptr);
  EMBER_CHECK(it != impl_->active.end(), ValueError, "retag: pointer ", ptr, " is not a live allocation of ", name_);
  Block* b = it->second;
  if (b->tag == tag) return;
  impl_->tag_stats.on_retag(b->tag, tag, b->size);
  b->tag = tag;
  impl_->record(TraceAction::Retag, b->id, b->requested, b->size, b->ptr, b->stream, tag);
}

void CachingAllocator::empty_cache() {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  // Recorded before the release (its segment_free events follow), so a replay releases at the same point.
  impl_->record(TraceAction::EmptyCache, 0, 0, 0, nullptr, 0, kUntagged);
  impl_->process_events(true);
  impl_->release_cached(0, false);
}

void CachingAllocator::set_config(const AllocatorConfig& config) {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  EMBER_CHECK(config.expandable_segments == impl_->config.expandable_segments || impl_->segments.empty(), ConfigError,
              name_, ": expandable_segments can only change while the allocator holds no segments (call "
              "empty_cache() after freeing every tensor)");
  EMBER_CHECK(config.max_split_size == impl_->config.max_split_size || impl_->active.empty(), ConfigError, name_,
              ": max_split_size_mb can only change while no allocation is live");
  impl_->config = config;
  for (Segment* s : impl_->segments) impl_->update_oversize(s);
}

AllocatorConfig CachingAllocator::config() const {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  return impl_->config;
}

int64_t CachingAllocator::allowed_memory() const {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  return impl_->allowed();
}

FaultInjector& CachingAllocator::fault_injector() { return impl_->faults; }

void CachingAllocator::set_oom_explanations(bool on) {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  impl_->explain_ooms = on;
}

}  // namespace ember::memory

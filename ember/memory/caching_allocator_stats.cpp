// The caching allocator's observable state: statistics and peak windows, per-tag bytes, fragmentation metrics,
// segment snapshots, the trace hooks and check_invariants(). Invariant: nothing here changes which block a later
// request gets; check_invariants() recounts every statistic from the blocks themselves.
#include <algorithm>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "ember/base/error.h"
#include "ember/memory/caching_allocator_impl.h"

namespace ember::memory {

using namespace caching_detail;

AllocatorStats CachingAllocator::stats() const {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  return impl_->summary();
}

std::vector<TagStat> CachingAllocator::tag_stats(AllocatorStats* totals) const {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  if (totals != nullptr) *totals = impl_->summary();
  return impl_->tag_stats.stats();
}

AllocatorStats CachingAllocator::Impl::summary() const {
  const DeviceStats& s = stats;
  AllocatorStats out;
  out.allocated_bytes = s.allocated_bytes[kAggregatePool].current;
  out.peak_allocated_bytes = s.allocated_bytes[kAggregatePool].peak;
  out.reserved_bytes = s.reserved_bytes[kAggregatePool].current;
  out.peak_reserved_bytes = s.reserved_bytes[kAggregatePool].peak;
  out.requested_bytes = s.requested_bytes[kAggregatePool].current;
  out.peak_requested_bytes = s.requested_bytes[kAggregatePool].peak;
  out.num_allocs = s.allocation[kAggregatePool].allocated;
  out.num_frees = s.allocation[kAggregatePool].freed;
  out.num_ooms = s.num_ooms;
  return out;
}

uint64_t CachingAllocator::open_peak_window() {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  const uint64_t id = impl_->next_window_id++;
  impl_->peak_windows.emplace_back(id, impl_->stats.allocated_bytes[kAggregatePool].current);
  return id;
}

int64_t CachingAllocator::peak_window(uint64_t id) const {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  for (const auto& w : impl_->peak_windows)
    if (w.first == id) return w.second;
  EMBER_THROW(ValueError, name_, ": no open peak window ", id);
}

void CachingAllocator::close_peak_window(uint64_t id) {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  auto& ws = impl_->peak_windows;
  ws.erase(std::remove_if(ws.begin(), ws.end(), [id](const auto& w) { return w.first == id; }), ws.end());
}

void CachingAllocator::reset_peak_stats() {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  DeviceStats& s = impl_->stats;
  for (int p = 0; p < kNumStatPools; ++p)
    for (StatCounter* c : {&s.allocation[p], &s.segment[p], &s.active[p], &s.inactive_split[p], &s.allocated_bytes[p],
                           &s.reserved_bytes[p], &s.active_bytes[p], &s.inactive_split_bytes[p],
                           &s.requested_bytes[p]})
      c->reset_peak();
  s.oversize_allocations.reset_peak();
  s.oversize_segments.reset_peak();
  impl_->tag_stats.reset_peaks();
  impl_->peak_active_bytes_since_reset = s.active_bytes[kAggregatePool].current;
  impl_->peak_reserved_bytes_since_reset = s.reserved_bytes[kAggregatePool].current;
}

DeviceStats CachingAllocator::device_stats() const {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  return impl_->stats;
}

FragmentationMetrics CachingAllocator::fragmentation() const {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  const DeviceStats& s = impl_->stats;
  FragmentationMetrics f;
  f.cache_slack = s.reserved_bytes[kAggregatePool].current - s.allocated_bytes[kAggregatePool].current;
  f.rounding_waste = s.allocated_bytes[kAggregatePool].current - s.requested_bytes[kAggregatePool].current;
  const int64_t pr = impl_->peak_reserved_bytes_since_reset;
  f.peak_fragmentation =
      pr > 0 ? 1.0 - static_cast<double>(impl_->peak_active_bytes_since_reset) / static_cast<double>(pr) : 0.0;
  // Counted by walking the pools rather than from the inactive_split_bytes counter (PyTorch's, whole block sizes): a
  // free block of an expandable segment holds only its mapped pages, so a hole unmapped by empty_cache strands
  // nothing, and the stranded bytes stay within the slack.
  for (const BlockPool* pool : {&impl_->small_pool, &impl_->large_pool})
    for (const Block* b : pool->blocks) {
      const int64_t held = impl_->held_bytes(b);
      f.largest_free_block = std::max(f.largest_free_block, held);
      if (Impl::is_inactive_split(b)) f.inactive_split_bytes += held;
    }
  return f;
}

std::vector<SegmentSnapshot> CachingAllocator::snapshot() const {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  std::vector<SegmentSnapshot> out;
  for (const Segment* s : impl_->segments) {
    SegmentSnapshot ss;
    ss.addr = reinterpret_cast<uint64_t>(s->base);
    ss.size = s->extent;
    ss.mapped = s->size;
    ss.stream = s->stream;
    ss.small_pool = s->is_small;
    ss.expandable = s->expandable;
    for (const Block* b = s->head; b != nullptr; b = b->next) {
      BlockSnapshot bs;
      bs.addr = reinterpret_cast<uint64_t>(b->ptr);
      bs.size = b->size;
      bs.requested = b->requested;
      bs.allocated = b->allocated;
      bs.pending_events = b->event_count > 0;
      bs.stream = b->stream;
      bs.tag = b->tag;
      bs.id = b->allocated ? b->id : 0;
      ss.blocks.push_back(bs);
    }
    out.push_back(std::move(ss));
  }
  std::sort(out.begin(), out.end(), [](const SegmentSnapshot& a, const SegmentSnapshot& b) { return a.addr < b.addr; });
  return out;
}

// ---- trace -------------------------------------------------------------------------------------------------------

void CachingAllocator::enable_trace(size_t capacity) {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  impl_->trace.set_capacity(capacity);
  impl_->trace_from_start = impl_->active.empty() && impl_->segments.empty();
}

void CachingAllocator::disable_trace() {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  impl_->trace.set_capacity(0);
  impl_->trace_from_start = false;
}

std::vector<TraceEvent> CachingAllocator::trace() const { return impl_->trace.events(); }
uint64_t CachingAllocator::trace_dropped() const { return impl_->trace.dropped(); }

void CachingAllocator::annotate(const std::string& note) {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  impl_->record(TraceAction::Annotate, 0, 0, 0, nullptr, 0, current_tag(), note);
}

// ---- invariants --------------------------------------------------------------------------------------------------

void CachingAllocator::check_invariants() const {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  const Impl& m = *impl_;
  auto fail = [&](const std::string& what) { EMBER_THROW(Error, name_, ": invariant violated: ", what); };
  int64_t seg_count[kNumStatPools] = {}, reserved[kNumStatPools] = {}, alloc_count[kNumStatPools] = {},
          alloc_bytes[kNumStatPools] = {}, active_bytes[kNumStatPools] = {}, inactive_bytes[kNumStatPools] = {},
          requested[kNumStatPools] = {};
  size_t free_blocks = 0, live_blocks = 0;
  for (const Segment* s : m.segments) {
    const int pi = pool_index(s->is_small);
    for (int p : {int(kAggregatePool), pi}) {
      ++seg_count[p];
      reserved[p] += s->size;
    }
    if (s->head == nullptr || s->head->prev != nullptr || s->head->ptr != s->base) fail("segment head is wrong");
    char* expect = s->base;
    for (const Block* b = s->head; b != nullptr; b = b->next) {
      if (b->ptr != expect) fail("blocks do not tile their segment (gap or overlap)");
      if (b->size <= 0) fail("empty block");
      if (b->segment != s) fail("block points at another segment");
      if (b->next != nullptr && b->next->prev != b) fail("broken block links");
      expect += b->size;
      const bool in_pool = b->pool->blocks.count(const_cast<Block*>(b)) > 0;
      if (!b->allocated) {
        ++free_blocks;
        if (!in_pool) fail("free block missing from its pool");
        if (b->next != nullptr && !b->next->allocated) fail("two adjacent free blocks");
        if (b->prev != nullptr || b->next != nullptr)
          for (int p : {int(kAggregatePool), pi}) inactive_bytes[p] += b->size;
      } else {
        if (in_pool) fail("allocated block in a pool");
        for (int p : {int(kAggregatePool), pi}) active_bytes[p] += b->size;
        if (b->event_count == 0) {
          ++live_blocks;
          auto it = m.active.find(b->ptr);
          if (it == m.active.end() || it->second != b) fail("live block missing from the active map");
          for (int p : {int(kAggregatePool), pi}) {
            ++alloc_count[p];
            alloc_bytes[p] += b->size;
            requested[p] += b->requested;
          }
        }
      }
    }
    if (expect != s->base + s->extent) fail("blocks do not cover their segment");
    if (s->expandable) {
      const int64_t page = m.backing.page_size();
      int64_t mapped = 0;
      for (uint8_t v : s->page_mapped) mapped += v ? page : 0;
      if (mapped != s->size) fail("mapped pages differ from the segment's reserved bytes");
      if (static_cast<int64_t>(s->page_mapped.size()) * page != s->extent) fail("page map does not cover the extent");
      for (const Block* b = s->head; b != nullptr; b = b->next) {
        if (!b->allocated) continue;
        for (int64_t q = (b->ptr - s->base) / page; q <= (b->ptr - s->base + b->size - 1) / page; ++q)
          if (!s->page_mapped[q]) fail("an allocated block lies on an unmapped page");
      }
    } else if (s->extent != s->size) {
      fail("a fixed segment's extent differs from its size");
    }
  }
  if (live_blocks != m.active.size()) fail("active map holds blocks that are not live");
  if (free_blocks != m.small_pool.blocks.size() + m.large_pool.blocks.size()) fail("pools hold stale blocks");
  const DeviceStats& s = m.stats;
  for (int p = 0; p < kNumStatPools; ++p) {
    if (s.segment[p].current != seg_count[p]) fail("segment count differs from a recount");
    if (s.reserved_bytes[p].current != reserved[p]) fail("reserved bytes differ from a recount");
    if (s.allocation[p].current != alloc_count[p]) fail("allocation count differs from a recount");
    if (s.allocated_bytes[p].current != alloc_bytes[p]) fail("allocated bytes differ from a recount");
    if (s.active_bytes[p].current != active_bytes[p]) fail("active bytes differ from a recount");
    if (s.inactive_split_bytes[p].current != inactive_bytes[p]) fail("inactive split bytes differ from a recount");
    if (s.requested_bytes[p].current != requested[p]) fail("requested bytes differ from a recount");
  }
  // Per-tag bytes: each tag's current bytes equal a recount of its live blocks; the sums equal the aggregate.
  std::unordered_map<TagId, int64_t> by_tag;
  for (const auto& [p, b] : m.active) by_tag[b->tag] += b->size;
  int64_t sum_current = 0, sum_at_peak = 0;
  for (const TagStat& t : m.tag_stats.stats()) {
    sum_current += t.current;
    sum_at_peak += t.at_peak;
    auto it = by_tag.find(t.tag);
    if (t.current != (it == by_tag.end() ? 0 : it->second)) fail("a tag's bytes differ from a recount of its blocks");
    if (it != by_tag.end()) by_tag.erase(it);
  }
  if (!by_tag.empty()) fail("live blocks carry a tag the per-tag statistics do not know");
  if (sum_current != s.allocated_bytes[kAggregatePool].current) fail("per-tag bytes do not sum to allocated bytes");
  if (sum_at_peak != s.allocated_bytes[kAggregatePool].peak) fail("per-tag at-peak bytes do not sum to the peak");
}

}  // namespace ember::memory

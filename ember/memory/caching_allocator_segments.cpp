// The caching allocator's segments: fixed segments from the backing, expandable segments (a reserved range mapped
// page by page), and giving cached memory back (release, shrink, garbage collection). Invariant: the device is
// asked first and the bookkeeping follows, so a backing that fails leaves the statistics equal to a recount.
#include <algorithm>
#include <memory>
#include <utility>
#include <vector>

#include "ember/memory/caching_allocator_impl.h"

namespace ember::memory {

using namespace caching_detail;

int64_t CachingAllocator::Impl::allocation_size(int64_t size) {
  if (size <= kSmallSize) return kSmallBuffer;
  if (size < kMinLargeAlloc) return kLargeBuffer;
  return round_up(size, kRoundLarge);
}

// Note [Expandable segments]: an expandable segment is a reserved virtual range whose blocks tile
// [base, base + extent); extent grows page by page at the end. Pages are mapped when a block that overlaps them is
// allocated and stay mapped while cached; releasing the cache unmaps every page that lies wholly inside a free
// block (holes in the middle too), so reserved memory is exactly the mapped pages. The pool lookup does not care
// whether a free block is mapped: holes are reused before the segment grows.
Segment* CachingAllocator::Impl::add_segment(char* base, int64_t size, bool is_small, StreamId stream, bool expandable,
                                              int64_t range) {
  auto seg = std::make_unique<Segment>();
  seg->base = base;
  seg->size = expandable ? 0 : size;
  seg->extent = size;
  seg->reserved_range = range;
  seg->expandable = expandable;
  seg->is_small = is_small;
  seg->stream = stream;
  seg->seq = next_segment_seq++;
  if (expandable) seg->page_mapped.assign(static_cast<size_t>(size / backing.page_size()), 0);
  Block* b = new_block();
  b->ptr = base;
  b->size = size;
  b->stream = stream;
  b->pool = is_small ? &small_pool : &large_pool;
  b->segment = seg.get();
  seg->head = b;
  segments.push_back(seg.get());
  Segment* out = seg.release();
  for_pools(is_small, [&](int p) {
    stats.segment[p].increase(1);
    stats.reserved_bytes[p].increase(out->size);
  });
  update_oversize(out);
  if (!expandable) {
    ++stats.num_device_alloc;
    note_active_peak();
    record(TraceAction::SegmentAlloc, 0, size, size, base, stream, kUntagged);
  }
  return out;
}

// Obtains a new segment able to hold `size` bytes; returns its single free block (not in a pool), or nullptr.
Block* CachingAllocator::Impl::alloc_segment(int64_t size, bool is_small, StreamId stream) {
  const int64_t seg_size = allocation_size(size);
  if (stats.reserved_bytes[kAggregatePool].current + seg_size > allowed()) return nullptr;
  void* p = backing.malloc(seg_size);
  if (p == nullptr) return nullptr;
  try {
    return add_segment(static_cast<char*>(p), seg_size, is_small, stream, false, seg_size)->head;
  } catch (...) {
    backing.free(p, seg_size);
    throw;
  }
}

// Maps the unmapped pages of `seg` that overlap [ptr, ptr + len). False (nothing left mapped by this call) when
// the allowed memory or the device has no room.
bool CachingAllocator::Impl::map_pages(Segment* seg, const char* ptr, int64_t len) {
  const int64_t page = backing.page_size();
  const int64_t first = (ptr - seg->base) / page, last = (ptr - seg->base + len - 1) / page;
  std::vector<std::pair<int64_t, int64_t>> done;  // page runs mapped here, for rollback
  auto rollback = [&] {
    for (auto [p0, n] : done) {
      backing.unmap(seg->base + p0 * page, n * page);
      for (int64_t q = p0; q < p0 + n; ++q) seg->page_mapped[q] = 0;
    }
  };
  int64_t added = 0;
  for (int64_t p0 = first; p0 <= last;) {
    if (seg->page_mapped[p0]) {
      ++p0;
      continue;
    }
    int64_t n = 1;
    while (p0 + n <= last && !seg->page_mapped[p0 + n]) ++n;
    const bool room = stats.reserved_bytes[kAggregatePool].current + added + n * page <= allowed();
    bool ok = false;
    try {
      ok = room && backing.map(seg->base + p0 * page, n * page);
    } catch (...) {
      rollback();
      throw;
    }
    if (!ok) {
      rollback();
      return false;
    }
    for (int64_t q = p0; q < p0 + n; ++q) seg->page_mapped[q] = 1;
    done.emplace_back(p0, n);
    added += n * page;
    p0 += n;
  }
  if (added == 0) return true;
  seg->size += added;
  for_pools(seg->is_small, [&](int p) { stats.reserved_bytes[p].increase(added); });
  ++stats.num_device_alloc;
  update_oversize(seg);
  note_active_peak();
  for (auto [p0, n] : done)
    record(TraceAction::SegmentMap, 0, n * page, n * page, seg->base + p0 * page, seg->stream, kUntagged);
  return true;
}

// Unmaps the mapped pages lying wholly inside the free block b; returns the bytes released.
int64_t CachingAllocator::Impl::unmap_free_pages(Block* b) {
  Segment* seg = b->segment;
  const int64_t page = backing.page_size();
  const int64_t first = round_up(b->ptr - seg->base, page) / page;
  const int64_t end = (b->ptr - seg->base + b->size) / page;  // exclusive
  int64_t released = 0;
  for (int64_t p0 = first; p0 < end;) {
    if (!seg->page_mapped[p0]) {
      ++p0;
      continue;
    }
    int64_t n = 1;
    while (p0 + n < end && seg->page_mapped[p0 + n]) ++n;
    backing.unmap(seg->base + p0 * page, n * page);  // bookkeeping follows only once the device agreed
    for (int64_t q = p0; q < p0 + n; ++q) seg->page_mapped[q] = 0;
    seg->size -= n * page;
    released += n * page;
    for_pools(seg->is_small, [&](int p) { stats.reserved_bytes[p].decrease(n * page); });
    ++stats.num_device_free;
    record(TraceAction::SegmentUnmap, 0, n * page, n * page, seg->base + p0 * page, seg->stream, kUntagged);
    p0 += n;
  }
  if (released > 0) update_oversize(seg);
  return released;
}

// Expandable: a free block of at least `size` at the end of a (stream, pool) segment, grown by whole pages if
// needed (nothing is mapped here: see map_pages). Removed from its pool. nullptr when no range can hold it.
Block* CachingAllocator::Impl::expand_segment(int64_t size, bool is_small, StreamId stream) {
  Segment* seg = nullptr;
  for (Segment* s : segments)
    if (s->expandable && s->is_small == is_small && s->stream == stream) seg = s;
  const int64_t page = backing.page_size();
  Block* last = nullptr;
  if (seg != nullptr) {
    last = seg->head;
    while (last->next != nullptr) last = last->next;
    const int64_t have = last->allocated ? 0 : last->size;
    if (have >= size) {  // the tail already fits (it was only passed over by the pool's oversize rule)
      last->pool->blocks.erase(last);
      return last;
    }
    const int64_t grow = round_up(size - have, page);
    if (seg->extent + grow > seg->reserved_range) seg = nullptr;  // range full: start another segment
    else {
      seg->extent += grow;
      seg->page_mapped.resize(static_cast<size_t>(seg->extent / page), 0);
      if (!last->allocated) {
        last->pool->blocks.erase(last);
        add_inactive(last, -1);
        last->size += grow;
        add_inactive(last, +1);
        return last;
      }
      Block* b = new_block();
      b->ptr = seg->base + (seg->extent - grow);
      b->size = grow;
      b->stream = stream;
      b->pool = last->pool;
      b->segment = seg;
      b->prev = last;
      last->next = b;
      add_inactive(b, +1);
      return b;
    }
  }
  // A new range: as large as the memory this allocator may use (the device's capacity when unbounded; a huge
  // address-only range when even that is unbounded), and never smaller than the request.
  const int64_t limit = allowed() != kNoLimit ? allowed() : backing.capacity();
  const int64_t want = round_up(size, page);
  const int64_t range = std::max(want, round_up(limit != kNoLimit ? limit : (int64_t{1} << 46), page));
  void* base = backing.reserve_range(range);
  if (base == nullptr) return nullptr;
  try {
    return add_segment(static_cast<char*>(base), want, is_small, stream, true, range)->head;
  } catch (...) {
    backing.release_range(base, range);
    throw;
  }
}

void CachingAllocator::Impl::release_segment(Segment* seg) {
  Block* b = seg->head;  // only whole-free segments are released: a single free block
  const int64_t held = seg->size;
  // The device first: if it fails, the bookkeeping is still intact.
  if (seg->expandable) {
    unmap_free_pages(b);  // a whole-free segment's pages all lie inside its one block
    backing.release_range(seg->base, seg->reserved_range);
  } else {
    backing.free(seg->base, seg->size);
  }
  b->pool->blocks.erase(b);
  for_pools(seg->is_small, [&](int p) {
    stats.segment[p].decrease(1);
    if (!seg->expandable) stats.reserved_bytes[p].decrease(held);
  });
  if (seg->counted_oversize) stats.oversize_segments.decrease(1);
  if (!seg->expandable) {
    ++stats.num_device_free;
    record(TraceAction::SegmentFree, 0, held, held, seg->base, seg->stream, kUntagged);
  }
  delete_block(b);
  segments.erase(std::find(segments.begin(), segments.end(), seg));
  delete seg;
}

// Expandable: unmaps the pages wholly inside every free block, trims a free tail off the extent, and releases the
// segment when nothing is left in it.
void CachingAllocator::Impl::shrink_expandable(Segment* seg) {
  for (Block* b = seg->head; b != nullptr; b = b->next)
    if (!b->allocated) unmap_free_pages(b);
  Block* last = seg->head;
  while (last->next != nullptr) last = last->next;
  if (last->allocated) return;
  if (last == seg->head) {
    release_segment(seg);
    return;
  }
  const int64_t page = backing.page_size();
  const int64_t keep_end = round_up(last->ptr - seg->base, page);  // first page boundary at/after the block start
  const int64_t cut = seg->extent - keep_end;
  if (cut <= 0) return;
  last->pool->blocks.erase(last);
  add_inactive(last, -1);
  seg->extent = keep_end;
  seg->page_mapped.resize(static_cast<size_t>(keep_end / page));
  last->size -= cut;
  if (last->size == 0) {  // the free block began on a page boundary: it is gone (its allocated prev stays)
    last->prev->next = nullptr;
    delete_block(last);
    return;
  }
  add_inactive(last, +1);
  last->pool->blocks.insert(last);
}

// Frees cached whole-segment blocks, oldest first, until reserved <= target (garbage collection) or all are gone.
void CachingAllocator::Impl::release_cached(int64_t target, bool oversize_only) {
  std::vector<Block*> candidates;
  for (BlockPool* pool : {&large_pool, &small_pool})
    for (Block* b : pool->blocks)
      if (b->prev == nullptr && b->next == nullptr && (!oversize_only || b->size >= config.max_split_size))
        candidates.push_back(b);
  std::sort(candidates.begin(), candidates.end(), [](const Block* a, const Block* b) {
    return a->last_use < b->last_use;
  });
  for (Block* b : candidates) {
    if (stats.reserved_bytes[kAggregatePool].current <= target) break;
    release_segment(b->segment);
  }
  for (Segment* s : std::vector<Segment*>(segments))
    if (s->expandable && stats.reserved_bytes[kAggregatePool].current > target) shrink_expandable(s);
}

void CachingAllocator::Impl::garbage_collect() {
  const double t = config.garbage_collection_threshold;
  if (t <= 0.0 || allowed() == kNoLimit) return;
  const int64_t target = static_cast<int64_t>(t * static_cast<double>(allowed()));
  if (stats.reserved_bytes[kAggregatePool].current > target) release_cached(target, false);
}

}  // namespace ember::memory

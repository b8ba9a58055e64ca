// The caching allocator's policy and bookkeeping (see caching_allocator.h for the invariants it keeps).
// Note [Block lifecycle]: a block is free (in its pool), allocated (in active_), or pending (freed by the user but
// still used by other streams: allocated stays true until its events complete, then it is freed for real).
// Only free blocks are merged with their neighbours, so a pending block is never coalesced or reused.
#include "ember/memory/caching_allocator.h"

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdio>
#include <cstring>
#include <memory>
#include <set>
#include <unordered_map>
#include <sstream>

#include "ember/base/error.h"
#include "ember/memory/oom_report.h"

namespace ember::memory {

namespace {

struct Segment;
struct BlockPool;

struct Block {
  char* ptr = nullptr;
  int64_t size = 0;
  int64_t requested = 0;
  StreamId stream = 0;
  BlockPool* pool = nullptr;
  Segment* segment = nullptr;
  Block* prev = nullptr;
  Block* next = nullptr;
  bool allocated = false;
  int event_count = 0;                // outstanding events of other streams (pending free)
  std::vector<StreamId> stream_uses;  // other streams the block was used on (record_stream)
  uint64_t last_use = 0;              // logical time of the last free, for LRU garbage collection
  uint64_t id = 0;
  TagId tag = kUntagged;
};

struct FitKey {  // what a request looks for: the smallest block of at least `size` on `stream`
  StreamId stream;
  int64_t size;
};

struct BlockOrder {  // best fit keyed on (stream, size, address)
  using is_transparent = void;
  bool operator()(const Block* a, const Block* b) const {
    if (a->stream != b->stream) return a->stream < b->stream;
    if (a->size != b->size) return a->size < b->size;
    return a->ptr < b->ptr;
  }
  bool operator()(const Block* a, const FitKey& k) const {
    return a->stream != k.stream ? a->stream < k.stream : a->size < k.size;
  }
  bool operator()(const FitKey& k, const Block* b) const {
    return k.stream != b->stream ? k.stream < b->stream : k.size < b->size;
  }
};

// Node memory for the pools and the active map: fixed-size nodes recycled through free lists, so the hot path of a
// cached alloc/free pair makes no system allocation. Used only under the allocator's mutex.
class NodeArena {
 public:
  void* get(size_t bytes) {
    std::vector<void*>& list = free_[slot(bytes)];
    if (!list.empty()) {
      void* p = list.back();
      list.pop_back();
      return p;
    }
    chunks_.push_back(std::make_unique<std::max_align_t[]>((bytes + sizeof(std::max_align_t) - 1) /
                                                            sizeof(std::max_align_t)));
    return chunks_.back().get();
  }
  void put(void* p, size_t bytes) { free_[slot(bytes)].push_back(p); }
  static constexpr size_t kMaxNode = 128;

 private:
  static size_t slot(size_t bytes) { return (bytes + 7) / 8; }
  std::vector<void*> free_[kMaxNode / 8 + 1];
  std::vector<std::unique_ptr<std::max_align_t[]>> chunks_;
};

template <class T>
struct ArenaAllocator {
  using value_type = T;
  NodeArena* arena;
  explicit ArenaAllocator(NodeArena* a) : arena(a) {}
  template <class U>
  ArenaAllocator(const ArenaAllocator<U>& o) : arena(o.arena) {}
  T* allocate(size_t n) {
    if (n == 1 && sizeof(T) <= NodeArena::kMaxNode) return static_cast<T*>(arena->get(sizeof(T)));
    return static_cast<T*>(::operator new(n * sizeof(T)));
  }
  void deallocate(T* p, size_t n) {
    if (n == 1 && sizeof(T) <= NodeArena::kMaxNode) arena->put(p, sizeof(T));
    else ::operator delete(p);
  }
  template <class U>
  bool operator==(const ArenaAllocator<U>& o) const { return arena == o.arena; }
};

struct BlockPool {
  explicit BlockPool(NodeArena* a) : blocks(BlockOrder(), ArenaAllocator<Block*>(a)) {}
  std::set<Block*, BlockOrder, ArenaAllocator<Block*>> blocks;
  bool is_small = false;
};

using ActiveMap = std::unordered_map<void*, Block*, std::hash<void*>, std::equal_to<void*>,
                                     ArenaAllocator<std::pair<void* const, Block*>>>;

struct Segment {
  bool counted_oversize = false;  // counted in stats.oversize_segments (kept in step as the segment grows/shrinks)
  char* base = nullptr;
  int64_t size = 0;            // bytes held from the backing (mapped bytes for expandable segments)
  int64_t extent = 0;          // bytes tiled by the blocks (== size for fixed segments)
  int64_t reserved_range = 0;  // expandable: virtual range size
  std::vector<uint8_t> page_mapped;  // expandable: one entry per page of [base, base + extent)
  bool expandable = false;
  bool is_small = false;
  StreamId stream = 0;
  Block* head = nullptr;
};

int pool_index(bool is_small) { return is_small ? kSmallPool : kLargePool; }

int64_t round_up(int64_t n, int64_t m) { return (n + m - 1) / m * m; }

int64_t power2_floor(int64_t n) {  // n >= 1
  return int64_t{1} << (63 - __builtin_clzll(static_cast<unsigned long long>(n)));
}

// Requests above this are refused up front (OutOfMemoryError): rounding arithmetic stays far from int64 overflow.
constexpr int64_t kMaxRequest = int64_t{1} << 60;

// Rounds size up to the next of `divisions` equal steps between its two enclosing powers of two.
int64_t roundup_power2_next_division(int64_t size, int64_t divisions) {
  if ((size & (size - 1)) == 0) return size;
  const int64_t floor2 = power2_floor(size);
  const int64_t step = floor2 / power2_floor(divisions);
  if (step == 0) return floor2 * 2;
  const int64_t rounded = size & ~(step - 1);
  return rounded == size ? size : rounded + step;
}

}  // namespace

struct CachingAllocator::Impl {
  Backing& backing;
  AllocatorConfig config;
  mutable std::mutex mutex;
  NodeArena arena;
  BlockPool small_pool{&arena}, large_pool{&arena};
  std::vector<Segment*> segments;  // address order is not required; segment lookup is via blocks
  ActiveMap active{64, std::hash<void*>(), std::equal_to<void*>(),
                   ArenaAllocator<std::pair<void* const, Block*>>(&arena)};  // user pointer -> allocated block
  std::vector<std::pair<EventId, Block*>> events; // outstanding cross-stream events, in record order
  DeviceStats stats;
  TagStatsTable tag_stats;  // bytes by owner tag, moved with allocated_bytes
  int64_t peak_active_bytes_since_reset = 0, peak_reserved_bytes_since_reset = 0;
  std::vector<std::pair<uint64_t, int64_t>> peak_windows;  // (id, peak allocated bytes) of the open windows
  uint64_t next_window_id = 1;
  uint64_t clock = 0;    // logical time for LRU
  uint64_t next_id = 1;  // allocation ids
  TraceRing trace;
  bool trace_from_start = false;
  bool explain_ooms = true;  // the trace was enabled while the allocator held nothing: it is the whole history
  std::chrono::steady_clock::time_point start = std::chrono::steady_clock::now();
  std::vector<Block*> free_block_objects;  // recycled Block objects (avoids new/delete on the hot path)

  explicit Impl(Backing& b, AllocatorConfig c) : backing(b), config(std::move(c)) { small_pool.is_small = true; }

  ~Impl() {
    for (Segment* s : segments) {
      for (Block* b = s->head; b != nullptr;) {
        Block* n = b->next;
        delete b;
        b = n;
      }
      delete s;
    }
    for (Block* b : free_block_objects) delete b;
  }

  // ---- small helpers ----------------------------------------------------------------------------------------------
  Block* new_block() {
    if (free_block_objects.empty()) return new Block();
    Block* b = free_block_objects.back();
    free_block_objects.pop_back();
    *b = Block();
    return b;
  }
  void delete_block(Block* b) { free_block_objects.push_back(b); }

  int64_t allowed() const {
    int64_t cap = backing.capacity();
    if (cap != kNoLimit && config.memory_fraction < 1.0)
      cap = static_cast<int64_t>(static_cast<double>(cap) * config.memory_fraction);
    return std::min(cap, config.capacity);
  }

  bool use_expandable() const { return config.expandable_segments && backing.supports_expandable(); }

  int64_t round_size(int64_t size) const {
    if (size < kMinBlockSize) return kMinBlockSize;
    const int64_t div = config.divisions_for(size);
    if (div > 1 && size > kMinBlockSize * div) return roundup_power2_next_division(size, div);
    return round_up(size, kMinBlockSize);
  }

  static int64_t allocation_size(int64_t size) {
    if (size <= kSmallSize) return kSmallBuffer;
    if (size < kMinLargeAlloc) return kLargeBuffer;
    return round_up(size, kRoundLarge);
  }

  BlockPool& pool_for(int64_t size) { return size <= kSmallSize ? small_pool : large_pool; }

  int64_t now_ns() const {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - start).count();
  }

  void record(TraceAction action, uint64_t id, int64_t size, int64_t block_size, const void* addr, StreamId stream,
              TagId tag, std::string note = {}) {
    if (!trace.enabled()) return;
    TraceEvent e;
    e.action = action;
    e.id = id;
    e.size = size;
    e.block_size = block_size;
    e.addr = reinterpret_cast<uint64_t>(addr);
    e.stream = stream;
    e.tag = tag;
    e.time_ns = now_ns();
    e.allocated = stats.allocated_bytes[kAggregatePool].current;
    e.reserved = stats.reserved_bytes[kAggregatePool].current;
    e.note = std::move(note);
    trace.push(std::move(e));
  }

  // Stats updates for every pool index that applies (aggregate + the block's pool).
  template <class F>
  void for_pools(bool is_small, F&& f) {
    f(kAggregatePool);
    f(pool_index(is_small));
  }

  static bool is_inactive_split(const Block* b) { return !b->allocated && (b->prev != nullptr || b->next != nullptr); }

  void add_inactive(const Block* b, int sign) {
    if (b == nullptr || !is_inactive_split(b)) return;
    for_pools(b->segment->is_small, [&](int p) {
      if (sign > 0) {
        stats.inactive_split[p].increase(1);
        stats.inactive_split_bytes[p].increase(b->size);
      } else {
        stats.inactive_split[p].decrease(1);
        stats.inactive_split_bytes[p].decrease(b->size);
      }
    });
  }

  void note_active_peak() {
    peak_active_bytes_since_reset =
        std::max(peak_active_bytes_since_reset, stats.active_bytes[kAggregatePool].current);
    peak_reserved_bytes_since_reset =
        std::max(peak_reserved_bytes_since_reset, stats.reserved_bytes[kAggregatePool].current);
  }

  void update_oversize(Segment* seg) {
    const bool oversize = seg->size >= config.max_split_size;
    if (oversize == seg->counted_oversize) return;
    if (oversize) stats.oversize_segments.increase(1);
    else stats.oversize_segments.decrease(1);
    seg->counted_oversize = oversize;
  }

  // ---- segments -----------------------------------------------------------------------------------------------
  // Note [Expandable segments]: an expandable segment is a reserved virtual range whose blocks tile
  // [base, base + extent); extent grows page by page at the end. Pages are mapped when a block that overlaps them is
  // allocated and stay mapped while cached; releasing the cache unmaps every page that lies wholly inside a free
  // block (holes in the middle too), so reserved memory is exactly the mapped pages. The pool lookup does not care
  // whether a free block is mapped: holes are reused before the segment grows.
  Segment* add_segment(char* base, int64_t size, bool is_small, StreamId stream, bool expandable, int64_t range) {
    auto seg = std::make_unique<Segment>();
    seg->base = base;
    seg->size = expandable ? 0 : size;
    seg->extent = size;
    seg->reserved_range = range;
    seg->expandable = expandable;
    seg->is_small = is_small;
    seg->stream = stream;
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
  Block* alloc_segment(int64_t size, bool is_small, StreamId stream) {
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
  bool map_pages(Segment* seg, const char* ptr, int64_t len) {
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
  int64_t unmap_free_pages(Block* b) {
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
  Block* expand_segment(int64_t size, bool is_small, StreamId stream) {
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

  void release_segment(Segment* seg) {
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
  void shrink_expandable(Segment* seg) {
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

  // ---- the pool ------------------------------------------------------------------------------------------------
  Block* get_free_block(BlockPool& pool, int64_t size, StreamId stream) {
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

  bool should_split(const Block* b, int64_t size) const {
    const int64_t remaining = b->size - size;
    if (b->pool->is_small || b->segment->expandable) return remaining >= kMinBlockSize;
    return size < config.max_split_size && remaining > kSmallSize;
  }

  // Frees cached whole-segment blocks, oldest first, until reserved <= target (garbage collection) or all are gone.
  void release_cached(int64_t target, bool oversize_only) {
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

  void garbage_collect() {
    const double t = config.garbage_collection_threshold;
    if (t <= 0.0 || allowed() == kNoLimit) return;
    const int64_t target = static_cast<int64_t>(t * static_cast<double>(allowed()));
    if (stats.reserved_bytes[kAggregatePool].current > target) release_cached(target, false);
  }

  void process_events(bool wait) {
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
  void free_block(Block* b) {
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

  [[noreturn]] void throw_oom(int64_t requested, int64_t rounded, StreamId stream);
  AllocatorStats summary() const;

  void* allocate(int64_t nbytes, StreamId stream) {
    EMBER_CHECK(nbytes >= 0, ValueError, "allocate: negative size ", nbytes);
    if (nbytes == 0) return nullptr;
    if (nbytes > kMaxRequest) throw_oom(nbytes, nbytes, stream);
    const int64_t size = round_size(nbytes);
    BlockPool& pool = pool_for(size);
    process_events(false);
    // A block of an expandable segment must have the pages under the request mapped (Note [Expandable segments]);
    // when the device has no room for them it goes back to its pool and the ladder continues.
    auto ready = [&](Block* blk) -> Block* {
      if (blk == nullptr || !blk->segment->expandable || map_pages(blk->segment, blk->ptr, size)) return blk;
      blk->pool->blocks.insert(blk);
      return nullptr;
    };
    auto from_pool = [&]() { return ready(get_free_block(pool, size, stream)); };
    auto obtain = [&]() -> Block* {
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
    if (poison_allocations() && backing.materialized()) std::memset(b->ptr, kPoisonByte, static_cast<size_t>(nbytes));
    return b->ptr;
  }

  void deallocate(void* ptr) {
    if (ptr == nullptr) return;
    auto it = active.find(ptr);
    EMBER_CHECK(it != active.end(), ValueError, "deallocate: pointer ", ptr, " was not allocated by this allocator");
    Block* b = it->second;
    // Events first: if recording one throws, nothing has changed yet (those already recorded are released).
    std::vector<EventId> recorded;
    try {
      for (StreamId s : b->stream_uses) recorded.push_back(backing.record_event(s));
    } catch (...) {
      for (EventId e : recorded) backing.release_event(e);
      throw;
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
};

// ---- OOM ---------------------------------------------------------------------------------------------------------

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
      f.largest_free = std::max(f.largest_free, b->size);
      ++f.free_blocks;
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
  impl_->process_events(true);
  impl_->release_cached(0, false);
}

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
  f.inactive_split_bytes = s.inactive_split_bytes[kAggregatePool].current;
  f.rounding_waste = s.allocated_bytes[kAggregatePool].current - s.requested_bytes[kAggregatePool].current;
  const int64_t pr = impl_->peak_reserved_bytes_since_reset;
  f.peak_fragmentation =
      pr > 0 ? 1.0 - static_cast<double>(impl_->peak_active_bytes_since_reset) / static_cast<double>(pr) : 0.0;
  for (const BlockPool* pool : {&impl_->small_pool, &impl_->large_pool})
    for (const Block* b : pool->blocks) f.largest_free_block = std::max(f.largest_free_block, b->size);
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

void CachingAllocator::set_oom_explanations(bool on) {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  impl_->explain_ooms = on;
}

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

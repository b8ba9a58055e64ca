// The caching allocator's internal state (blocks, pools, segments, Impl), included only by caching_allocator*.cpp.
// Invariant: blocks, pools, segments and statistics change only under Impl::mutex (the trace ring has its own lock).
#pragma once

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "ember/memory/caching_allocator.h"

namespace ember::memory {

// The block, pool and segment types. Named (not anonymous) because CachingAllocator::Impl, which has external linkage,
// holds them; nothing outside the caching allocator's files uses them.
namespace caching_detail {

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

uint64_t segment_seq(const Block* b);  // below, once Segment is complete

// Note [Address-free tie-break]
// Best fit keyed on (stream, size, place), the place being (the segment's creation number, the address within it):
// among free blocks of one size the oldest segment's lowest block wins. PyTorch breaks the tie by address, which makes
// the allocator's choices depend on where the device or the OS put each segment: host mmap hands out decreasing
// addresses, a simulated device (trace replay, the meta-device estimator) increasing ones, so the same allocation
// sequence reserved 40 MiB on the host and 42 MiB in its replay. With the creation number, every backing makes the
// same choices for the same sequence. On CUDA, whose addresses usually grow, the order is mostly PyTorch's.
struct BlockOrder {
  using is_transparent = void;
  bool operator()(const Block* a, const Block* b) const {
    if (a->stream != b->stream) return a->stream < b->stream;
    if (a->size != b->size) return a->size < b->size;
    if (a->segment != b->segment) return segment_seq(a) < segment_seq(b);
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
  uint64_t seq = 0;  // creation number (Note [Address-free tie-break])
};

inline uint64_t segment_seq(const Block* b) { return b->segment->seq; }

inline int pool_index(bool is_small) { return is_small ? kSmallPool : kLargePool; }

inline int64_t round_up(int64_t n, int64_t m) { return (n + m - 1) / m * m; }

inline int64_t power2_floor(int64_t n) {  // n >= 1
  return int64_t{1} << (63 - __builtin_clzll(static_cast<unsigned long long>(n)));
}

// Requests above this are refused up front (OutOfMemoryError): rounding arithmetic stays far from int64 overflow.
inline constexpr int64_t kMaxRequest = int64_t{1} << 60;

// Rounds size up to the next of `divisions` equal steps between its two enclosing powers of two.
inline int64_t roundup_power2_next_division(int64_t size, int64_t divisions) {
  if ((size & (size - 1)) == 0) return size;
  const int64_t floor2 = power2_floor(size);
  const int64_t step = floor2 / power2_floor(divisions);
  if (step == 0) return floor2 * 2;
  const int64_t rounded = size & ~(step - 1);
  return rounded == size ? size : rounded + step;
}

}  // namespace caching_detail

struct CachingAllocator::Impl {
  using Block = caching_detail::Block;
  using BlockPool = caching_detail::BlockPool;
  using Segment = caching_detail::Segment;

  Backing& backing;
  AllocatorConfig config;
  mutable std::mutex mutex;
  caching_detail::NodeArena arena;
  BlockPool small_pool{&arena}, large_pool{&arena};
  std::vector<Segment*> segments;  // address order is not required; segment lookup is via blocks
  caching_detail::ActiveMap active{  // user pointer -> allocated block
      64, std::hash<void*>(), std::equal_to<void*>(),
      caching_detail::ArenaAllocator<std::pair<void* const, Block*>>(&arena)};
  std::vector<std::pair<EventId, Block*>> events; // outstanding cross-stream events, in record order
  DeviceStats stats;
  TagStatsTable tag_stats;  // bytes by owner tag, moved with allocated_bytes
  int64_t peak_active_bytes_since_reset = 0, peak_reserved_bytes_since_reset = 0;
  std::vector<std::pair<uint64_t, int64_t>> peak_windows;  // (id, peak allocated bytes) of the open windows
  uint64_t next_window_id = 1;
  uint64_t clock = 0;    // logical time for LRU
  uint64_t next_id = 1;  // allocation ids
  uint64_t next_segment_seq = 0;
  TraceRing trace;
  bool trace_from_start = false;  // the trace was enabled while the allocator held nothing: it is the whole history
  bool explain_ooms = true;       // OutOfMemoryError messages replay allocations to check their advice
  FaultInjector faults;           // Note [Injected out of memory] (fault_injection.h); atomic, read without the mutex
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
    f(caching_detail::pool_index(is_small));
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

  // ---- segments, expandable segments, release (caching_allocator_segments.cpp) -------------------------------------
  static int64_t allocation_size(int64_t size);
  Segment* add_segment(char* base, int64_t size, bool is_small, StreamId stream, bool expandable, int64_t range);
  Block* alloc_segment(int64_t size, bool is_small, StreamId stream);
  bool map_pages(Segment* seg, const char* ptr, int64_t len);
  int64_t unmap_free_pages(Block* b);
  Block* expand_segment(int64_t size, bool is_small, StreamId stream);
  void release_segment(Segment* seg);
  void shrink_expandable(Segment* seg);
  void release_cached(int64_t target, bool oversize_only);
  void garbage_collect();

  // ---- the pool and the alloc/free paths (caching_allocator.cpp) -------------------------------------------------
  // Note [Inline hot path]: libember is a shared library built as position-independent code, where GCC neither
  // inlines nor calls directly a default-visibility function that is not inline (it could be interposed). The
  // functions of a cached alloc/free pair are therefore declared inline here and defined in caching_allocator.cpp,
  // the only file that may call them (a call from another file fails to link instead of being slow).
  inline int64_t round_size(int64_t size) const;
  inline Block* get_free_block(BlockPool& pool, int64_t size, StreamId stream);
  inline bool should_split(const Block* b, int64_t size) const;
  inline void process_events(bool wait);
  inline void free_block(Block* b);
  inline void* allocate(int64_t nbytes, StreamId stream);
  inline void deallocate(void* ptr);
  [[noreturn]] void throw_oom(int64_t requested, int64_t rounded, StreamId stream);
  // The bytes of free block `b` that are held from the device: its size, or for a block of an expandable segment
  // (which may span unmapped pages) only its mapped bytes. Used for the largest free block (OOM facts, fragmentation).
  int64_t held_bytes(const Block* b) const;

  // ---- statistics (caching_allocator_stats.cpp) ------------------------------------------------------------------
  AllocatorStats summary() const;
};

}  // namespace ember::memory

// Caching allocator knobs (EMBER_ALLOC_CONF keys): each one changes behaviour exactly as documented —
// max_split_size_mb, roundup_power2_divisions, garbage_collection_threshold, expandable_segments, capacity and
// per_process_memory_fraction. Expectations are hand-computed from PyTorch's rules (DESIGN.md reference numbers).
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "ember/base/error.h"
#include "ember/memory/caching_allocator.h"
#include "tests/memory/caching_test_util.h"

using namespace ember;
using namespace ember::memory;
using namespace caching_test;


namespace {







int64_t block_size_of(CachingAllocator& a, const void* p) {
  const std::vector<SegmentSnapshot> snap = a.snapshot();
  const BlockSnapshot* b = find_block(snap, p);
  return b ? b->size : -1;
}

// ---- max_split_size_mb ------------------------------------------------------------------------------------

TEST(CachingKnobs, MaxSplitSizeKeepsOversizeBlocksWhole) {
  auto a = make_allocator(GiB, "max_split_size_mb:40");
  ASSERT_EQ(a->config().max_split_size, 40 * MiB);
  void* big = a->allocate(60 * MiB);  // an oversize segment and allocation
  DeviceStats s = a->device_stats();
  EXPECT_EQ(s.oversize_allocations.current, 1);
  EXPECT_EQ(s.oversize_segments.current, 1);
  a->deallocate(big);
  EXPECT_EQ(a->device_stats().oversize_allocations.current, 0);
  EXPECT_EQ(a->device_stats().oversize_segments.current, 1);  // cached, still held

  void* small = a->allocate(4 * MiB);  // not from the cached 60 MiB block: a fresh 20 MiB segment
  EXPECT_NE(small, big);
  EXPECT_EQ(a->device_stats().num_device_alloc, 2);
  const std::vector<SegmentSnapshot> snap = a->snapshot();
  const BlockSnapshot* cached = find_block(snap, big);
  ASSERT_NE(cached, nullptr);
  EXPECT_FALSE(cached->allocated);
  EXPECT_EQ(cached->size, 60 * MiB);  // still whole

  void* near = a->allocate(41 * MiB);  // within 20 MiB of 60: served by the oversize block, which is not split
  EXPECT_EQ(near, big);
  EXPECT_EQ(block_size_of(*a, near), 60 * MiB);
  EXPECT_EQ(a->device_stats().num_device_alloc, 2);
  EXPECT_EQ(a->device_stats().oversize_allocations.current, 1);
  a->deallocate(near);

  void* far = a->allocate(40 * MiB);  // 60 >= 40 + 20: not served by it; a 40 MiB (oversize) segment of its own
  EXPECT_NE(far, big);
  EXPECT_EQ(a->device_stats().num_device_alloc, 3);
  s = a->device_stats();
  EXPECT_EQ(s.oversize_segments.current, 2);
  EXPECT_EQ(s.oversize_allocations.current, 1);
  EXPECT_EQ(s.oversize_allocations.peak, 1);
  EXPECT_EQ(s.oversize_allocations.allocated, 3);  // big, near, far
  EXPECT_EQ(verify_caching_allocator(*a), "");
  a->deallocate(small);
  a->deallocate(far);
  a->empty_cache();
  EXPECT_EQ(a->device_stats().oversize_segments.current, 0);
}

TEST(CachingKnobs, WithoutMaxSplitSizeBigBlocksAreSplit) {
  auto a = make_allocator(GiB);
  void* big = a->allocate(60 * MiB);
  a->deallocate(big);
  void* small = a->allocate(4 * MiB);  // the default splits the cached 60 MiB block
  EXPECT_EQ(small, big);
  EXPECT_EQ(block_size_of(*a, small), 4 * MiB);
  EXPECT_EQ(a->device_stats().num_device_alloc, 1);
  EXPECT_EQ(a->device_stats().oversize_segments.current, 0);
  a->deallocate(small);
}

// ---- roundup_power2_divisions -----------------------------------------------------------------------------

TEST(CachingKnobs, RoundupPower2DivisionsSizes) {
  struct Case {
    int64_t request, rounded_default, rounded_div4;
  };
  const Case cases[] = {
      {1000, 1024, 1024},                          // <= 512 x 4 bytes: plain 512 B rounding
      {9000, 9216, 10240},                         // [8K, 16K) in steps of 2K
      {300 * KiB, 300 * KiB, 320 * KiB},           // [256K, 512K) in steps of 64K
      {1200 * KiB, 1200 * KiB, 1280 * KiB},        // [1M, 2M) in steps of 256K
      {MiB + 1, MiB + 512, MiB + 256 * KiB},
      {2 * MiB, 2 * MiB, 2 * MiB},                 // a power of two stays
      {5 * MiB + 1, 5 * MiB + 512, 6 * MiB},       // [4M, 8M) in steps of 1M
      {33 * MiB, 34 * MiB, 40 * MiB},              // [32M, 64M) in steps of 8M (default: a 34 MiB segment whose
                                                   // 1 MiB rest is not split off)
  };
  for (const Case& c : cases) {
    for (const char* conf : {"", "roundup_power2_divisions:4"}) {
      auto a = make_allocator(GiB, conf);
      void* p = a->allocate(c.request);
      EXPECT_EQ(block_size_of(*a, p), *conf ? c.rounded_div4 : c.rounded_default) << c.request << " " << conf;
      EXPECT_EQ(a->device_stats().requested_bytes[kAggregatePool].current, c.request);
      a->deallocate(p);
    }
  }
}

TEST(CachingKnobs, RoundupPower2DivisionsReusesBlocks) {
  // Growing requests 33..39 MiB, each freed before the next: plain rounding needs a new segment whenever the
  // request outgrows the cached ones (34, 36, 38, 40 MiB: 4 segments); with 4 divisions all round to 40 MiB (1).
  int64_t device_allocs[2];
  int i = 0;
  for (const char* conf : {"", "roundup_power2_divisions:4"}) {
    auto a = make_allocator(GiB, conf);
    for (int64_t mb = 33; mb <= 39; ++mb) a->deallocate(a->allocate(mb * MiB));
    device_allocs[i++] = a->device_stats().num_device_alloc;
    EXPECT_EQ(verify_caching_allocator(*a), "");
  }
  EXPECT_EQ(device_allocs[0], 4);
  EXPECT_EQ(device_allocs[1], 1);
}

// ---- garbage_collection_threshold -------------------------------------------------------------------------

struct GcRun {
  std::vector<bool> survived;  // A, B, C, D segments still held after E was allocated
  int64_t device_frees = 0, reserved = 0;
};

// Capacity 128 MiB. A, B, C (16 MiB) and D (18 MiB) each take a segment of their size and are freed in the order
// B, A, C, D (B least recently used); then E (20 MiB) fits no cached block, so the backing must be asked.
GcRun gc_run(const std::string& conf) {
  auto a = make_allocator(128 * MiB, conf);
  void* A = a->allocate(16 * MiB);
  void* B = a->allocate(16 * MiB);
  void* C = a->allocate(16 * MiB);
  void* D = a->allocate(18 * MiB);  // reserved 48 MiB before it: below any threshold used here, nothing released
  EXPECT_EQ(a->device_stats().num_device_free, 0);
  for (void* p : {B, A, C, D}) a->deallocate(p);
  void* E = a->allocate(20 * MiB);
  GcRun r;
  const auto snap = a->snapshot();
  for (void* p : {A, B, C, D}) r.survived.push_back(has_segment_at(snap, p));
  EXPECT_TRUE(has_segment_at(snap, E));
  r.device_frees = a->device_stats().num_device_free;
  r.reserved = a->stats().reserved_bytes;
  // A request the cache can serve does not collect, although reserved is above the threshold: the lowest
  // surviving 16 MiB block is reused and nothing is freed or obtained.
  const int64_t maps = a->device_stats().num_device_alloc;
  void* again = a->allocate(16 * MiB);
  EXPECT_EQ(again, has_segment_at(snap, A) ? A : C);
  EXPECT_EQ(a->device_stats().num_device_free, r.device_frees);
  EXPECT_EQ(a->device_stats().num_device_alloc, maps);
  a->deallocate(again);
  EXPECT_EQ(verify_caching_allocator(*a), "");
  a->deallocate(E);
  return r;
}

TEST(CachingKnobs, GarbageCollectionReleasesLeastRecentlyUsedFirst) {
  // Threshold 0.5 of 128 MiB = 64 MiB; reserved is 66 MiB when E is requested: B (LRU) is released -> 50 MiB.
  GcRun half = gc_run("garbage_collection_threshold:0.5");
  EXPECT_EQ(half.device_frees, 1);
  EXPECT_EQ(half.survived, (std::vector<bool>{true, false, true, true}));
  EXPECT_EQ(half.reserved, (16 + 16 + 18 + 20) * MiB);
  // Threshold 0.3 = 38.4 MiB: B, then A (the next least recently used) -> 34 MiB.
  GcRun low = gc_run("garbage_collection_threshold:0.3");
  EXPECT_EQ(low.device_frees, 2);
  EXPECT_EQ(low.survived, (std::vector<bool>{false, false, true, true}));
  EXPECT_EQ(low.reserved, (16 + 18 + 20) * MiB);
  // Without the knob nothing is released: there is room on the device.
  GcRun off = gc_run("");
  EXPECT_EQ(off.device_frees, 0);
  EXPECT_EQ(off.survived, (std::vector<bool>{true, true, true, true}));
  EXPECT_EQ(off.reserved, (16 * 3 + 18 + 20) * MiB);
}

// ---- expandable_segments ----------------------------------------------------------------------------------

TEST(CachingKnobs, ExpandableSegmentGrowsByPages) {
  auto a = make_allocator(GiB, "expandable_segments:True");
  void* p = a->allocate(4 * MiB);        // maps 4 MiB
  void* q = a->allocate(3 * MiB);        // maps 4 more: [4][3][1 free]
  void* r = a->allocate(MiB + MiB / 2);  // the free 1 MiB grows by one 2 MiB page: [4][3][1.5][1.5 free]
  const auto snap = a->snapshot();
  ASSERT_EQ(snap.size(), 1u);
  EXPECT_TRUE(snap[0].expandable);
  EXPECT_EQ(snap[0].size, 10 * MiB);
  ASSERT_EQ(snap[0].blocks.size(), 4u);
  EXPECT_EQ(addr(q), addr(p) + 4 * MiB);
  EXPECT_EQ(addr(r), addr(p) + 7 * MiB);
  EXPECT_EQ(snap[0].blocks[3].size, MiB + MiB / 2);
  EXPECT_FALSE(snap[0].blocks[3].allocated);
  EXPECT_EQ(a->device_stats().num_device_alloc, 3);
  EXPECT_EQ(a->stats().reserved_bytes, 10 * MiB);
  EXPECT_EQ(sim_of(*a).used(), 10 * MiB);
  EXPECT_EQ(verify_caching_allocator(*a), "");
  // The same requests with fixed segments reserve a whole 20 MiB segment.
  auto f = make_allocator(GiB);
  for (int64_t n : {4 * MiB, 3 * MiB, MiB + MiB / 2}) f->allocate(n);
  EXPECT_EQ(f->stats().reserved_bytes, 20 * MiB);
  for (void* x : {p, q, r}) a->deallocate(x);
}

// Allocates `count` blocks of `size`; returns how many succeeded before the first OOM.
int fill(CachingAllocator& a, int64_t size, int count, std::vector<void*>& out) {
  for (int i = 0; i < count; ++i) {
    try {
      out.push_back(a.allocate(size));
    } catch (const OutOfMemoryError&) {
      return i;
    }
  }
  return count;
}

TEST(CachingKnobs, ExpandableSegmentsAvoidSegmentRoundingWaste) {
  // 7 MiB blocks on a 60 MiB device. Fixed: a 20 MiB segment holds two (6 MiB left over), so 3 segments hold
  // 6 blocks and the 7th fails with 18 MiB free. Expandable: blocks pack at 7 MiB, 8 fit (56 MiB mapped).
  for (bool expandable : {false, true}) {
    auto a = make_allocator(60 * MiB, expandable ? "expandable_segments:True" : "");
    std::vector<void*> blocks;
    EXPECT_EQ(fill(*a, 7 * MiB, 9, blocks), expandable ? 8 : 6) << expandable;
    EXPECT_EQ(a->stats().reserved_bytes, expandable ? 56 * MiB : 60 * MiB);
    EXPECT_EQ(verify_caching_allocator(*a), "");
    for (void* p : blocks) a->deallocate(p);
  }
}

TEST(CachingKnobs, ExpandableSegmentsServeAfterStaircaseFrees) {
  // Eight 9 MiB blocks fill an 80 MiB device in fixed 20 MiB segments ([9][9][2] each); freeing blocks 0, 3, 4, 7
  // leaves 40 MiB free but no hole above 11 MiB, and no segment entirely free: a 16 MiB request fails.
  // In one expandable segment blocks 3 and 4 are neighbours: their 18 MiB hole serves it without growing.
  for (bool expandable : {false, true}) {
    auto a = make_allocator(80 * MiB, expandable ? "expandable_segments:True" : "");
    std::vector<void*> blocks;
    ASSERT_EQ(fill(*a, 9 * MiB, 8, blocks), 8) << expandable;
    for (int i : {0, 3, 4, 7}) a->deallocate(blocks[static_cast<size_t>(i)]);
    const int64_t maps = a->device_stats().num_device_alloc;
    if (!expandable) {
      EXPECT_EQ(a->fragmentation().largest_free_block, 11 * MiB);
      EXPECT_THROW(a->allocate(16 * MiB), OutOfMemoryError);
    } else {
      EXPECT_EQ(a->fragmentation().largest_free_block, 18 * MiB);
      void* p = a->allocate(16 * MiB);
      EXPECT_EQ(p, blocks[3]);
      EXPECT_EQ(a->device_stats().num_device_alloc, maps);
      a->deallocate(p);
    }
    EXPECT_EQ(verify_caching_allocator(*a), "");
    for (int i : {1, 2, 5, 6}) a->deallocate(blocks[static_cast<size_t>(i)]);
  }
}

TEST(CachingKnobs, EmptyCacheUnmapsTrailingPages) {
  auto a = make_allocator(GiB, "expandable_segments:True");
  SimulatedBacking& sim = sim_of(*a);
  void* A = a->allocate(3 * MiB);
  void* B = a->allocate(3 * MiB);
  void* C = a->allocate(3 * MiB);  // [A 3][B 3][C 3][1 free]: 10 MiB mapped
  ASSERT_EQ(sim.used(), 10 * MiB);
  a->deallocate(C);  // trailing free [6, 10)
  EXPECT_EQ(sim.used(), 10 * MiB);  // freeing keeps the pages cached
  a->empty_cache();  // unmaps [6, 10)
  auto snap = a->snapshot();
  ASSERT_EQ(snap.size(), 1u);
  EXPECT_EQ(snap[0].size, 6 * MiB);
  EXPECT_EQ(snap[0].blocks.size(), 2u);
  EXPECT_EQ(sim.used(), 6 * MiB);
  a->deallocate(B);  // trailing free [3, 6): only the whole page [4, 6) can go
  a->empty_cache();
  snap = a->snapshot();
  ASSERT_EQ(snap.size(), 1u);
  EXPECT_EQ(snap[0].size, 4 * MiB);
  ASSERT_EQ(snap[0].blocks.size(), 2u);
  EXPECT_EQ(snap[0].blocks[1].size, MiB);
  EXPECT_FALSE(snap[0].blocks[1].allocated);
  EXPECT_EQ(sim.used(), 4 * MiB);
  EXPECT_EQ(a->device_stats().num_device_free, 2);
  EXPECT_EQ(verify_caching_allocator(*a), "");
  a->deallocate(A);
  a->empty_cache();  // the whole segment goes
  EXPECT_TRUE(a->snapshot().empty());
  EXPECT_EQ(sim.used(), 0);
  EXPECT_EQ(a->stats().reserved_bytes, 0);
}

// Expandable segments and max_split_size together: a trailing free block at or above max_split_size cannot serve a
// small request (the oversize rule), so the allocator grows the segment instead; that must still work.
TEST(CachingKnobs, ExpandableWithMaxSplitSize) {
  auto a = make_allocator(GiB, "expandable_segments:True,max_split_size_mb:40");
  void* A = a->allocate(4 * MiB);
  void* B = a->allocate(60 * MiB);
  a->deallocate(B);  // trailing free block of 60 MiB
  void* C = nullptr;
  ASSERT_NO_THROW(C = a->allocate(4 * MiB));
  EXPECT_NE(C, nullptr);
  EXPECT_EQ(verify_caching_allocator(*a), "");
  EXPECT_NO_THROW(a->check_invariants());
  a->deallocate(C);
  a->deallocate(A);
  a->empty_cache();
  EXPECT_TRUE(a->snapshot().empty());
  EXPECT_EQ(a->device_stats().oversize_segments.current, 0);
}

// An expandable segment that grows past max_split_size (or shrinks below it) must keep oversize_segments equal to
// the number of segments at or above max_split_size; in particular it returns to 0 when the segment is released.
TEST(CachingKnobs, ExpandableOversizeSegmentCount) {
  auto a = make_allocator(GiB, "expandable_segments:True,max_split_size_mb:40");
  void* p = a->allocate(30 * MiB);  // maps 30 MiB: not oversize
  EXPECT_EQ(a->device_stats().oversize_segments.current, 0);
  void* q = a->allocate(20 * MiB);  // grows the same segment to 50 MiB: now at or above 40 MiB
  ASSERT_EQ(a->snapshot().size(), 1u);
  EXPECT_EQ(a->snapshot()[0].size, 50 * MiB);
  EXPECT_EQ(a->device_stats().oversize_segments.current, 1);
  a->deallocate(q);
  a->deallocate(p);
  a->empty_cache();
  EXPECT_TRUE(a->snapshot().empty());
  EXPECT_EQ(a->device_stats().oversize_segments.current, 0);
}

// max_split_size_mb may change while no allocation is live, but cached segments stay: the oversize count must
// follow (a 60 MiB segment cached without a limit becomes oversize under max_split_size_mb:40).
TEST(CachingKnobs, SetConfigMaxSplitKeepsOversizeCount) {
  auto a = make_allocator(GiB);
  a->deallocate(a->allocate(60 * MiB));
  a->set_config(parse_alloc_config("max_split_size_mb:40"));
  EXPECT_EQ(verify_caching_allocator(*a), "");
  a->empty_cache();
  EXPECT_EQ(a->device_stats().oversize_segments.current, 0);
}

// ---- capacity and per_process_memory_fraction -------------------------------------------------------------

TEST(CachingKnobs, AllowedMemory) {
  EXPECT_EQ(make_allocator(GiB)->allowed_memory(), GiB);
  EXPECT_EQ(make_allocator(GiB, "per_process_memory_fraction:0.5")->allowed_memory(), 512 * MiB);
  EXPECT_EQ(make_allocator(GiB, "capacity:256MiB,per_process_memory_fraction:0.5")->allowed_memory(), 256 * MiB);
  EXPECT_EQ(make_allocator(GiB, "capacity:768MiB,per_process_memory_fraction:0.5")->allowed_memory(), 512 * MiB);
  EXPECT_EQ(make_allocator(512 * MiB, "capacity:1GiB")->allowed_memory(), 512 * MiB);
}

TEST(CachingKnobs, MemoryFractionLimitsReserved) {
  auto a = make_allocator(100 * MiB, "per_process_memory_fraction:0.5");  // 50 MiB allowed
  void* p = a->allocate(40 * MiB);
  try {
    a->allocate(12 * MiB);  // 52 MiB > 50, although the device has 60 MiB free
    FAIL() << "expected OutOfMemoryError";
  } catch (const OutOfMemoryError& e) {
    EXPECT_EQ(e.requested(), 12 * MiB);
    EXPECT_NE(std::string(e.what()).find("allowed 50.00 MiB"), std::string::npos) << e.what();
  }
  EXPECT_EQ(a->backing().available(), 60 * MiB);
  void* q = a->allocate(10 * MiB);  // exactly up to the limit
  EXPECT_EQ(a->stats().reserved_bytes, 50 * MiB);
  EXPECT_THROW(a->allocate(512), OutOfMemoryError);
  EXPECT_EQ(a->stats().num_ooms, 2);
  EXPECT_EQ(verify_caching_allocator(*a), "");
  a->deallocate(p);
  a->deallocate(q);
}

TEST(CachingKnobs, CapacitySettingLimitsReserved) {
  auto a = make_allocator(GiB, "capacity:64MiB");
  std::vector<void*> blocks;
  EXPECT_EQ(fill(*a, 16 * MiB, 5, blocks), 4);
  EXPECT_EQ(a->stats().reserved_bytes, 64 * MiB);
  // Expandable segments obey the same limit.
  auto e = make_allocator(GiB, "capacity:64MiB,expandable_segments:True");
  std::vector<void*> eblocks;
  EXPECT_EQ(fill(*e, 16 * MiB, 5, eblocks), 4);
  EXPECT_EQ(e->stats().reserved_bytes, 64 * MiB);
  for (void* p : blocks) a->deallocate(p);
  for (void* p : eblocks) e->deallocate(p);
}

TEST(CachingKnobs, SetConfigAppliesToNewRequests) {
  auto a = make_allocator(GiB);
  void* p = a->allocate(1200 * KiB);
  EXPECT_EQ(block_size_of(*a, p), 1200 * KiB);
  a->set_config(parse_alloc_config("roundup_power2_divisions:4"));
  void* q = a->allocate(1200 * KiB);
  EXPECT_EQ(block_size_of(*a, q), 1280 * KiB);
  EXPECT_EQ(block_size_of(*a, p), 1200 * KiB);  // existing blocks stay
  // expandable_segments cannot change while segments are held.
  EXPECT_THROW(a->set_config(parse_alloc_config("expandable_segments:True")), ConfigError);
  a->deallocate(p);
  a->deallocate(q);
  a->empty_cache();
  EXPECT_NO_THROW(a->set_config(parse_alloc_config("expandable_segments:True")));
  void* r = a->allocate(3 * MiB);
  EXPECT_TRUE(a->snapshot().at(0).expandable);
  a->deallocate(r);
}

}  // namespace

// Releasing the cache unmaps free pages in the middle of an expandable segment too (Note [Expandable segments]):
// after freeing a 40 MiB block that sits before a live 2 MiB one, empty_cache() leaves only the live block's page
// mapped, so another stream can take 30 MiB of a 64 MiB device.
TEST(CachingKnobs, ExpandableReleasesInteriorPages) {
  auto a = make_allocator(64 * MiB, "expandable_segments:True");
  void* big = a->allocate(40 * MiB);
  void* small = a->allocate(2 * MiB);
  a->deallocate(big);
  a->empty_cache();
  EXPECT_EQ(a->stats().reserved_bytes, 2 * MiB);
  EXPECT_EQ(verify_caching_allocator(*a), "");
  void* other = a->allocate(30 * MiB, /*stream=*/1);
  EXPECT_EQ(a->stats().reserved_bytes, 32 * MiB);
  // The hole is reused (and remapped) before the segment grows.
  void* again = a->allocate(20 * MiB);
  EXPECT_LT(reinterpret_cast<uintptr_t>(again), reinterpret_cast<uintptr_t>(small));
  EXPECT_EQ(verify_caching_allocator(*a), "");
  for (void* p : {small, other, again}) a->deallocate(p);
  a->empty_cache();
  EXPECT_EQ(a->stats().reserved_bytes, 0);
  EXPECT_TRUE(a->snapshot().empty());
}

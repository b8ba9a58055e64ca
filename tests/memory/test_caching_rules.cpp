// Caching allocator rules with hand-computed expectations: size classes, best fit, split/coalesce, cross-stream
// reuse, statistics, trace events and poisoning (DESIGN.md reference numbers; PyTorch's rules).
// Every test ends with the independent recount (verify_caching_allocator) as its invariant check.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <random>
#include <vector>

#include "ember/base/error.h"
#include "ember/memory/caching_allocator.h"
#include "ember/memory/host_allocator.h"
#include "tests/harness/op_harness.h"
#include "tests/memory/caching_test_util.h"

using namespace ember;
using namespace ember::memory;
using namespace caching_test;

namespace {

// ---- size classes ------------------------------------------------------------------------------------------

struct Placement {
  int64_t block = 0, segment = 0;
  bool small = false;
};

Placement place(int64_t request) {
  auto a = make_allocator(GiB);
  void* p = a->allocate(request);
  const auto snap = a->snapshot();
  const SegmentSnapshot* s = nullptr;
  const BlockSnapshot* b = find_block(snap, p, &s);
  EXPECT_NE(b, nullptr);
  Placement out{b ? b->size : -1, s ? s->size : -1, s ? s->small_pool : false};
  a->deallocate(p);
  return out;
}

TEST(CachingRules, RoundsTo512Bytes) {
  const std::pair<int64_t, int64_t> cases[] = {{1, 512},       {511, 512},     {512, 512},         {513, 1024},
                                               {1000, 1024},   {4097, 4608},   {65536, 65536},     {100000, 100352}};
  for (auto [req, block] : cases) EXPECT_EQ(place(req).block, block) << req;
  auto a = make_allocator(GiB);
  EXPECT_EQ(a->allocate(0), nullptr);  // zero bytes: nothing taken
  EXPECT_EQ(a->device_stats().allocation[kAggregatePool].allocated, 0);
  EXPECT_EQ(a->device_stats().num_device_alloc, 0);
}

TEST(CachingRules, SegmentSizes) {
  struct Case {
    int64_t request, block, segment;
    bool small;
  };
  const Case cases[] = {
      {1, 512, 2 * MiB, true},                            // small pool: 2 MiB segments
      {MiB, MiB, 2 * MiB, true},                          // 1 MiB is still small
      {MiB + 1, MiB + 512, 20 * MiB, false},              // 1-10 MiB: 20 MiB segments
      {5 * MiB, 5 * MiB, 20 * MiB, false},
      {10 * MiB - 513, 10 * MiB - 512, 20 * MiB, false},  // rounds to 10 MiB - 512: still < 10 MiB
      {10 * MiB - 1, 10 * MiB, 10 * MiB, false},          // rounds to 10 MiB: its own segment
      {10 * MiB + 1, 10 * MiB + 512, 12 * MiB, false},    // > 10 MiB: rounded to 2 MiB; rest 1.5 MiB split off
      {11 * MiB, 12 * MiB, 12 * MiB, false},              // rest exactly 1 MiB: not split, the block keeps it
      {12 * MiB + MiB / 2, 12 * MiB + MiB / 2, 14 * MiB, false},
      {100 * MiB, 100 * MiB, 100 * MiB, false},
      {100 * MiB + 1, 100 * MiB + 512, 102 * MiB, false},
  };
  for (const Case& c : cases) {
    const Placement p = place(c.request);
    EXPECT_EQ(p.block, c.block) << c.request;
    EXPECT_EQ(p.segment, c.segment) << c.request;
    EXPECT_EQ(p.small, c.small) << c.request;
  }
}

TEST(CachingRules, SmallPoolFillsTwoMiBSegments) {
  auto a = make_allocator(GiB);
  void* p1 = a->allocate(MiB);
  void* p2 = a->allocate(MiB - 512);  // the rest of the segment: 1 MiB, split leaving 512 B
  void* p3 = a->allocate(512);        // exactly the 512 B left
  void* p4 = a->allocate(512);        // a new small segment
  const auto snap = a->snapshot();
  const SegmentSnapshot* s1 = segment_of(snap, p1);
  ASSERT_NE(s1, nullptr);
  EXPECT_EQ(addr(p2), addr(p1) + MiB);
  EXPECT_EQ(addr(p3), addr(p1) + 2 * MiB - 512);
  EXPECT_EQ(segment_of(snap, p3), s1);
  EXPECT_NE(segment_of(snap, p4), s1);
  ASSERT_EQ(s1->blocks.size(), 3u);
  const DeviceStats st = a->device_stats();
  EXPECT_EQ(st.segment[kSmallPool].current, 2);
  EXPECT_EQ(st.segment[kLargePool].current, 0);
  EXPECT_EQ(st.reserved_bytes[kSmallPool].current, 4 * MiB);
  EXPECT_EQ(verify_caching_allocator(*a), "");
  for (void* p : {p1, p2, p3, p4}) a->deallocate(p);
}

// ---- best fit ---------------------------------------------------------------------------------------------

TEST(CachingRules, BestFitSmallestBlockThenLowestAddress) {
  auto a = make_allocator(GiB);
  // One small segment: [a 8K][s 512][b 4K][s 512][c 8K][s 512][tail].
  void* pa = a->allocate(8 * KiB);
  void* s1 = a->allocate(512);
  void* pb = a->allocate(4 * KiB);
  void* s2 = a->allocate(512);
  void* pc = a->allocate(8 * KiB);
  void* s3 = a->allocate(512);
  const uint64_t base = addr(pa);
  ASSERT_EQ(addr(pb), base + 8 * KiB + 512);
  ASSERT_EQ(addr(pc), base + 12 * KiB + 1024);
  a->deallocate(pa);
  a->deallocate(pb);
  a->deallocate(pc);
  // Free: 8K at 0, 4K at 8.5K, 8K at 13K, and the ~2 MiB tail.
  void* q1 = a->allocate(4 * KiB);  // the smallest adequate block: b
  EXPECT_EQ(addr(q1), base + 8 * KiB + 512);
  void* q2 = a->allocate(6 * KiB);  // two 8K blocks: the lower address wins; 2K split off
  EXPECT_EQ(addr(q2), base);
  void* q3 = a->allocate(8 * KiB);  // c now is the only 8K block
  EXPECT_EQ(addr(q3), base + 12 * KiB + 1024);
  void* q4 = a->allocate(2 * KiB);  // the 2K remainder of a
  EXPECT_EQ(addr(q4), base + 6 * KiB);
  void* q5 = a->allocate(1 * KiB);  // only the tail is left
  EXPECT_EQ(addr(q5), base + 21 * KiB + 512);
  EXPECT_EQ(verify_caching_allocator(*a), "");
  for (void* p : {s1, s2, s3, q1, q2, q3, q4, q5}) a->deallocate(p);
}

TEST(CachingRules, BestFitLargePool) {
  auto a = make_allocator(GiB);
  void* A = a->allocate(3 * MiB);  // one 20 MiB segment: [A 3][s 2][B 5][s 2][8 free]
  void* s1 = a->allocate(2 * MiB);
  void* B = a->allocate(5 * MiB);
  void* s2 = a->allocate(2 * MiB);
  const uint64_t base = addr(A);
  ASSERT_EQ(addr(B), base + 5 * MiB);
  a->deallocate(A);
  a->deallocate(B);
  void* q1 = a->allocate(4 * MiB);  // smallest adequate: B (5 MiB); remainder 1 MiB is not > 1 MiB: not split
  EXPECT_EQ(addr(q1), base + 5 * MiB);
  void* q2 = a->allocate(3 * MiB);  // A
  EXPECT_EQ(addr(q2), base);
  void* q3 = a->allocate(6 * MiB);  // the 8 MiB tail, split: 2 MiB remain
  EXPECT_EQ(addr(q3), base + 12 * MiB);
  const auto snap = a->snapshot();
  ASSERT_EQ(snap.size(), 1u);
  EXPECT_EQ(find_block(snap, q1)->size, 5 * MiB);
  EXPECT_EQ(find_block(snap, q3)->size, 6 * MiB);
  ASSERT_EQ(snap[0].blocks.size(), 6u);
  EXPECT_FALSE(snap[0].blocks.back().allocated);
  EXPECT_EQ(snap[0].blocks.back().size, 2 * MiB);
  EXPECT_EQ(a->device_stats().num_device_alloc, 1);
  EXPECT_EQ(verify_caching_allocator(*a), "");
  for (void* p : {s1, s2, q1, q2, q3}) a->deallocate(p);
}

// ---- split / coalesce ---------------------------------------------------------------------------------------

TEST(CachingRules, SplitAndCoalesce) {
  auto a = make_allocator(GiB);
  void* x = a->allocate(KiB);
  void* y = a->allocate(KiB);
  void* z = a->allocate(KiB);
  auto blocks = [&] { return a->snapshot().at(0).blocks; };
  ASSERT_EQ(blocks().size(), 4u);  // x y z tail
  EXPECT_EQ(blocks()[3].size, 2 * MiB - 3 * KiB);
  a->deallocate(y);  // [x][y free][z][tail free]
  ASSERT_EQ(blocks().size(), 4u);
  EXPECT_EQ(a->device_stats().inactive_split[kAggregatePool].current, 2);
  EXPECT_EQ(a->device_stats().inactive_split_bytes[kAggregatePool].current, 2 * MiB - 2 * KiB);
  a->deallocate(x);  // x merges with y
  ASSERT_EQ(blocks().size(), 3u);
  EXPECT_EQ(blocks()[0].size, 2 * KiB);
  EXPECT_FALSE(blocks()[0].allocated);
  a->deallocate(z);  // everything merges into one unsplit block
  ASSERT_EQ(blocks().size(), 1u);
  EXPECT_EQ(blocks()[0].size, 2 * MiB);
  EXPECT_EQ(a->device_stats().inactive_split[kAggregatePool].current, 0);
  EXPECT_EQ(a->device_stats().inactive_split_bytes[kAggregatePool].current, 0);
  EXPECT_EQ(verify_caching_allocator(*a), "");
}

TEST(CachingRules, LargeBlocksSplitOnlyWhenRemainderAboveOneMiB) {
  auto a = make_allocator(GiB);
  void* p1 = a->allocate(9 * MiB + MiB / 2);  // 20 MiB segment: rest 10.5 MiB split off
  void* p2 = a->allocate(9 * MiB + MiB / 2);  // rest would be exactly 1 MiB: not split, block is 10.5 MiB
  auto snap = a->snapshot();
  ASSERT_EQ(snap.size(), 1u);
  ASSERT_EQ(snap[0].blocks.size(), 2u);
  EXPECT_EQ(find_block(snap, p1)->size, 9 * MiB + MiB / 2);
  EXPECT_EQ(find_block(snap, p2)->size, 10 * MiB + MiB / 2);
  DeviceStats st = a->device_stats();
  EXPECT_EQ(st.allocated_bytes[kAggregatePool].current, 20 * MiB);
  EXPECT_EQ(st.requested_bytes[kAggregatePool].current, 19 * MiB);
  EXPECT_EQ(a->fragmentation().rounding_waste, MiB);
  a->deallocate(p2);
  void* p3 = a->allocate(9 * MiB);  // rest 1.5 MiB > 1 MiB: split
  snap = a->snapshot();
  EXPECT_EQ(addr(p3), addr(p2));
  EXPECT_EQ(find_block(snap, p3)->size, 9 * MiB);
  ASSERT_EQ(snap[0].blocks.size(), 3u);
  EXPECT_EQ(snap[0].blocks[2].size, MiB + MiB / 2);
  // The small pool splits whenever at least 512 B remain.
  void* s1 = a->allocate(MiB);
  void* s2 = a->allocate(MiB - 512);
  snap = a->snapshot();
  const SegmentSnapshot* ss = segment_of(snap, s1);
  ASSERT_NE(ss, nullptr);
  ASSERT_EQ(ss->blocks.size(), 3u);
  EXPECT_EQ(find_block(snap, s2)->size, MiB - 512);
  EXPECT_EQ(ss->blocks[2].size, 512);
  EXPECT_EQ(verify_caching_allocator(*a), "");
  for (void* p : {p1, p3, s1, s2}) a->deallocate(p);
}

// ---- streams ------------------------------------------------------------------------------------------------

TEST(CachingRules, CrossStreamReuseWaitsForEvents) {
  auto a = make_allocator(GiB);
  SimulatedBacking& sim = sim_of(*a);
  void* A = a->allocate(4 * MiB, 1);  // 20 MiB segment of stream 1
  a->record_stream(A, 2);
  a->record_stream(A, 1);  // its own stream: no event needed
  a->deallocate(A);        // pending: stream 2 may still be using it
  auto snap = a->snapshot();
  ASSERT_TRUE(find_block(snap, A)->pending_events);
  DeviceStats st = a->device_stats();
  EXPECT_EQ(st.allocated_bytes[kAggregatePool].current, 0);
  EXPECT_EQ(st.active_bytes[kAggregatePool].current, 4 * MiB);  // still active until the event completes
  void* B = a->allocate(4 * MiB, 1);  // not A: it is taken from the free rest of the segment
  EXPECT_EQ(addr(B), addr(A) + 4 * MiB);
  sim.complete_events();
  void* C = a->allocate(4 * MiB, 1);  // the event completed: A is back in the pool and is the best fit
  EXPECT_EQ(C, A);
  // A block of stream 1 never serves stream 2: a segment of its own.
  a->deallocate(C);
  void* D = a->allocate(4 * MiB, 2);
  snap = a->snapshot();
  EXPECT_EQ(snap.size(), 2u);
  EXPECT_EQ(segment_of(snap, D)->stream, 2u);
  EXPECT_NE(segment_of(snap, D), segment_of(snap, A));
  EXPECT_EQ(verify_caching_allocator(*a), "");
  a->deallocate(B);
  a->deallocate(D);
  // empty_cache waits for pending frees.
  void* E = a->allocate(4 * MiB, 1);
  a->record_stream(E, 3);
  a->deallocate(E);
  a->empty_cache();
  EXPECT_TRUE(a->snapshot().empty());
  EXPECT_EQ(sim.used(), 0);
  EXPECT_GE(a->device_stats().num_sync_all_streams, 1);
}

TEST(CachingRules, PendingBlockIsNotCoalesced) {
  auto a = make_allocator(GiB);
  SimulatedBacking& sim = sim_of(*a);
  void* x = a->allocate(KiB);
  void* y = a->allocate(KiB);
  a->record_stream(x, 5);
  a->deallocate(x);  // pending
  a->deallocate(y);  // free; must not merge with pending x
  auto blocks = a->snapshot().at(0).blocks;
  ASSERT_EQ(blocks.size(), 2u);
  EXPECT_TRUE(blocks[0].pending_events);
  EXPECT_EQ(blocks[1].size, 2 * MiB - KiB);
  EXPECT_EQ(verify_caching_allocator(*a), "");
  sim.complete_events();
  void* z = a->allocate(KiB);  // processes the event first: x merges back, z gets the lowest address
  EXPECT_EQ(z, x);
  blocks = a->snapshot().at(0).blocks;
  ASSERT_EQ(blocks.size(), 2u);
  EXPECT_EQ(verify_caching_allocator(*a), "");
  a->deallocate(z);
}

// ---- statistics ---------------------------------------------------------------------------------------------

TEST(CachingStats, ByHand) {
  auto a = make_allocator(GiB);
  void* p1 = a->allocate(1000);            // small: 1024 B of a 2 MiB segment
  void* p3 = a->allocate(12 * MiB + 100);  // 12 MiB + 512 of a 14 MiB segment (rest 2 MiB - 512 split off)
  void* p2 = a->allocate(3 * MiB);         // too big for that rest: 3 MiB of a new 20 MiB segment
  DeviceStats s = a->device_stats();
  const int64_t alloc_bytes = 1024 + 3 * MiB + 12 * MiB + 512;
  const int64_t req_bytes = 1000 + 3 * MiB + 12 * MiB + 100;
  EXPECT_EQ(s.allocation[kAggregatePool].current, 3);
  EXPECT_EQ(s.allocation[kSmallPool].current, 1);
  EXPECT_EQ(s.allocation[kLargePool].current, 2);
  EXPECT_EQ(s.allocated_bytes[kAggregatePool].current, alloc_bytes);
  EXPECT_EQ(s.allocated_bytes[kSmallPool].current, 1024);
  EXPECT_EQ(s.allocated_bytes[kLargePool].current, 15 * MiB + 512);
  EXPECT_EQ(s.requested_bytes[kAggregatePool].current, req_bytes);
  EXPECT_EQ(s.requested_bytes[kSmallPool].current, 1000);
  EXPECT_EQ(s.reserved_bytes[kAggregatePool].current, 36 * MiB);
  EXPECT_EQ(s.reserved_bytes[kSmallPool].current, 2 * MiB);
  EXPECT_EQ(s.reserved_bytes[kLargePool].current, 34 * MiB);
  EXPECT_EQ(s.segment[kAggregatePool].current, 3);
  EXPECT_EQ(s.active[kAggregatePool].current, 3);
  EXPECT_EQ(s.active_bytes[kAggregatePool].current, alloc_bytes);
  EXPECT_EQ(s.inactive_split[kAggregatePool].current, 3);
  EXPECT_EQ(s.inactive_split[kSmallPool].current, 1);
  EXPECT_EQ(s.inactive_split_bytes[kAggregatePool].current, (2 * MiB - 1024) + 17 * MiB + (2 * MiB - 512));
  EXPECT_EQ(s.inactive_split_bytes[kLargePool].current, 17 * MiB + (2 * MiB - 512));
  EXPECT_EQ(s.num_device_alloc, 3);
  EXPECT_EQ(s.num_device_free, 0);
  FragmentationMetrics f = a->fragmentation();
  EXPECT_EQ(f.cache_slack, 36 * MiB - alloc_bytes);
  EXPECT_EQ(f.rounding_waste, 24 + 412);
  EXPECT_EQ(f.inactive_split_bytes, s.inactive_split_bytes[kAggregatePool].current);
  EXPECT_EQ(f.largest_free_block, 17 * MiB);

  a->deallocate(p2);  // its 20 MiB segment becomes one free, unsplit block
  s = a->device_stats();
  EXPECT_EQ(s.allocation[kAggregatePool].current, 2);
  EXPECT_EQ(s.allocation[kAggregatePool].allocated, 3);
  EXPECT_EQ(s.allocation[kAggregatePool].freed, 1);
  EXPECT_EQ(s.allocated_bytes[kAggregatePool].freed, 3 * MiB);
  EXPECT_EQ(s.allocated_bytes[kAggregatePool].peak, alloc_bytes);
  EXPECT_EQ(s.requested_bytes[kLargePool].freed, 3 * MiB);
  EXPECT_EQ(s.inactive_split[kLargePool].current, 1);
  EXPECT_EQ(s.inactive_split_bytes[kLargePool].current, 2 * MiB - 512);
  EXPECT_EQ(s.reserved_bytes[kAggregatePool].current, 36 * MiB);  // cached, not returned
  EXPECT_EQ(a->fragmentation().largest_free_block, 20 * MiB);

  a->empty_cache();  // returns the unsplit 20 MiB segment only
  s = a->device_stats();
  EXPECT_EQ(s.reserved_bytes[kAggregatePool].current, 16 * MiB);
  EXPECT_EQ(s.reserved_bytes[kAggregatePool].peak, 36 * MiB);
  EXPECT_EQ(s.reserved_bytes[kAggregatePool].freed, 20 * MiB);
  EXPECT_EQ(s.segment[kAggregatePool].current, 2);
  EXPECT_EQ(s.num_device_free, 1);

  a->reset_peak_stats();
  s = a->device_stats();
  EXPECT_EQ(s.reserved_bytes[kAggregatePool].peak, 16 * MiB);
  EXPECT_EQ(s.allocated_bytes[kAggregatePool].peak, 1024 + 12 * MiB + 512);
  EXPECT_EQ(s.allocation[kAggregatePool].peak, 2);
  EXPECT_EQ(s.allocated_bytes[kAggregatePool].allocated, alloc_bytes);  // totals survive a peak reset
  EXPECT_EQ(a->stats().peak_reserved_bytes, 16 * MiB);
  void* p4 = a->allocate(5 * MiB);  // a new peak after the reset
  EXPECT_EQ(a->device_stats().reserved_bytes[kAggregatePool].peak, 36 * MiB);
  a->deallocate(p4);

  a->deallocate(p1);
  a->deallocate(p3);
  a->empty_cache();
  s = a->device_stats();
  EXPECT_EQ(s.reserved_bytes[kAggregatePool].current, 0);
  EXPECT_EQ(s.segment[kAggregatePool].current, 0);
  EXPECT_EQ(s.num_device_alloc, 4);
  EXPECT_EQ(s.num_device_free, 4);
  EXPECT_EQ(s.allocation[kAggregatePool].allocated, 4);
  EXPECT_EQ(s.allocation[kAggregatePool].freed, 4);
  EXPECT_EQ(s.requested_bytes[kAggregatePool].freed, req_bytes + 5 * MiB);
  const AllocatorStats simple = a->stats();
  EXPECT_EQ(simple.num_allocs, 4);
  EXPECT_EQ(simple.num_frees, 4);
  EXPECT_EQ(simple.allocated_bytes, 0);
  EXPECT_EQ(simple.reserved_bytes, 0);
  EXPECT_EQ(verify_caching_allocator(*a), "");
}

TEST(CachingStats, PeakFragmentation) {
  auto a = make_allocator(GiB);
  void* p = a->allocate(5 * MiB);  // active 5 MiB of 20 MiB reserved
  FragmentationMetrics f = a->fragmentation();
  EXPECT_DOUBLE_EQ(f.peak_fragmentation, 1.0 - 5.0 / 20.0);
  void* q = a->allocate(15 * MiB);  // fills the segment exactly
  EXPECT_DOUBLE_EQ(a->fragmentation().peak_fragmentation, 0.0);
  a->deallocate(p);
  a->deallocate(q);
  a->reset_peak_stats();  // peaks restart from the current: 0 active, 20 MiB reserved
  EXPECT_DOUBLE_EQ(a->fragmentation().peak_fragmentation, 1.0);
}

// A hole that empty_cache unmapped from an expandable segment holds no memory: it is neither stranded split memory
// nor a free block worth counting, so the stranded bytes stay within the cache slack.
TEST(CachingStats, UnmappedHoleIsNotStranded) {
  auto a = make_allocator(GiB, "expandable_segments:True");
  void* x = a->allocate(4 * MiB);
  void* y = a->allocate(4 * MiB);
  void* z = a->allocate(4 * MiB);
  a->deallocate(y);
  FragmentationMetrics f = a->fragmentation();
  EXPECT_EQ(f.inactive_split_bytes, 4 * MiB);  // mapped, cached between two live blocks
  EXPECT_EQ(f.cache_slack, 4 * MiB);
  a->empty_cache();
  f = a->fragmentation();
  EXPECT_EQ(a->stats().reserved_bytes, 8 * MiB);
  EXPECT_EQ(f.cache_slack, 0);
  EXPECT_EQ(f.inactive_split_bytes, 0);
  EXPECT_EQ(f.largest_free_block, 0);
  a->deallocate(x);
  a->deallocate(z);
  EXPECT_EQ(verify_caching_allocator(*a), "");
}

// ---- trace --------------------------------------------------------------------------------------------------

TEST(CachingTrace, EventsCarryActionsAndIds) {
  auto a = make_allocator(64 * MiB);
  a->enable_trace(64);
  void* p = a->allocate(1000);
  void* q = a->allocate(3 * MiB, 1);
  a->deallocate(p);
  a->annotate("step 1");
  a->empty_cache();  // the small segment goes back
  EXPECT_THROW(a->allocate(100 * MiB), OutOfMemoryError);
  const std::vector<TraceEvent> ev = a->trace();
  const TraceAction want[] = {TraceAction::SegmentAlloc, TraceAction::Alloc, TraceAction::SegmentAlloc,
                              TraceAction::Alloc,        TraceAction::Free,  TraceAction::Annotate,
                              TraceAction::EmptyCache,   TraceAction::SegmentFree, TraceAction::Oom};
  ASSERT_EQ(ev.size(), std::size(want));
  for (size_t i = 0; i < ev.size(); ++i) EXPECT_EQ(ev[i].action, want[i]) << i;
  EXPECT_EQ(ev[0].size, 2 * MiB);
  EXPECT_EQ(ev[1].id, 1u);
  EXPECT_EQ(ev[1].size, 1000);
  EXPECT_EQ(ev[1].block_size, 1024);
  EXPECT_EQ(ev[1].addr, addr(p));
  EXPECT_EQ(ev[1].allocated, 1024);
  EXPECT_EQ(ev[1].reserved, 2 * MiB);
  EXPECT_EQ(ev[2].size, 20 * MiB);
  EXPECT_EQ(ev[2].stream, 1u);
  EXPECT_EQ(ev[3].id, 2u);
  EXPECT_EQ(ev[3].size, 3 * MiB);
  EXPECT_EQ(ev[3].stream, 1u);
  EXPECT_EQ(ev[3].addr, addr(q));
  EXPECT_EQ(ev[4].id, 1u);
  EXPECT_EQ(ev[4].size, 1000);
  EXPECT_EQ(ev[5].note, "step 1");
  EXPECT_EQ(ev[6].reserved, 22 * MiB);  // empty_cache is recorded before it releases
  EXPECT_EQ(ev[7].size, 2 * MiB);
  EXPECT_EQ(ev[7].reserved, 20 * MiB);
  EXPECT_EQ(ev[8].size, 100 * MiB);
  for (size_t i = 1; i < ev.size(); ++i) EXPECT_LE(ev[i - 1].time_ns, ev[i].time_ns);
  a->disable_trace();
  a->deallocate(q);
  EXPECT_TRUE(a->trace().empty());
}

TEST(CachingTrace, ExpandableSegmentsTraceMapAndUnmap) {
  auto a = make_allocator(GiB, parse_alloc_config("expandable_segments:True"));
  a->enable_trace(64);
  void* p = a->allocate(3 * MiB);  // maps 4 MiB
  void* q = a->allocate(3 * MiB);  // maps 2 more
  a->deallocate(q);
  a->empty_cache();  // unmaps [4, 6) MiB; [3, 4) shares p's last page and stays mapped
  a->deallocate(p);
  a->empty_cache();
  std::vector<TraceAction> got;
  for (const TraceEvent& e : a->trace())
    if (e.action != TraceAction::Alloc && e.action != TraceAction::Free) got.push_back(e.action);
  const std::vector<TraceAction> want = {TraceAction::SegmentMap,   TraceAction::SegmentMap,
                                         TraceAction::EmptyCache,   TraceAction::SegmentUnmap,
                                         TraceAction::EmptyCache,   TraceAction::SegmentUnmap};
  EXPECT_EQ(got, want);
  EXPECT_TRUE(a->snapshot().empty());
}

// ---- poisoning ----------------------------------------------------------------------------------------------

TEST(CachingPoison, MaterializedAllocationsReadAsFF) {
  ASSERT_TRUE(poison_allocations()) << "the test main turns poisoning on";
  auto a = make_allocator(64 * MiB, {}, /*materialize=*/true);
  for (int64_t n : {int64_t{1}, int64_t{1000}, 3 * MiB + 7}) {
    auto* p = static_cast<unsigned char*>(a->allocate(n));
    for (int64_t i = 0; i < n; ++i) ASSERT_EQ(p[i], kPoisonByte) << n << " bytes, byte " << i;
    std::memset(p, 0, static_cast<size_t>(n));
    a->deallocate(p);
    auto* r = static_cast<unsigned char*>(a->allocate(n));  // the same block again, poisoned again
    ASSERT_EQ(r, p);
    for (int64_t i = 0; i < n; ++i) ASSERT_EQ(r[i], kPoisonByte) << n << " bytes, reused, byte " << i;
    a->deallocate(r);
  }
  // Without poisoning a reused block keeps its old bytes: poisoning is what wrote the 0xFF.
  set_poison_allocations(false);
  auto* p = static_cast<unsigned char*>(a->allocate(4096));
  std::memset(p, 0x11, 4096);
  a->deallocate(p);
  auto* r = static_cast<unsigned char*>(a->allocate(4096));
  set_poison_allocations(true);
  ASSERT_EQ(r, p);
  EXPECT_EQ(r[0], 0x11);
  EXPECT_EQ(r[4095], 0x11);
  a->deallocate(r);
}

}  // namespace

namespace {

TEST(CachingRules, PeakWindowsAreIndependentOfResetsAndOfEachOther) {
  auto a = make_allocator(GiB);
  void* base = a->allocate(1 * MiB);  // 1 MiB live before the windows open
  const uint64_t outer = a->open_peak_window();
  EXPECT_EQ(a->peak_window(outer), 1 * MiB);
  void* p = a->allocate(4 * MiB);
  a->deallocate(p);
  int64_t inner_peak = 0;
  {
    PeakWindow inner(*a);  // opens at 1 MiB, after the 4 MiB came and went
    a->reset_peak_stats();
    void* q = a->allocate(2 * MiB);
    inner_peak = inner.peak();
    a->deallocate(q);
  }
  EXPECT_EQ(inner_peak, 3 * MiB);
  EXPECT_EQ(a->peak_window(outer), 5 * MiB);  // the reset did not touch it
  EXPECT_EQ(a->stats().peak_allocated_bytes, 3 * MiB);
  a->close_peak_window(outer);
  EXPECT_THROW((void)a->peak_window(outer), ValueError);
  a->deallocate(base);
  EXPECT_EQ(verify_caching_allocator(*a), "");
  HostAllocator host;  // keeps no windows
  EXPECT_THROW((void)host.open_peak_window(), ValueError);
}

}  // namespace

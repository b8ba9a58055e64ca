// One CachingAllocator shared by several threads at once (built to run under ThreadSanitizer, scripts/sanitize tsan):
// workers allocate mixed sizes on their streams, record other streams and free, while an observer completes events,
// reads statistics and snapshots and empties the cache. Afterwards the statistics equal the workers' own totals.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <random>
#include <map>
#include <thread>
#include <vector>

#include "ember/memory/caching_allocator.h"
#include "tests/harness/op_harness.h"
#include "tests/memory/caching_test_util.h"

using namespace ember::memory;
using namespace caching_test;

namespace {

struct Held {
  void* ptr = nullptr;
  int64_t requested = 0;
};

// What one worker did, counted by the worker itself (the independent side of the final comparison).
struct WorkerTotals {
  int64_t allocs = 0, frees = 0, recorded = 0;
  std::vector<Held> held;  // still live when the worker finished
};

// The default configuration's rounding (DESIGN.md: 512-byte blocks), written out here rather than asked of the
// allocator.
int64_t rounded(int64_t n) { return std::max<int64_t>(512, round_up(n, 512)); }

TEST(AllocatorThreads, ConcurrentAllocRecordStreamFreeWithObserver) {
  const uint64_t seed = ember::testing::test_seed();
  auto a = make_allocator(8 * GiB);
  SimulatedBacking& sim = sim_of(*a);
  constexpr int kWorkers = 4, kOps = 3000;
  constexpr size_t kMaxHeld = 24;
  std::vector<WorkerTotals> totals(kWorkers);
  std::atomic<int> running{kWorkers};
  std::atomic<int64_t> observations{0};

  std::vector<std::thread> threads;
  for (int t = 0; t < kWorkers; ++t)
    threads.emplace_back([&, t] {
      std::mt19937_64 rng(seed * 7919 + static_cast<uint64_t>(t));
      WorkerTotals& mine = totals[static_cast<size_t>(t)];
      const StreamId stream = static_cast<StreamId>(t % 2);  // two workers per stream: they share its pool
      for (int i = 0; i < kOps; ++i) {
        if (mine.held.size() < kMaxHeld && (mine.held.empty() || rng() % 2 == 0)) {
          const uint64_t kind = rng() % 10;  // small (< 1 MiB), medium (1-10 MiB), or a few above 10 MiB
          const int64_t n = kind < 7 ? 1 + static_cast<int64_t>(rng() % (MiB - 1))
                            : kind < 9 ? MiB + static_cast<int64_t>(rng() % (9 * MiB))
                                       : 10 * MiB + static_cast<int64_t>(rng() % (6 * MiB));
          mine.held.push_back({a->allocate(n, stream), n});
          ++mine.allocs;
        } else {
          const size_t k = rng() % mine.held.size();
          if (rng() % 3 == 0) {  // used on a side stream too: the block waits for that stream's event when freed
            a->record_stream(mine.held[k].ptr, static_cast<StreamId>(2 + rng() % 2));
            ++mine.recorded;
          }
          a->deallocate(mine.held[k].ptr);
          ++mine.frees;
          mine.held[k] = mine.held.back();
          mine.held.pop_back();
        }
      }
      running.fetch_sub(1);
    });

  // The observer: everything a profiler or a training loop's report may call while other threads allocate.
  threads.emplace_back([&] {
    int64_t last_allocs = 0, n = 0;
    while (running.load() > 0) {
      const AllocatorStats st = a->stats();
      EXPECT_LE(st.allocated_bytes, st.reserved_bytes);
      EXPECT_LE(st.requested_bytes, st.allocated_bytes);
      EXPECT_LE(st.num_frees, st.num_allocs);
      EXPECT_GE(st.num_allocs, last_allocs) << "num_allocs went down";
      last_allocs = st.num_allocs;
      for (const SegmentSnapshot& s : a->snapshot()) {  // each snapshot is taken under the lock: consistent
        int64_t covered = 0;
        for (const BlockSnapshot& b : s.blocks) covered += b.size;
        EXPECT_EQ(covered, s.size) << "segment at " << s.addr;
      }
      (void)a->device_stats();
      (void)a->fragmentation();
      sim.complete_events();  // the side streams catch up
      if (n % 8 == 0) EXPECT_NO_THROW(a->check_invariants());
      if (n % 32 == 31) a->empty_cache();
      ++n;
      std::this_thread::yield();
    }
    observations.store(n);
  });
  for (std::thread& th : threads) th.join();

  int64_t allocs = 0, frees = 0, recorded = 0, live_rounded = 0, live_requested = 0;
  std::map<void*, int64_t> live;  // pointer -> bytes requested
  for (const WorkerTotals& w : totals) {
    allocs += w.allocs;
    frees += w.frees;
    recorded += w.recorded;
    for (const Held& h : w.held) {
      EXPECT_TRUE(live.emplace(h.ptr, h.requested).second) << "pointer " << h.ptr << " handed to two callers";
      live_rounded += rounded(h.requested);
      live_requested += h.requested;
    }
  }
  std::printf("[ threads ] seed %llu: %lld allocs, %lld frees (%lld after record_stream), %zu live, %lld observer "
              "rounds\n",
              static_cast<unsigned long long>(seed), static_cast<long long>(allocs), static_cast<long long>(frees),
              static_cast<long long>(recorded), live.size(), static_cast<long long>(observations.load()));
  EXPECT_EQ(allocs + frees, int64_t{kWorkers} * kOps);
  EXPECT_GT(recorded, 0);

  AllocatorStats st = a->stats();
  EXPECT_EQ(st.num_allocs, allocs);
  EXPECT_EQ(st.num_frees, frees);
  EXPECT_EQ(st.num_ooms, 0);
  EXPECT_EQ(st.requested_bytes, live_requested);
  // A block may be bigger than the rounded request (a large free block is split only when more than 1 MiB would
  // remain), so allocated_bytes is the sum of the live blocks' sizes, each at least its rounded request.
  const std::vector<SegmentSnapshot> snap = a->snapshot();
  int64_t live_block_bytes = 0, allocated_blocks = 0;
  for (const SegmentSnapshot& s : snap)
    for (const BlockSnapshot& b : s.blocks)
      if (b.allocated && !b.pending_events) ++allocated_blocks;
  for (const auto& [p, requested] : live) {
    const BlockSnapshot* b = find_block(snap, p);
    ASSERT_NE(b, nullptr) << "live pointer " << p << " is not a block";
    EXPECT_TRUE(b->allocated && !b->pending_events) << "live pointer " << p;
    EXPECT_EQ(b->requested, requested) << "live pointer " << p;
    EXPECT_GE(b->size, rounded(requested)) << "live pointer " << p;
    live_block_bytes += b->size;
  }
  EXPECT_EQ(allocated_blocks, static_cast<int64_t>(live.size()));
  EXPECT_EQ(st.allocated_bytes, live_block_bytes);
  EXPECT_GE(st.allocated_bytes, live_rounded);
  const DeviceStats ds = a->device_stats();
  EXPECT_EQ(ds.allocation[kAggregatePool].current, static_cast<int64_t>(live.size()));
  EXPECT_EQ(ds.allocation[kAggregatePool].allocated, allocs);
  EXPECT_EQ(ds.allocation[kAggregatePool].freed, frees);
  EXPECT_EQ(verify_caching_allocator(*a), "");
  EXPECT_NO_THROW(a->check_invariants());

  for (const auto& [p, requested] : live) a->deallocate(p);
  a->empty_cache();  // completes the outstanding events, then returns every segment
  st = a->stats();
  EXPECT_EQ(st.num_frees, allocs);
  EXPECT_EQ(st.allocated_bytes, 0);
  EXPECT_EQ(st.requested_bytes, 0);
  EXPECT_EQ(st.reserved_bytes, 0);
  EXPECT_TRUE(a->snapshot().empty());
  EXPECT_EQ(sim.used(), 0);
  EXPECT_EQ(sim.num_mallocs(), sim.num_frees());
  EXPECT_EQ(verify_caching_allocator(*a), "");
  EXPECT_NO_THROW(a->check_invariants());
}

}  // namespace

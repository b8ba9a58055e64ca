// parallel_for (core/parallel.h): every index of [0, n) is visited exactly once, chunks follow Note [Parallel chunks]
// (count, boundaries, alignment) for any thread count, nested calls run serially, an exception from a chunk reaches
// the caller after every chunk has finished, and two user threads can use the pool at once. References are the
// hand-computed chunk boundaries and plain counting.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "ember/base/error.h"
#include "ember/core/parallel.h"
#include "tests/harness/op_harness.h"

namespace ember::testing {
namespace {

TEST(Parallel, EveryIndexOnceForAnyThreadCountGrainAndAlignment) {
  for (int threads : {1, 2, 3, 8}) {
    ScopedNumThreads tc(threads);
    for (int64_t n : {1, 7, 100, 1000, 12345}) {
      for (int64_t grain : {1, 16, 1000}) {
        for (int64_t align : {1, 8, 48}) {
          SCOPED_TRACE(::testing::Message()
                       << "threads " << threads << " n " << n << " grain " << grain << " align " << align);
          std::vector<std::atomic<int>> hits(static_cast<size_t>(n));
          std::vector<int64_t> seen_chunks;
          std::mutex m;
          parallel::parallel_for(n, grain, align, [&](int64_t c, int64_t b, int64_t e) {
            ASSERT_LT(b, e);
            for (int64_t i = b; i < e; ++i) hits[static_cast<size_t>(i)].fetch_add(1);
            std::lock_guard<std::mutex> lk(m);
            seen_chunks.push_back(c);
          });
          for (int64_t i = 0; i < n; ++i) ASSERT_EQ(hits[static_cast<size_t>(i)].load(), 1) << "index " << i;
          const int64_t c = parallel::chunk_count(n, grain);
          EXPECT_EQ(c, std::clamp<int64_t>(n / grain, 1, threads));
          EXPECT_LE(static_cast<int64_t>(seen_chunks.size()), c);
        }
      }
    }
  }
}

TEST(Parallel, ChunkBoundariesAreFixedByTheSizes) {
  // chunk_begin(i) = floor(i * n / c) rounded down to a multiple of align; chunk c begins at n.
  EXPECT_EQ(parallel::chunk_begin(0, 3, 100, 1), 0);
  EXPECT_EQ(parallel::chunk_begin(1, 3, 100, 1), 33);
  EXPECT_EQ(parallel::chunk_begin(2, 3, 100, 1), 66);
  EXPECT_EQ(parallel::chunk_begin(3, 3, 100, 1), 100);
  EXPECT_EQ(parallel::chunk_begin(1, 2, 1000, 48), 480);  // 500 rounded down to 48 * 10
  EXPECT_EQ(parallel::chunk_begin(1, 2, 90, 48), 0);      // 45 -> 0: chunk 0 is empty, chunk 1 takes all
  ScopedNumThreads tc(2);
  std::vector<std::pair<int64_t, int64_t>> ranges(2, {-1, -1});
  parallel::parallel_for(1000, 48, 48, [&](int64_t c, int64_t b, int64_t e) {
    ranges[static_cast<size_t>(c)] = {b, e};
  });
  EXPECT_EQ(ranges[0], std::make_pair(int64_t{0}, int64_t{480}));
  EXPECT_EQ(ranges[1], std::make_pair(int64_t{480}, int64_t{1000}));
}

TEST(Parallel, NestedCallsRunSeriallyInsideAChunk) {
  ScopedNumThreads tc(4);
  std::atomic<int64_t> total{0};
  std::atomic<bool> nested_split{false};
  parallel::parallel_for(4, 1, [&](int64_t b, int64_t e) {
    EXPECT_TRUE(parallel::in_parallel_region());
    for (int64_t i = b; i < e; ++i) {
      if (parallel::chunk_count(1000, 1) != 1) nested_split = true;
      parallel::parallel_for(1000, 1, [&](int64_t nb, int64_t ne) {
        if (nb != 0 || ne != 1000) nested_split = true;
        total += ne - nb;
      });
    }
  });
  EXPECT_FALSE(nested_split.load());
  EXPECT_EQ(total.load(), 4000);
  EXPECT_FALSE(parallel::in_parallel_region());
}

TEST(Parallel, AnExceptionReachesTheCallerAfterEveryChunk) {
  ScopedNumThreads tc(3);
  std::atomic<int> finished{0};
  EXPECT_THROW(parallel::parallel_for(3, 1,
                                      [&](int64_t b, int64_t) {
                                        if (b == 1) throw std::runtime_error("chunk 1 failed");
                                        finished.fetch_add(1);
                                      }),
               std::runtime_error);
  EXPECT_EQ(finished.load(), 2);
  // The pool still works afterwards.
  std::atomic<int64_t> sum{0};
  parallel::parallel_for(300, 1, [&](int64_t b, int64_t e) { sum += e - b; });
  EXPECT_EQ(sum.load(), 300);
}

// Several chunks throw, the later ones first in time: the caller gets the lowest chunk's exception, as a serial run
// would raise it, whatever the timing.
TEST(Parallel, TheLowestThrowingChunksExceptionReachesTheCaller) {
  ScopedNumThreads tc(3);
  for (int rep = 0; rep < 20; ++rep) {
    std::atomic<bool> later_thrown{false};
    try {
      parallel::parallel_for(3, 1, 1, [&](int64_t chunk, int64_t, int64_t) {
        if (chunk == 0) {
          // Let a later chunk throw first when a worker runs it; on the caller alone it runs after this one.
          for (int spin = 0; spin < 100000 && !later_thrown.load(); ++spin) std::this_thread::yield();
          throw std::runtime_error("chunk 0");
        }
        later_thrown = true;
        throw std::runtime_error("chunk " + std::to_string(chunk));
      });
      ADD_FAILURE() << "no exception";
    } catch (const std::runtime_error& e) {
      EXPECT_STREQ(e.what(), "chunk 0");
    }
  }
}

TEST(Parallel, TwoUserThreadsShareThePool) {
  ScopedNumThreads tc(2);
  auto work = [](std::atomic<int64_t>& sum) {
    for (int rep = 0; rep < 200; ++rep) parallel::parallel_for(10000, 100, [&](int64_t b, int64_t e) { sum += e - b; });
  };
  std::atomic<int64_t> s1{0}, s2{0};
  std::thread t1(work, std::ref(s1)), t2(work, std::ref(s2));
  t1.join();
  t2.join();
  EXPECT_EQ(s1.load(), 200 * 10000);
  EXPECT_EQ(s2.load(), 200 * 10000);
}

TEST(Parallel, ClaimedItemsRunOnceEachOnTheirSlots) {
  for (int threads : {1, 2, 3}) {
    ScopedNumThreads tc(threads);
    for (int64_t items : {0, 1, 2, 5, 64}) {
      SCOPED_TRACE(::testing::Message() << "threads " << threads << " items " << items);
      const int64_t slots = parallel::chunk_count(items, 1);
      std::vector<std::atomic<int>> hits(static_cast<size_t>(items));
      std::atomic<int> bad_slot{0};
      parallel::for_each_claimed(items, std::max<int64_t>(slots, 1), [&](int64_t slot, int64_t item) {
        if (slot < 0 || slot >= std::max<int64_t>(slots, 1)) ++bad_slot;
        ++hits[static_cast<size_t>(item)];
      });
      EXPECT_EQ(bad_slot.load(), 0);
      for (int64_t i = 0; i < items; ++i) EXPECT_EQ(hits[static_cast<size_t>(i)].load(), 1) << i;
    }
    // Inside a chunk: one slot, every item on the calling thread.
    std::atomic<int> inner{0};
    parallel::parallel_for(2, 1, [&](int64_t, int64_t) {
      parallel::for_each_claimed(5, 1, [&](int64_t slot, int64_t) { inner += slot == 0 ? 1 : 100; });
    });
    EXPECT_EQ(inner.load(), threads >= 2 ? 10 : 5);
  }
}

TEST(Parallel, BadThreadCountsAreConfigErrors) {
  const int before = get_num_threads();
  EXPECT_THROW(set_num_threads(0), ConfigError);
  EXPECT_THROW(set_num_threads(-3), ConfigError);
  EXPECT_THROW(set_num_threads(100000), ConfigError);
  EXPECT_EQ(get_num_threads(), before);
  ScopedNumThreads tc(1);
  EXPECT_EQ(get_num_threads(), 1);
  EXPECT_EQ(parallel::chunk_count(1 << 20, 1), 1);
}

}  // namespace
}  // namespace ember::testing

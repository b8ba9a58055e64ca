// The generator shared by several threads (built to run under ThreadSanitizer too, scripts/sanitize tsan): concurrent
// reserve() calls get disjoint counter ranges that tile the stream, and concurrent rand() draws from the default
// generator are exactly the draws one thread makes from the same seed, in some order.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <thread>
#include <utility>
#include <vector>

#include "ember/core/generator.h"
#include "ember/core/tensor.h"

using namespace ember;

namespace {

constexpr int kThreads = 4;

TEST(GeneratorThreads, ConcurrentReservesTileTheStream) {
  Generator g(123);
  constexpr int kDraws = 2000;
  std::vector<std::vector<std::pair<uint64_t, uint64_t>>> ranges(kThreads);  // (offset, counters) per thread
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t)
    threads.emplace_back([&, t] {
      for (int i = 0; i < kDraws; ++i) {
        const uint64_t counters = 1 + static_cast<uint64_t>((t * 7 + i) % 5);
        const PhiloxState s = g.reserve(counters);
        EXPECT_EQ(s.seed, 123u);
        ranges[static_cast<size_t>(t)].emplace_back(s.offset, counters);
      }
    });
  for (std::thread& th : threads) th.join();
  std::vector<std::pair<uint64_t, uint64_t>> all;
  uint64_t total = 0;
  for (const auto& r : ranges) {
    all.insert(all.end(), r.begin(), r.end());
    for (const auto& [offset, counters] : r) total += counters;
  }
  std::sort(all.begin(), all.end());
  uint64_t next = 0;  // the ranges, sorted, must follow one another with no gap and no overlap
  for (const auto& [offset, counters] : all) {
    ASSERT_EQ(offset, next) << "a counter range overlaps another or leaves a gap";
    next = offset + counters;
  }
  EXPECT_EQ(next, total);
  EXPECT_EQ(g.state().offset, total);
}

TEST(GeneratorThreads, ConcurrentDrawsPartitionOneThreadsStream) {
  constexpr int kDraws = 50;
  constexpr int64_t kNumel = 37;
  auto values = [](const Tensor& t) { return t.to_vector<float>(); };
  // The stream one thread draws from seed 77.
  manual_seed(77);
  std::vector<std::vector<float>> sequential;
  for (int i = 0; i < kThreads * kDraws; ++i) sequential.push_back(values(rand({kNumel})));
  const uint64_t offset_after = default_generator().state().offset;

  manual_seed(77);
  std::vector<std::vector<std::vector<float>>> drawn(kThreads);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t)
    threads.emplace_back([&, t] {
      for (int i = 0; i < kDraws; ++i) drawn[static_cast<size_t>(t)].push_back(values(rand({kNumel})));
    });
  for (std::thread& th : threads) th.join();
  std::vector<std::vector<float>> concurrent;
  for (auto& d : drawn) concurrent.insert(concurrent.end(), d.begin(), d.end());
  EXPECT_EQ(default_generator().state().offset, offset_after);
  std::sort(sequential.begin(), sequential.end());
  std::sort(concurrent.begin(), concurrent.end());
  EXPECT_EQ(concurrent, sequential) << "concurrent draws are not the single-threaded stream's draws";
}

}  // namespace

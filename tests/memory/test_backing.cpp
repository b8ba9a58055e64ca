// Backings under the caching allocator: host memory (alignment, immediate events) and the simulated device
// (capacity exhaustion returns nullptr, used() accounting, fake-address uniqueness and alignment, deferred event
// completion, expandable map/unmap page accounting, materialised pages that really hold data, thread safety).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <map>
#include <mutex>
#include <random>
#include <set>
#include <thread>
#include <vector>

#include "ember/base/error.h"
#include "ember/memory/alloc_config.h"
#include "ember/memory/backing.h"
#include "tests/harness/op_harness.h"

using ember::ValueError;
using namespace ember::memory;

namespace {

constexpr int64_t KiB = 1024, MiB = 1024 * KiB, GiB = 1024 * MiB;
constexpr int64_t kPage = 2 * MiB;

uintptr_t addr(const void* p) { return reinterpret_cast<uintptr_t>(p); }
char* at(void* p, int64_t off) { return static_cast<char*>(p) + off; }

// Writes a position-dependent pattern to [p, p+n) and checks it reads back.
void write_and_check(void* p, int64_t n, unsigned salt) {
  auto* b = static_cast<unsigned char*>(p);
  for (int64_t i = 0; i < n; i += 4093) b[i] = static_cast<unsigned char>((i / 4093 + salt) & 0xFF);
  b[n - 1] = static_cast<unsigned char>(salt ^ 0x5A);
  for (int64_t i = 0; i < n - 1; i += 4093) ASSERT_EQ(b[i], static_cast<unsigned char>((i / 4093 + salt) & 0xFF));
  ASSERT_EQ(b[n - 1], static_cast<unsigned char>(salt ^ 0x5A));
}

}  // namespace

// ---- host backing -------------------------------------------------------------------------------------------------

TEST(HostBacking, UnboundedAndAligned) {
  auto b = make_host_backing();
  EXPECT_EQ(b->name(), "host");
  EXPECT_EQ(b->capacity(), kNoLimit);
  EXPECT_EQ(b->available(), kNoLimit);
  EXPECT_TRUE(b->materialized());
  for (int64_t n : {int64_t{1}, int64_t{511}, int64_t{512}, int64_t{513}, 3 * KiB + 7, 2 * MiB, 20 * MiB + 1}) {
    void* p = b->malloc(n);
    ASSERT_NE(p, nullptr) << n;
    EXPECT_EQ(addr(p) % 512, 0u) << n;
    write_and_check(p, n, static_cast<unsigned>(n));
    b->free(p, n);
  }
  EXPECT_THROW(b->malloc(0), ValueError);
  EXPECT_THROW(b->malloc(-5), ValueError);
}

TEST(HostBacking, EventsCompleteImmediately) {
  auto b = make_host_backing();
  std::set<EventId> ids;
  for (StreamId s : {StreamId{0}, StreamId{7}, StreamId{7}, StreamId{123456}}) {
    const EventId e = b->record_event(s);
    EXPECT_TRUE(ids.insert(e).second) << "event ids repeat";
    EXPECT_TRUE(b->event_completed(e));
  }
  for (EventId e : ids) b->release_event(e);
  b->synchronize();
}

TEST(HostBacking, NoExpandableSegments) {
  auto b = make_host_backing();
  EXPECT_FALSE(b->supports_expandable());
  EXPECT_EQ(b->reserve_range(4 * kPage), nullptr);
  int dummy = 0;
  EXPECT_FALSE(b->map(&dummy, kPage));
}

// ---- simulated backing: segments --------------------------------------------------------------------------------

TEST(SimBacking, RejectsNonPositiveCapacity) {
  EXPECT_THROW(SimulatedBacking(0, false), ValueError);
  EXPECT_THROW(SimulatedBacking(-1, true), ValueError);
}

TEST(SimBacking, NameAndKind) {
  auto b = make_simulated_backing(6 * GiB, false);
  EXPECT_NE(b->name().find("6.00 GiB"), std::string::npos) << b->name();
  EXPECT_FALSE(b->materialized());
  EXPECT_TRUE(make_simulated_backing(MiB, true)->materialized());
  EXPECT_EQ(b->capacity(), 6 * GiB);
  EXPECT_TRUE(b->supports_expandable());
  EXPECT_EQ(b->page_size(), kPage);
}

TEST(SimBacking, CapacityExhaustionReturnsNullAndAccountsUsed) {
  for (bool materialize : {false, true}) {
    SCOPED_TRACE(materialize ? "materialised" : "address-only");
    auto b = make_simulated_backing(10 * MiB, materialize);
    EXPECT_EQ(b->used(), 0);
    EXPECT_EQ(b->available(), 10 * MiB);
    void* a = b->malloc(4 * MiB);
    void* c = b->malloc(4 * MiB);
    ASSERT_NE(a, nullptr);
    ASSERT_NE(c, nullptr);
    EXPECT_EQ(b->used(), 8 * MiB);
    EXPECT_EQ(b->available(), 2 * MiB);
    EXPECT_EQ(b->malloc(4 * MiB), nullptr);      // does not fit: nullptr, no throw
    EXPECT_EQ(b->malloc(2 * MiB + 1), nullptr);  // one byte too many
    EXPECT_EQ(b->used(), 8 * MiB);               // failed requests take nothing
    void* d = b->malloc(2 * MiB);                // exactly fills the device
    ASSERT_NE(d, nullptr);
    EXPECT_EQ(b->used(), 10 * MiB);
    EXPECT_EQ(b->available(), 0);
    EXPECT_EQ(b->malloc(1), nullptr);
    EXPECT_EQ(b->num_mallocs(), 3);
    b->free(c, 4 * MiB);
    EXPECT_EQ(b->used(), 6 * MiB);
    EXPECT_EQ(b->num_frees(), 1);
    void* e = b->malloc(3 * MiB);  // the freed room is usable again
    ASSERT_NE(e, nullptr);
    EXPECT_EQ(b->used(), 9 * MiB);
    b->free(a, 4 * MiB);
    b->free(d, 2 * MiB);
    b->free(e, 3 * MiB);
    EXPECT_EQ(b->used(), 0);
    EXPECT_EQ(b->num_mallocs(), 4);
    EXPECT_EQ(b->num_frees(), 4);
    EXPECT_THROW(b->malloc(0), ValueError);
  }
}

TEST(SimBacking, InvalidFreesThrow) {
  auto b = make_simulated_backing(10 * MiB, false);
  void* p = b->malloc(MiB);
  EXPECT_THROW(b->free(p, 2 * MiB), ValueError);  // wrong size
  int local = 0;
  EXPECT_THROW(b->free(&local, 4), ValueError);  // not ours
  b->free(p, MiB);
  EXPECT_THROW(b->free(p, MiB), ValueError);  // double free
  EXPECT_EQ(b->used(), 0);
}

TEST(SimBacking, FakeAddressesAreUniqueAlignedAndNeverOverlap) {
  const uint64_t seed = ember::testing::test_seed();
  std::printf("FakeAddressesAreUniqueAlignedAndNeverOverlap seed=%llu\n", static_cast<unsigned long long>(seed));
  std::mt19937_64 rng(seed);
  auto b = make_simulated_backing(1024 * GiB, false);
  std::map<uintptr_t, int64_t> live;
  std::set<uintptr_t> ever;
  int64_t used = 0;
  bool first = true;
  for (int i = 0; i < 4000; ++i) {
    if (!live.empty() && rng() % 3 == 0) {
      auto it = live.begin();
      std::advance(it, static_cast<long>(rng() % live.size()));
      b->free(reinterpret_cast<void*>(it->first), it->second);
      used -= it->second;
      live.erase(it);
      continue;
    }
    const int64_t n = 1 + static_cast<int64_t>(rng() % (64 * MiB));
    void* p = b->malloc(n);
    ASSERT_NE(p, nullptr);
    if (first) EXPECT_EQ(addr(p), uintptr_t{0x10000000000});
    first = false;
    EXPECT_EQ(addr(p) % 512, 0u);
    EXPECT_TRUE(ever.insert(addr(p)).second) << "address handed out twice (seed " << seed << ")";
    auto next = live.lower_bound(addr(p));
    if (next != live.end()) EXPECT_LE(addr(p) + static_cast<uintptr_t>(n), next->first);
    if (next != live.begin()) {
      auto prev = std::prev(next);
      EXPECT_LE(prev->first + static_cast<uintptr_t>(prev->second), addr(p));
    }
    live.emplace(addr(p), n);
    used += n;
    ASSERT_EQ(b->used(), used);
  }
  for (auto [p, n] : live) b->free(reinterpret_cast<void*>(p), n);
  EXPECT_EQ(b->used(), 0);
}

TEST(SimBacking, AddressOnlyHandsOutMoreThanTheHostHas) {
  // 40 x 2 GiB on an "80 GiB device": no real memory is touched.
  auto b = make_simulated_backing(80 * GiB, false);
  std::vector<void*> ptrs;
  for (int i = 0; i < 40; ++i) {
    void* p = b->malloc(2 * GiB);
    ASSERT_NE(p, nullptr) << i;
    ptrs.push_back(p);
  }
  EXPECT_EQ(b->used(), 80 * GiB);
  EXPECT_EQ(b->malloc(512), nullptr);
  for (void* p : ptrs) b->free(p, 2 * GiB);
  EXPECT_EQ(b->used(), 0);
}

TEST(SimBacking, MaterialisedSegmentsHoldData) {
  auto b = make_simulated_backing(64 * MiB, true);
  std::vector<std::pair<void*, int64_t>> segs;
  for (int64_t n : {int64_t{1}, int64_t{1000}, 2 * MiB, 20 * MiB + 3}) {
    void* p = b->malloc(n);
    ASSERT_NE(p, nullptr);
    EXPECT_EQ(addr(p) % 512, 0u);
    write_and_check(p, n, static_cast<unsigned>(segs.size()));
    segs.emplace_back(p, n);
  }
  // Every segment still holds its own pattern after the others were written.
  for (size_t i = 0; i < segs.size(); ++i) write_and_check(segs[i].first, segs[i].second, static_cast<unsigned>(i));
  for (auto [p, n] : segs) b->free(p, n);
}

// ---- simulated backing: events ----------------------------------------------------------------------------------

TEST(SimBacking, EventsCompleteOnlyWhenTold) {
  auto b = make_simulated_backing(GiB, false);
  const EventId e1 = b->record_event(1);
  const EventId e2 = b->record_event(2);
  EXPECT_NE(e1, e2);
  EXPECT_FALSE(b->event_completed(e1));
  EXPECT_FALSE(b->event_completed(e2));
  EXPECT_FALSE(b->event_completed(e1));  // asking does not complete it
  b->complete_events();
  EXPECT_TRUE(b->event_completed(e1));
  EXPECT_TRUE(b->event_completed(e2));
  const EventId e3 = b->record_event(1);  // recorded after the completion: pending again
  EXPECT_NE(e3, e1);
  EXPECT_NE(e3, e2);
  EXPECT_FALSE(b->event_completed(e3));
  b->synchronize();
  EXPECT_TRUE(b->event_completed(e3));
  b->release_event(e1);
  EXPECT_THROW(b->event_completed(e1), ValueError);  // forgotten
  EXPECT_THROW(b->release_event(e1), ValueError);
  EXPECT_THROW(b->event_completed(987654321), ValueError);
  b->release_event(e2);
  b->release_event(e3);
}

// ---- simulated backing: expandable segments ---------------------------------------------------------------------

TEST(SimBacking, ExpandableMapUnmapAccounting) {
  for (bool materialize : {false, true}) {
    SCOPED_TRACE(materialize ? "materialised" : "address-only");
    auto b = make_simulated_backing(10 * MiB, materialize);
    char* base = static_cast<char*>(b->reserve_range(5 * MiB));  // rounded up to 3 pages
    ASSERT_NE(base, nullptr);
    EXPECT_EQ(addr(base) % kPage, 0u);
    EXPECT_EQ(b->used(), 0);                                     // address space is free
    char* big = static_cast<char*>(b->reserve_range(64 * MiB));  // more than the capacity: still only addresses
    ASSERT_NE(big, nullptr);
    EXPECT_TRUE(addr(big) >= addr(base) + 6 * MiB || addr(big) + 64 * MiB <= addr(base)) << "ranges overlap";

    EXPECT_TRUE(b->map(base, 2 * kPage));
    EXPECT_EQ(b->used(), 4 * MiB);
    EXPECT_TRUE(b->map(base + 2 * kPage, kPage));
    EXPECT_EQ(b->used(), 6 * MiB);
    EXPECT_TRUE(b->map(big, 2 * kPage));
    EXPECT_EQ(b->used(), 10 * MiB);
    EXPECT_EQ(b->available(), 0);
    EXPECT_FALSE(b->map(big + 2 * kPage, kPage));  // out of room: false, nothing changes
    EXPECT_EQ(b->used(), 10 * MiB);
    EXPECT_EQ(b->malloc(512), nullptr);  // segments and pages share the capacity

    b->unmap(base + kPage, kPage);  // a hole in the middle
    EXPECT_EQ(b->used(), 8 * MiB);
    EXPECT_TRUE(b->map(big + 2 * kPage, kPage));
    EXPECT_EQ(b->used(), 10 * MiB);
    b->unmap(big, 3 * kPage);
    EXPECT_EQ(b->used(), 4 * MiB);
    EXPECT_TRUE(b->map(base + kPage, kPage));  // the hole can be mapped again
    EXPECT_EQ(b->used(), 6 * MiB);

    // Releasing a range with pages still mapped gives their bytes back.
    b->release_range(base, 5 * MiB);
    EXPECT_EQ(b->used(), 0);
    b->release_range(big, 64 * MiB);
    EXPECT_EQ(b->used(), 0);
    EXPECT_EQ(b->available(), 10 * MiB);
  }
}

TEST(SimBacking, ExpandableMisuseThrows) {
  auto b = make_simulated_backing(100 * MiB, false);
  char* base = static_cast<char*>(b->reserve_range(4 * kPage));
  ASSERT_NE(base, nullptr);
  ASSERT_TRUE(b->map(base, kPage));
  EXPECT_THROW(b->map(base, kPage), ValueError);                    // already mapped
  EXPECT_THROW(b->map(base + 512, kPage), ValueError);              // not on a page boundary
  EXPECT_THROW(b->map(base + kPage, kPage + 512), ValueError);      // not a whole number of pages
  EXPECT_THROW(b->map(base + 3 * kPage, 2 * kPage), ValueError);    // past the end of the range
  EXPECT_THROW(b->map(base - kPage, kPage), ValueError);            // before the range
  EXPECT_THROW(b->unmap(base + kPage, kPage), ValueError);          // not mapped
  EXPECT_THROW(b->release_range(base + kPage, kPage), ValueError);  // not a range start
  EXPECT_THROW(b->release_range(base, 8 * kPage), ValueError);      // wrong size
  EXPECT_THROW(b->reserve_range(0), ValueError);
  EXPECT_EQ(b->used(), kPage);
  b->unmap(base, kPage);
  b->release_range(base, 4 * kPage);
  EXPECT_THROW(b->map(base, kPage), ValueError);  // the range is gone
  EXPECT_EQ(b->used(), 0);
}

TEST(SimBacking, MaterialisedMappedPagesHoldData) {
  auto b = make_simulated_backing(16 * MiB, true);
  char* base = static_cast<char*>(b->reserve_range(8 * GiB));  // large reservation: address space only
  ASSERT_NE(base, nullptr);
  ASSERT_TRUE(b->map(base, 3 * kPage));
  write_and_check(base, 3 * kPage, 1);
  ASSERT_TRUE(b->map(base + 3 * kPage, kPage));  // grow in place: the old bytes stay, the new page is usable
  write_and_check(base + 3 * kPage, kPage, 2);
  EXPECT_EQ(static_cast<unsigned char>(base[3 * kPage - 1]), static_cast<unsigned char>(1 ^ 0x5A));
  b->unmap(base + 2 * kPage, 2 * kPage);
  EXPECT_EQ(static_cast<unsigned char>(base[0]), 1u);  // pages that stay mapped keep their contents
  ASSERT_TRUE(b->map(base + 2 * kPage, kPage));
  write_and_check(base + 2 * kPage, kPage, 3);
  EXPECT_EQ(b->used(), 3 * kPage);
  b->unmap(base, 3 * kPage);
  b->release_range(base, 8 * GiB);
  EXPECT_EQ(b->used(), 0);
}

// ---- thread safety ----------------------------------------------------------------------------------------------

TEST(SimBacking, ConcurrentUseKeepsAccountsExact) {
  for (bool materialize : {false, true}) {
    SCOPED_TRACE(materialize ? "materialised" : "address-only");
    auto b = make_simulated_backing(64 * MiB, materialize);
    constexpr int kThreads = 4, kIters = 2000;
    std::mutex mu;
    std::set<EventId> events;
    std::vector<std::thread> threads;
    for (int t = 0; t < kThreads; ++t) {
      threads.emplace_back([&, t] {
        std::vector<EventId> mine;
        for (int i = 0; i < kIters; ++i) {
          const int64_t n = 4 * KiB * (1 + (i + t) % 8);
          void* p = b->malloc(n);
          if (p == nullptr) continue;  // 4 threads x 32 KiB always fit, but stay honest
          if (materialize) std::memset(p, t, static_cast<size_t>(n));
          mine.push_back(b->record_event(static_cast<StreamId>(t)));
          b->free(p, n);
        }
        std::lock_guard<std::mutex> lock(mu);
        for (EventId e : mine) EXPECT_TRUE(events.insert(e).second) << "event id handed out twice";
      });
    }
    for (auto& th : threads) th.join();
    EXPECT_EQ(b->used(), 0);
    EXPECT_EQ(b->num_mallocs(), kThreads * kIters);
    EXPECT_EQ(b->num_frees(), kThreads * kIters);
    EXPECT_EQ(events.size(), static_cast<size_t>(kThreads * kIters));
    for (EventId e : events) EXPECT_FALSE(b->event_completed(e));
    b->synchronize();
    for (EventId e : events) {
      EXPECT_TRUE(b->event_completed(e));
      b->release_event(e);
    }
  }
}

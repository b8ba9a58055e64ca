// The OOM ladder and OutOfMemoryError: cached memory is returned to the device (oversize blocks first, then pending
// stream frees, then every unsplit block) before a request fails; on a simulated 6 GiB device the error carries
// the numbers, gives advice only where a replay proves it, and the allocator stays consistent and usable.
#include <gtest/gtest.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "ember/base/error.h"
#include "ember/memory/caching_allocator.h"
#include "tests/memory/caching_test_util.h"

using namespace ember;
using namespace ember::memory;
using namespace caching_test;


namespace {





// Runs `fn`, which must throw OutOfMemoryError; returns it (or fails the test).
template <class F>
OutOfMemoryError expect_oom(F&& fn) {
  try {
    fn();
  } catch (const OutOfMemoryError& e) {
    return e;
  }
  ADD_FAILURE() << "expected OutOfMemoryError";
  return OutOfMemoryError("none", 0, 0, 0, 0);
}

// ---- the ladder ---------------------------------------------------------------------------------------------

TEST(CachingOom, LadderFreesCachedBlocksBeforeFailing) {
  auto a = make_allocator(64 * MiB);
  std::vector<void*> blocks;
  for (int i = 0; i < 3; ++i) blocks.push_back(a->allocate(16 * MiB));
  for (void* p : blocks) a->deallocate(p);  // 48 MiB cached in three unsplit 16 MiB segments
  // 32 MiB fits no cached block and 48 + 32 > 64: the cache is emptied and the backing asked again.
  void* p = a->allocate(32 * MiB);
  const DeviceStats s = a->device_stats();
  EXPECT_EQ(s.num_alloc_retries, 1);
  EXPECT_EQ(s.num_device_free, 3);
  EXPECT_EQ(s.num_device_alloc, 4);
  EXPECT_EQ(s.num_ooms, 0);
  EXPECT_EQ(a->stats().reserved_bytes, 32 * MiB);
  EXPECT_EQ(a->snapshot().size(), 1u);
  EXPECT_EQ(verify_caching_allocator(*a), "");
  a->deallocate(p);
}

TEST(CachingOom, LadderFreesOversizeBlocksFirst) {
  auto a = make_allocator(100 * MiB, "max_split_size_mb:40");
  void* big = a->allocate(60 * MiB);
  void* mid = a->allocate(16 * MiB);
  a->deallocate(big);
  a->deallocate(mid);
  // 30 MiB: the 60 MiB block is oversize (refused), 16 MiB too small; 76 + 30 > 100. Releasing the oversize block
  // is enough: the 16 MiB segment survives and no full retry is counted.
  void* p = a->allocate(30 * MiB);
  const auto snap = a->snapshot();
  EXPECT_FALSE(has_segment_at(snap, big));
  EXPECT_TRUE(has_segment_at(snap, mid));
  const DeviceStats s = a->device_stats();
  EXPECT_EQ(s.num_device_free, 1);
  EXPECT_EQ(s.num_alloc_retries, 0);
  EXPECT_EQ(s.oversize_segments.current, 0);
  EXPECT_EQ(a->stats().reserved_bytes, 46 * MiB);
  EXPECT_EQ(verify_caching_allocator(*a), "");
  a->deallocate(p);
}

TEST(CachingOom, LadderWaitsForPendingStreamFrees) {
  auto a = make_allocator(20 * MiB);
  void* A = a->allocate(16 * MiB, 0);
  a->record_stream(A, 1);
  a->deallocate(A);  // pending until stream 1's event completes: nobody calls complete_events()
  void* B = a->allocate(16 * MiB, 0);  // 16 + 16 > 20: the ladder synchronises, A's block comes back
  EXPECT_EQ(B, A);
  const DeviceStats s = a->device_stats();
  EXPECT_EQ(s.num_sync_all_streams, 1);
  EXPECT_EQ(s.num_alloc_retries, 1);
  EXPECT_EQ(s.num_device_alloc, 1);
  EXPECT_EQ(s.num_device_free, 0);
  EXPECT_EQ(verify_caching_allocator(*a), "");
  a->deallocate(B);
}

// ---- the error on a simulated 6 GiB device ----------------------------------------------------------------

TEST(CachingOom, FullDeviceGivesTheHonestAlternative) {
  auto a = make_allocator(6 * GiB);
  void* x = a->allocate(5 * GiB);
  void* y = a->allocate(3 * MiB);  // a 20 MiB segment: 17 MiB reserved but unallocated
  const OutOfMemoryError e = expect_oom([&] { a->allocate(GiB); });
  EXPECT_EQ(e.requested(), GiB);
  EXPECT_EQ(e.capacity(), 6 * GiB);
  EXPECT_EQ(e.allocated(), 5 * GiB + 3 * MiB);
  EXPECT_EQ(e.reserved(), 5 * GiB + 20 * MiB);
  const std::string msg = e.what();
  for (const char* part : {"tried to allocate 1.00 GiB", "6.00 GiB", "5.00 GiB allocated", "5.02 GiB reserved",
                           "17.00 MiB is reserved but unallocated", "largest 17.00 MiB", "smaller batch",
                           "checkpointing", "mixed precision"})
    EXPECT_TRUE(contains(msg, part)) << "missing \"" << part << "\" in: " << msg;
  for (const char* knob : {"EMBER_ALLOC_CONF", "expandable_segments", "max_split_size"})
    EXPECT_FALSE(contains(msg, knob)) << "suggests " << knob << " although no setting helps: " << msg;
  // Consistent afterwards, nothing lost or leaked by the failed request.
  EXPECT_NO_THROW(a->check_invariants());
  EXPECT_EQ(verify_caching_allocator(*a), "");
  EXPECT_EQ(a->stats().num_ooms, 1);
  EXPECT_EQ(a->device_stats().num_ooms, 1);
  EXPECT_EQ(a->stats().allocated_bytes, 5 * GiB + 3 * MiB);
  // Freeing memory makes the request work: served from the cached 5 GiB block, no device call.
  a->deallocate(x);
  const int64_t device_allocs = a->device_stats().num_device_alloc;
  void* z = a->allocate(GiB);
  EXPECT_EQ(z, x);
  EXPECT_EQ(a->device_stats().num_device_alloc, device_allocs);
  a->deallocate(z);
  a->deallocate(y);
  void* w = a->allocate(5 * GiB + GiB / 2);  // needs the cached segments released first
  EXPECT_NE(w, nullptr);
  EXPECT_EQ(verify_caching_allocator(*a), "");
  a->deallocate(w);
}

TEST(CachingOom, FragmentationSuggestsExpandableSegments) {
  // 7 MiB blocks in 20 MiB segments: two per segment, 6 MiB left in each. 307 segments fill 6 GiB (6140 MiB)
  // with 614 blocks; the 615th fails with 307 x 6 MiB = 1842 MiB reserved but unallocated.
  auto a = make_allocator(6 * GiB);
  std::vector<void*> blocks;
  for (int i = 0; i < 614; ++i) blocks.push_back(a->allocate(7 * MiB));
  const OutOfMemoryError e = expect_oom([&] { a->allocate(7 * MiB); });
  EXPECT_EQ(e.reserved(), 6140 * MiB);
  EXPECT_EQ(e.allocated(), 614 * 7 * MiB);
  const std::string msg = e.what();
  for (const char* part : {"tried to allocate 7.00 MiB", "1.80 GiB is reserved but unallocated",
                           "307 free block(s)", "largest 6.00 MiB", "EMBER_ALLOC_CONF=expandable_segments"})
    EXPECT_TRUE(contains(msg, part)) << "missing \"" << part << "\" in: " << msg;
  EXPECT_FALSE(contains(msg, "max_split_size")) << "max_split_size_mb does not help here: " << msg;
  EXPECT_FALSE(contains(msg, "smaller batch")) << msg;
  EXPECT_NO_THROW(a->check_invariants());
  EXPECT_EQ(verify_caching_allocator(*a), "");
  // The advice is true: with expandable segments all 615 fit.
  for (void* p : blocks) a->deallocate(p);
  a->empty_cache();
  a->set_config(parse_alloc_config("expandable_segments:True"));
  blocks.clear();
  for (int i = 0; i < 615; ++i) ASSERT_NO_THROW(blocks.push_back(a->allocate(7 * MiB))) << i;
  EXPECT_EQ(verify_caching_allocator(*a), "");
  for (void* p : blocks) a->deallocate(p);
}

// The live bytes and the request fit the device, the cache holds less than the request, and the device's free
// memory is smaller than the 20 MiB segment a 4 MiB request gets: not a case of "no setting helps" — packed afresh
// under expandable segments (pages, not segments) the request fits, and the message says so.
TEST(CachingOom, FreeDeviceMemorySmallerThanTheSegmentSuggestsExpandableSegments) {
  auto a = make_allocator(30 * MiB, "expandable_segments:False");
  void* x = a->allocate(12 * MiB);  // a segment of its own (12 MiB)
  const OutOfMemoryError e = expect_oom([&] { a->allocate(4 * MiB); });
  const std::string msg = e.what();
  for (const char* part : {"12.00 MiB allocated", "0 B is reserved but unallocated", "reports 18.00 MiB free",
                           "EMBER_ALLOC_CONF=expandable_segments:True"})
    EXPECT_TRUE(contains(msg, part)) << "missing \"" << part << "\" in: " << msg;
  EXPECT_FALSE(contains(msg, "no allocator setting")) << msg;
  EXPECT_FALSE(contains(msg, "smaller batch")) << msg;
  a->deallocate(x);
  EXPECT_EQ(verify_caching_allocator(*a), "");
  auto b = make_allocator(30 * MiB, "expandable_segments:True");  // the advice is true
  void* bx = b->allocate(12 * MiB);
  void* by = nullptr;
  EXPECT_NO_THROW(by = b->allocate(4 * MiB));
  b->deallocate(by);
  b->deallocate(bx);
}

// Memory another process holds counts against what could be packed: 30 MiB live and a 20 MiB request fit the
// 64 MiB device, but not the 44 MiB this allocator can have beside the other's 20 MiB — no setting helps, and the
// message must not suggest one (a replay on the whole 64 MiB would "serve" the request). Two allocators on one device:
// `other` stands for another process.
TEST(CachingOom, MemoryHeldElsewhereCountsAgainstTheReplays) {
  std::shared_ptr<Backing> device(make_simulated_backing(64 * MiB, /*materialize=*/false));
  CachingAllocator other(std::make_unique<ForwardingBacking>(device), parse_alloc_config("expandable_segments:False"));
  CachingAllocator mine(std::make_unique<ForwardingBacking>(device), parse_alloc_config("expandable_segments:False"));
  void* o = other.allocate(20 * MiB);
  void* x = mine.allocate(30 * MiB);
  const OutOfMemoryError e = expect_oom([&] { mine.allocate(20 * MiB); });
  const std::string msg = e.what();
  for (const char* part : {"reports 14.00 MiB free", "20.00 MiB is held outside this allocator", "no allocator setting"})
    EXPECT_TRUE(contains(msg, part)) << "missing \"" << part << "\" in: " << msg;
  EXPECT_FALSE(contains(msg, "EMBER_ALLOC_CONF")) << msg;
  EXPECT_FALSE(contains(msg, "packed afresh")) << msg;
  mine.deallocate(x);
  other.deallocate(o);
}

// A cached 4 GiB block split by small requests strands 2 GiB holes; with max_split_size_mb:128 the big block would
// not have been split. Runs the same sequence under `conf`; returns the OOM message ("" when it fits).
// With `traced`, the allocator records its history from the start, so the OOM message can replay it.
std::string split_big_block_sequence(const std::string& conf, bool traced = true) {
  auto a = make_allocator(6 * GiB, conf);
  if (traced) a->enable_trace(1 << 16);
  void* x = a->allocate(4 * GiB);
  a->deallocate(x);
  void* s1 = a->allocate(3 * MiB);       // default: split from the 4 GiB block
  void* big1 = a->allocate(2 * GiB);     // from its rest
  void* s2 = a->allocate(3 * MiB);
  a->deallocate(big1);                   // [s1][2 GiB free][s2][2 GiB - 6 MiB free]
  std::string msg;
  try {
    a->deallocate(a->allocate(2 * GiB + GiB / 2));
  } catch (const OutOfMemoryError& e) {
    msg = e.what();
  }
  EXPECT_EQ(verify_caching_allocator(*a), "");
  a->deallocate(s1);
  a->deallocate(s2);
  return msg;
}

// Without a recorded history the live set alone cannot show which setting would have helped (the two live blocks
// fit easily when packed afresh): the message says so instead of guessing.
TEST(CachingOom, FragmentationWithoutHistorySaysHowToFindOut) {
  const std::string msg = split_big_block_sequence("", /*traced=*/false);
  ASSERT_FALSE(msg.empty());
  EXPECT_TRUE(contains(msg, "fit when packed afresh")) << msg;
  EXPECT_TRUE(contains(msg, "enable_trace")) << msg;
  EXPECT_FALSE(contains(msg, "EMBER_ALLOC_CONF=")) << msg;
}

TEST(CachingOom, SplitBigBlockSuggestsMaxSplitSize) {
  const std::string msg = split_big_block_sequence("");
  ASSERT_FALSE(msg.empty()) << "expected an OOM under the default configuration";
  EXPECT_TRUE(contains(msg, "max_split_size_mb:128")) << msg;
  EXPECT_TRUE(contains(msg, "largest 2.00 GiB")) << msg;
  EXPECT_FALSE(contains(msg, "smaller batch")) << msg;
  // ... and the advice is true: the same sequence fits under it.
  EXPECT_EQ(split_big_block_sequence("max_split_size_mb:128"), "");
}

// Requests near INT64_MAX must fail cleanly (OutOfMemoryError), never wrap around in the size rounding.
TEST(CachingOom, HugeRequestsThrow) {
  for (int64_t n : {int64_t{1} << 62, INT64_MAX - 100, INT64_MAX}) {
    auto a = make_allocator(6 * GiB);
    EXPECT_THROW(a->allocate(n), OutOfMemoryError) << n;
    EXPECT_EQ(a->stats().allocated_bytes, 0) << n;
    EXPECT_EQ(verify_caching_allocator(*a), "");
  }
}

TEST(CachingOom, HugeRequestsThrowWithRoundupDivisions) {
  auto a = make_allocator(6 * GiB, "roundup_power2_divisions:4");
  EXPECT_THROW(a->allocate((int64_t{1} << 62) + 12345), OutOfMemoryError);
  EXPECT_THROW(a->allocate(INT64_MAX), OutOfMemoryError);
}

TEST(CachingOom, OomIsTracedAndCounted) {
  auto a = make_allocator(6 * GiB);
  a->enable_trace(16);
  void* x = a->allocate(4 * GiB);
  EXPECT_THROW(a->allocate(3 * GiB), OutOfMemoryError);
  EXPECT_THROW(a->allocate(3 * GiB), OutOfMemoryError);
  const auto ev = a->trace();
  int ooms = 0;
  for (const TraceEvent& t : ev)
    if (t.action == TraceAction::Oom) {
      ++ooms;
      EXPECT_EQ(t.size, 3 * GiB);
      EXPECT_EQ(t.allocated, 4 * GiB);
      EXPECT_EQ(t.reserved, 4 * GiB);
    }
  EXPECT_EQ(ooms, 2);
  EXPECT_EQ(a->device_stats().num_ooms, 2);
  EXPECT_EQ(a->device_stats().num_alloc_retries, 2);
  a->deallocate(x);
  void* y = a->allocate(3 * GiB);  // served from the cached 4 GiB block once it is free
  EXPECT_EQ(y, x);
  a->deallocate(y);
}

}  // namespace

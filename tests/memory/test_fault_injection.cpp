// Fault injection (memory/fault_injection.h): plans fail exactly the requests they name; the caching allocator's
// injected OOM walks the real ladder with the device refusing and ends in a real OutOfMemoryError; the simulated
// backing refuses mallocs and maps on demand and throws from record_event, which the allocator survives without
// leaking the block or breaking an invariant (Note [Event failure on free]).
#include <gtest/gtest.h>

#include <atomic>
#include <cstdint>
#include <string>
#include <thread>
#include <vector>

#include "ember/base/error.h"
#include "ember/memory/caching_allocator.h"
#include "ember/memory/fault_injection.h"
#include "tests/memory/caching_test_util.h"

using namespace ember;
using namespace ember::memory;
using namespace caching_test;

namespace {

// Runs `fn`; true when it threw OutOfMemoryError, false when it returned (any other exception fails the test).
template <class F>
bool throws_oom(F&& fn) {
  try {
    fn();
  } catch (const OutOfMemoryError&) {
    return true;
  }
  return false;
}

void expect_consistent(CachingAllocator& a) {
  EXPECT_NO_THROW(a.check_invariants());
  EXPECT_EQ(verify_caching_allocator(a), "");
}

// ---- plans and the injector --------------------------------------------------------------------------------------

TEST(FaultPlan, NamesTheFailingIndices) {
  const FaultPlan t = FaultPlan::transient(3), p = FaultPlan::persistent(3), c = FaultPlan::counting();
  const FaultPlan three{2, 3};
  for (int64_t i = 0; i < 10; ++i) {
    EXPECT_EQ(t.fails(i), i == 3) << i;
    EXPECT_EQ(p.fails(i), i >= 3) << i;
    EXPECT_FALSE(c.fails(i)) << i;
    EXPECT_EQ(three.fails(i), i >= 2 && i <= 4) << i;
  }
  EXPECT_FALSE(FaultPlan::transient(-1).fails(0));
}

TEST(FaultInjector, CountsOnlyWhileArmedAndRestartsOnArm) {
  FaultInjector f;
  EXPECT_FALSE(f.armed());
  for (int i = 0; i < 5; ++i) EXPECT_FALSE(f.next());
  EXPECT_EQ(f.seen(), 0);  // not armed: nothing counted
  f.arm(FaultPlan::transient(2));
  EXPECT_TRUE(f.armed());
  std::vector<bool> got;
  for (int i = 0; i < 5; ++i) got.push_back(f.next());
  EXPECT_EQ(got, (std::vector<bool>{false, false, true, false, false}));
  EXPECT_EQ(f.seen(), 5);
  EXPECT_EQ(f.injected(), 1);
  f.disarm();
  EXPECT_FALSE(f.next());
  EXPECT_EQ(f.seen(), 5);  // disarmed: counters kept, nothing more counted
  f.arm(FaultPlan::persistent(0));
  EXPECT_EQ(f.seen(), 0);
  EXPECT_TRUE(f.next());
  EXPECT_TRUE(f.next());
  EXPECT_EQ(f.injected(), 2);
  {
    ScopedFaultPlan scoped(f, FaultPlan::counting());
    EXPECT_FALSE(f.next());
    EXPECT_EQ(f.seen(), 1);
  }
  EXPECT_FALSE(f.armed());
}

// ---- the allocator's injector ------------------------------------------------------------------------------------

TEST(AllocatorFaults, TransientFailsOnlyTheNthRequest) {
  auto a = make_allocator(1 * GiB);
  // A warm cache that could serve every request below without the device.
  std::vector<void*> warm;
  for (int i = 0; i < 4; ++i) warm.push_back(a->allocate(1 * MiB));
  for (void* p : warm) a->deallocate(p);
  const int64_t ooms0 = a->device_stats().num_ooms;
  ScopedFaultPlan plan(a->fault_injector(), FaultPlan::transient(2));
  std::vector<void*> live;
  std::vector<bool> failed;
  for (int i = 0; i < 6; ++i) {
    EXPECT_EQ(a->allocate(0), nullptr);  // asks for nothing: not counted
    void* p = nullptr;
    failed.push_back(throws_oom([&] { p = a->allocate(256 * KiB); }));
    if (p) live.push_back(p);
  }
  EXPECT_EQ(failed, (std::vector<bool>{false, false, true, false, false, false}));
  EXPECT_EQ(a->fault_injector().seen(), 6);
  EXPECT_EQ(a->fault_injector().injected(), 1);
  EXPECT_EQ(a->device_stats().num_ooms, ooms0 + 1);
  EXPECT_EQ(a->stats().num_ooms, ooms0 + 1);
  EXPECT_EQ(a->stats().allocated_bytes, 5 * 256 * KiB);
  expect_consistent(*a);
  for (void* p : live) a->deallocate(p);
  EXPECT_EQ(a->stats().allocated_bytes, 0);
  expect_consistent(*a);
}

TEST(AllocatorFaults, PersistentFailsEveryRequestFromNUntilDisarmed) {
  auto a = make_allocator(1 * GiB);
  a->fault_injector().arm(FaultPlan::persistent(1));
  void* first = a->allocate(4 * MiB);
  for (int i = 0; i < 5; ++i) EXPECT_TRUE(throws_oom([&] { a->allocate(512); })) << i;
  EXPECT_TRUE(throws_oom([&] { a->allocate(64 * MiB); }));
  EXPECT_EQ(a->fault_injector().seen(), 7);
  EXPECT_EQ(a->fault_injector().injected(), 6);
  EXPECT_EQ(a->device_stats().num_ooms, 6);
  EXPECT_EQ(a->stats().allocated_bytes, 4 * MiB);
  expect_consistent(*a);
  a->fault_injector().disarm();
  void* after = a->allocate(512);
  EXPECT_NE(after, nullptr);
  EXPECT_EQ(a->fault_injector().seen(), 7);  // disarmed: no longer counted
  a->deallocate(after);
  a->deallocate(first);
  expect_consistent(*a);
}

// Note [Injected out of memory]: the request walks the ladder — the cache it cannot use is released, the retry
// counts, the device is asked for nothing — and fails like a real OOM: counted, traced, the usual message.
TEST(AllocatorFaults, InjectedOomRunsTheLadderWithTheDeviceRefusing) {
  auto a = make_allocator(1 * GiB);
  a->enable_trace(1000);
  void* held = a->allocate(3 * MiB);       // a large segment (20 MiB) that stays
  void* small = a->allocate(100 * KiB);    // a small segment (2 MiB), freed: cached unsplit
  void* big = a->allocate(64 * MiB);       // its own 64 MiB segment, freed: cached unsplit
  a->deallocate(small);
  a->deallocate(big);
  ASSERT_EQ(a->stats().reserved_bytes, 20 * MiB + 2 * MiB + 64 * MiB);
  SimulatedBacking& sim = sim_of(*a);
  const int64_t device_requests = sim.num_device_requests();
  const DeviceStats before = a->device_stats();
  a->fault_injector().arm(FaultPlan::transient(0));
  OutOfMemoryError error("none", 0, 0, 0, 0);
  bool raised = false;
  try {
    a->allocate(100 * KiB);  // the cached small segment would serve it
  } catch (const OutOfMemoryError& e) {
    error = e;
    raised = true;
  }
  ASSERT_TRUE(raised);
  const DeviceStats after = a->device_stats();
  EXPECT_EQ(after.num_ooms, before.num_ooms + 1);
  EXPECT_EQ(after.num_alloc_retries, before.num_alloc_retries + 1);
  EXPECT_EQ(after.num_device_alloc, before.num_device_alloc);      // nothing obtained
  EXPECT_EQ(after.num_device_free, before.num_device_free + 2);    // the two free segments went back
  EXPECT_EQ(sim.num_device_requests(), device_requests);           // the device was not asked
  EXPECT_EQ(a->stats().reserved_bytes, 20 * MiB);                  // only the segment holding `held` is left
  EXPECT_EQ(a->stats().allocated_bytes, 3 * MiB);
  EXPECT_EQ(error.requested(), 100 * KiB);
  EXPECT_EQ(error.allocated(), 3 * MiB);
  EXPECT_EQ(error.reserved(), 20 * MiB);
  EXPECT_TRUE(contains(error.what(), "out of memory")) << error.what();
  int ooms_traced = 0;
  for (const TraceEvent& e : a->trace())
    if (e.action == TraceAction::Oom) {
      ++ooms_traced;
      EXPECT_EQ(e.size, 100 * KiB);
    }
  EXPECT_EQ(ooms_traced, 1);
  expect_consistent(*a);
  // Transient: the next request is served (from a fresh segment: the cache was released).
  void* p = a->allocate(100 * KiB);
  EXPECT_EQ(a->device_stats().num_device_alloc, before.num_device_alloc + 1);
  a->deallocate(p);
  a->deallocate(held);
  expect_consistent(*a);
}

TEST(AllocatorFaults, InjectedOomOnExpandableSegmentsUnmapsFreePages) {
  auto a = make_allocator(1 * GiB, "expandable_segments:True");
  void* keep = a->allocate(4 * MiB);
  void* drop = a->allocate(8 * MiB);
  a->deallocate(drop);
  const int64_t reserved = a->stats().reserved_bytes;
  ASSERT_GT(reserved, 4 * MiB);
  {
    ScopedFaultPlan plan(a->fault_injector(), FaultPlan::transient(0));
    EXPECT_TRUE(throws_oom([&] { a->allocate(1 * MiB); }));
  }
  EXPECT_LT(a->stats().reserved_bytes, reserved);  // the free pages went back with the ladder
  EXPECT_EQ(a->stats().allocated_bytes, 4 * MiB);
  expect_consistent(*a);
  a->deallocate(keep);
  expect_consistent(*a);
}

TEST(AllocatorFaults, CountsPerAllocatorAcrossThreads) {
  auto a = make_allocator(1 * GiB);
  auto other = make_allocator(1 * GiB);
  a->fault_injector().arm(FaultPlan::persistent(100));
  constexpr int kThreads = 4, kEach = 100;
  std::atomic<int> ooms{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t)
    threads.emplace_back([&] {
      for (int i = 0; i < kEach; ++i) {
        void* p = nullptr;
        try {
          p = a->allocate(4 * KiB);
        } catch (const OutOfMemoryError&) {
          ++ooms;
        }
        a->deallocate(p);
        other->deallocate(other->allocate(4 * KiB));  // another allocator: not counted here
      }
    });
  for (std::thread& t : threads) t.join();
  a->fault_injector().disarm();
  EXPECT_EQ(a->fault_injector().seen(), kThreads * kEach);
  EXPECT_EQ(a->fault_injector().injected(), kThreads * kEach - 100);
  EXPECT_EQ(ooms.load(), kThreads * kEach - 100);
  EXPECT_EQ(a->device_stats().num_ooms, kThreads * kEach - 100);
  EXPECT_EQ(other->device_stats().num_ooms, 0);
  EXPECT_EQ(a->stats().allocated_bytes, 0);
  expect_consistent(*a);
}

// ---- the simulated backing's device faults ----------------------------------------------------------------------

TEST(BackingFaults, MallocAndMapRefuseLikeAFullDevice) {
  auto sim = make_simulated_backing(1 * GiB, false);
  sim->device_faults().arm(FaultPlan{1, 2});  // requests 1 and 2 fail
  void* p0 = sim->malloc(2 * MiB);
  EXPECT_NE(p0, nullptr);
  EXPECT_EQ(sim->malloc(2 * MiB), nullptr);
  void* range = sim->reserve_range(8 * MiB);  // address space: not a device request
  ASSERT_NE(range, nullptr);
  EXPECT_FALSE(sim->map(range, 2 * MiB));
  EXPECT_TRUE(sim->map(range, 2 * MiB));
  void* p3 = sim->malloc(2 * MiB);
  EXPECT_NE(p3, nullptr);
  EXPECT_EQ(sim->device_faults().seen(), 5);
  EXPECT_EQ(sim->device_faults().injected(), 2);
  EXPECT_EQ(sim->num_device_requests(), 5);
  EXPECT_EQ(sim->num_mallocs(), 2);
  EXPECT_EQ(sim->used(), 6 * MiB);  // refused requests took nothing
  sim->free(p0, 2 * MiB);
  sim->free(p3, 2 * MiB);
  sim->release_range(range, 8 * MiB);
  EXPECT_EQ(sim->used(), 0);
}

// The ladder's retries ask the device again, after emptying the cache, and see it refusing.
TEST(BackingFaults, LadderRetriesSeeTheDeviceRefusing) {
  auto a = make_allocator(1 * GiB);
  SimulatedBacking& sim = sim_of(*a);
  a->deallocate(a->allocate(100 * KiB));  // a cached small segment (2 MiB)
  ASSERT_EQ(a->stats().reserved_bytes, 2 * MiB);
  const int64_t r0 = sim.num_device_requests();
  {  // persistent: malloc, the retry after freeing oversize blocks, the retry after emptying the cache: all refused
    ScopedFaultPlan plan(sim.device_faults(), FaultPlan::persistent(0));
    EXPECT_TRUE(throws_oom([&] { a->allocate(4 * MiB); }));
    EXPECT_EQ(sim.device_faults().seen(), 3);
  }
  EXPECT_EQ(sim.num_device_requests(), r0 + 3);
  EXPECT_EQ(a->stats().reserved_bytes, 0);  // the cache was emptied on the way
  EXPECT_EQ(a->device_stats().num_ooms, 1);
  EXPECT_EQ(a->device_stats().num_alloc_retries, 1);
  expect_consistent(*a);
  {  // transient: the first refusal is followed by a retry that succeeds, no OOM
    ScopedFaultPlan plan(sim.device_faults(), FaultPlan::transient(0));
    void* p = a->allocate(4 * MiB);
    EXPECT_EQ(sim.device_faults().seen(), 2);
    a->deallocate(p);
  }
  EXPECT_EQ(a->device_stats().num_ooms, 1);
  {  // expandable segments: a refused map is a device request too
    auto e = make_allocator(1 * GiB, "expandable_segments:True");
    SimulatedBacking& es = sim_of(*e);
    ScopedFaultPlan plan(es.device_faults(), FaultPlan::persistent(0));
    EXPECT_TRUE(throws_oom([&] { e->allocate(4 * MiB); }));
    EXPECT_GE(es.device_faults().seen(), 2);
    EXPECT_EQ(es.used(), 0);
    expect_consistent(*e);
  }
}

// ---- event failures ----------------------------------------------------------------------------------------------

TEST(BackingFaults, RecordEventThrowsBackendError) {
  auto sim = make_simulated_backing(1 * GiB, false);
  sim->event_faults().arm(FaultPlan::transient(1));
  const EventId e0 = sim->record_event(1);
  EXPECT_THROW(sim->record_event(2), BackendError);
  const EventId e2 = sim->record_event(3);
  EXPECT_EQ(sim->num_event_ops(), 3);
  EXPECT_EQ(sim->event_faults().injected(), 1);
  sim->release_event(e0);
  sim->release_event(e2);
}

// Note [Event failure on free]: the free completes — after a device-wide synchronisation instead of events — so the
// block is neither leaked nor left pending, and every statistic still equals a recount.
TEST(BackingFaults, FreeSurvivesAFailingRecordEvent) {
  for (int64_t failing : {0, 1}) {  // the first or the second of the block's two events
    SCOPED_TRACE(failing);
    auto a = make_allocator(1 * GiB);
    SimulatedBacking& sim = sim_of(*a);
    void* keep = a->allocate(1 * MiB);
    void* p = a->allocate(1 * MiB);
    a->record_stream(p, 7);
    a->record_stream(p, 8);
    const int64_t syncs = a->device_stats().num_sync_all_streams;
    sim.event_faults().arm(FaultPlan::transient(failing));
    EXPECT_NO_THROW(a->deallocate(p));
    sim.event_faults().disarm();
    EXPECT_EQ(sim.event_faults().injected(), 1);
    EXPECT_EQ(a->stats().allocated_bytes, 1 * MiB);
    EXPECT_EQ(a->device_stats().active_bytes[kAggregatePool].current, 1 * MiB);  // not pending
    EXPECT_EQ(a->device_stats().num_sync_all_streams, syncs + 1);
    for (const SegmentSnapshot& s : a->snapshot())
      for (const BlockSnapshot& b : s.blocks) EXPECT_FALSE(b.pending_events);
    expect_consistent(*a);
    // Freed at once: the next request of that size on the block's stream gets it back.
    void* again = a->allocate(1 * MiB);
    EXPECT_EQ(again, p);
    a->deallocate(again);
    a->deallocate(keep);
    EXPECT_EQ(a->stats().allocated_bytes, 0);
    expect_consistent(*a);
    a->empty_cache();
    EXPECT_EQ(sim.used(), 0);
  }
}

// Without a fault the same free waits for the other streams (the contrast that shows the fallback above is one).
TEST(BackingFaults, FreeWithoutFaultWaitsForEvents) {
  auto a = make_allocator(1 * GiB);
  void* p = a->allocate(1 * MiB);
  a->record_stream(p, 7);
  a->deallocate(p);
  EXPECT_EQ(a->stats().allocated_bytes, 0);
  EXPECT_EQ(a->device_stats().active_bytes[kAggregatePool].current, 1 * MiB);  // pending
  expect_consistent(*a);
  sim_of(*a).complete_events();
  void* q = a->allocate(1 * MiB);
  EXPECT_EQ(q, p);
  a->deallocate(q);
  expect_consistent(*a);
}

}  // namespace

// Fault injection for tests of the failure paths: a FaultPlan says which requests fail (the N-th counted from when
// it is armed, and optionally the ones after it), a FaultInjector counts requests against it. The caching allocator
// consults one at the start of every allocate() (CachingAllocator::fault_injector()); SimulatedBacking has one for
// device requests (malloc, map) and one for event operations (record_event).
// Invariant: an injector that is not armed counts nothing, fails nothing and costs one relaxed atomic load.
#pragma once

#include <atomic>
#include <cstdint>

namespace ember::memory {

// Note [Injected out of memory]
// An allocation request the allocator's injector fails is served "as if the device had no room for it": no cached
// block fits it and every device request it makes is refused. The request therefore walks the whole OOM ladder of a
// real out-of-memory — garbage collection, freeing oversize cached blocks, synchronising and freeing every cached
// unsplit block (num_alloc_retries counts it), unmapping free pages of expandable segments — asking the device for
// nothing, and ends where a real one ends: num_ooms is incremented, an Oom event enters the trace, and
// OutOfMemoryError is thrown with the usual message (and explanation, unless set_oom_explanations(false)). The cache
// is as a real OOM leaves it (released), so what follows — an OOM-resilient retry, a caller's empty_cache() — meets
// the same allocator state as after a real one. Requests of 0 bytes ask for nothing and are not counted.

// Which requests fail. Requests are numbered from 0 at the moment the plan is armed.
struct FaultPlan {
  static constexpr int64_t kNever = -1;    // fail_at: no request fails (the injector only counts)
  static constexpr int64_t kForever = -1;  // count: every request from fail_at on fails, until disarmed

  int64_t fail_at = kNever;  // the first request that fails
  int64_t count = 1;         // how many consecutive requests fail from there (kForever: all of them)

  static FaultPlan transient(int64_t n) { return {n, 1}; }               // request n only
  static FaultPlan persistent(int64_t n) { return {n, kForever}; }       // request n and every later one
  static FaultPlan counting() { return {kNever, 0}; }                    // nothing fails; requests are counted
  bool fails(int64_t index) const {
    return fail_at >= 0 && index >= fail_at && (count == kForever || index - fail_at < count);
  }
};

// Thread-safe: requests may come from any thread; arm()/disarm() may be called while others allocate (a request
// racing with arm() is counted under the old or the new plan).
class FaultInjector {
 public:
  void arm(const FaultPlan& plan);  // starts counting afresh (seen() and injected() restart from 0)
  void disarm();                    // nothing fails or is counted any more; the counters keep their values
  bool armed() const { return armed_.load(std::memory_order_acquire); }
  FaultPlan plan() const;

  // Called once per request: true when this request must fail. One relaxed load while not armed.
  bool next() {
    if (!armed_.load(std::memory_order_relaxed)) return false;
    return next_armed();
  }

  int64_t seen() const { return seen_.load(std::memory_order_relaxed); }          // requests counted since arm()
  int64_t injected() const { return injected_.load(std::memory_order_relaxed); }  // of them failed

 private:
  bool next_armed();
  std::atomic<bool> armed_{false};
  std::atomic<int64_t> fail_at_{FaultPlan::kNever}, count_{0};
  std::atomic<int64_t> seen_{0}, injected_{0};
};

// Arms an injector for the lifetime of the object (disarms it on destruction, also when a test assertion throws).
class ScopedFaultPlan {
 public:
  ScopedFaultPlan(FaultInjector& injector, const FaultPlan& plan) : injector_(injector) { injector_.arm(plan); }
  ~ScopedFaultPlan() { injector_.disarm(); }
  ScopedFaultPlan(const ScopedFaultPlan&) = delete;
  ScopedFaultPlan& operator=(const ScopedFaultPlan&) = delete;

 private:
  FaultInjector& injector_;
};

}  // namespace ember::memory

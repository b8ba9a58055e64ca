// FaultInjector (fault_injection.h): counting requests against an armed FaultPlan.
// Invariant: while armed, every call of next() takes exactly one index; it fails iff the plan fails that index.
#include "ember/memory/fault_injection.h"

namespace ember::memory {

void FaultInjector::arm(const FaultPlan& plan) {
  armed_.store(false, std::memory_order_release);
  fail_at_.store(plan.fail_at, std::memory_order_relaxed);
  count_.store(plan.count, std::memory_order_relaxed);
  seen_.store(0, std::memory_order_relaxed);
  injected_.store(0, std::memory_order_relaxed);
  armed_.store(true, std::memory_order_release);
}

void FaultInjector::disarm() { armed_.store(false, std::memory_order_release); }

FaultPlan FaultInjector::plan() const {
  return {fail_at_.load(std::memory_order_relaxed), count_.load(std::memory_order_relaxed)};
}

bool FaultInjector::next_armed() {
  const int64_t index = seen_.fetch_add(1, std::memory_order_relaxed);
  if (!plan().fails(index)) return false;
  injected_.fetch_add(1, std::memory_order_relaxed);
  return true;
}

}  // namespace ember::memory

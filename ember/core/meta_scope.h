// The meta allocation scope: while one is active on a thread, meta tensors created on that thread take addresses
// (no bytes) from the scope's address-only caching allocator, and give them back when their storage dies — so a
// dry run on the meta device (shapes and dtypes, no data, no compute) reproduces a real run's allocator statistics.
// Invariant: outside every scope meta storages hold nothing, as before; inside one, data pointers of meta tensors
// stay null (the addresses are for the allocator's bookkeeping only). Note [Meta allocation scope] in storage.cpp.
#pragma once

#include <memory>

#include "ember/core/tensor.h"
#include "ember/memory/alloc_config.h"
#include "ember/memory/caching_allocator.h"

namespace ember {

class MetaAllocationScope {
 public:
  // The policy the CPU allocator applies now (memory::effective_config of memory::cpu_allocator()), its capacity too.
  MetaAllocationScope();
  // `config` — the policy to simulate; config.capacity caps the simulated device (kNoLimit: unbounded).
  explicit MetaAllocationScope(const memory::AllocatorConfig& config);
  ~MetaAllocationScope();  // restores the thread's previous scope (scopes nest)
  MetaAllocationScope(const MetaAllocationScope&) = delete;
  MetaAllocationScope& operator=(const MetaAllocationScope&) = delete;

  // Statistics, snapshot and trace of the dry run. Storages made in the scope keep the allocator alive, so tensors
  // may outlive the scope (they free into it when they die).
  memory::CachingAllocator& allocator() const { return *allocator_; }

 private:
  std::shared_ptr<memory::CachingAllocator> allocator_, previous_;
};

// The allocator of this thread's innermost MetaAllocationScope; null outside every scope.
memory::CachingAllocator* current_meta_allocator();

// Suspends this thread's scope for its lifetime: meta storages made meanwhile are byte-free, as outside any scope.
class MetaAllocationPause {
 public:
  MetaAllocationPause();
  ~MetaAllocationPause();
  MetaAllocationPause(const MetaAllocationPause&) = delete;
  MetaAllocationPause& operator=(const MetaAllocationPause&) = delete;

 private:
  std::shared_ptr<memory::CachingAllocator> paused_;
};

// A contiguous meta tensor that takes no bytes, inside a scope too: a placeholder that only carries a shape, for
// which a real run allocates nothing either (the operand a backward kernel is handed but never reads).
Tensor meta_placeholder(const Shape& shape, DType dtype);

}  // namespace ember

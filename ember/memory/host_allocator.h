// Host (CPU) allocator: aligned system memory with exact statistics.
// The caching allocator replaces it behind the same Allocator interface.
#pragma once

#include <atomic>
#include <mutex>
#include <unordered_map>

#include "ember/memory/allocator.h"

namespace ember::memory {

class HostAllocator final : public Allocator {
 public:
  void* allocate(int64_t nbytes, StreamId stream = 0) override;
  void deallocate(void* ptr) override;
  AllocatorStats stats() const override;
  void reset_peak_stats() override;
  std::string name() const override { return "host"; }

 private:
  mutable std::mutex mutex_;
  std::unordered_map<void*, int64_t> live_;  // pointer -> requested bytes
  AllocatorStats stats_;
};

// The process-wide host allocator used for CPU tensors.
Allocator& host_allocator();

}  // namespace ember::memory

// Refcounted bytes on one device, obtained from a memory:: allocator and returned to it when the last reference goes.
// Invariant: every view of a tensor shares one Storage; the version counter counts in-place writes to it (autograd
// uses it to detect modification of saved tensors).
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>

#include "ember/core/device.h"
#include "ember/memory/allocator.h"

namespace ember {

// The allocator that serves tensors on `device` (memory::cpu_allocator() for cpu, the device's allocator for cuda,
// the innermost MetaAllocationScope's for meta). Throws DeviceError for meta outside every scope (it has no bytes)
// and for unavailable devices.
memory::Allocator& allocator_for(Device device);

class StorageImpl {
 public:
  StorageImpl(int64_t nbytes, Device device);  // allocates (meta: an address inside a MetaAllocationScope, else none)
  // Allocates from `allocator` for work on `stream` instead of from allocator_for(device): pinned host staging
  // buffers (memory::pinned_pool(), `pinned` true) and device buffers filled on a side stream. The caller vouches that
  // the allocator serves `device`.
  StorageImpl(int64_t nbytes, Device device, memory::Allocator& allocator, memory::StreamId stream, bool pinned);
  ~StorageImpl();
  StorageImpl(const StorageImpl&) = delete;
  StorageImpl& operator=(const StorageImpl&) = delete;

  void* data() const { return device_.is_meta() ? nullptr : data_; }  // never a meta address (nothing backs it)
  int64_t nbytes() const { return nbytes_; }
  Device device() const { return device_; }
  int64_t version() const { return version_.load(std::memory_order_relaxed); }
  void bump_version() { version_.fetch_add(1, std::memory_order_relaxed); }
  memory::Allocator* allocator() const { return allocator_; }  // null for byte-free meta storage
  // The address the allocator handed out (for its bookkeeping: record_stream, retag) — for meta storage inside a
  // MetaAllocationScope an address nothing backs, so never dereference it; data() is the pointer to read and write.
  void* allocation() const { return data_; }
  bool pinned() const { return pinned_; }                          // page-locked host memory from the pinned pool

 private:
  void* data_ = nullptr;
  int64_t nbytes_ = 0;
  Device device_;
  memory::Allocator* allocator_ = nullptr;
  bool pinned_ = false;
  std::shared_ptr<memory::Allocator> meta_owner_;  // meta in a scope: keeps the scope's allocator alive
  std::atomic<int64_t> version_{0};
};

using Storage = std::shared_ptr<StorageImpl>;

}  // namespace ember

// Host allocator: std::aligned_alloc with a live-allocation map so statistics are exact and frees are validated.
// Invariant: stats_ changes only together with live_, under mutex_; a pointer is in live_ iff it is ours and live.
#include "ember/memory/host_allocator.h"

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <new>

#include "ember/base/error.h"

namespace ember::memory {

namespace {
std::atomic<bool> g_poison{false};
}  // namespace

void set_poison_allocations(bool on) { g_poison.store(on, std::memory_order_relaxed); }
bool poison_allocations() { return g_poison.load(std::memory_order_relaxed); }

void* HostAllocator::allocate(int64_t nbytes, StreamId) {
  EMBER_CHECK(nbytes >= 0, ValueError, "HostAllocator::allocate: negative size ", nbytes);
  if (nbytes == 0) return nullptr;
  const int64_t rounded = (nbytes + kAlignment - 1) / kAlignment * kAlignment;
  void* p = std::aligned_alloc(static_cast<size_t>(kAlignment), static_cast<size_t>(rounded));
  std::lock_guard<std::mutex> lock(mutex_);
  if (p == nullptr) {
    ++stats_.num_ooms;
    throw OutOfMemoryError(detail::concat("host allocator: out of memory allocating ", format_bytes(nbytes),
                                          " (", format_bytes(stats_.allocated_bytes), " already allocated)"),
                           nbytes, -1, stats_.allocated_bytes, stats_.reserved_bytes);
  }
  try {
    live_.emplace(p, nbytes);
  } catch (...) {  // the map could not grow: give the block back rather than leak it
    std::free(p);
    throw;
  }
  if (poison_allocations()) std::memset(p, kPoisonByte, static_cast<size_t>(nbytes));
  stats_.allocated_bytes += nbytes;
  stats_.reserved_bytes += rounded;
  if (stats_.allocated_bytes > stats_.peak_allocated_bytes) stats_.peak_allocated_bytes = stats_.allocated_bytes;
    if (stats_.reserved_bytes > stats_.peak_reserved_bytes) stats_.peak_reserved_bytes = stats_.reserved_bytes;
  ++stats_.num_allocs;
  return p;
}

void HostAllocator::deallocate(void* ptr) {
  if (ptr == nullptr) return;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = live_.find(ptr);
    EMBER_CHECK(it != live_.end(), ValueError, "HostAllocator::deallocate: pointer ", ptr,
                " was not allocated by this allocator");
    const int64_t n = it->second;
    stats_.allocated_bytes -= n;
    stats_.reserved_bytes -= (n + kAlignment - 1) / kAlignment * kAlignment;
    ++stats_.num_frees;
    live_.erase(it);
  }
  std::free(ptr);
}

AllocatorStats HostAllocator::stats() const {
  std::lock_guard<std::mutex> lock(mutex_);
  AllocatorStats s = stats_;
  s.requested_bytes = s.allocated_bytes;  // no rounding: requested and allocated agree
  s.peak_requested_bytes = s.peak_allocated_bytes;
  return s;
}

void HostAllocator::reset_peak_stats() {
  std::lock_guard<std::mutex> lock(mutex_);
  stats_.peak_allocated_bytes = stats_.allocated_bytes;
  stats_.peak_reserved_bytes = stats_.reserved_bytes;
}

Allocator& host_allocator() {
  static HostAllocator* instance = new HostAllocator();  // never destroyed: tensors may outlive static teardown
  return *instance;
}

}  // namespace ember::memory

// PinnedPool (pinned_pool.h): power-of-two bins of page-locked host memory, reused LIFO, with stream events that
// hold a freed block back until the streams recorded for it have finished. Compiled in every build; the CUDA parts
// are guarded by EMBER_WITH_CUDA, and without a GPU the pool hands out ordinary aligned host memory.
#include "ember/memory/pinned_pool.h"

#include <algorithm>
#include <bit>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <utility>

#include "ember/base/error.h"
#include "ember/memory/cuda_device.h"

#if defined(EMBER_WITH_CUDA)
#include "ember/base/cuda_check.h"
#include "ember/memory/cuda_backing.h"
#include "ember/memory/cuda_scoped.h"
#endif

namespace ember::memory {

namespace {

constexpr int64_t kHostPage = 4096;
constexpr int kNumBins = 63;  // block sizes 2^0 .. 2^62

#if defined(EMBER_WITH_CUDA)

using cuda::ScopedDevice;
using cuda::to_stream;

struct PooledEvent {
  int device = 0;
  cudaEvent_t event = nullptr;
};

// cudaEvents (timing disabled) kept per device and reused; shared by every pool in the process, never destroyed.
class EventPool {
 public:
  // An event recorded on `stream`, created and recorded with the stream's device current. The legacy default stream
  // (0) belongs to every device, so for it `default_device` (the device current when the stream was recorded for
  // the block) says which one; other streams know their own device.
  PooledEvent record(StreamId stream, int default_device) {
    int device = default_device;
    if (stream != 0) EMBER_CUDA_CHECK(cudaStreamGetDevice(to_stream(stream), &device));
    ScopedDevice scoped(device);
    PooledEvent ev{device, nullptr};
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (static_cast<int>(free_.size()) <= device) free_.resize(static_cast<size_t>(device) + 1);
      if (!free_[device].empty()) {
        ev.event = free_[device].back();
        free_[device].pop_back();
      }
    }
    if (ev.event == nullptr) EMBER_CUDA_CHECK(cudaEventCreateWithFlags(&ev.event, cudaEventDisableTiming));
    cudaError_t st = cudaEventRecord(ev.event, to_stream(stream));
    if (st != cudaSuccess) release(ev);
    EMBER_CUDA_CHECK(st);
    return ev;
  }

  // Returns the event for reuse; never throws (an event that cannot be kept is destroyed instead).
  void release(const PooledEvent& ev) noexcept {
    try {
      std::lock_guard<std::mutex> lock(mutex_);
      if (static_cast<int>(free_.size()) <= ev.device) free_.resize(static_cast<size_t>(ev.device) + 1);
      free_[ev.device].push_back(ev.event);
    } catch (...) {
      (void)cudaEventDestroy(ev.event);
    }
  }

 private:
  std::mutex mutex_;
  std::vector<std::vector<cudaEvent_t>> free_;  // by device
};

EventPool& event_pool() {
  static auto* pool = new EventPool();
  return *pool;
}

bool event_done(const PooledEvent& ev) {
  cudaError_t st = cudaEventQuery(ev.event);
  if (st == cudaErrorNotReady) {
    (void)cudaGetLastError();
    return false;
  }
  EMBER_CUDA_CHECK(st);
  return true;
}

// Writes one byte in every page of [base, base + bytes) so the kernel maps the pages before they are pinned,
// spreading the pages over up to `threads` threads (the slow part of registering a large buffer). Registration
// itself is one call on the whole range afterwards, so the block is a single pinned allocation.
void touch_pages(char* base, int64_t bytes, int threads) {
  const int64_t pages = (bytes + kHostPage - 1) / kHostPage;
  const int64_t parts = std::clamp<int64_t>(threads, 1, pages);
  const int64_t per_part = (pages + parts - 1) / parts;
  auto touch = [base, bytes](int64_t first_page, int64_t end_page) {
    for (int64_t page = first_page; page < end_page; ++page) {
      const int64_t off = page * kHostPage;
      if (off < bytes) base[off] = 0;
    }
  };
  std::vector<std::thread> workers;
  for (int64_t part = 1; part < parts; ++part) {
    const int64_t first = part * per_part, end = std::min(pages, first + per_part);
    if (first >= end) break;
    try {
      workers.emplace_back(touch, first, end);
    } catch (...) {  // no thread to be had: touch these pages here
      touch(first, end);
    }
  }
  touch(0, std::min(pages, per_part));
  for (auto& w : workers) w.join();
}

#endif  // EMBER_WITH_CUDA

PinnedSource choose_source(const AllocatorConfig& config) {
#if defined(EMBER_WITH_CUDA)
  if (cuda::device_count() > 0)
    return config.pinned_use_host_register ? PinnedSource::CudaHostRegister : PinnedSource::CudaHostAlloc;
#endif
  return PinnedSource::PlainHost;
}

int64_t block_size_for(int64_t nbytes) {
  return static_cast<int64_t>(std::bit_ceil(static_cast<uint64_t>(std::max(nbytes, kMinPinnedBlock))));
}

// Makes room for one more element so that the push_back that follows cannot throw (amortised doubling).
template <typename T>
void reserve_one(std::vector<T>& v) {
  if (v.size() == v.capacity()) v.reserve(std::max<size_t>(8, 2 * v.capacity()));
}

int64_t alignment_for(int64_t size) { return std::clamp<int64_t>(size, kAlignment, kHostPage); }

// Bytes taken from the system for a block of `size`: registered blocks cover whole pages so that no two
// registrations share a page.
int64_t system_bytes(PinnedSource source, int64_t size) {
  return source == PinnedSource::CudaHostRegister ? std::max(size, kHostPage) : size;
}

}  // namespace

const char* pinned_source_name(PinnedSource source) {
  switch (source) {
    case PinnedSource::CudaHostAlloc: return "cudaHostAlloc";
    case PinnedSource::CudaHostRegister: return "cudaHostRegister";
    case PinnedSource::PlainHost: return "host memory, not page-locked";
  }
  return "?";
}

struct PinnedPool::Block {
  // A stream recorded for the block. `device` is the device current at record_stream, which names the device whose
  // legacy default stream is meant when stream == 0 (other streams carry their own device).
  struct Use {
    StreamId stream = 0;
    int device = 0;
    bool operator==(const Use&) const = default;
  };
  int64_t size = 0;       // power of two
  int64_t requested = 0;  // while live
  bool live = false;
  std::vector<Use> streams;  // recorded with record_stream while live
};

struct PinnedPool::Pending {
  void* ptr = nullptr;
#if defined(EMBER_WITH_CUDA)
  std::vector<PooledEvent> events;
#endif
};

PinnedPool::PinnedPool(const AllocatorConfig& config)
    : source_(choose_source(config)),
      register_threads_(std::max(1, config.pinned_num_register_threads)),
      bins_(kNumBins) {}

PinnedPool::~PinnedPool() {
  std::vector<std::pair<void*, int64_t>> to_free;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    for (auto& pending : pending_) {
#if defined(EMBER_WITH_CUDA)
      for (const PooledEvent& ev : pending->events) {
        (void)cudaEventSynchronize(ev.event);
        event_pool().release(ev);
      }
#endif
      to_free.emplace_back(pending->ptr, blocks_.at(pending->ptr)->size);
    }
    pending_.clear();
    for (auto& bin : bins_) {
      for (void* p : bin) to_free.emplace_back(p, blocks_.at(p)->size);
      bin.clear();
    }
  }
  for (auto& [p, size] : to_free) {
    try {
      free_to_system(p, size);
    } catch (...) {  // the runtime may be shutting down; nothing useful to do
    }
  }
}

std::string PinnedPool::name() const { return detail::concat("pinned (", pinned_source_name(source_), ")"); }

void* PinnedPool::allocate_from_system(int64_t size) {
  const int64_t bytes = system_bytes(source_, size);
  const int64_t align = alignment_for(bytes);
  switch (source_) {
    case PinnedSource::PlainHost:
      return std::aligned_alloc(static_cast<size_t>(align), static_cast<size_t>(bytes));
#if defined(EMBER_WITH_CUDA)
    case PinnedSource::CudaHostAlloc: {
      ScopedDevice scoped(pinning_device());  // no new context on a device the process does not use
      void* p = nullptr;
      cudaError_t st = cudaHostAlloc(&p, static_cast<size_t>(bytes), cudaHostAllocPortable);
      if (st == cudaErrorMemoryAllocation) {
        (void)cudaGetLastError();
        return nullptr;
      }
      EMBER_CUDA_CHECK(st);
      return p;
    }
    case PinnedSource::CudaHostRegister: {
      // No new context on a device the process does not use; made before the allocation, which a throw would leak.
      ScopedDevice scoped(pinning_device());
      void* p = std::aligned_alloc(static_cast<size_t>(kHostPage), static_cast<size_t>(bytes));
      if (p == nullptr) return nullptr;
      touch_pages(static_cast<char*>(p), bytes, register_threads_);
      const cudaError_t st = cudaHostRegister(p, static_cast<size_t>(bytes), cudaHostRegisterPortable);
      if (st == cudaSuccess) return p;
      (void)cudaGetLastError();
      std::free(p);
      if (st == cudaErrorMemoryAllocation) return nullptr;
      EMBER_CUDA_CHECK(st);
      return nullptr;
    }
#else
    default:
      break;
#endif
  }
  return nullptr;
}

void PinnedPool::free_to_system(void* ptr, int64_t size) {
  switch (source_) {
    case PinnedSource::PlainHost:
      std::free(ptr);
      return;
#if defined(EMBER_WITH_CUDA)
    case PinnedSource::CudaHostAlloc:
      EMBER_CUDA_CHECK(cudaFreeHost(ptr));
      return;
    case PinnedSource::CudaHostRegister: {  // one registration per block (see touch_pages)
      const cudaError_t st = cudaHostUnregister(ptr);
      std::free(ptr);
      EMBER_CUDA_CHECK(st);
      return;
    }
#else
    default:
      return;
#endif
  }
}

void PinnedPool::process_pending_locked() {
#if defined(EMBER_WITH_CUDA)
  for (size_t i = 0; i < pending_.size();) {
    Pending& pending = *pending_[i];
    bool done = true;
    for (const PooledEvent& ev : pending.events) {
      if (!event_done(ev)) {
        done = false;
        break;
      }
    }
    if (!done) {
      ++i;
      continue;
    }
    const int64_t size = blocks_.at(pending.ptr)->size;
    auto& bin = bins_[std::countr_zero(static_cast<uint64_t>(size))];
    reserve_one(bin);  // may throw while the block is still pending with its events; nothing below throws
    for (const PooledEvent& ev : pending.events) event_pool().release(ev);
    bin.push_back(pending.ptr);
    stats_.pending_blocks -= 1;
    stats_.pending_bytes -= size;
    stats_.cached_blocks += 1;
    stats_.cached_bytes += size;
    pending_[i] = std::move(pending_.back());
    pending_.pop_back();
  }
#endif
}

int64_t PinnedPool::release_cached_locked(std::vector<std::pair<void*, int64_t>>& out) {
  int64_t released = 0;
  for (auto& bin : bins_) {
    for (void* p : bin) {
      auto it = blocks_.find(p);
      const int64_t size = it->second->size;
      out.emplace_back(p, size);
      blocks_.erase(it);
      released += size;
      stats_.cached_blocks -= 1;
      stats_.cached_bytes -= size;
      stats_.totals.reserved_bytes -= size;
      stats_.num_host_frees += 1;
    }
    bin.clear();
  }
  return released;
}

void* PinnedPool::allocate(int64_t nbytes, StreamId) {
  EMBER_CHECK(nbytes >= 0, ValueError, "PinnedPool::allocate: negative size ", nbytes);
  if (nbytes == 0) return nullptr;
  EMBER_CHECK(nbytes <= (int64_t{1} << 62), ValueError, "PinnedPool::allocate: size ", nbytes, " is too large");
  const int64_t size = block_size_for(nbytes);
  const int bin = std::countr_zero(static_cast<uint64_t>(size));

  auto hand_out = [&](Block& b) {  // under mutex_
    b.live = true;
    b.requested = nbytes;
    b.streams.clear();
    AllocatorStats& t = stats_.totals;
    t.allocated_bytes += size;
    t.peak_allocated_bytes = std::max(t.peak_allocated_bytes, t.allocated_bytes);
    t.requested_bytes += nbytes;
    t.peak_requested_bytes = std::max(t.peak_requested_bytes, t.requested_bytes);
    t.num_allocs += 1;
    stats_.live_blocks += 1;
    stats_.live_block_bytes += size;
  };

  void* p = nullptr;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    process_pending_locked();
    if (!bins_[bin].empty()) {
      p = bins_[bin].back();
      bins_[bin].pop_back();
      stats_.cached_blocks -= 1;
      stats_.cached_bytes -= size;
      stats_.num_cache_hits += 1;
      hand_out(*blocks_.at(p));
    }
  }
  if (p == nullptr) {
    // A miss: ask the system outside the lock (pinning is slow), and free the cache once before giving up.
    p = allocate_from_system(size);
    if (p == nullptr) {
      std::vector<std::pair<void*, int64_t>> cached;
      {
        std::lock_guard<std::mutex> lock(mutex_);
        process_pending_locked();
        release_cached_locked(cached);
      }
      for (auto& [q, s] : cached) free_to_system(q, s);
      p = allocate_from_system(size);
    }
    std::lock_guard<std::mutex> lock(mutex_);
    if (p == nullptr) {
      stats_.totals.num_ooms += 1;
      throw OutOfMemoryError(
          detail::concat("pinned host pool (", pinned_source_name(source_), "): out of memory allocating ",
                         format_bytes(nbytes), " (a ", format_bytes(size), " block); ",
                         format_bytes(stats_.totals.allocated_bytes), " allocated, ",
                         format_bytes(stats_.totals.reserved_bytes), " held by the pool"),
          nbytes, -1, stats_.totals.allocated_bytes, stats_.totals.reserved_bytes);
    }
    auto block = std::make_unique<Block>();
    block->size = size;
    Block& b = *block;
    try {
      blocks_.emplace(p, std::move(block));
    } catch (...) {
      free_to_system(p, size);
      throw;
    }
    AllocatorStats& t = stats_.totals;
    t.reserved_bytes += size;
    t.peak_reserved_bytes = std::max(t.peak_reserved_bytes, t.reserved_bytes);
    stats_.num_host_allocs += 1;
    hand_out(b);
  }
  if (poison_allocations()) std::memset(p, kPoisonByte, static_cast<size_t>(nbytes));
  return p;
}

void PinnedPool::deallocate(void* ptr) {
  if (ptr == nullptr) return;
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = blocks_.find(ptr);
  EMBER_CHECK(it != blocks_.end() && it->second->live, ValueError, "PinnedPool::deallocate: pointer ", ptr,
              " is not a live block of this pool");
  Block& b = *it->second;
  auto& bin = bins_[std::countr_zero(static_cast<uint64_t>(b.size))];

  // Everything that can throw comes first (events, the Pending record, room in the destination container), so a
  // failure leaves the block live with its recorded streams and no event outstanding; the caller may retry.
#if defined(EMBER_WITH_CUDA)
  std::vector<PooledEvent> events;
  auto release_events = [&events]() noexcept {
    for (const PooledEvent& ev : events) event_pool().release(ev);
    events.clear();
  };
  std::unique_ptr<Pending> pending;
  try {
    if (source_ != PinnedSource::PlainHost && !b.streams.empty()) {
      events.reserve(b.streams.size());
      for (const Block::Use& use : b.streams) events.push_back(event_pool().record(use.stream, use.device));
    }
    if (!events.empty()) {
      pending = std::make_unique<Pending>();
      reserve_one(pending_);
    } else {
      reserve_one(bin);
    }
  } catch (...) {
    release_events();
    throw;
  }
  const bool wait = pending != nullptr;
  if (wait) {
    pending->ptr = ptr;
    pending->events = std::move(events);
    pending_.push_back(std::move(pending));
  } else {
    bin.push_back(ptr);
  }
#else
  const bool wait = false;
  bin.push_back(ptr);  // may throw before any state changed
#endif

  AllocatorStats& t = stats_.totals;
  t.allocated_bytes -= b.size;
  t.requested_bytes -= b.requested;
  t.num_frees += 1;
  stats_.live_blocks -= 1;
  stats_.live_block_bytes -= b.size;
  if (wait) {
    stats_.pending_blocks += 1;
    stats_.pending_bytes += b.size;
  } else {
    stats_.cached_blocks += 1;
    stats_.cached_bytes += b.size;
  }
  b.live = false;
  b.requested = 0;
  b.streams.clear();
}

void PinnedPool::record_stream(void* ptr, StreamId stream) {
  Block::Use use{stream, 0};
#if defined(EMBER_WITH_CUDA)
  // The legacy default stream of the device current now; looked up outside the lock.
  if (source_ != PinnedSource::PlainHost && stream == 0) EMBER_CUDA_CHECK(cudaGetDevice(&use.device));
#endif
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = blocks_.find(ptr);
  EMBER_CHECK(it != blocks_.end() && it->second->live, ValueError, "PinnedPool::record_stream: pointer ", ptr,
              " is not a live block of this pool");
  if (source_ == PinnedSource::PlainHost) return;  // no device work can be reading it
  auto& streams = it->second->streams;
  if (std::find(streams.begin(), streams.end(), use) == streams.end()) streams.push_back(use);
}

void PinnedPool::empty_cache() {
  std::vector<std::pair<void*, int64_t>> cached;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    process_pending_locked();
    release_cached_locked(cached);
  }
  for (auto& [p, size] : cached) free_to_system(p, size);
}

AllocatorStats PinnedPool::stats() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return stats_.totals;
}

PinnedPoolStats PinnedPool::detailed_stats() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return stats_;
}

void PinnedPool::reset_peak_stats() {
  std::lock_guard<std::mutex> lock(mutex_);
  stats_.totals.peak_allocated_bytes = stats_.totals.allocated_bytes;
  stats_.totals.peak_reserved_bytes = stats_.totals.reserved_bytes;
  stats_.totals.peak_requested_bytes = stats_.totals.requested_bytes;
}

int64_t PinnedPool::block_size(const void* ptr) const {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = blocks_.find(const_cast<void*>(ptr));
  EMBER_CHECK(it != blocks_.end() && it->second->live, ValueError, "PinnedPool::block_size: pointer ", ptr,
              " is not a live block of this pool");
  return it->second->size;
}

PinnedPool& pinned_pool() {
  static PinnedPool* pool = new PinnedPool(alloc_config_from_env());  // never destroyed: buffers may outlive exit
  return *pool;
}

}  // namespace ember::memory

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
  // An event recorded on `stream`, created on the stream's device.
  PooledEvent record(StreamId stream) {
    int device = 0;
    if (stream == 0) EMBER_CUDA_CHECK(cudaGetDevice(&device));
    else EMBER_CUDA_CHECK(cudaStreamGetDevice(to_stream(stream), &device));
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

  void release(const PooledEvent& ev) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (static_cast<int>(free_.size()) <= ev.device) free_.resize(static_cast<size_t>(ev.device) + 1);
    free_[ev.device].push_back(ev.event);
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

// The pieces cudaHostRegister is called on for a block: `threads` equal page-aligned chunks when the block has at
// least one page per thread (sizes and thread counts are powers of two, so the split is exact), else one piece.
std::vector<std::pair<char*, int64_t>> register_chunks(void* ptr, int64_t bytes, int threads) {
  std::vector<std::pair<char*, int64_t>> out;
  char* base = static_cast<char*>(ptr);
  if (threads > 1 && bytes >= threads * kHostPage) {
    const int64_t chunk = bytes / threads;
    for (int i = 0; i < threads; ++i) out.emplace_back(base + i * chunk, chunk);
  } else {
    out.emplace_back(base, bytes);
  }
  return out;
}

// Touches every page of the chunk (faulting it in) and page-locks it. Runs on its own thread for chunks > 0.
cudaError_t register_chunk(char* p, int64_t bytes) {
  for (int64_t off = 0; off < bytes; off += kHostPage) p[off] = 0;
  cudaError_t st = cudaHostRegister(p, static_cast<size_t>(bytes), cudaHostRegisterPortable);
  if (st != cudaSuccess) (void)cudaGetLastError();
  return st;
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
  int64_t size = 0;       // power of two
  int64_t requested = 0;  // while live
  bool live = false;
  std::vector<StreamId> streams;  // recorded with record_stream while live
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
      void* p = std::aligned_alloc(static_cast<size_t>(kHostPage), static_cast<size_t>(bytes));
      if (p == nullptr) return nullptr;
      const auto chunks = register_chunks(p, bytes, register_threads_);
      std::vector<cudaError_t> status(chunks.size(), cudaSuccess);
      std::vector<std::thread> workers;
      for (size_t i = 1; i < chunks.size(); ++i) {
        try {
          workers.emplace_back([&, i] { status[i] = register_chunk(chunks[i].first, chunks[i].second); });
        } catch (...) {  // no thread to be had: register it here
          status[i] = register_chunk(chunks[i].first, chunks[i].second);
        }
      }
      status[0] = register_chunk(chunks[0].first, chunks[0].second);
      for (auto& w : workers) w.join();
      cudaError_t failure = cudaSuccess;
      for (size_t i = 0; i < chunks.size(); ++i) {
        if (status[i] == cudaSuccess) continue;
        if (failure == cudaSuccess || status[i] != cudaErrorMemoryAllocation) failure = status[i];
      }
      if (failure == cudaSuccess) return p;
      for (size_t i = 0; i < chunks.size(); ++i)
        if (status[i] == cudaSuccess) (void)cudaHostUnregister(chunks[i].first);
      std::free(p);
      if (failure == cudaErrorMemoryAllocation) return nullptr;
      EMBER_CUDA_CHECK(failure);
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
    case PinnedSource::CudaHostRegister: {
      cudaError_t failure = cudaSuccess;
      for (auto& [p, bytes] : register_chunks(ptr, system_bytes(source_, size), register_threads_)) {
        cudaError_t st = cudaHostUnregister(p);
        if (st != cudaSuccess && failure == cudaSuccess) failure = st;
      }
      std::free(ptr);
      EMBER_CUDA_CHECK(failure);
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
    for (const PooledEvent& ev : pending.events) event_pool().release(ev);
    const int64_t size = blocks_.at(pending.ptr)->size;
    bins_[std::countr_zero(static_cast<uint64_t>(size))].push_back(pending.ptr);
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
    t.allocated_bytes += nbytes;
    t.peak_allocated_bytes = std::max(t.peak_allocated_bytes, t.allocated_bytes);
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
  auto pending = std::make_unique<Pending>();
  pending->ptr = ptr;
#if defined(EMBER_WITH_CUDA)
  if (source_ != PinnedSource::PlainHost && !b.streams.empty()) {
    try {
      for (StreamId s : b.streams) pending->events.push_back(event_pool().record(s));
    } catch (...) {  // the block stays live; the caller may retry
      for (const PooledEvent& ev : pending->events) event_pool().release(ev);
      throw;
    }
  }
  const bool wait = !pending->events.empty();
#else
  const bool wait = false;
#endif
  if (wait) pending_.push_back(std::move(pending));  // may throw before any state changed
  else bins_[std::countr_zero(static_cast<uint64_t>(b.size))].push_back(ptr);

  AllocatorStats& t = stats_.totals;
  t.allocated_bytes -= b.requested;
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
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = blocks_.find(ptr);
  EMBER_CHECK(it != blocks_.end() && it->second->live, ValueError, "PinnedPool::record_stream: pointer ", ptr,
              " is not a live block of this pool");
  if (source_ == PinnedSource::PlainHost) return;  // no device work can be reading it
  auto& streams = it->second->streams;
  if (std::find(streams.begin(), streams.end(), stream) == streams.end()) streams.push_back(stream);
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

// The pinned (page-locked) host memory pool for the data pipeline: blocks rounded up to a power of two, cached and
// reused after free, with record_stream deferring reuse until the streams that read a block have finished.
// Invariant: every block the pool holds is in exactly one state — live, pending (waiting on stream events) or cached
// in the bin of its size — and the statistics equal a recount of those states.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "ember/memory/alloc_config.h"
#include "ember/memory/allocator.h"

namespace ember::memory {

// Where the pool's memory comes from. Decided once, when the pool is constructed.
enum class PinnedSource {
  CudaHostAlloc,     // cudaHostAlloc (CUDA build, at least one device)
  CudaHostRegister,  // aligned host memory + cudaHostRegister (pinned_use_cuda_host_register:True)
  PlainHost,         // ordinary aligned host memory: CPU-only build, or no GPU at run time
};
const char* pinned_source_name(PinnedSource source);

inline constexpr int64_t kMinPinnedBlock = 512;  // the smallest block; every block size is a power of two >= this

struct PinnedPoolStats {
  AllocatorStats totals;               // allocated (block bytes of live blocks), requested (bytes asked for),
                                       // reserved (block bytes held), peaks, counts
  int64_t live_blocks = 0;             // blocks handed out and not freed
  int64_t live_block_bytes = 0;        // their rounded sizes (equals totals.allocated_bytes)
  int64_t pending_blocks = 0;          // freed, waiting for events on the streams recorded for them
  int64_t pending_bytes = 0;
  int64_t cached_blocks = 0;           // free and ready for reuse
  int64_t cached_bytes = 0;
  int64_t num_host_allocs = 0;         // blocks obtained from the system (cudaHostAlloc / register / aligned_alloc)
  int64_t num_host_frees = 0;          // blocks given back (empty_cache, or the cache freed to retry an allocation)
  int64_t num_cache_hits = 0;          // allocations served from the cache
};

class PinnedPool final : public Allocator {
 public:
  // Reads pinned_use_host_register and pinned_num_register_threads from `config`.
  explicit PinnedPool(const AllocatorConfig& config = {});
  // Returns cached blocks and waits for pending ones. Blocks still live are left to the system (never freed under a
  // user), so destroy a pool only after its memory is freed.
  ~PinnedPool() override;
  PinnedPool(const PinnedPool&) = delete;
  PinnedPool& operator=(const PinnedPool&) = delete;

  // A block of bit_ceil(max(nbytes, kMinPinnedBlock)) bytes, aligned to min(block size, 4096) (at least kAlignment).
  // `stream` is not recorded (as in PyTorch's host allocator): call record_stream for every stream that reads the
  // block asynchronously. Throws OutOfMemoryError after freeing the cache and retrying once.
  void* allocate(int64_t nbytes, StreamId stream = 0) override;
  // The block is reused once events recorded now on its recorded streams have completed (immediately without them).
  void deallocate(void* ptr) override;
  // `ptr` (a live block from this pool) is used by work queued on `stream` (the bits of a cudaStream_t, 0 = legacy
  // default stream). Without CUDA there is nothing to wait for and this only validates ptr.
  void record_stream(void* ptr, StreamId stream) override;
  // Frees every cached block (pending blocks whose events have completed first become cached).
  void empty_cache() override;
  AllocatorStats stats() const override;
  void reset_peak_stats() override;
  std::string name() const override;

  PinnedPoolStats detailed_stats() const;
  PinnedSource source() const { return source_; }
  bool page_locked() const { return source_ != PinnedSource::PlainHost; }
  // Rounded size of the live block at ptr (ValueError if ptr is not a live block of this pool).
  int64_t block_size(const void* ptr) const;

 private:
  struct Block;
  struct Pending;

  void* allocate_from_system(int64_t size);
  void free_to_system(void* ptr, int64_t size);
  void process_pending_locked();   // moves pending blocks whose events completed into the cache
  int64_t release_cached_locked(std::vector<std::pair<void*, int64_t>>& out);  // empties the bins

  PinnedSource source_;
  int register_threads_ = 1;
  mutable std::mutex mutex_;
  std::unordered_map<void*, std::unique_ptr<Block>> blocks_;  // every block the pool holds
  std::vector<std::vector<void*>> bins_;                      // bins_[k]: cached blocks of 2^k bytes (LIFO)
  std::vector<std::unique_ptr<Pending>> pending_;             // freed blocks waiting on events
  PinnedPoolStats stats_;
};

// The process-wide pool, configured from EMBER_ALLOC_CONF on first use; never destroyed.
PinnedPool& pinned_pool();

}  // namespace ember::memory

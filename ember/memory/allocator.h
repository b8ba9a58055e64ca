// The allocator interface every tensor byte comes from (DESIGN.md: memory knows bytes, streams, devices — no tensors).
// Invariant: allocate(n) returns memory aligned to kAlignment or throws OutOfMemoryError; deallocate(p) takes only
// pointers this allocator returned; the statistics count exactly the live allocations.
#pragma once

#include <cstdint>
#include <string>

#include "ember/memory/tags.h"

namespace ember::memory {

inline constexpr int64_t kAlignment = 64;

// A stream as the memory layer sees it: an opaque id (a cudaStream_t's bits on CUDA). 0 is the default stream.
using StreamId = uint64_t;

struct AllocatorStats {
  int64_t allocated_bytes = 0;       // bytes in live allocations (after the allocator's rounding)
  int64_t peak_allocated_bytes = 0;  // high-water mark of allocated_bytes since the last reset
  int64_t reserved_bytes = 0;        // bytes held from the backing (>= allocated_bytes)
  int64_t peak_reserved_bytes = 0;   // high-water mark of reserved_bytes since the last reset
  int64_t requested_bytes = 0;       // bytes the callers asked for in live allocations (before rounding)
  int64_t peak_requested_bytes = 0;  // high-water mark of requested_bytes since the last reset
  int64_t num_allocs = 0;            // allocate() calls that returned memory
  int64_t num_frees = 0;             // deallocate() calls
  int64_t num_ooms = 0;              // requests that ended in OutOfMemoryError
};

class Allocator {
 public:
  virtual ~Allocator() = default;
  // Returns nbytes of memory for use on `stream` (nullptr when nbytes == 0). Throws OutOfMemoryError when it cannot.
  virtual void* allocate(int64_t nbytes, StreamId stream = 0) = 0;
  virtual void deallocate(void* ptr) = 0;
  // The block at ptr is also used on `stream`: its memory is reused only after that stream's work completes.
  virtual void record_stream(void* ptr, StreamId stream) {}
  // The live allocation at `ptr` changes owner to `tag` (its bytes move between the owners' statistics). Allocators
  // without per-owner statistics ignore it.
  virtual void retag(void* ptr, TagId tag) {}
  // Returns cached, unused memory to the backing. A no-op for allocators that cache nothing.
  virtual void empty_cache() {}
  virtual AllocatorStats stats() const = 0;
  virtual void reset_peak_stats() = 0;
  virtual std::string name() const = 0;

  // Peak windows: a high-water mark of allocated bytes private to one caller (a profiler, an estimator, a phase
  // report), independent of reset_peak_stats() and of other open windows. open_peak_window() returns an id whose
  // peak starts at the current allocated bytes; peak_window(id) reads it; close_peak_window(id) ends it. An allocator
  // that keeps no windows throws ValueError (use PeakWindow below, which says so in its message).
  virtual uint64_t open_peak_window();
  virtual int64_t peak_window(uint64_t id) const;
  virtual void close_peak_window(uint64_t id) {}
};

// An open peak window for the lifetime of the object.
class PeakWindow {
 public:
  explicit PeakWindow(Allocator& allocator) : allocator_(allocator), id_(allocator.open_peak_window()) {}
  ~PeakWindow() { allocator_.close_peak_window(id_); }
  PeakWindow(const PeakWindow&) = delete;
  PeakWindow& operator=(const PeakWindow&) = delete;
  int64_t peak() const { return allocator_.peak_window(id_); }  // highest allocated bytes since construction

 private:
  Allocator& allocator_;
  uint64_t id_;
};

// Human-readable byte count: "1.50 MiB".
std::string format_bytes(int64_t bytes);
// Parses "6GiB", "512MiB", "1.5 GB", "4096" (bytes); ConfigError naming `what` otherwise.
int64_t parse_bytes(const std::string& text, const char* what);

// Debug aid (process-wide, off by default): every allocation is filled with 0xFF bytes before it is returned —
// NaN in every floating format, -1 in signed integers — so a kernel that leaves output elements unwritten shows up
// in tests instead of passing on lucky zeros. The test harness turns it on.
void set_poison_allocations(bool on);
bool poison_allocations();
inline constexpr unsigned char kPoisonByte = 0xFF;

}  // namespace ember::memory

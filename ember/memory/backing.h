// What the caching allocator sits on (DESIGN.md §2): raw segments from a device, stream events, and optionally a
// virtual-memory API for expandable segments. Implementations: host memory, a simulated device with a fixed
// capacity (materialised or address-only), and CUDA (memory/cuda_backing.cpp).
// Invariant: malloc returns nullptr — never throws — when the device is out of room, so the allocator can run its
// OOM ladder; every other failure throws.
#pragma once

#include <cstdint>
#include <cstring>
#include <memory>
#include <string>

#include "ember/memory/allocator.h"
#include "ember/memory/fault_injection.h"

namespace ember::memory {

using EventId = uint64_t;

class Backing {
 public:
  virtual ~Backing() = default;
  virtual std::string name() const = 0;

  // Raw segments. Addresses are aligned to at least 512 bytes.
  virtual void* malloc(int64_t nbytes) = 0;  // nullptr when out of room
  virtual void free(void* ptr, int64_t nbytes) = 0;
  // Device bytes in all (kNoLimit when unbounded, e.g. host memory).
  virtual int64_t capacity() const = 0;
  // Bytes the device could still hand out (capacity - used for simulated devices; cudaMemGetInfo on CUDA).
  virtual int64_t available() const = 0;

  // Streams and events: an event recorded on a stream completes when the work queued before it has finished.
  virtual EventId record_event(StreamId stream) = 0;
  virtual bool event_completed(EventId event) = 0;
  virtual void release_event(EventId event) = 0;
  virtual void synchronize() = 0;  // waits for all streams

  // Expandable segments (virtual memory): reserve an address range, then map/unmap physical pages inside it.
  virtual bool supports_expandable() const { return false; }
  virtual int64_t page_size() const { return 2 * 1024 * 1024; }
  virtual void* reserve_range(int64_t nbytes) { return nullptr; }
  virtual bool map(void* addr, int64_t nbytes) { return false; }  // false when out of room
  virtual void unmap(void* addr, int64_t nbytes) {}
  virtual void release_range(void* addr, int64_t nbytes) {}

  // True when addresses can be dereferenced (false for an address-only simulation used by replay).
  virtual bool materialized() const { return true; }

  // Sets the first nbytes of a block just handed out for `stream` to `byte`: the poisoning of new allocations in
  // tests (set_poison_allocations, allocator.h). Host-addressable memory is written here; a device's memory is not
  // host-addressable, so its backing queues the fill on `stream`, ahead of the work the block is for (CUDA:
  // cudaMemsetAsync). An address-only backing does nothing.
  virtual void fill(void* ptr, int64_t nbytes, unsigned char byte, StreamId stream) {
    (void)stream;
    if (materialized()) std::memset(ptr, byte, static_cast<size_t>(nbytes));
  }
};

// Host memory (aligned_alloc), unbounded, synchronous: events complete immediately.
std::unique_ptr<Backing> make_host_backing();

// A device of `capacity` bytes simulated on the host. materialize=true backs blocks with real host memory (CPU
// tensors can live there); false hands out addresses only (for replaying traces of large GPUs). Events complete
// when complete_events() or synchronize() is called, so cross-stream reuse can be tested deterministically.
// Supports expandable segments (page accounting against the capacity).
// Faults (fault_injection.h), for tests of what sits above: device_faults() fails device requests — a malloc
// returns nullptr, a map returns false, exactly as when the device is full — and event_faults() fails event
// operations — record_event throws BackendError, as a failing cudaEventRecord does. Both count from when armed.
class SimulatedBacking final : public Backing {
 public:
  SimulatedBacking(int64_t capacity, bool materialize);
  ~SimulatedBacking() override;
  std::string name() const override;
  void* malloc(int64_t nbytes) override;
  void free(void* ptr, int64_t nbytes) override;
  int64_t capacity() const override { return capacity_; }
  int64_t available() const override;
  EventId record_event(StreamId stream) override;
  bool event_completed(EventId event) override;
  void release_event(EventId event) override;
  void synchronize() override { complete_events(); }
  bool supports_expandable() const override { return true; }
  void* reserve_range(int64_t nbytes) override;
  bool map(void* addr, int64_t nbytes) override;
  void unmap(void* addr, int64_t nbytes) override;
  void release_range(void* addr, int64_t nbytes) override;
  bool materialized() const override { return materialize_; }

  void complete_events();  // every recorded event completes
  int64_t used() const;    // bytes currently taken from the capacity (segments + mapped pages)
  int64_t num_mallocs() const { return num_mallocs_; }
  int64_t num_frees() const { return num_frees_; }

  FaultInjector& device_faults() { return device_faults_; }  // malloc and map requests
  FaultInjector& event_faults() { return event_faults_; }    // record_event calls
  // Requests seen over the backing's lifetime, failed or not (armed or not): device requests (malloc + map) and
  // event operations (record_event).
  int64_t num_device_requests() const;
  int64_t num_event_ops() const;

 private:
  struct State;
  int64_t capacity_;
  bool materialize_;
  int64_t num_mallocs_ = 0, num_frees_ = 0;
  FaultInjector device_faults_, event_faults_;
  std::unique_ptr<State> state_;
};
std::unique_ptr<SimulatedBacking> make_simulated_backing(int64_t capacity, bool materialize);

}  // namespace ember::memory

// RAII wrappers over CUDA streams and events, the current-stream accessor kernels launch on, and DeviceGuard.
// Invariant: every CUDA call here is checked (BackendError); an owning Stream/Event releases its handle exactly once,
// and a wrapped default stream is never destroyed.
#pragma once

#include <cuda_runtime.h>

namespace ember::cuda {

class Stream {
 public:
  // A new stream on `device`; non_blocking streams do not synchronise with the legacy default stream.
  static Stream create(int device, bool non_blocking = true, int priority = 0);
  // The default (legacy) stream of `device`, wrapped without ownership.
  static Stream default_stream(int device);

  Stream(Stream&& other) noexcept;
  Stream& operator=(Stream&& other) noexcept;
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;
  ~Stream();

  cudaStream_t get() const { return stream_; }
  int device() const { return device_; }
  bool owns() const { return owned_; }
  bool is_default() const { return stream_ == nullptr; }
  // Blocks until all work queued on the stream has finished.
  void synchronize() const;
  // True when all work queued on the stream has finished (does not block).
  bool query() const;

 private:
  Stream(cudaStream_t s, int device, bool owned) : stream_(s), device_(device), owned_(owned) {}
  void reset() noexcept;
  cudaStream_t stream_ = nullptr;
  int device_ = 0;
  bool owned_ = false;
};

// The stream ember's kernels are launched on for `device` (the default stream for now).
Stream current_stream(int device);

class Event {
 public:
  // Created on the current device; timing events can measure elapsed time, others are cheaper to record.
  explicit Event(bool enable_timing = true);
  Event(Event&& other) noexcept;
  Event& operator=(Event&& other) noexcept;
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;
  ~Event();

  cudaEvent_t get() const { return event_; }
  void record(const Stream& stream);
  void synchronize() const;
  bool query() const;  // true once the recorded work has completed
  // Milliseconds between `start` and `end` (both recorded with timing enabled and completed).
  static float elapsed_ms(const Event& start, const Event& end);

 private:
  void reset() noexcept;
  cudaEvent_t event_ = nullptr;
};

// Makes `device` current for the guard's lifetime, then restores the previous current device if its primary context
// is active (restoring would otherwise create one; the thread then stays on `device`).
class DeviceGuard {
 public:
  explicit DeviceGuard(int device);
  ~DeviceGuard();
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int previous_ = -1;
  int device_ = -1;
};

}  // namespace ember::cuda

// Asynchronous host-to-device copies for the DataLoader: a copy stream of its own, one event per batch, and the
// hand-over that makes the compute stream wait for a batch on the GPU without blocking the host.
// Invariant: a device tensor handed over is complete before any work queued afterwards on the compute stream runs,
// and neither its device bytes nor its pinned source is reused while a stream that touched them is still running.
#pragma once

#include <memory>
#include <vector>

#include "ember/core/device.h"
#include "ember/core/tensor.h"

namespace ember::data {

// Note [Copy stream]: copies run on the copier's own non-blocking stream, so they overlap the kernels of the
// compute stream (the stream ember launches kernels on, kernels/cuda/stream.h current_stream). Device buffers are
// allocated for the copy stream (so the allocator never hands the copy a block the compute stream may still be
// reading) and recorded on the compute stream at hand-over (so freeing them after the step waits for its kernels);
// the pinned source is recorded on the copy stream (so the pinned pool reuses it only once the copy is done). The
// hand-over is cudaStreamWaitEvent: the host returns at once and only work queued after it waits for the copy.
class DeviceCopier {
 public:
  // DeviceError unless `device` is an available CUDA device.
  explicit DeviceCopier(Device device);
  ~DeviceCopier();
  DeviceCopier(const DeviceCopier&) = delete;
  DeviceCopier& operator=(const DeviceCopier&) = delete;

  class Ticket;  // one batch's copies in flight (opaque)

  // Starts copying each CPU tensor of `tensors` (contiguous; pinned for a truly asynchronous copy) to the device and
  // replaces it by its device tensor, whose bytes are valid only after hand_over(ticket).
  std::shared_ptr<Ticket> start(std::vector<Tensor*> tensors);
  // The compute stream waits (on the GPU) for the ticket's copies; the device tensors are recorded on it.
  void hand_over(const std::shared_ptr<Ticket>& ticket);
  // Whether the ticket's copies have finished (does not block).
  bool done(const std::shared_ptr<Ticket>& ticket) const;

  Device device() const { return device_; }

 private:
  struct Impl;
  Device device_;
  std::unique_ptr<Impl> impl_;
};

}  // namespace ember::data

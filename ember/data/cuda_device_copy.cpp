// DeviceCopier over the CUDA runtime: a non-blocking copy stream, cudaMemcpyAsync from pinned batches, an event per
// batch and cudaStreamWaitEvent at hand-over (Note [Copy stream] in device_copy.h). Invariant: every runtime call is
// checked; the copier's stream is destroyed only after its queued copies finished.
#include <cstdint>
#include <utility>

#include "ember/base/cuda_check.h"
#include "ember/data/device_copy.h"
#include "ember/kernels/cuda/stream.h"
#include "ember/memory/cuda_device.h"

namespace ember::data {

namespace {
memory::StreamId stream_id(cudaStream_t s) { return static_cast<memory::StreamId>(reinterpret_cast<uintptr_t>(s)); }
}  // namespace

struct DeviceCopier::Impl {
  cuda::Stream copy_stream;
  explicit Impl(int device) : copy_stream(cuda::Stream::create(device, /*non_blocking=*/true)) {}
};

class DeviceCopier::Ticket {
 public:
  Ticket() : event(/*enable_timing=*/false) {}
  cuda::Event event;
  std::vector<Tensor> device_tensors;  // recorded on the compute stream at hand-over
};

DeviceCopier::DeviceCopier(Device device) : device_(device) {
  EMBER_CHECK(device.is_cuda(), DeviceError, "DeviceCopier: ", device.str(), " is not a CUDA device");
  EMBER_CHECK(device.index >= 0 && device.index < memory::cuda::device_count(), DeviceError, "DataLoader: ",
              device.str(), " is not available (", memory::cuda::device_count(), " CUDA device(s) visible)");
  impl_ = std::make_unique<Impl>(device.index);
}

DeviceCopier::~DeviceCopier() {
  if (impl_ != nullptr) {
    try {
      impl_->copy_stream.synchronize();
    } catch (...) {
      // A destructor cannot throw; a failing synchronise means the device is already lost.
    }
  }
}

std::shared_ptr<DeviceCopier::Ticket> DeviceCopier::start(std::vector<Tensor*> tensors) {
  cuda::DeviceGuard guard(device_.index);
  const cudaStream_t stream = impl_->copy_stream.get();
  auto ticket = std::make_shared<Ticket>();
  for (Tensor* t : tensors) {
    EMBER_CHECK(t != nullptr && t->defined() && t->device().is_cpu(), DeviceError,
                "DeviceCopier: expected a CPU tensor to copy");
    const Tensor host = t->contiguous();
    Tensor dev = empty_on_stream(host.sizes(), {host.dtype(), device_}, stream_id(stream));
    if (host.nbytes() > 0) {
      EMBER_CUDA_CHECK(cudaMemcpyAsync(dev.raw_data(), host.raw_data(), static_cast<size_t>(host.nbytes()),
                                       cudaMemcpyHostToDevice, stream));
      host.record_stream(stream_id(stream));  // the pinned pool keeps the source until the copy is done
    }
    ticket->device_tensors.push_back(dev);
    *t = std::move(dev);
  }
  ticket->event.record(impl_->copy_stream);
  return ticket;
}

void DeviceCopier::hand_over(const std::shared_ptr<Ticket>& ticket) {
  EMBER_CHECK(ticket != nullptr, ValueError, "DeviceCopier::hand_over: no ticket");
  cuda::DeviceGuard guard(device_.index);
  const cuda::Stream compute = cuda::current_stream(device_.index);
  EMBER_CUDA_CHECK(cudaStreamWaitEvent(compute.get(), ticket->event.get(), 0));
  for (const Tensor& t : ticket->device_tensors) t.record_stream(stream_id(compute.get()));
  ticket->device_tensors.clear();
}

bool DeviceCopier::done(const std::shared_ptr<Ticket>& ticket) const {
  return ticket == nullptr || ticket->event.query();
}

}  // namespace ember::data

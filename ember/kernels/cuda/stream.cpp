// Stream, Event and DeviceGuard (see stream.h). Every runtime call goes through EMBER_CUDA_CHECK; destructors and
// moves never throw (a failed release there is swallowed, since the context may already be gone at exit).
#include "ember/kernels/cuda/stream.h"

#include <utility>

#include "ember/base/cuda_check.h"
#include "ember/memory/cuda_backing.h"
#include "ember/memory/cuda_device.h"

namespace ember::cuda {

namespace {
void check_device(int device, const char* what) {
  const int n = memory::cuda::device_count();
  EMBER_CHECK(device >= 0 && device < n, DeviceError, what, ": cuda:", device, " is not available (", n,
              " CUDA device(s) visible)");
}
}  // namespace

// ---- Stream --------------------------------------------------------------------------------------------------

Stream Stream::create(int device, bool non_blocking, int priority) {
  check_device(device, "Stream::create");
  DeviceGuard guard(device);
  cudaStream_t s = nullptr;
  EMBER_CUDA_CHECK(
      cudaStreamCreateWithPriority(&s, non_blocking ? cudaStreamNonBlocking : cudaStreamDefault, priority));
  return Stream(s, device, true);
}

Stream Stream::default_stream(int device) {
  check_device(device, "Stream::default_stream");
  return Stream(nullptr, device, false);
}

Stream::Stream(Stream&& other) noexcept
    : stream_(std::exchange(other.stream_, nullptr)), device_(other.device_), owned_(std::exchange(other.owned_, false)) {}

Stream& Stream::operator=(Stream&& other) noexcept {
  if (this != &other) {
    reset();
    stream_ = std::exchange(other.stream_, nullptr);
    device_ = other.device_;
    owned_ = std::exchange(other.owned_, false);
  }
  return *this;
}

Stream::~Stream() { reset(); }

void Stream::reset() noexcept {
  if (owned_ && stream_ != nullptr) {
    int previous = -1;
    if (cudaGetDevice(&previous) == cudaSuccess && previous != device_) (void)cudaSetDevice(device_);
    (void)cudaStreamDestroy(stream_);
    if (previous >= 0 && previous != device_ && memory::primary_context_active(previous))
      (void)cudaSetDevice(previous);
  }
  stream_ = nullptr;
  owned_ = false;
}

void Stream::synchronize() const {
  DeviceGuard guard(device_);
  EMBER_CUDA_CHECK(cudaStreamSynchronize(stream_));
}

bool Stream::query() const {
  DeviceGuard guard(device_);
  const cudaError_t st = cudaStreamQuery(stream_);
  if (st == cudaErrorNotReady) {
    (void)cudaGetLastError();  // not an error: work is still queued
    return false;
  }
  EMBER_CUDA_CHECK(st);
  return true;
}

Stream current_stream(int device) { return Stream::default_stream(device); }

// ---- Event ---------------------------------------------------------------------------------------------------

Event::Event(bool enable_timing) {
  EMBER_CHECK(memory::cuda::device_count() > 0, DeviceError, "cuda::Event: no CUDA device is available");
  EMBER_CUDA_CHECK(cudaEventCreateWithFlags(&event_, enable_timing ? cudaEventDefault : cudaEventDisableTiming));
}

Event::Event(Event&& other) noexcept : event_(std::exchange(other.event_, nullptr)) {}

Event& Event::operator=(Event&& other) noexcept {
  if (this != &other) {
    reset();
    event_ = std::exchange(other.event_, nullptr);
  }
  return *this;
}

Event::~Event() { reset(); }

void Event::reset() noexcept {
  if (event_ != nullptr) (void)cudaEventDestroy(event_);
  event_ = nullptr;
}

void Event::record(const Stream& stream) {
  EMBER_CHECK(event_ != nullptr, ValueError, "cuda::Event::record: the event was moved from");
  DeviceGuard guard(stream.device());
  EMBER_CUDA_CHECK(cudaEventRecord(event_, stream.get()));
}

void Event::synchronize() const {
  EMBER_CHECK(event_ != nullptr, ValueError, "cuda::Event::synchronize: the event was moved from");
  EMBER_CUDA_CHECK(cudaEventSynchronize(event_));
}

bool Event::query() const {
  EMBER_CHECK(event_ != nullptr, ValueError, "cuda::Event::query: the event was moved from");
  const cudaError_t st = cudaEventQuery(event_);
  if (st == cudaErrorNotReady) {
    (void)cudaGetLastError();
    return false;
  }
  EMBER_CUDA_CHECK(st);
  return true;
}

float Event::elapsed_ms(const Event& start, const Event& end) {
  EMBER_CHECK(start.event_ != nullptr && end.event_ != nullptr, ValueError,
              "cuda::Event::elapsed_ms: an event was moved from");
  float ms = 0.0f;
  EMBER_CUDA_CHECK(cudaEventElapsedTime(&ms, start.event_, end.event_));
  return ms;
}

// ---- DeviceGuard ---------------------------------------------------------------------------------------------

DeviceGuard::DeviceGuard(int device) : device_(device) {
  EMBER_CUDA_CHECK(cudaGetDevice(&previous_));
  if (previous_ != device_) EMBER_CUDA_CHECK(cudaSetDevice(device_));
}

// Not back to a device whose primary context is inactive: cudaSetDevice would create one (memory/cuda_scoped.h).
DeviceGuard::~DeviceGuard() {
  if (previous_ >= 0 && previous_ != device_ && memory::primary_context_active(previous_))
    (void)cudaSetDevice(previous_);
}

}  // namespace ember::cuda

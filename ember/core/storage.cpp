// Storage: allocation through the device's allocator, release on destruction.
// Invariant: bytes are returned to the allocator that gave them, exactly once.
#include "ember/core/storage.h"

#include "ember/base/error.h"
#include "ember/memory/cuda_device.h"
#include "ember/memory/cpu_allocator.h"

namespace ember {

memory::Allocator& allocator_for(Device device) {
  switch (device.type) {
    case DeviceType::CPU: return memory::cpu_allocator();
    case DeviceType::CUDA: return memory::cuda::allocator(device.index);
    case DeviceType::Meta: break;
  }
  EMBER_THROW(DeviceError, "allocator_for: device ", device.str(), " holds no bytes");
}

StorageImpl::StorageImpl(int64_t nbytes, Device device) : nbytes_(nbytes), device_(device) {
  EMBER_CHECK(nbytes >= 0, ValueError, "Storage: negative size ", nbytes);
  if (device.is_meta()) return;
  allocator_ = &allocator_for(device);
  data_ = allocator_->allocate(nbytes);
}

StorageImpl::~StorageImpl() {
  if (allocator_ != nullptr && data_ != nullptr) {
    try {
      allocator_->deallocate(data_);
    } catch (...) {
      // A destructor cannot throw; a failing free here means the device is already lost.
    }
  }
}

}  // namespace ember

// Storage: allocation through the device's allocator, release on destruction; and the meta allocation scope.
// Invariant: bytes are returned to the allocator that gave them, exactly once.
#include "ember/core/storage.h"

#include "ember/base/error.h"
#include "ember/core/meta_scope.h"
#include "ember/memory/address_only.h"
#include "ember/memory/cpu_allocator.h"
#include "ember/memory/cuda_device.h"

namespace ember {

// Note [Meta allocation scope]
// A MetaAllocationScope makes meta storages created on its thread allocate their byte count from the scope's
// address-only caching allocator (memory/address_only.h): the same size classes, rounding, splitting, caching and
// OOM ladder as the real allocator with that policy, over addresses nothing backs. Every tensor of a dry run —
// parameters, batches, activations, gradients, optimizer state, kernel workspace (Note [Meta kernels] in
// kernels/stubs.h) — then shows in its statistics exactly when a real run would allocate and free it. The storage
// holds a reference to the allocator (meta_owner_), so a meta tensor may outlive its scope; StorageImpl::data()
// stays null for meta, so no kernel can reach an address. Scopes are per thread and nest; a thread without one keeps
// meta byte-free.
namespace {
thread_local std::shared_ptr<memory::CachingAllocator> t_meta_allocator;
}  // namespace

MetaAllocationScope::MetaAllocationScope() : MetaAllocationScope(memory::effective_config(memory::cpu_allocator())) {}

MetaAllocationScope::MetaAllocationScope(const memory::AllocatorConfig& config)
    : allocator_(memory::make_address_only_allocator(config, "meta")), previous_(t_meta_allocator) {
  t_meta_allocator = allocator_;
}

MetaAllocationScope::~MetaAllocationScope() { t_meta_allocator = std::move(previous_); }

memory::CachingAllocator* current_meta_allocator() { return t_meta_allocator.get(); }

MetaAllocationPause::MetaAllocationPause() : paused_(std::move(t_meta_allocator)) { t_meta_allocator = nullptr; }
MetaAllocationPause::~MetaAllocationPause() { t_meta_allocator = std::move(paused_); }

memory::Allocator& allocator_for(Device device) {
  switch (device.type) {
    case DeviceType::CPU: return memory::cpu_allocator();
    case DeviceType::CUDA: return memory::cuda::allocator(device.index);
    case DeviceType::Meta:
      if (t_meta_allocator != nullptr) return *t_meta_allocator;
      break;
  }
  EMBER_THROW(DeviceError, "allocator_for: device ", device.str(),
              " holds no bytes (outside a MetaAllocationScope, meta tensors have no allocator)");
}

StorageImpl::StorageImpl(int64_t nbytes, Device device) : nbytes_(nbytes), device_(device) {
  EMBER_CHECK(nbytes >= 0, ValueError, "Storage: negative size ", nbytes);
  if (device.is_meta()) {  // Note [Meta allocation scope]
    if (t_meta_allocator == nullptr) return;
    meta_owner_ = t_meta_allocator;
    allocator_ = meta_owner_.get();
    data_ = allocator_->allocate(nbytes);
    return;
  }
  allocator_ = &allocator_for(device);
  data_ = allocator_->allocate(nbytes);
}

StorageImpl::StorageImpl(int64_t nbytes, Device device, memory::Allocator& allocator, memory::StreamId stream,
                         bool pinned)
    : nbytes_(nbytes), device_(device), allocator_(&allocator), pinned_(pinned) {
  EMBER_CHECK(nbytes >= 0, ValueError, "Storage: negative size ", nbytes);
  EMBER_CHECK(!device.is_meta(), DeviceError, "Storage: meta storage takes no allocator");
  data_ = allocator_->allocate(nbytes, stream);
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

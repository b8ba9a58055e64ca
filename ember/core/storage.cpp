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
thread_local MetaTarget t_meta_target;

const MetaTarget& checked_target(const MetaTarget& target) {
  EMBER_CHECK(target.device != DeviceType::Meta, ValueError, "MetaAllocationScope: a dry run stands in for the cpu "
              "or a cuda device, not for meta");
  EMBER_CHECK(target.sm_count >= 1, ValueError, "MetaAllocationScope: sm_count must be >= 1, got ", target.sm_count);
  EMBER_CHECK(target.im2col_chunk_bytes >= 1, ValueError, "MetaAllocationScope: im2col_chunk_bytes must be >= 1, got ",
              target.im2col_chunk_bytes);
  EMBER_CHECK(target.gemm_workspace_bytes >= 0 && target.conv_workspace_bytes >= 0, ValueError,
              "MetaAllocationScope: workspace assumptions must be >= 0 bytes, got gemm ", target.gemm_workspace_bytes,
              " and conv ", target.conv_workspace_bytes);
  return target;
}
}  // namespace

MetaAllocationScope::MetaAllocationScope() : MetaAllocationScope(memory::effective_config(memory::cpu_allocator())) {}

MetaAllocationScope::MetaAllocationScope(const memory::AllocatorConfig& config, const MetaTarget& target)
    : previous_target_(checked_target(target)) {
  allocator_ = memory::make_address_only_allocator(config, "meta");
  previous_ = t_meta_allocator;
  t_meta_allocator = allocator_;
  std::swap(previous_target_, t_meta_target);  // previous_target_ held `target`
}

MetaAllocationScope::~MetaAllocationScope() {
  t_meta_allocator = std::move(previous_);
  t_meta_target = previous_target_;
}

memory::CachingAllocator* current_meta_allocator() { return t_meta_allocator.get(); }

const MetaTarget& current_meta_target() { return t_meta_target; }

Device host_state_device(Device param) {
  return param.is_meta() && !current_meta_target().is_cuda() ? param : Device::cpu();
}

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

// The meta allocation scope: while one is active on a thread, meta tensors created on that thread take addresses
// (no bytes) from the scope's address-only caching allocator, and give them back when their storage dies — so a
// dry run on the meta device (shapes and dtypes, no data, no compute) reproduces a real run's allocator statistics.
// Invariant: outside every scope meta storages hold nothing, as before; inside one, data pointers of meta tensors
// stay null (the addresses are for the allocator's bookkeeping only). Note [Meta allocation scope] in storage.cpp.
#pragma once

#include <memory>

#include "ember/core/tensor.h"
#include "ember/memory/alloc_config.h"
#include "ember/memory/caching_allocator.h"

namespace ember {

// Note [Dry-run targets]
// A dry run stands in for a run on some device, and the kernels of the devices take different workspace: the CPU
// kernels stage f16/bf16 operands in f32 and pack GEMM panels, the CUDA kernels hand 16-bit operands to cuBLASLt as
// they are but take partial-sum buffers, attention tiles and library workspaces. The target says whose workspace the
// kernels' meta entries replay (Note [Meta kernels] in kernels/stubs.h) and which state a real run keeps on the host
// (host_state_device). What a CUDA kernel's workspace depends on beyond shapes is part of the target: the SM count
// (split reductions size their partials by it) and the attention path; what only the library knows at run time — the
// cuBLASLt and cuDNN workspace an algorithm asks for — is an assumption the target states (0 by default: an estimate
// that says "plus whatever the libraries take", which a user who knows their device can set).
struct MetaTarget {
  DeviceType device = DeviceType::CPU;  // CPU or CUDA: whose kernels' workspace is replayed
  int sm_count = 132;                   // CUDA: streaming multiprocessors (an H100 or H200 SXM has 132)
  bool flash_attention = true;          // CUDA: attention on the flash kernels where they apply (else the tiled path)
  int64_t gemm_workspace_bytes = 0;     // CUDA: cuBLASLt workspace each product call takes (0 to 32 MiB)
  int64_t conv_workspace_bytes = 0;     // CUDA: cuDNN workspace each convolution pass takes (0 to 256 MiB)
  bool conv_im2col = false;             // CUDA: convolutions on the im2col path (EMBER_CONV=im2col, or no cuDNN)
  int64_t im2col_chunk_bytes = int64_t{64} << 20;  // CUDA: the im2col path's column budget (set_im2col_chunk_bytes)

  static MetaTarget cpu() { return {}; }
  static MetaTarget cuda() {
    MetaTarget t;
    t.device = DeviceType::CUDA;
    return t;
  }
  bool is_cuda() const { return device == DeviceType::CUDA; }
};

class MetaAllocationScope {
 public:
  // The policy the CPU allocator applies now (memory::effective_config of memory::cpu_allocator()), its capacity too.
  MetaAllocationScope();
  // `config` — the policy to simulate; config.capacity caps the simulated device (kNoLimit: unbounded). `target` —
  // the device the dry run stands in for (Note [Dry-run targets]); ValueError for a meta target or sm_count < 1.
  explicit MetaAllocationScope(const memory::AllocatorConfig& config, const MetaTarget& target = MetaTarget::cpu());
  ~MetaAllocationScope();  // restores the thread's previous scope (scopes nest)
  MetaAllocationScope(const MetaAllocationScope&) = delete;
  MetaAllocationScope& operator=(const MetaAllocationScope&) = delete;

  // Statistics, snapshot and trace of the dry run. Storages made in the scope keep the allocator alive, so tensors
  // may outlive the scope (they free into it when they die).
  memory::CachingAllocator& allocator() const { return *allocator_; }

 private:
  std::shared_ptr<memory::CachingAllocator> allocator_, previous_;
  MetaTarget previous_target_;
};

// The allocator of this thread's innermost MetaAllocationScope; null outside every scope.
memory::CachingAllocator* current_meta_allocator();

// The target of this thread's innermost MetaAllocationScope; the CPU target outside every scope.
const MetaTarget& current_meta_target();

// Where an optimizer keeps per-parameter host state (Adam's step count) for a parameter on `param`: the CPU for real
// devices; for meta, meta when the dry run stands in for the CPU (one allocator holds everything, so the state's
// bytes count) and the CPU when it stands in for CUDA (the real run keeps the count in host memory, outside the
// device allocator the estimate predicts).
Device host_state_device(Device param);

// Suspends this thread's scope for its lifetime: meta storages made meanwhile are byte-free, as outside any scope.
class MetaAllocationPause {
 public:
  MetaAllocationPause();
  ~MetaAllocationPause();
  MetaAllocationPause(const MetaAllocationPause&) = delete;
  MetaAllocationPause& operator=(const MetaAllocationPause&) = delete;

 private:
  std::shared_ptr<memory::CachingAllocator> paused_;
};

// A contiguous meta tensor that takes no bytes, inside a scope too: a placeholder that only carries a shape, for
// which a real run allocates nothing either (the operand a backward kernel is handed but never reads).
Tensor meta_placeholder(const Shape& shape, DType dtype);

}  // namespace ember

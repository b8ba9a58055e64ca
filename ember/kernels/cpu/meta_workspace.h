// The workspace of the CPU kernels, replayed on meta (Note [Meta kernels] in kernels/stubs.h): the Meta entries of
// the stubs whose CPU kernel takes scratch tensors allocate the same sizes, in the same order and for the same
// lifetimes, as meta tensors — nothing is computed — so a dry run inside a MetaAllocationScope counts them.
// Invariant: each replay mirrors the CPU kernel it sits next to; tests/kernels/test_meta_workspace.cpp holds the two
// to the same allocator peak.
#pragma once

#include <cstdint>
#include <vector>

#include "ember/core/tensor.h"

namespace ember::kernels::cpu {

// Scratch tensors on meta, held until the object dies and then freed last-taken first (as a kernel's locals are).
class MetaWorkspace {
 public:
  MetaWorkspace() = default;
  MetaWorkspace(const MetaWorkspace&) = delete;
  MetaWorkspace& operator=(const MetaWorkspace&) = delete;
  ~MetaWorkspace() {
    while (!held_.empty()) held_.pop_back();
  }
  void take(int64_t numel, DType dtype) { held_.push_back(empty({numel}, TensorOptions(dtype, Device::meta()))); }

 private:
  std::vector<Tensor> held_;
};

// The workspace one call of the CPU bmm kernel takes for [B, M, K] x [B, K, N] operands of `dtype` (B > 0, M, N > 0)
// whose matrices have element strides (rows, cols) = (a_rs, a_cs) and (b_rs, b_cs): packed copies, f32 staging for
// f16/bf16, Eigen's GEMM panels, per chunk when it runs on several threads (Note [Parallel GEMM] in gemm.cpp). Taken
// into a fresh workspace and freed before it returns, as the call.
void replay_bmm_workspace(DType dtype, int64_t B, int64_t M, int64_t K, int64_t N, int64_t a_rs, int64_t a_cs,
                          int64_t b_rs, int64_t b_cs);

}  // namespace ember::kernels::cpu
